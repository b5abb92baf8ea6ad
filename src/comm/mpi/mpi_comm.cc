// The MPI backend (see moeshard/comm/mpi_comm.h). The only file of moeshard that includes
// <mpi.h>. Every MPI call goes through MOESHARD_MPI, which turns a failure into a Status naming
// the call, the error code and class, and MPI_Error_string.
#include "moeshard/comm/mpi_comm.h"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <thread>
#include <vector>

#include "comm/collective_util.h"

namespace moeshard {
namespace {

using comm_internal::CallHeader;
using comm_internal::CollectiveOp;
using comm_internal::CollectiveOpName;
using Clock = std::chrono::steady_clock;

std::string MpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "(no description)";
  return std::string(text, static_cast<size_t>(len));
}

Status MpiStatus(const char* call, int code) {
  if (code == MPI_SUCCESS) return Status::Ok();
  int error_class = code;
  if (MPI_Error_class(code, &error_class) != MPI_SUCCESS) error_class = code;
  return InternalError(fmt::format("{} failed: error code {} (class {}): {}", call, code,
                                   error_class, MpiErrorText(code)));
}

#define MOESHARD_MPI(fn, ...) MOESHARD_RETURN_IF_ERROR(MpiStatus(#fn, fn(__VA_ARGS__)))

bool MpiFinalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// MPI counts and displacements are int.
Status ToInt(size_t v, const char* what, int* out) {
  if (v > static_cast<size_t>(INT_MAX)) {
    return OutOfRangeError(fmt::format(
        "{} = {} exceeds MPI's int limit (2^31 - 1 elements): use a larger elem_bytes or split "
        "the call",
        what, v));
  }
  *out = static_cast<int>(v);
  return Status::Ok();
}

Status ToInts(std::span<const size_t> v, const char* what, std::vector<int>* out) {
  out->resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) MOESHARD_RETURN_IF_ERROR(ToInt(v[i], what, &(*out)[i]));
  return Status::Ok();
}

// MPI may reject null buffers even for zero counts; zero-length transfers point here.
std::byte g_empty_buffer[1];
const void* NonNull(const void* p) { return p != nullptr ? p : g_empty_buffer; }
void* NonNull(void* p) { return p != nullptr ? p : g_empty_buffer; }

std::byte* Bytes(void* p) { return static_cast<std::byte*>(p); }

MPI_Datatype ReduceMpiType(ReduceDtype dtype) {
  switch (dtype) {
    case ReduceDtype::kFloat32: return MPI_FLOAT;
    case ReduceDtype::kBfloat16: return MPI_UINT16_T;  // moved as bits, summed by us
  }
  return MPI_DATATYPE_NULL;
}

// Tag of the call headers peers exchange before each collective. Point-to-point messages and
// collectives never match each other, and MPI keeps messages between two ranks in order.
constexpr int kHeaderTag = 0x6d73;

class MpiComm final : public Communicator {
 public:
  MpiComm(MPI_Comm comm, int rank, int size, std::string name, int world_rank, int world_size,
          const MpiCommOptions& options)
      : Communicator(rank, size, std::move(name)),
        comm_(comm),
        world_rank_(world_rank),
        world_size_(world_size),
        options_(options) {}

