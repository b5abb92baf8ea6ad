// MPI communicator: one process per rank under mpirun (OpenMPI), multi-process and multi-node.
// This header does not include <mpi.h>; only src/comm/mpi/ does.
//
// Programs usually start it through the launcher factory (launcher.h: CreateLauncher picks mpi
// under mpirun); used directly, from main():
//
//   if (LaunchedUnderMpi()) {
//     auto session = MpiSession::Init(&argc, &argv);       // MPI_Init_thread
//     if (!session.ok()) { print; return 1; }
//     RunMpiRank(**session, MpiCommOptions{}, [&](Communicator& world) -> Status { ... });
//   }                                              // ~MpiSession: MPI_Finalize
//
// Semantics are those of communicator.h, with the same bits as the local backend: reductions
// are done as an all-to-all of chunks, a sum in rank order on the chunk's owner, and an
// all-gather — never with MPI_Reduce/MPI_Allreduce, whose order is the implementation's.
// Collectives are nonblocking MPI calls completed by polling, so they honour the timeout. When
// options.verify_calls is on (the default), every collective first exchanges a small header
// with each peer, so mismatched calls or counts fail with a message naming both ranks, and a
// timeout names the ranks that never arrived.
//
// Failure: RunMpiRank turns any failure of this rank (an error Status, an exception, a timeout)
// into "[rank r/n] <message>" on stderr and MPI_Abort, which ends every process of the job.
// MPI errors are returned, not fatal (MPI_ERRORS_RETURN), and name the call, code and
// MPI_Error_string.
//
// Thread safety: MpiSession::Init once per process. A communicator (and all communicators of a
// process) is driven by one thread at a time.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "moeshard/base/status.h"
#include "moeshard/comm/communicator.h"
#include "moeshard/comm/launch_env.h"

namespace moeshard {

struct MpiCommOptions {
  // A collective not complete after this long fails with DeadlineExceeded.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Exchange a call header with each peer before each collective (see above). Costs one small
  // message per peer and collective.
  bool verify_calls = true;
};

// True when moeshard was built with the MPI backend.
bool MpiAvailable();

// What mpirun / mpiexec / srun told this process through the launch environment.
struct MpiLaunchInfo {
  // Started by one: OMPI_COMM_WORLD_SIZE (OpenMPI), PMIX_RANK (PMIx: OpenMPI 5, Slurm), PMI_SIZE
  // or PMI_RANK (MPICH / Intel MPI Hydra, Slurm PMI) is set.
  bool launched = false;
  int world_size = 0;  // OMPI_COMM_WORLD_SIZE, else PMI_SIZE; 0 when neither says
  int local_size = 0;  // OMPI_COMM_WORLD_LOCAL_SIZE: the job's processes on this node; 0 unknown
};
MpiLaunchInfo ReadMpiLaunchInfo(const LaunchEnv& env);

// ReadMpiLaunchInfo(ProcessLaunchEnv()).launched: a program can choose the MPI backend by itself.
bool LaunchedUnderMpi();

// Owns MPI initialisation for the process: MPI_Init_thread on Init, MPI_Finalize on
// destruction. Sets MPI_ERRORS_RETURN on MPI_COMM_WORLD.
class MpiSession {
 public:
  // REQUIRES: called once per process. argc/argv may be null.
  // FailedPrecondition when MPI was already initialised; Unimplemented without MPI support.
  static Result<std::unique_ptr<MpiSession>> Init(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

  // COLLECTIVE (over MPI_COMM_WORLD): a communicator over a duplicate of MPI_COMM_WORLD, named
  // "world". Communicators must be destroyed before the session.
  Result<std::unique_ptr<Communicator>> World(const MpiCommOptions& options = {});

  // Prints "[rank r/n] <status>" to stderr and ends the whole job with MPI_Abort (exit code 1).
  [[noreturn]] void AbortJob(const Status& status);

 private:
  MpiSession(int world_rank, int world_size) : world_rank_(world_rank), world_size_(world_size) {}
  const int world_rank_;
  const int world_size_;
};

// Runs per_rank(world) in this process. Returns when it returned OK; on any failure (error
// Status, exception, failure to create the world) calls session.AbortJob, so the job ends with
// this rank's message and never hangs.
// COLLECTIVE over MPI_COMM_WORLD.
void RunMpiRank(MpiSession& session, const MpiCommOptions& options,
                const std::function<Status(Communicator&)>& per_rank);

}  // namespace moeshard
