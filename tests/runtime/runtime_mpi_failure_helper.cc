// Runs runtime_test::BadRankBody under mpirun: `bad` makes rank 1 pass bad input (the job must
// end, every rank, with rank 1's message), `ok` is the control (exit 0).
#include <cstdio>
#include <cstring>

#include "moeshard/comm/mpi_comm.h"
#include "tests/runtime/runtime_cases.h"

int main(int argc, char** argv) {
  using namespace moeshard;
  const bool bad = argc > 1 && std::strcmp(argv[1], "bad") == 0;
  auto session = MpiSession::Init(&argc, &argv);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().ToString().c_str());
    return 1;
  }
  MpiCommOptions options;
  options.timeout = std::chrono::seconds(60);
  RunMpiRank(**session, options,
             [&](Communicator& world) { return runtime_test::BadRankBody(world, bad ? 1 : -1); });
  return 0;
}
