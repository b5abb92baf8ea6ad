// The environment a launcher reads, as one map: the variables mpirun, mpiexec and srun set to
// tell a process which job it belongs to (OMPI_COMM_WORLD_SIZE, PMI_RANK, ...).
//
// moeshard reads them in one place: ProcessLaunchEnv() snapshots, from this process's
// environment, exactly the variables the registered launchers declare (launcher.h); launchers
// and everything that asks about the launch see only that map, so a test passes a literal one
// instead of calling setenv.
//
// Thread safety: ProcessLaunchEnv reads the environment (std::getenv); do not call it while
// another thread changes the environment.
#pragma once

#include <functional>
#include <map>
#include <string>

namespace moeshard {

// Variable name -> value; a variable that is not set is absent.
using LaunchEnv = std::map<std::string, std::string, std::less<>>;

// The variables every registered launcher reads, as this process's environment has them.
LaunchEnv ProcessLaunchEnv();

}  // namespace moeshard
