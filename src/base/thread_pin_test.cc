// Pinning a ThreadPool's threads to CPUs, and splitting a process's CPUs between ranks (kept
// apart from thread_pool_test.cc, which replaces the global operator new).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "moeshard/base/thread_pool.h"

#if defined(__linux__)
#include <sched.h>
#endif

#if defined(__linux__)
namespace moeshard {
namespace {

// The CPU set thread `t` of a pinned pool runs on, read inside a chunk.
TEST(ThreadPoolTest, PinnedThreadsRunOnTheirCpus) {
  const std::vector<int> allowed = AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  // Two threads on the last allowed CPU and the first (the caller is thread 0).
  const std::vector<int> cpus = {allowed.back(), allowed.front()};
  std::thread caller([&] {
    ThreadPool pool(2, 0, cpus);
    EXPECT_EQ(pool.cpus(), cpus);
    std::vector<std::vector<int>> seen(2);
    std::mutex mu;
    for (int rep = 0; rep < 5; ++rep) {
      // Both chunks wait for each other (up to 2 s), so each thread runs one.
      std::atomic<int> arrived{0};
      pool.ParallelFor(2, 1, [&](int64_t, int64_t, int t) {
        arrived.fetch_add(1);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::yield();
        }
        cpu_set_t set;
        CPU_ZERO(&set);
        ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
        std::vector<int> mine;
        for (int c = 0; c < CPU_SETSIZE; ++c) {
          if (CPU_ISSET(c, &set)) mine.push_back(c);
        }
        std::lock_guard<std::mutex> lock(mu);
        seen[static_cast<size_t>(t)] = mine;
      });
    }
    for (int t = 0; t < 2; ++t) {
      EXPECT_EQ(seen[static_cast<size_t>(t)], std::vector<int>{cpus[static_cast<size_t>(t)]})
          << "thread " << t;
    }
  });
  caller.join();
}

TEST(ThreadPoolTest, SplitCpusGivesEachPartItsOwnOrNone) {
  EXPECT_EQ(SplitCpus({0, 1, 2, 3}, 2, 2), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(SplitCpus({4, 5, 6}, 3, 1), (std::vector<std::vector<int>>{{4}, {5}, {6}}));
  EXPECT_TRUE(SplitCpus({0, 1}, 2, 2).empty());  // oversubscribed: nobody pinned
  EXPECT_TRUE(SplitCpus({0, 1}, 0, 1).empty());
}

}  // namespace
}  // namespace moeshard
#endif
