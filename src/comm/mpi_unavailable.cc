// The MPI entry points of a build without MPI (MOESHARD_ENABLE_MPI=OFF or MPI not found): they
// exist so that callers need no #ifdefs, and fail with a message that says how to get MPI.
#include <cstdio>
#include <cstdlib>

#include "comm/collective_util.h"
#include "moeshard/comm/mpi_comm.h"

namespace moeshard {
namespace {
constexpr const char* kNoMpi =
    "moeshard was built without MPI (install openmpi-bin and libopenmpi-dev, then reconfigure "
    "with -DMOESHARD_ENABLE_MPI=ON), or use the local communicator";
}  // namespace

bool MpiAvailable() { return false; }

Result<std::unique_ptr<MpiSession>> MpiSession::Init(int*, char***) {
  return UnimplementedError(std::string("MpiSession::Init: ") + kNoMpi);
}

MpiSession::~MpiSession() = default;

Result<std::unique_ptr<Communicator>> MpiSession::World(const MpiCommOptions&) {
  return UnimplementedError(std::string("MpiSession::World: ") + kNoMpi);
}

void MpiSession::AbortJob(const Status& status) {
  std::fprintf(stderr, "%s%s\n", comm_internal::RankPrefix(world_rank_, world_size_).c_str(),
               status.ToString().c_str());
  std::fflush(stderr);
  std::abort();
}

void RunMpiRank(MpiSession& session, const MpiCommOptions&,
                const std::function<Status(Communicator&)>&) {
  session.AbortJob(UnimplementedError(std::string("RunMpiRank: ") + kNoMpi));
}

}  // namespace moeshard
