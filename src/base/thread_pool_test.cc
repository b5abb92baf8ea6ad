#include "moeshard/base/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <numeric>
#include <thread>

namespace moeshard {
namespace {

TEST(ThreadPoolTest, CoversRangeExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 1000}) {
      for (int64_t grain : {0, 1, 3, 64}) {
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int> bad_idx{0};
        pool.ParallelFor(n, grain, [&](int64_t b, int64_t e, int t) {
          if (t < 0 || t >= threads) bad_idx++;
          for (int64_t i = b; i < e; ++i) hits[i]++;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
        EXPECT_EQ(bad_idx.load(), 0);
      }
    }
  }
}

// Workers that spin between calls (and a caller that spins waiting for them) hand work over
// correctly whatever the window, including calls that come after the window ran out.
TEST(ThreadPoolTest, SpinWindowsHandOverEveryCall) {
  for (int spin_us : {0, 50, 1000}) {
    ThreadPool pool(2, spin_us);
    EXPECT_EQ(pool.spin_us(), spin_us);
    for (int call = 0; call < 200; ++call) {
      if (call % 50 == 49)
        std::this_thread::sleep_for(std::chrono::microseconds(2 * spin_us + 100));
      std::atomic<int64_t> total{0};
      pool.ParallelFor(16, 1, [&](int64_t b, int64_t e, int) { total += e - b; });
      ASSERT_EQ(total.load(), 16) << "spin " << spin_us << " call " << call;
    }
  }
}

// The default window: spin only when the pool fits the machine.
TEST(ThreadPoolTest, DefaultSpinsOnlyWhenThePoolFitsTheCores) {
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_GT(ThreadPool(1).spin_us(), 0);
  ThreadPool oversubscribed(std::max(2, hw) * 2);
  EXPECT_EQ(oversubscribed.spin_us(), 0);
}

TEST(ThreadPoolTest, ManyCallsFromSeveralThreads) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int it = 0; it < 100; ++it) {
        pool.ParallelFor(50, 1, [&](int64_t b, int64_t e, int) { total += e - b; });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 3 * 100 * 50);
}

}  // namespace
}  // namespace moeshard

// Counts heap allocations made by this test binary, to check ParallelFor allocates nothing.
namespace {
std::atomic<int64_t> g_allocations{0};
}  // namespace
void* operator new(size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace moeshard {
namespace {

TEST(ThreadPoolTest, ParallelForDoesNotAllocate) {
  ThreadPool pool(2);
  std::array<int64_t, 8> big_capture{};  // larger than std::function's inline buffer
  std::atomic<int64_t> sum{0};
  pool.ParallelFor(64, 1,
                   [&, big_capture](int64_t b, int64_t e, int) { sum += e - b + big_capture[0]; });
  const int64_t before = g_allocations.load();
  for (int i = 0; i < 100; ++i) {
    pool.ParallelFor(
        64, 1, [&, big_capture](int64_t b, int64_t e, int) { sum += e - b + big_capture[1]; });
  }
  EXPECT_EQ(g_allocations.load() - before, 0);
  EXPECT_EQ(sum.load(), 101 * 64);
}

}  // namespace
}  // namespace moeshard
