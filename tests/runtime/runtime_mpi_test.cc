// The sharded runtime on the MPI backend: the cases of runtime_cases.h whose world size equals
// the job's (ctest runs it with 2 and 4 processes). Its own main initialises MPI; a case that
// fails on any rank ends the whole job through MpiSession::AbortJob with that rank's message.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "moeshard/comm/mpi_comm.h"
#include "tests/runtime/runtime_cases.h"

namespace moeshard {
namespace {

MpiSession* g_session = nullptr;
Communicator* g_world = nullptr;

class RuntimeMpiTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RuntimeMpiTest, MatchesOneRank) {
  for (const runtime_test::RuntimeCase& c : runtime_test::AllRuntimeCases()) {
    if (c.name != GetParam()) continue;
    const Status s = c.body(*g_world);
    if (!s.ok()) g_session->AbortJob(s.WithContext("case " + c.name));
    return;
  }
  FAIL() << "no case " << GetParam();
}

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  int size = 0;
  if (const char* s = std::getenv("OMPI_COMM_WORLD_SIZE")) size = std::atoi(s);
  if (const char* s = std::getenv("PMI_SIZE"); s != nullptr && size == 0) size = std::atoi(s);
  for (const runtime_test::RuntimeCase& c : runtime_test::AllRuntimeCases()) {
    if (c.world == size) names.push_back(c.name);
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
  using namespace moeshard;
  auto session = MpiSession::Init(&argc, &argv);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().ToString().c_str());
    return 1;
  }
  g_session = session->get();
  MpiCommOptions options;
  options.timeout = std::chrono::seconds(120);
  auto world = (*session)->World(options);
  if (!world.ok()) (*session)->AbortJob(world.status());
  g_world = world->get();

  ::testing::InitGoogleTest(&argc, argv);
  if ((*session)->world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS();
  float any_failed = failed != 0 ? 1.0f : 0.0f;
  Status s = g_world->AllReduceSum(std::span<float>(&any_failed, 1));
  if (!s.ok()) (*session)->AbortJob(s);
  if (any_failed != 0.0f && failed == 0) {
    std::fprintf(stderr, "[rank %d] another rank failed a test\n", (*session)->world_rank());
    failed = 1;
  }
  world->reset();
  return failed;
}