  ~MpiComm() override {
    if (MpiFinalized()) return;
    for (auto& [bytes, type] : elem_types_) MPI_Type_free(&type);
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  Status Barrier() override {
    CallHeader h;
    h.op = CollectiveOp::kBarrier;
    return Finish(h, [&]() -> Status {
      MOESHARD_RETURN_IF_ERROR(Begin(&h, {}));
      MPI_Request req;
      MOESHARD_MPI(MPI_Ibarrier, comm_, &req);
      return Wait(&req, 1, "MPI_Ibarrier");
    });
  }

  Status Broadcast(void* data, size_t num_bytes, int root) override {
    CallHeader h;
    h.op = CollectiveOp::kBroadcast;
    h.count = num_bytes;
    h.root = root;
    return Finish(h, [&]() -> Status {
      if (root < 0 || root >= size()) {
        return InvalidArgumentError(
            fmt::format("root: expected a rank in [0, {}), got {}", size(), root));
      }
      if (data == nullptr && num_bytes > 0) {
        return InvalidArgumentError(fmt::format("data is null for {} bytes", num_bytes));
      }
      MOESHARD_RETURN_IF_ERROR(Begin(&h, {}));
      // Pieces of 1 GiB keep every count within int.
      constexpr size_t kPiece = size_t{1} << 30;
      for (size_t off = 0; off < num_bytes; off += kPiece) {
        const int len = static_cast<int>(std::min(kPiece, num_bytes - off));
        MPI_Request req;
        MOESHARD_MPI(MPI_Ibcast, Bytes(data) + off, len, MPI_BYTE, root, comm_, &req);
        MOESHARD_RETURN_IF_ERROR(Wait(&req, 1, "MPI_Ibcast"));
      }
      return Status::Ok();
    });
  }

  Status AllGatherV(const void* send, size_t send_count, void* recv,
                    std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                    size_t elem_bytes) override {
    CallHeader h;
    h.op = CollectiveOp::kAllGatherV;
    h.count = send_count;
    h.elem_bytes = elem_bytes;
    return Finish(h, [&]() -> Status {
      MOESHARD_RETURN_IF_ERROR(CheckElemBytes(elem_bytes));
      size_t extent = 0;
      MOESHARD_RETURN_IF_ERROR(comm_internal::CheckBlocks("recv_counts", recv_counts, recv_displs,
                                                          size(), true, &displs_a_, &extent));
      const size_t me = static_cast<size_t>(rank());
      if (recv_counts[me] != send_count) {
        return InvalidArgumentError(
            fmt::format("recv_counts[{}] (this rank's own block) is {}, but send_count is {}",
                        rank(), recv_counts[me], send_count));
      }
      MOESHARD_RETURN_IF_ERROR(
          CheckBuffers(send, send_count * elem_bytes, recv, extent * elem_bytes, false));
      MOESHARD_RETURN_IF_ERROR(Begin(&h, {}));
      if (options_.verify_calls) {
        for (int p = 0; p < size(); ++p) {
          const size_t sent = peer_headers_[static_cast<size_t>(p)].count;
          if (p != rank() && sent != recv_counts[static_cast<size_t>(p)]) {
            return InvalidArgumentError(fmt::format(
                "rank {} expects recv_counts[{}] = {} elements from rank {}, but rank {} sends "
                "send_count = {}",
                rank(), p, recv_counts[static_cast<size_t>(p)], p, p, sent));
          }
        }
      }
      int send_n = 0;
      MOESHARD_RETURN_IF_ERROR(ToInt(send_count, "send_count", &send_n));
      MOESHARD_RETURN_IF_ERROR(ToInts(recv_counts, "recv_counts", &ints_a_));
      MOESHARD_RETURN_IF_ERROR(ToInts(displs_a_, "recv_displs", &ints_b_));
      MPI_Datatype type;
      MOESHARD_RETURN_IF_ERROR(ElemType(elem_bytes, &type));
      MPI_Request req;
      MOESHARD_MPI(MPI_Iallgatherv, NonNull(send), send_n, type, NonNull(recv), ints_a_.data(),
                   ints_b_.data(), type, comm_, &req);
      return Wait(&req, 1, "MPI_Iallgatherv");
    });
  }

  Status AllToAllV(const AllToAllVArgs& args) override {
    CallHeader h;
    h.op = CollectiveOp::kAllToAllV;
    h.elem_bytes = args.elem_bytes;
    return Finish(h, [&]() -> Status {
      MOESHARD_RETURN_IF_ERROR(CheckElemBytes(args.elem_bytes));
      size_t send_extent = 0;
      size_t recv_extent = 0;
      MOESHARD_RETURN_IF_ERROR(comm_internal::CheckBlocks("send_counts", args.send_counts,
                                                          args.send_displs, size(), false,
                                                          &displs_a_, &send_extent));
      MOESHARD_RETURN_IF_ERROR(comm_internal::CheckBlocks("recv_counts", args.recv_counts,
                                                          args.recv_displs, size(), true,
                                                          &displs_b_, &recv_extent));
      const size_t eb = args.elem_bytes;
      MOESHARD_RETURN_IF_ERROR(
          CheckBuffers(args.send, send_extent * eb, args.recv, recv_extent * eb, false));
      MOESHARD_RETURN_IF_ERROR(Begin(&h, args.send_counts));
      if (options_.verify_calls) {
        for (int p = 0; p < size(); ++p) {
          const size_t up = static_cast<size_t>(p);
          const size_t sent = p == rank() ? args.send_counts[up] : peer_headers_[up].peer_count;
          if (sent != args.recv_counts[up]) {
            return InvalidArgumentError(fmt::format(
                "rank {} sends send_counts[{}] = {} elements to rank {}, but rank {} expects "
                "recv_counts[{}] = {} (exchange the counts with AllToAll first)",
                p, rank(), sent, rank(), rank(), p, args.recv_counts[up]));
          }
        }
      }
      std::vector<int> send_counts, recv_counts;
      MOESHARD_RETURN_IF_ERROR(ToInts(args.send_counts, "send_counts", &send_counts));
      MOESHARD_RETURN_IF_ERROR(ToInts(args.recv_counts, "recv_counts", &recv_counts));
      MOESHARD_RETURN_IF_ERROR(ToInts(displs_a_, "send_displs", &ints_a_));
      MOESHARD_RETURN_IF_ERROR(ToInts(displs_b_, "recv_displs", &ints_b_));
      MPI_Datatype type;
      MOESHARD_RETURN_IF_ERROR(ElemType(eb, &type));
      MPI_Request req;
      MOESHARD_MPI(MPI_Ialltoallv, NonNull(args.send), send_counts.data(), ints_a_.data(), type,
                   NonNull(args.recv), recv_counts.data(), ints_b_.data(), type, comm_, &req);
      return Wait(&req, 1, "MPI_Ialltoallv");
    });
  }

  Result<std::unique_ptr<Communicator>> Split(int color, int key) override {
    CallHeader h;
    h.op = CollectiveOp::kSplit;
    std::unique_ptr<Communicator> result;
    MOESHARD_RETURN_IF_ERROR(Finish(h, [&]() -> Status {
      if (color < kSplitNoColor) {
        return InvalidArgumentError(fmt::format(
            "color: expected >= 0 or kSplitNoColor ({}), got {}", kSplitNoColor, color));
      }
      MOESHARD_RETURN_IF_ERROR(Begin(&h, {}));
      MPI_Comm sub = MPI_COMM_NULL;
      MOESHARD_MPI(MPI_Comm_split, comm_, color == kSplitNoColor ? MPI_UNDEFINED : color, key,
                   &sub);
      if (sub == MPI_COMM_NULL) return Status::Ok();
      int sub_rank = 0;
      int sub_size = 0;
      MOESHARD_MPI(MPI_Comm_set_errhandler, sub, MPI_ERRORS_RETURN);
      MOESHARD_MPI(MPI_Comm_rank, sub, &sub_rank);
      MOESHARD_MPI(MPI_Comm_size, sub, &sub_size);
      result = std::make_unique<MpiComm>(sub, sub_rank, sub_size,
                                         fmt::format("{}/split#{}(color={})", name(), h.seq, color),
                                         world_rank_, world_size_, options_);
      return Status::Ok();
    }));
    return result;
  }

 protected:
  // All-reduce as reduce-scatter + all-gather, with the sum done by us in rank order:
  //   1. all-to-all: rank r receives chunk r of every rank's input -> scratch [n, len_r];
  //   2. rank r sums its n pieces in rank order (ReduceSumInRankOrder) into recv chunk r;
  //   3. all-gather of the reduced chunks, in place in recv.
  // The same bits as the local backend, and the bandwidth of a ring all-reduce.
  Status DoAllReduceSum(ReduceDtype dtype, const void* send, void* recv, size_t count) override {
    CallHeader h;
    h.op = CollectiveOp::kAllReduceSum;
    h.dtype = static_cast<uint32_t>(dtype);
    h.count = count;
    return Finish(h, [&]() -> Status {
      const size_t esize = ReduceDtypeBytes(dtype);
      MOESHARD_RETURN_IF_ERROR(CheckBuffers(send, count * esize, recv, count * esize, true));
      int count_int = 0;
      MOESHARD_RETURN_IF_ERROR(ToInt(count, "count", &count_int));
      MOESHARD_RETURN_IF_ERROR(Begin(&h, {}));
      const int n = size();
      const size_t un = static_cast<size_t>(n);
      const size_t begin = comm_internal::ChunkBegin(count, n, rank());
      const size_t len = comm_internal::ChunkBegin(count, n, rank() + 1) - begin;
      std::vector<int> send_counts(un), send_displs(un), recv_counts(un), recv_displs(un);
      for (int p = 0; p < n; ++p) {
        const size_t up = static_cast<size_t>(p);
        const size_t b = comm_internal::ChunkBegin(count, n, p);
        send_displs[up] = static_cast<int>(b);
        send_counts[up] = static_cast<int>(comm_internal::ChunkBegin(count, n, p + 1) - b);
        recv_counts[up] = static_cast<int>(len);
        recv_displs[up] = static_cast<int>(up * len);
      }
      scratch_.resize(std::max<size_t>(1, un * len * esize));
      const MPI_Datatype type = ReduceMpiType(dtype);
      MPI_Request req;
      MOESHARD_MPI(MPI_Ialltoallv, NonNull(send), send_counts.data(), send_displs.data(), type,
                   scratch_.data(), recv_counts.data(), recv_displs.data(), type, comm_, &req);
      MOESHARD_RETURN_IF_ERROR(Wait(&req, 1, "MPI_Ialltoallv"));
      srcs_.resize(un);
      for (size_t p = 0; p < un; ++p) srcs_[p] = scratch_.data() + p * len * esize;
      if (len > 0) {
        comm_internal::ReduceSumInRankOrder(dtype, srcs_.data(), n, len,
                                            Bytes(recv) + begin * esize);
      }
      MOESHARD_MPI(MPI_Iallgatherv, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, NonNull(recv),
                   send_counts.data(), send_displs.data(), type, comm_, &req);
      return Wait(&req, 1, "MPI_Iallgatherv");
    });
  }

  // Reduce-scatter as all-to-all of blocks + a sum in rank order on the block's owner.
  Status DoReduceScatterSum(ReduceDtype dtype, const void* send, void* recv,
                            std::span<const size_t> recv_counts) override {
    CallHeader h;
    h.op = CollectiveOp::kReduceScatterSum;
    h.dtype = static_cast<uint32_t>(dtype);
    h.counts_hash = comm_internal::HashCounts(recv_counts);
    return Finish(h, [&]() -> Status {
      size_t total = 0;
      MOESHARD_RETURN_IF_ERROR(comm_internal::CheckBlocks("recv_counts", recv_counts, {}, size(),
                                                          false, &displs_a_, &total));
      const size_t esize = ReduceDtypeBytes(dtype);
      const size_t me = static_cast<size_t>(rank());
      const size_t len = recv_counts[me];
      MOESHARD_RETURN_IF_ERROR(CheckBuffers(send, total * esize, recv, len * esize, false));
      int unused = 0;
      MOESHARD_RETURN_IF_ERROR(ToInt(total, "sum of recv_counts", &unused));
      MOESHARD_RETURN_IF_ERROR(
          ToInt(len * static_cast<size_t>(size()), "size() * recv_counts[rank]", &unused));
      MOESHARD_RETURN_IF_ERROR(Begin(&h, {}));
      const size_t un = static_cast<size_t>(size());
      std::vector<int> recv_n(un, static_cast<int>(len)), recv_displs(un);
      for (size_t p = 0; p < un; ++p) recv_displs[p] = static_cast<int>(p * len);
      MOESHARD_RETURN_IF_ERROR(ToInts(recv_counts, "recv_counts", &ints_a_));
      MOESHARD_RETURN_IF_ERROR(ToInts(displs_a_, "recv_counts prefix sums", &ints_b_));
      scratch_.resize(std::max<size_t>(1, un * len * esize));
      const MPI_Datatype type = ReduceMpiType(dtype);
      MPI_Request req;
      MOESHARD_MPI(MPI_Ialltoallv, NonNull(send), ints_a_.data(), ints_b_.data(), type,
                   scratch_.data(), recv_n.data(), recv_displs.data(), type, comm_, &req);
      MOESHARD_RETURN_IF_ERROR(Wait(&req, 1, "MPI_Ialltoallv"));
      srcs_.resize(un);
      for (size_t p = 0; p < un; ++p) srcs_[p] = scratch_.data() + p * len * esize;
      comm_internal::ReduceSumInRankOrder(dtype, srcs_.data(), size(), len, recv);
      return Status::Ok();
    });
  }

 private:
  // Runs `body`; on failure prefixes the message with this rank and the call, and marks the
  // communicator broken (a timed-out nonblocking collective cannot be cancelled).
  template <typename Body>
  Status Finish(const CallHeader& h, Body&& body) {
    if (!broken_.ok()) {
      return FailedPreconditionError(
          fmt::format("{}{} on '{}': the communicator is unusable after an earlier failure: {}",
                      comm_internal::RankPrefix(world_rank_, world_size_), CollectiveOpName(h.op),
                      name(), broken_.message()));
    }
    Status s;
    try {
      s = body();
    } catch (const std::exception& e) {  // std::bad_alloc from a scratch buffer
      s = ResourceExhaustedError(fmt::format("exception: {}", e.what()));
    }
    if (s.ok()) return s;
    broken_ = Status(s.code(), fmt::format("{}{} on '{}': {}",
                                           comm_internal::RankPrefix(world_rank_, world_size_),
                                           CollectiveOpName(h.op), name(), s.message()));
    return broken_;
  }

  // Starts a collective: numbers it, sets its deadline, and (verify_calls) exchanges headers
  // with every peer and checks them. peer_counts: [size()] per-peer values sent in
  // header.peer_count (AllToAllV send counts), or empty.
  Status Begin(CallHeader* h, std::span<const size_t> peer_counts) {
    h->seq = ++seq_;
    deadline_ = Clock::now() + options_.timeout;
    if (!options_.verify_calls || size() == 1) return Status::Ok();
    const size_t un = static_cast<size_t>(size());
    out_headers_.assign(un, *h);
    peer_headers_.assign(un, CallHeader{});
    requests_.assign(2 * un, MPI_REQUEST_NULL);
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      const size_t up = static_cast<size_t>(p);
      if (!peer_counts.empty()) out_headers_[up].peer_count = peer_counts[up];
      MOESHARD_MPI(MPI_Irecv, &peer_headers_[up], static_cast<int>(sizeof(CallHeader)), MPI_BYTE, p,
                   kHeaderTag, comm_, &requests_[up]);
      MOESHARD_MPI(MPI_Isend, &out_headers_[up], static_cast<int>(sizeof(CallHeader)), MPI_BYTE, p,
                   kHeaderTag, comm_, &requests_[un + up]);
    }
    MOESHARD_RETURN_IF_ERROR(Wait(requests_.data(), static_cast<int>(requests_.size()),
                                  "the call-header exchange", /*header_recvs=*/true));
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      MOESHARD_RETURN_IF_ERROR(
          comm_internal::CheckSameCall(*h, rank(), peer_headers_[static_cast<size_t>(p)], p));
    }
    return Status::Ok();
  }

  // Completes `reqs` by polling (OpenMPI progresses nonblocking collectives inside MPI calls),
  // spinning briefly, then yielding and sleeping so oversubscribed ranks leave the cores to
  // their peers. DeadlineExceeded at deadline_. header_recvs: reqs[0, size()) are the header
  // receives, whose completion tells which ranks have arrived.
  Status Wait(MPI_Request* reqs, int num_reqs, const char* what, bool header_recvs = false) {
    for (uint64_t iter = 0;; ++iter) {
      int done = 0;
      MOESHARD_MPI(MPI_Testall, num_reqs, reqs, &done, MPI_STATUSES_IGNORE);
      if (done) return Status::Ok();
      if (iter < 64) continue;
      if (Clock::now() >= deadline_) return TimedOut(reqs, what, header_recvs);
      if (iter < 256) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(iter < 2048 ? 5 : 50));
      }
    }
  }

  Status TimedOut(MPI_Request* reqs, const char* what, bool header_recvs) {
    const double secs = std::chrono::duration<double>(options_.timeout).count();
    if (!header_recvs) {
      return DeadlineExceededError(fmt::format(
          "collective #{} timed out after {:g} s in {} (every rank had entered the collective; "
          "a process may have died or be stuck)",
          seq_, secs, what));
    }
    std::vector<int> missing, arrived;
    for (int p = 0; p < size(); ++p) {
      int flag = 1;
      if (p != rank()) MPI_Test(&reqs[p], &flag, MPI_STATUS_IGNORE);
      (flag ? arrived : missing).push_back(p);
    }
    return DeadlineExceededError(fmt::format(
        "collective #{} timed out after {:g} s waiting for ranks to arrive: missing [{}]; "
        "arrived: [{}] (a rank is stuck, or the ranks issue collectives in different orders; "
        "raise MpiCommOptions::timeout if the work between collectives is slow)",
        seq_, secs, comm_internal::JoinRanks(missing), comm_internal::JoinRanks(arrived)));
  }

  Status CheckElemBytes(size_t elem_bytes) {
    if (elem_bytes == 0) return InvalidArgumentError("elem_bytes: expected >= 1, got 0");
    int unused = 0;
    return ToInt(elem_bytes, "elem_bytes", &unused);
  }

  Status CheckBuffers(const void* send, size_t send_bytes, const void* recv, size_t recv_bytes,
                      bool in_place_ok) {
    if (send == nullptr && send_bytes > 0) {
      return InvalidArgumentError(fmt::format("send is null for {} bytes", send_bytes));
    }
    if (recv == nullptr && recv_bytes > 0) {
      return InvalidArgumentError(fmt::format("recv is null for {} bytes", recv_bytes));
    }
    if (in_place_ok && send == recv) return Status::Ok();
    if (comm_internal::Overlaps(send, send_bytes, recv, recv_bytes)) {
      return InvalidArgumentError(
          fmt::format("send [{} bytes] and recv [{} bytes] overlap{}", send_bytes, recv_bytes,
                      in_place_ok ? " (only exactly in place, send == recv, is allowed)" : ""));
    }
    return Status::Ok();
  }

  // A committed contiguous type of `bytes` bytes, cached for the communicator's lifetime.
  Status ElemType(size_t bytes, MPI_Datatype* type) {
    auto it = elem_types_.find(bytes);
    if (it != elem_types_.end()) {
      *type = it->second;
      return Status::Ok();
    }
    MPI_Datatype t;
    MOESHARD_MPI(MPI_Type_contiguous, static_cast<int>(bytes), MPI_BYTE, &t);
    MOESHARD_MPI(MPI_Type_commit, &t);
    elem_types_.emplace(bytes, t);
    *type = t;
    return Status::Ok();
  }

  MPI_Comm comm_;
  const int world_rank_;
  const int world_size_;
  const MpiCommOptions options_;
  uint64_t seq_ = 0;
  Clock::time_point deadline_;
  Status broken_;  // OK until a collective fails
  std::map<size_t, MPI_Datatype> elem_types_;
  // Reused per call, so steady-state collectives do not allocate.
  std::vector<CallHeader> out_headers_, peer_headers_;
  std::vector<MPI_Request> requests_;
  std::vector<size_t> displs_a_, displs_b_;
  std::vector<int> ints_a_, ints_b_;
  std::vector<std::byte> scratch_;
  std::vector<const void*> srcs_;
};

}  // namespace

