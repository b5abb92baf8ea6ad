// Launchers: how the ranks of a job come to exist, behind one interface and one factory.
//
//   local  the ranks are threads of this process, over LocalComm (local_comm.h): the default.
//   mpi    one process per rank, started by mpirun / mpiexec / srun, over MpiComm (mpi_comm.h):
//          what `auto` picks when the environment says a launcher started this process.
//   nccl   (later) one process per GPU; docs/backends.md, "Launchers", says how to add one.
//
// A caller says which launcher (`--comm`: local, mpi, or auto) and how many ranks the job needs;
// CreateLauncher picks it from the launch environment (launch_env.h), which it owns: the
// launchers read only that map, and no caller reads OMPI_* or PMI* variables itself. The
// launcher then answers what depends on it -- how many ranks share this machine's cores, which
// CPUs each rank's kernel threads get -- and runs the per-rank function on every rank this
// process hosts.
//
//   auto launcher = CreateLauncher({.comm = flags.comm, .world = plan.topology.world});
//   if (!launcher.ok()) return launcher.status();
//   int threads = (*launcher)->DefaultThreadsPerRank();
//   Status s = (*launcher)->Run([&](Communicator& world) -> Status { ... });
//
// Thread safety: creating an mpi launcher initialises MPI (MpiSession::Init): at most once per
// process, and the launcher must outlive every communicator it handed out. A Launcher is used by
// one thread; Run calls per_rank on the ranks' own threads (local) or this thread (mpi).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/comm/communicator.h"
#include "moeshard/comm/launch_env.h"
#include "moeshard/comm/local_comm.h"
#include "moeshard/comm/mpi_comm.h"

namespace moeshard {

class Launcher {
 public:
  virtual ~Launcher() = default;

  // "local" or "mpi": what `--comm` names it and reports print.
  virtual const char* name() const = 0;
  // The job's ranks (for mpi, the processes mpirun started).
  virtual int world() const = 0;
  // The job's ranks that share this machine's cores: local, all of them; mpi, the processes
  // the launcher put on this node (OMPI_COMM_WORLD_LOCAL_SIZE), else the whole world.
  virtual int ranks_per_node() const = 0;
  // Whether the ranks are threads of this process, which can then also start jobs of other
  // sizes on its own (CreateLauncher with comm "local"); false when the world is fixed by an
  // external launcher.
  virtual bool in_process() const = 0;

  // The CPUs of each rank's `threads_per_rank` kernel threads, [world()] lists, or empty when
  // they do not fit (then nothing is pinned). local: this process's CPUs split between the
  // ranks, node by node (`node_of`, when non-null, receives each rank's NUMA node, -1 when not
  // placed by node); mpi: this process's CPUs for its one rank, at every index (node_of is left
  // as it is).
  virtual std::vector<std::vector<int>> RankCpus(int threads_per_rank,
                                                 std::vector<int>* node_of) const = 0;

  // Kernel threads per rank when none are asked for: this machine's cores / ranks_per_node(),
  // at least 1.
  int DefaultThreadsPerRank() const;

  // COLLECTIVE over every process of the job: runs per_rank(world) on every rank this process
  // hosts and returns when they have returned. local: OK, or the first failure as "[rank r/n]
  // <message>" (RunLocalRanks). mpi: OK; a failing rank ends the whole job with its message
  // (MPI_Abort, RunMpiRank), so Run does not return then. Call it once.
  virtual Status Run(const std::function<Status(Communicator&)>& per_rank) = 0;
};

struct LaunchOptions {
  // What `--comm` takes: "local", "mpi", or "" / "auto" (mpi when the environment says mpirun
  // started this process, else local).
  std::string comm = "auto";
  // The ranks the job needs, or 0: as many as the launcher has (mpi: the processes started;
  // local: a job of 0 ranks fails in Run).
  int world = 0;
  // What needs `world` ranks, named when mpirun started another number: "TP2 EP2".
  std::string job = "";
  // The command to start under mpirun, named when mpi is asked for outside it.
  std::string command = "moeshard run ...";
  // The launch environment (a literal map in tests).
  LaunchEnv env = ProcessLaunchEnv();
  LocalCommOptions local = {};
  MpiCommOptions mpi = {};
};

// The launcher `comm` names in `env`, without starting it. Errors name the value and the
// expected ones: "'--comm x': expected local or mpi"; "'--comm mpi': expected to run under
// mpirun (mpirun -np 4 moeshard run ...)" (world and command from `options`).
Result<std::string> ResolveLauncher(const LaunchOptions& options);

// Resolves and starts the launcher (mpi: initialises MPI and checks that mpirun started
// options.world processes when it is not 0: "'mpirun -np': expected 4 processes for TP2 EP2,
// got 2").
Result<std::unique_ptr<Launcher>> CreateLauncher(const LaunchOptions& options);

}  // namespace moeshard
