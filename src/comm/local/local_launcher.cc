// The local launcher: the job's ranks as threads of this process (RunLocalRanks), each rank's
// kernel threads on CPUs of their own, taken node by node.
#include "comm/launcher_registry.h"
#include "moeshard/base/numa.h"
#include "moeshard/base/thread_pool.h"

namespace moeshard::comm_internal {
namespace {

class LocalLauncher final : public Launcher {
 public:
  LocalLauncher(int world, const LocalCommOptions& options) : world_(world), options_(options) {}

  const char* name() const override { return "local"; }
  int world() const override { return world_; }
  int ranks_per_node() const override { return world_; }
  bool in_process() const override { return true; }

  std::vector<std::vector<int>> RankCpus(int threads_per_rank,
                                         std::vector<int>* node_of) const override {
    return SplitCpusByNode(AllowedCpus(), NumaNodes(), world_, threads_per_rank, node_of);
  }

  Status Run(const std::function<Status(Communicator&)>& per_rank) override {
    return RunLocalRanks(world_, options_, per_rank);
  }

 private:
  const int world_;
  const LocalCommOptions options_;
};

}  // namespace

LauncherEntry LocalLauncherEntry() {
  return {
      .name = "local",
      .env_vars = {},
      .auto_claims = [](const LaunchEnv&) { return true; },
      .auto_fallback = true,
      .check_env = [](const LaunchOptions&) { return Status::Ok(); },
      .create = [](const LaunchOptions& o) -> Result<std::unique_ptr<Launcher>> {
        return std::unique_ptr<Launcher>(std::make_unique<LocalLauncher>(o.world, o.local));
      },
  };
}

}  // namespace moeshard::comm_internal
