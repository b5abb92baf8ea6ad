#include "moeshard/base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>

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
