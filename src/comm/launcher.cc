// The launcher factory and the launch environment: see moeshard/comm/launcher.h and
// launch_env.h. The only code that reads launchers' environment variables.
#include "moeshard/comm/launcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "comm/launcher_registry.h"

namespace moeshard {
namespace comm_internal {

const std::vector<LauncherEntry>& Launchers() {
  // In the order messages list them. A new launcher: one line here.
  static const std::vector<LauncherEntry> kLaunchers = {
      LocalLauncherEntry(),
      MpiLauncherEntry(),
  };
  return kLaunchers;
}

}  // namespace comm_internal

namespace {

using comm_internal::LauncherEntry;

// The launcher options.comm names, or the error saying what it takes.
Result<const LauncherEntry*> FindLauncher(const LaunchOptions& options) {
  const std::vector<LauncherEntry>& all = comm_internal::Launchers();
  const LauncherEntry* found = nullptr;
  if (options.comm.empty() || options.comm == "auto") {
    for (const LauncherEntry& l : all) {
      if (!l.auto_claims(options.env)) continue;
      if (!l.auto_fallback) {
        found = &l;
        break;
      }
      if (found == nullptr) found = &l;
    }
  } else {
    for (const LauncherEntry& l : all) {
      if (options.comm == l.name) found = &l;
    }
  }
  if (found == nullptr) {
    std::string names;
    for (size_t i = 0; i < all.size(); ++i) {
      names += fmt::format("{}{}", i == 0 ? "" : i + 1 == all.size() ? " or " : ", ", all[i].name);
    }
    return InvalidArgumentError(fmt::format("'--comm {}': expected {}",
                                            options.comm.empty() ? "auto" : options.comm, names));
  }
  MOESHARD_RETURN_IF_ERROR(found->check_env(options));
  return found;
}

}  // namespace

LaunchEnv ProcessLaunchEnv() {
  LaunchEnv env;
  for (const LauncherEntry& l : comm_internal::Launchers()) {
    for (const char* var : l.env_vars) {
      if (const char* value = std::getenv(var)) env.emplace(var, value);
    }
  }
  return env;
}

int Launcher::DefaultThreadsPerRank() const {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, ranks_per_node()));
}

Result<std::string> ResolveLauncher(const LaunchOptions& options) {
  MOESHARD_ASSIGN_OR_RETURN(const LauncherEntry* l, FindLauncher(options));
  return std::string(l->name);
}

Result<std::unique_ptr<Launcher>> CreateLauncher(const LaunchOptions& options) {
  MOESHARD_ASSIGN_OR_RETURN(const LauncherEntry* l, FindLauncher(options));
  return l->create(options);
}

}  // namespace moeshard
