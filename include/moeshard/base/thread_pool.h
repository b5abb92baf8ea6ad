// ThreadPool: a fixed set of worker threads for data-parallel loops.
//
// ParallelFor splits [0, n) into chunks handed out through an atomic counter; the calling
// thread works too, so a pool of N threads uses N-1 workers plus the caller.
//
// Waiting: after a call, workers (and a caller waiting for them) spin for a short window before
// sleeping on a condition variable. Waking a sleeping thread costs 50-150 us on the VMs this
// runs on, which is most of a small-expert decode step, while the spin hands work over in well
// under a microsecond. The window defaults to 1 ms when the pool fits the machine
// (num_threads <= hardware threads) and to 0 otherwise, so oversubscribed runs (many ranks as
// threads, each with a pool) never burn a core another thread needs.
//
// Thread safety: one ParallelFor at a time per pool (calls from several threads are serialised
// by an internal mutex). The callback must not call ParallelFor on the same pool.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
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

// One iteration of a spin-wait loop (a pause hint on x86).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// The CPUs this process may run on (its affinity mask, ascending); every hardware thread when
// the OS does not say.
std::vector<int> AllowedCpus();

// `cpus` split into `parts` consecutive runs of `per_part` CPUs each (part p gets
// cpus[p * per_part, (p + 1) * per_part)); empty when there are not enough CPUs to give every
// part its own (then nobody is pinned: an oversubscribed run must not stack threads).
std::vector<std::vector<int>> SplitCpus(const std::vector<int>& cpus, int parts, int per_part);

class ThreadPool {
 public:
  // num_threads counts the caller: 1 means run everything inline. 0 means
  // std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads = 0);
  // spin_us: how long an idle worker (or a caller waiting for workers) spins before sleeping;
  // negative picks the default described above.
  ThreadPool(int num_threads, int spin_us);
  // Pinned: thread i (worker i, and the caller as thread 0 on its first ParallelFor) runs on
  // cpus[i % cpus.size()] only, so the OS does not migrate a kernel thread and its caches away.
  // Empty `cpus`: not pinned. A CPU the process may not use is ignored (the thread keeps the
  // process's affinity).
  ThreadPool(int num_threads, int spin_us, std::vector<int> cpus);
  // The CPUs the threads are pinned to (empty: not pinned).
  const std::vector<int>& cpus() const { return cpus_; }
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }
  int spin_us() const { return spin_us_; }

  // Calls fn(begin, end, thread_idx) over disjoint chunks covering [0, n), each at most `grain`
  // long (grain 0: n / num_threads rounded up). thread_idx is in [0, num_threads()), unique
  // among concurrently running chunks. Returns when every chunk has finished.
  // Chunks are claimed in increasing order, each by a thread that then runs it, so a chunk may
  // wait (spin) for a chunk before it to finish: that chunk is already running.
  // Never allocates.
  template <typename F>
  void ParallelFor(int64_t n, int64_t grain, F&& fn) {
    RunParallel(n, grain, ChunkFnRef(fn));
  }

 private:
  void RunParallel(int64_t n, int64_t grain, ChunkFnRef fn);
  void WorkerLoop(int thread_idx);
  void RunChunks(int thread_idx);

  // Spins until pred() or the spin window ends; true when pred() held.
  template <typename Pred>
  bool SpinUntil(Pred pred) const;

  const int num_threads_;
  const int spin_us_;
  const std::vector<int> cpus_;
  std::atomic<bool> caller_pinned_{false};
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // serialises ParallelFor callers

  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  // Written under mutex_; atomic so that spinning threads can read them without it.
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> workers_busy_{0};

  // The current job (valid while a generation is running).
  const ChunkFnRef* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
  std::atomic<int64_t> next_{0};
};

}  // namespace moeshard
