#include "moeshard/base/thread_pool.h"

#include <algorithm>

#include "moeshard/base/check.h"
#include "moeshard/base/math.h"

namespace moeshard {

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(num_threads > 0
                       ? num_threads
                       : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))) {
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks(int thread_idx) {
  for (;;) {
    const int64_t begin = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (begin >= n_) return;
    (*fn_)(begin, std::min(n_, begin + grain_), thread_idx);
  }
}

void ThreadPool::WorkerLoop(int thread_idx) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunChunks(thread_idx);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--workers_busy_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::RunParallel(int64_t n, int64_t grain, ChunkFnRef fn) {
  if (n <= 0) return;
  if (grain <= 0) grain = CeilDiv(n, num_threads_);
  if (num_threads_ == 1 || n <= grain) {
    for (int64_t b = 0; b < n; b += grain) fn(b, std::min(n, b + grain), 0);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    n_ = n;
    grain_ = grain;
    next_.store(0, std::memory_order_relaxed);
    workers_busy_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_cv_.notify_all();
  RunChunks(0);
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return workers_busy_ == 0; });
  fn_ = nullptr;
}

}  // namespace moeshard
