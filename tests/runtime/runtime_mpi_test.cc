// The sharded runtime on the MPI backend: the cases of runtime_cases.h whose world size equals
// the job's, on every kernel backend, (ctest runs it with 2 and 4 processes). Its own main
// initialises MPI; a case that fails on any rank ends the whole job through MpiSession::AbortJob
// with that rank's message.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "moeshard/comm/mpi_comm.h"
#include "tests/mpi_gtest_main.h"
#include "tests/runtime/runtime_cases.h"

namespace moeshard {
namespace {

MpiSession* g_session = nullptr;
Communicator* g_world = nullptr;

class RuntimeMpiTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RuntimeMpiTest, MatchesOneRank) {
  for (const runtime_test::CaseRun& run : runtime_test::AllCaseRuns()) {
    if (run.name != GetParam()) continue;
    const Status s = run.Run(*g_world);
    if (!s.ok()) g_session->AbortJob(s.WithContext("case " + run.name));
    return;
  }
  FAIL() << "no case " << GetParam();
}

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  // Before MPI is initialised (the test list is made first): what the launcher told us.
  const int size = ReadMpiLaunchInfo(ProcessLaunchEnv()).world_size;
  for (const runtime_test::CaseRun& run : runtime_test::AllCaseRuns(size)) {
    names.push_back(run.name);
  }
  return names;
}

INSTANTIATE_TEST_SUITE_P(AllCases, RuntimeMpiTest, ::testing::ValuesIn(CaseNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(RuntimeMpiJobTest, RunsEveryCaseOfItsSize) {
  EXPECT_FALSE(CaseNames().empty()) << "no runtime case for " << g_world->size() << " ranks";
}

}  // namespace
}  // namespace moeshard

int main(int argc, char** argv) {
  return moeshard::testing::RunMpiGtest(argc, argv, std::chrono::seconds(120), &moeshard::g_session,
                                        &moeshard::g_world);
}
