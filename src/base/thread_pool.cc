#include "moeshard/base/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include "base/check.h"
#include "moeshard/base/math.h"

namespace moeshard {
namespace {

constexpr int kDefaultSpinUs = 1000;

int ResolveThreads(int num_threads) {
  return num_threads > 0 ? num_threads
                         : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

int ResolveSpin(int threads, int spin_us) {
  if (spin_us >= 0) return spin_us;
  const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return threads <= hw ? kDefaultSpinUs : 0;
}

}  // namespace

// Pins the calling thread to `cpu` (Linux); false when the OS refuses (a CPU outside the
// process's affinity) or elsewhere.
bool PinCurrentThread(int cpu) {
#if defined(__linux__)
  if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
#else
  (void)cpu;
  return false;
#endif
}

std::vector<int> AllowedCpus() {
  std::vector<int> out;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) out.push_back(c);
    }
  }
#endif
  if (out.empty()) {
    const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    for (int c = 0; c < hw; ++c) out.push_back(c);
  }
  return out;
}

std::vector<std::vector<int>> SplitCpus(const std::vector<int>& cpus, int parts, int per_part) {
  if (parts < 1 || per_part < 1 ||
      static_cast<int64_t>(parts) * per_part > static_cast<int64_t>(cpus.size())) {
    return {};
  }
  std::vector<std::vector<int>> out(static_cast<size_t>(parts));
  for (int p = 0; p < parts; ++p) {
    out[static_cast<size_t>(p)].assign(cpus.begin() + p * per_part,
                                       cpus.begin() + (p + 1) * per_part);
  }
  return out;
}

ThreadPool::ThreadPool(int num_threads) : ThreadPool(num_threads, -1) {}

ThreadPool::ThreadPool(int num_threads, int spin_us) : ThreadPool(num_threads, spin_us, {}) {}

ThreadPool::ThreadPool(int num_threads, int spin_us, std::vector<int> cpus)
    : num_threads_(ResolveThreads(num_threads)),
      spin_us_(ResolveSpin(ResolveThreads(num_threads), spin_us)),
      cpus_(std::move(cpus)) {
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i] {
      if (!cpus_.empty()) PinCurrentThread(cpus_[static_cast<size_t>(i) % cpus_.size()]);
      WorkerLoop(i);
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

template <typename Pred>
bool ThreadPool::SpinUntil(Pred pred) const {
  if (pred()) return true;
  if (spin_us_ <= 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (pred()) return true;
      CpuRelax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return pred();
  }
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
    auto ready = [&] {
      return stop_.load(std::memory_order_acquire) ||
             generation_.load(std::memory_order_acquire) != seen;
    };
    if (!SpinUntil(ready)) {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, ready);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    RunChunks(thread_idx);
    if (workers_busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // The caller may be asleep on done_cv_: notify under the mutex so the wake-up is not lost.
      std::lock_guard<std::mutex> lock(mutex_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::RunParallel(int64_t n, int64_t grain, ChunkFnRef fn) {
  if (n <= 0) return;
  if (!cpus_.empty() && !caller_pinned_.exchange(true, std::memory_order_relaxed)) {
    PinCurrentThread(cpus_[0]);  // the first caller is thread 0
  }
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
    workers_busy_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);  // publishes the job to spinning workers
  }
  work_cv_.notify_all();
  RunChunks(0);
  auto done = [&] { return workers_busy_.load(std::memory_order_acquire) == 0; };
  if (!SpinUntil(done)) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, done);
  }
  fn_ = nullptr;
}

}  // namespace moeshard
