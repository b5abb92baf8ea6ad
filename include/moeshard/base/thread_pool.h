// ThreadPool: a fixed set of worker threads for data-parallel loops.
//
// ParallelFor splits [0, n) into chunks handed out through an atomic counter; the calling
// thread works too, so a pool of N threads uses N-1 workers plus the caller. Workers sleep on a
// condition variable between calls (no spinning), which keeps oversubscribed runs (8 ranks as
// threads on 2 cores, each with a pool) fair.
//
// Thread safety: one ParallelFor at a time per pool (calls from several threads are serialised
// by an internal mutex). The callback must not call ParallelFor on the same pool.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace moeshard {

// A non-owning reference to a callable `void(int64_t begin, int64_t end, int thread_idx)`.
// Unlike std::function it never allocates, so a ParallelFor in a hot loop costs no heap
// traffic whatever the lambda captures. The callable must outlive the reference.
class ChunkFnRef {
 public:
  template <typename F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, ChunkFnRef>)
  ChunkFnRef(F& fn)  // NOLINT(google-explicit-constructor): passed straight from call sites
      : obj_(const_cast<void*>(static_cast<const void*>(&fn))),
        call_([](void* obj, int64_t b, int64_t e, int t) { (*static_cast<F*>(obj))(b, e, t); }) {}
  void operator()(int64_t b, int64_t e, int t) const { call_(obj_, b, e, t); }

 private:
  void* obj_;
  void (*call_)(void*, int64_t, int64_t, int);
};

class ThreadPool {
 public:
  // num_threads counts the caller: 1 means run everything inline. 0 means
  // std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end, thread_idx) over disjoint chunks covering [0, n), each at most `grain`
  // long (grain 0: n / num_threads rounded up). thread_idx is in [0, num_threads()), unique
  // among concurrently running chunks. Returns when every chunk has finished.
  // Never allocates.
  template <typename F>
  void ParallelFor(int64_t n, int64_t grain, F&& fn) {
    RunParallel(n, grain, ChunkFnRef(fn));
  }

 private:
  void RunParallel(int64_t n, int64_t grain, ChunkFnRef fn);
  void WorkerLoop(int thread_idx);
  void RunChunks(int thread_idx);

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // serialises ParallelFor callers

  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  int workers_busy_ = 0;

  // The current job (valid while a generation is running).
  const ChunkFnRef* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace moeshard
