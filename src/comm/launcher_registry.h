// The registry of launchers (private to the comm layer): each launcher's name, the environment
// variables it reads, when `auto` picks it, and how it starts. CreateLauncher, ResolveLauncher
// and ProcessLaunchEnv read only this list (launcher.cc). Adding a launcher (NCCL) is one class
// in its backend's folder with its XxxLauncherEntry(), declared below and listed in Launchers()
// (docs/backends.md, "Launchers").
//
// Thread safety: the list is immutable.
#pragma once

#include <memory>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/comm/launcher.h"

namespace moeshard::comm_internal {

struct LauncherEntry {
  const char* name = "";  // what --comm takes, e.g. "mpi"
  // The variables it reads; ProcessLaunchEnv snapshots those of every launcher.
  std::vector<const char*> env_vars = {};
  // When `auto` picks it: the first launcher in Launchers() order that claims `env`; a fallback
  // (local) only when no other one does.
  bool (*auto_claims)(const LaunchEnv& env) = nullptr;
  bool auto_fallback = false;
  // Whether it can run in `env` (mpi: only under mpirun); the error says how to start it.
  Status (*check_env)(const LaunchOptions& options) = nullptr;
  // Starts it. REQUIRES: check_env(options) is OK.
  Result<std::unique_ptr<Launcher>> (*create)(const LaunchOptions& options) = nullptr;
};

// Every launcher, in the order messages list them.
const std::vector<LauncherEntry>& Launchers();

// Each launcher's entry, defined beside its class.
LauncherEntry LocalLauncherEntry();  // local/local_launcher.cc
LauncherEntry MpiLauncherEntry();    // mpi/mpi_launcher.cc

}  // namespace moeshard::comm_internal