bool MpiAvailable() { return true; }

Result<std::unique_ptr<MpiSession>> MpiSession::Init(int* argc, char*** argv) {
  int initialized = 0;
  MOESHARD_MPI(MPI_Initialized, &initialized);
  if (initialized) {
    return FailedPreconditionError(
        "MpiSession::Init: MPI is already initialised (create one MpiSession per process)");
  }
  int provided = 0;
  // SERIALIZED: the rank's thread may be any thread, one at a time (the contract of
  // communicator.h).
  MOESHARD_RETURN_IF_ERROR(
      MpiStatus("MPI_Init_thread", MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided)));
  MOESHARD_MPI(MPI_Comm_set_errhandler, MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  int size = 0;
  MOESHARD_MPI(MPI_Comm_rank, MPI_COMM_WORLD, &rank);
  MOESHARD_MPI(MPI_Comm_size, MPI_COMM_WORLD, &size);
  return std::unique_ptr<MpiSession>(new MpiSession(rank, size));
}

MpiSession::~MpiSession() {
  if (!MpiFinalized()) MPI_Finalize();
}

Result<std::unique_ptr<Communicator>> MpiSession::World(const MpiCommOptions& options) {
  MPI_Comm dup = MPI_COMM_NULL;
  MOESHARD_MPI(MPI_Comm_dup, MPI_COMM_WORLD, &dup);
  MOESHARD_MPI(MPI_Comm_set_errhandler, dup, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(std::make_unique<MpiComm>(
      dup, world_rank_, world_size_, "world", world_rank_, world_size_, options));
}

void MpiSession::AbortJob(const Status& status) {
  const std::string prefix = comm_internal::RankPrefix(world_rank_, world_size_);
  std::string message = status.message();
  // Comm errors already carry the prefix; print it once, in front.
  if (message.rfind(prefix, 0) == 0) message = message.substr(prefix.size());
  std::fprintf(stderr, "%s%s: %s\n", prefix.c_str(), StatusCodeName(status.code()),
               message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest if it did
}

void RunMpiRank(MpiSession& session, const MpiCommOptions& options,
                const std::function<Status(Communicator&)>& per_rank) {
  Status s;
  try {
    auto world = session.World(options);
    if (!world.ok()) session.AbortJob(world.status());
    s = per_rank(**world);
  } catch (const std::exception& e) {
    s = InternalError(fmt::format("uncaught exception in the rank function: {}", e.what()));
  } catch (...) {
    s = InternalError("uncaught exception of unknown type in the rank function");
  }
  if (!s.ok()) session.AbortJob(s);
}

}  // namespace moeshard
