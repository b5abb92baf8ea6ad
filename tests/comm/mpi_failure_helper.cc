// A small MPI program in which rank 1 fails, for the ctest cases that check a failing rank ends
// the whole job with its message and without hanging (expect_job_failure.cmake runs it under
// mpirun and checks the exit code and the output). Usage: mpi_failure_helper MODE, MODE one of
//   error       rank 1 returns an error while the others wait in a barrier
//   throw       rank 1 throws from its rank function
//   bad_counts  rank 1 passes AllToAllV counts that disagree with what rank 0 sends
//   timeout     rank 1 never arrives; the others time out after 1 s naming rank 1
//   ok          nobody fails (the control: exits 0)
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "moeshard/comm/mpi_comm.h"

using namespace moeshard;

int main(int argc, char** argv) {
  auto session = MpiSession::Init(&argc, &argv);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().ToString().c_str());
    return 1;
  }
  const std::string mode = argc > 1 ? argv[1] : "";
  MpiCommOptions options;
  options.timeout = mode == "timeout" ? std::chrono::seconds(1) : std::chrono::seconds(60);
  RunMpiRank(**session, options, [&](Communicator& world) -> Status {
    MOESHARD_RETURN_IF_ERROR(world.Barrier());
    const bool me = world.rank() == 1;
    if (mode == "error") {
      if (me) return InvalidArgumentError("deliberate failure on rank 1");
    } else if (mode == "throw") {
      if (me) throw std::runtime_error("deliberate exception on rank 1");
    } else if (mode == "bad_counts") {
      const size_t n = static_cast<size_t>(world.size());
      std::vector<size_t> send_counts(n, 1), recv_counts(n, 1);
      if (me) recv_counts[0] = 2;
      std::vector<char> send(n), recv(n + 1);
      AllToAllVArgs args;
      args.send = send.data();
      args.send_counts = send_counts;
      args.recv = recv.data();
      args.recv_counts = recv_counts;
      MOESHARD_RETURN_IF_ERROR(world.AllToAllV(args));
    } else if (mode == "timeout") {
      if (me) std::this_thread::sleep_for(std::chrono::seconds(60));
    } else if (mode != "ok") {
      return InvalidArgumentError("unknown mode '" + mode + "'");
    }
    return world.Barrier();
  });
  std::printf("[rank %d] finished\n", (*session)->world_rank());
  return 0;
}
