// LaunchedUnderMpi: whether a launcher started this process as one rank of a job. Needs no MPI
// library, so it works (and says false) in builds without MPI too.
#include <cstdlib>

#include "moeshard/comm/mpi_comm.h"

namespace moeshard {

bool LaunchedUnderMpi() {
  // OpenMPI's mpirun, PMIx launchers (OpenMPI 5, Slurm with PMIx), MPICH/Intel MPI Hydra (PMI).
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

}  // namespace moeshard
