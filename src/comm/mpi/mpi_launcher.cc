// The MPI launcher: this process is one rank of a job mpirun / mpiexec / srun started (one
// process per rank), over the MPI communicator. Built with and without MPI: it uses only
// mpi_comm.h, whose entry points say how to get MPI in a build without it.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "comm/launcher_registry.h"
#include "moeshard/base/thread_pool.h"

namespace moeshard {
namespace {

// OpenMPI's mpirun, PMIx launchers (OpenMPI 5, Slurm with PMIx), MPICH/Intel MPI Hydra (PMI):
// any of these says a launcher started this process.
constexpr const char* kLaunchedVars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE",
                                         "PMI_RANK"};
constexpr const char* kLocalSizeVar = "OMPI_COMM_WORLD_LOCAL_SIZE";

// The positive integer `var` holds in `env`, else 0.
int PositiveInt(const LaunchEnv& env, const char* var) {
  const auto it = env.find(var);
  return it == env.end() ? 0 : std::max(0, std::atoi(it->second.c_str()));
}

class MpiLauncher final : public Launcher {
 public:
  MpiLauncher(std::unique_ptr<MpiSession> session, const MpiLaunchInfo& info,
              const MpiCommOptions& options)
      : session_(std::move(session)), info_(info), options_(options) {}

  const char* name() const override { return "mpi"; }
  int world() const override { return session_->world_size(); }
  int ranks_per_node() const override {
    return info_.local_size > 0 ? info_.local_size : session_->world_size();
  }
  bool in_process() const override { return false; }

  std::vector<std::vector<int>> RankCpus(int threads_per_rank, std::vector<int>*) const override {
    // This process's one rank on its own CPUs (mpirun may have bound the process already).
    const std::vector<std::vector<int>> mine = SplitCpus(AllowedCpus(), 1, threads_per_rank);
    if (mine.empty()) return {};
    return std::vector<std::vector<int>>(static_cast<size_t>(world()), mine[0]);
  }

  Status Run(const std::function<Status(Communicator&)>& per_rank) override {
    RunMpiRank(*session_, options_, per_rank);
    return Status::Ok();
  }

 private:
  std::unique_ptr<MpiSession> session_;
  const MpiLaunchInfo info_;
  const MpiCommOptions options_;
};

Result<std::unique_ptr<Launcher>> CreateMpiLauncher(const LaunchOptions& o) {
  MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<MpiSession> session,
                            MpiSession::Init(nullptr, nullptr));
  if (o.world > 0 && session->world_size() != o.world) {
    return InvalidArgumentError(fmt::format("'mpirun -np': expected {} processes for {}, got {}",
                                            o.world, o.job, session->world_size()));
  }
  return std::unique_ptr<Launcher>(
      std::make_unique<MpiLauncher>(std::move(session), ReadMpiLaunchInfo(o.env), o.mpi));
}

}  // namespace

MpiLaunchInfo ReadMpiLaunchInfo(const LaunchEnv& env) {
  MpiLaunchInfo info;
  for (const char* var : kLaunchedVars) info.launched = info.launched || env.count(var) > 0;
  info.world_size = PositiveInt(env, "OMPI_COMM_WORLD_SIZE");
  if (info.world_size == 0) info.world_size = PositiveInt(env, "PMI_SIZE");
  info.local_size = PositiveInt(env, kLocalSizeVar);
  return info;
}

bool LaunchedUnderMpi() { return ReadMpiLaunchInfo(ProcessLaunchEnv()).launched; }

namespace comm_internal {

LauncherEntry MpiLauncherEntry() {
  std::vector<const char*> vars(std::begin(kLaunchedVars), std::end(kLaunchedVars));
  vars.push_back(kLocalSizeVar);
  return {
      .name = "mpi",
      .env_vars = vars,
      .auto_claims = [](const LaunchEnv& env) { return ReadMpiLaunchInfo(env).launched; },
      .auto_fallback = false,
      .check_env = [](const LaunchOptions& o) -> Status {
        if (ReadMpiLaunchInfo(o.env).launched) return Status::Ok();
        return FailedPreconditionError(fmt::format(
            "'--comm mpi': expected to run under mpirun (mpirun -np {} {})", o.world, o.command));
      },
      .create = CreateMpiLauncher,
  };
}

}  // namespace comm_internal
}  // namespace moeshard
