// The Communicator contract on the MPI backend: the same cases as comm_local_test
// (comm_cases.h), run by every process of an mpirun job (ctest runs it with 2 and 4
// processes). Its own main initialises MPI. A case that fails on any rank ends the whole job
// through MpiSession::AbortJob with that rank's message, so a failure can never leave the other
// ranks waiting in a collective.
#include "moeshard/comm/mpi_comm.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "tests/comm/comm_cases.h"
#include "tests/mpi_gtest_main.h"

namespace moeshard {
namespace {

MpiSession* g_session = nullptr;
Communicator* g_world = nullptr;

class MpiCommCaseTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MpiCommCaseTest, Passes) {
  ASSERT_NE(g_world, nullptr);
  for (const comm_test::CommCase& c : comm_test::AllCommCases()) {
    if (c.name != GetParam()) continue;
    Status s = c.body(*g_world);
    if (!s.ok()) g_session->AbortJob(s.WithContext("case " + c.name));
    return;
  }
  FAIL() << "no case " << GetParam();
}

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  for (const comm_test::CommCase& c : comm_test::AllCommCases()) names.push_back(c.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(AllCases, MpiCommCaseTest, ::testing::ValuesIn(CaseNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(MpiCommTest, DetectsTheLauncher) {
  EXPECT_TRUE(MpiAvailable());
  EXPECT_TRUE(LaunchedUnderMpi());
  EXPECT_EQ(g_world->size(), g_session->world_size());
  EXPECT_EQ(g_world->rank(), g_session->world_rank());
}

}  // namespace
}  // namespace moeshard

int main(int argc, char** argv) {
  return moeshard::testing::RunMpiGtest(argc, argv, std::chrono::seconds(60), &moeshard::g_session,
                                        &moeshard::g_world);
}
