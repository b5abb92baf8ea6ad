// The sharded runtime on local ranks (threads): every case of runtime_cases.h, plus the
// failing-rank test. Label multirank.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>

#include "moeshard/comm/local_comm.h"
#include "tests/runtime/runtime_cases.h"

namespace moeshard {
namespace {

using runtime_test::AllRuntimeCases;
using runtime_test::RuntimeCase;

LocalCommOptions TestOptions() {
  LocalCommOptions o;
  o.timeout = std::chrono::seconds(60);
  return o;
}

class RuntimeLocalTest : public ::testing::TestWithParam<std::string> {};

// Every case on every kernel backend ("<case>_cpu", "<case>_reference").
TEST_P(RuntimeLocalTest, MatchesOneRank) {
  for (const runtime_test::CaseRun& run : runtime_test::AllCaseRuns()) {
    if (run.name != GetParam()) continue;
    const Status s = RunLocalRanks(run.runtime_case->world, TestOptions(),
                                   [&run](Communicator& w) { return run.Run(w); });
    EXPECT_TRUE(s.ok()) << s.ToString();
    return;
  }
  FAIL() << "no case " << GetParam();
}

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  for (const runtime_test::CaseRun& run : runtime_test::AllCaseRuns()) names.push_back(run.name);
  return names;
}

TEST(RuntimeLocalBackendsTest, EveryKernelCaseRunsOnEveryBackend) {
  // The parametrization above cannot silently drop the test backend.
  int64_t kernel_cases = 0, reference_runs = 0;
  for (const RuntimeCase& c : AllRuntimeCases()) kernel_cases += c.uses_kernels ? 1 : 0;
  for (const runtime_test::CaseRun& run : runtime_test::AllCaseRuns()) {
    reference_runs += run.kernel_backend == "reference" ? 1 : 0;
  }
  EXPECT_GT(kernel_cases, 10);
  EXPECT_EQ(reference_runs, kernel_cases);
}

INSTANTIATE_TEST_SUITE_P(AllCases, RuntimeLocalTest, ::testing::ValuesIn(CaseNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(RuntimeLocalFailureTest, BadInputOnOneRankEndsEveryRankWithItsMessage) {
  for (int n : {2, 4}) {
    std::vector<Status> statuses;
    const auto start = std::chrono::steady_clock::now();
    const Status s = RunLocalRanks(
        n, TestOptions(), [](Communicator& w) { return runtime_test::BadRankBody(w, 1); },
        &statuses);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 30) << "the job should end promptly, not at a timeout";
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(s.message(), ::testing::HasSubstr(fmt::format("[rank 1/{}]", n)));
    EXPECT_THAT(s.message(), ::testing::HasSubstr(runtime_test::kBadRankMessage));
    ASSERT_EQ(statuses.size(), static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      EXPECT_FALSE(statuses[r].ok()) << "rank " << r;
      EXPECT_THAT(statuses[r].message(), ::testing::HasSubstr(runtime_test::kBadRankMessage))
          << "rank " << r;
    }
  }
}

TEST(RuntimeLocalFailureTest, GoodInputOnEveryRankSucceeds) {
  // The control: the same body without a bad rank passes, so the test above fails for the
  // reason it claims.
  const Status s = RunLocalRanks(4, TestOptions(), [](Communicator& w) {
    return runtime_test::BadRankBody(w, /*bad_rank=*/-1);
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
}

}  // namespace
}  // namespace moeshard
