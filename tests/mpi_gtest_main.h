// The main() of a GoogleTest binary run under mpirun: every process is a rank of one MPI world,
// rank 0 prints the report, and any rank's failure fails the job.
//
// Usage, in exactly one test file:  int main(int argc, char** argv) {
//   return moeshard::testing::RunMpiGtest(argc, argv, std::chrono::seconds(60), &g_session,
//                                         &g_world); }
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <span>

#include "moeshard/comm/mpi_comm.h"

namespace moeshard::testing {

// Initialises MPI, sets *session and *world for the tests, runs them, and returns the exit code
// (non-zero when a test failed on any rank).
inline int RunMpiGtest(int argc, char** argv, std::chrono::milliseconds timeout,
                       MpiSession** session_out, Communicator** world_out) {
  auto session = MpiSession::Init(&argc, &argv);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().ToString().c_str());
    return 1;
  }
  *session_out = session->get();
  MpiCommOptions options;
  options.timeout = timeout;
  auto world = (*session)->World(options);
  if (!world.ok()) (*session)->AbortJob(world.status());
  *world_out = world->get();

  ::testing::InitGoogleTest(&argc, argv);
  // One report per job: rank 0 prints, the others stay quiet unless a test fails on them.
  if ((*session)->world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS();
  // Any rank's gtest failure fails the job (exit code of rank 0 included).
  float any_failed = failed != 0 ? 1.0f : 0.0f;
  Status s = (*world)->AllReduceSum(std::span<float>(&any_failed, 1));
  if (!s.ok()) (*session)->AbortJob(s);
  if (any_failed != 0.0f && failed == 0) {
    std::fprintf(stderr, "[rank %d] another rank failed a test\n", (*session)->world_rank());
    failed = 1;
  }
  *world_out = nullptr;
  world->reset();
  return failed;
}

}  // namespace moeshard::testing
