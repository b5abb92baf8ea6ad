// The local backend's Communicator: see moeshard/comm/local_comm.h for the data-movement
// scheme. Every collective is
//   1. check this rank's own arguments (an error here aborts the job at once);
//   2. publish a CallHeader and pointers in this rank's slot; publish barrier (abortable);
//   3. every rank compares all headers and cross-rank counts — identical inputs, identical
//      verdict on every rank — then, if they agree, copies straight from/to peers' buffers;
//   4. completion barrier (not abortable: every rank got past 2 and only copies in between), so
//      no peer touches this rank's buffers after it returns.
#include "moeshard/comm/local_comm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <numeric>
#include <system_error>
#include <thread>
#include <utility>

#include "comm/collective_util.h"
#include "comm/local/local_group.h"

namespace moeshard {
namespace {

using comm_internal::CallHeader;
using comm_internal::CollectiveOp;
using comm_internal::CollectiveOpName;
using comm_internal::LocalClock;
using comm_internal::LocalGroup;
using comm_internal::LocalJob;
using comm_internal::LocalSlot;

const std::byte* Bytes(const void* p) { return static_cast<const std::byte*>(p); }
std::byte* Bytes(void* p) { return static_cast<std::byte*>(p); }

class LocalComm final : public Communicator {
 public:
  LocalComm(std::shared_ptr<LocalGroup> group, int rank)
      : Communicator(rank, group->size(), group->name()),
        group_(std::move(group)),
        job_(&group_->job()),
        world_rank_(group_->world_rank(rank)) {}

  // The Communicator API: each call runs its *Impl under Guard, so that no exception (in
  // practice std::bad_alloc) escapes and any failure aborts the job.
  Status Barrier() override {
    return Guard(CollectiveOp::kBarrier, [&] { return BarrierImpl(); });
  }
  Status Broadcast(void* data, size_t num_bytes, int root) override {
    return Guard(CollectiveOp::kBroadcast, [&] { return BroadcastImpl(data, num_bytes, root); });
  }
  Status AllGatherV(const void* send, size_t send_count, void* recv,
                    std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                    size_t elem_bytes) override {
    return Guard(CollectiveOp::kAllGatherV, [&] {
      return AllGatherVImpl(send, send_count, recv, recv_counts, recv_displs, elem_bytes);
    });
  }
  Status AllToAllV(const AllToAllVArgs& args) override {
    return Guard(CollectiveOp::kAllToAllV, [&] { return AllToAllVImpl(args); });
  }
  Result<std::unique_ptr<Communicator>> Split(int color, int key) override {
    std::unique_ptr<Communicator> out;
    MOESHARD_RETURN_IF_ERROR(
        Guard(CollectiveOp::kSplit, [&] { return SplitImpl(color, key, &out); }));
    return out;
  }

 protected:
  Status DoAllReduceSum(ReduceDtype dtype, const void* send, void* recv, size_t count) override {
    return Guard(CollectiveOp::kAllReduceSum,
                 [&] { return AllReduceImpl(dtype, send, recv, count); });
  }
  Status DoReduceScatterSum(ReduceDtype dtype, const void* send, void* recv,
                            std::span<const size_t> recv_counts) override {
    return Guard(CollectiveOp::kReduceScatterSum,
                 [&] { return ReduceScatterImpl(dtype, send, recv, recv_counts); });
  }

 private:
  Status BarrierImpl() {
    CallHeader h;
    h.op = CollectiveOp::kBarrier;
    return Run(h, [] { return Status::Ok(); });
  }

  Status BroadcastImpl(void* data, size_t num_bytes, int root) {
    CallHeader h;
    h.op = CollectiveOp::kBroadcast;
    h.count = num_bytes;
    h.root = root;
    if (root < 0 || root >= size()) {
      return Fail(h, InvalidArgumentError(
                         fmt::format("root: expected a rank in [0, {}), got {}", size(), root)));
    }
    if (data == nullptr && num_bytes > 0) {
      return Fail(h, InvalidArgumentError(fmt::format("data is null for {} bytes", num_bytes)));
    }
    LocalSlot& mine = group_->slot(rank());
    mine.recv = data;
    return Run(h, [&] {
      if (rank() != root && num_bytes > 0) {
        std::memcpy(data, group_->slot(root).recv, num_bytes);
      }
      return Status::Ok();
    });
  }

  Status AllGatherVImpl(const void* send, size_t send_count, void* recv,
                        std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                        size_t elem_bytes) {
    CallHeader h;
    h.op = CollectiveOp::kAllGatherV;
    h.count = send_count;
    h.elem_bytes = elem_bytes;
    size_t extent = 0;
    MOESHARD_RETURN_IF_ERROR(CheckElemBytes(h));
    Status st = comm_internal::CheckBlocks("recv_counts", recv_counts, recv_displs, size(),
                                           /*check_overlap=*/true, &recv_displs_, &extent);
    if (!st.ok()) return Fail(h, st);
    if (recv_counts[static_cast<size_t>(rank())] != send_count) {
      return Fail(h, InvalidArgumentError(fmt::format(
                         "recv_counts[{}] (this rank's own block) is {}, but send_count is {}",
                         rank(), recv_counts[static_cast<size_t>(rank())], send_count)));
    }
    MOESHARD_RETURN_IF_ERROR(CheckBuffers(h, send, send_count * elem_bytes, recv,
                                          extent * elem_bytes, /*in_place_ok=*/false));
    LocalSlot& mine = group_->slot(rank());
    mine.send = send;
    mine.recv_counts = recv_counts;
    return Run(h, [&]() -> Status {
      // Every rank checks the whole matrix, so every rank reaches the same verdict.
      for (int q = 0; q < size(); ++q) {
        for (int p = 0; p < size(); ++p) {
          const size_t expected = group_->slot(q).recv_counts[static_cast<size_t>(p)];
          const size_t sent = group_->slot(p).header.count;
          if (expected != sent) {
            return InvalidArgumentError(fmt::format(
                "rank {} expects recv_counts[{}] = {} elements from rank {}, but rank {} sends "
                "send_count = {}",
                q, p, expected, p, p, sent));
          }
        }
      }
      for (int i = 0; i < size(); ++i) {
        const int p = (rank() + i) % size();
        const size_t bytes = recv_counts[static_cast<size_t>(p)] * elem_bytes;
        if (bytes == 0) continue;
        std::memcpy(Bytes(recv) + recv_displs_[static_cast<size_t>(p)] * elem_bytes,
                    group_->slot(p).send, bytes);
      }
      return Status::Ok();
    });
  }

  Status AllToAllVImpl(const AllToAllVArgs& args) {
    CallHeader h;
    h.op = CollectiveOp::kAllToAllV;
    h.elem_bytes = args.elem_bytes;
    MOESHARD_RETURN_IF_ERROR(CheckElemBytes(h));
    size_t send_extent = 0;
    size_t recv_extent = 0;
    Status st =
        comm_internal::CheckBlocks("send_counts", args.send_counts, args.send_displs, size(),
                                   /*check_overlap=*/false, &send_displs_, &send_extent);
    if (st.ok()) {
      st = comm_internal::CheckBlocks("recv_counts", args.recv_counts, args.recv_displs, size(),
                                      /*check_overlap=*/true, &recv_displs_, &recv_extent);
    }
    if (!st.ok()) return Fail(h, st);
    const size_t eb = args.elem_bytes;
    MOESHARD_RETURN_IF_ERROR(CheckBuffers(h, args.send, send_extent * eb, args.recv,
                                          recv_extent * eb, /*in_place_ok=*/false));
    LocalSlot& mine = group_->slot(rank());
    mine.send = args.send;
    mine.send_counts = args.send_counts;
    mine.send_displs = send_displs_;
    mine.recv_counts = args.recv_counts;
    return Run(h, [&]() -> Status {
      for (int p = 0; p < size(); ++p) {
        for (int q = 0; q < size(); ++q) {
          const size_t sent = group_->slot(p).send_counts[static_cast<size_t>(q)];
          const size_t expected = group_->slot(q).recv_counts[static_cast<size_t>(p)];
          if (sent != expected) {
            return InvalidArgumentError(fmt::format(
                "rank {} sends send_counts[{}] = {} elements to rank {}, but rank {} expects "
                "recv_counts[{}] = {} (exchange the counts with AllToAll first)",
                p, q, sent, q, q, p, expected));
          }
        }
      }
      const size_t me = static_cast<size_t>(rank());
      for (int i = 0; i < size(); ++i) {
        const int p = (rank() + i) % size();
        const size_t up = static_cast<size_t>(p);
        const size_t bytes = args.recv_counts[up] * eb;
        if (bytes == 0) continue;
        const LocalSlot& peer = group_->slot(p);
        std::memcpy(Bytes(args.recv) + recv_displs_[up] * eb,
                    Bytes(peer.send) + peer.send_displs[me] * eb, bytes);
      }
      return Status::Ok();
    });
  }

  Status SplitImpl(int color, int key, std::unique_ptr<Communicator>* out) {
    CallHeader h;
    h.op = CollectiveOp::kSplit;
    if (color < kSplitNoColor) {
      return Fail(
          h, InvalidArgumentError(fmt::format("color: expected >= 0 or kSplitNoColor ({}), got {}",
                                              kSplitNoColor, color)));
    }
    LocalSlot& mine = group_->slot(rank());
    mine.color = color;
    mine.key = key;
    return Run(h, [&]() -> Status {
      if (color == kSplitNoColor) return Status::Ok();
      std::vector<std::pair<int, int>> members;  // (key, parent rank)
      for (int p = 0; p < size(); ++p) {
        if (group_->slot(p).color == color) members.emplace_back(group_->slot(p).key, p);
      }
      std::sort(members.begin(), members.end());
      std::vector<int> world_ranks;
      int new_rank = -1;
      for (const auto& [k, p] : members) {
        if (p == rank()) new_rank = static_cast<int>(world_ranks.size());
        world_ranks.push_back(group_->world_rank(p));
      }
      auto group = group_->GetOrCreateSplit(
          seq_, color, fmt::format("{}/split#{}(color={})", name(), seq_, color), world_ranks);
      *out = std::make_unique<LocalComm>(std::move(group), new_rank);
      return Status::Ok();
    });
  }

  Status AllReduceImpl(ReduceDtype dtype, const void* send, void* recv, size_t count) {
    CallHeader h;
    h.op = CollectiveOp::kAllReduceSum;
    h.dtype = static_cast<uint32_t>(dtype);
    h.count = count;
    const size_t esize = ReduceDtypeBytes(dtype);
    MOESHARD_RETURN_IF_ERROR(
        CheckBuffers(h, send, count * esize, recv, count * esize, /*in_place_ok=*/true));
    LocalSlot& mine = group_->slot(rank());
    mine.send = send;
    mine.recv = recv;
    return Run(h, [&] {
      // This rank reduces chunk rank() of everyone's input, in rank order, and writes the
      // result into everyone's output. Only this rank touches chunk rank() of any buffer, so
      // in-place calls are safe tile by tile.
      const int n = size();
      const size_t begin = comm_internal::ChunkBegin(count, n, rank());
      const size_t end = comm_internal::ChunkBegin(count, n, rank() + 1);
      std::vector<const void*>& srcs = srcs_;
      srcs.resize(static_cast<size_t>(n));
      alignas(64) std::byte tile[kTileElems * 4];
      for (size_t off = begin; off < end; off += kTileElems) {
        const size_t m = std::min(kTileElems, end - off);
        for (int p = 0; p < n; ++p) {
          srcs[static_cast<size_t>(p)] = Bytes(group_->slot(p).send) + off * esize;
        }
        comm_internal::ReduceSumInRankOrder(dtype, srcs.data(), n, m, tile);
        for (int p = 0; p < n; ++p) {
          std::memcpy(Bytes(group_->slot(p).recv) + off * esize, tile, m * esize);
        }
      }
      return Status::Ok();
    });
  }

  Status ReduceScatterImpl(ReduceDtype dtype, const void* send, void* recv,
                           std::span<const size_t> recv_counts) {
    CallHeader h;
    h.op = CollectiveOp::kReduceScatterSum;
    h.dtype = static_cast<uint32_t>(dtype);
    h.counts_hash = comm_internal::HashCounts(recv_counts);
    size_t total = 0;
    Status st = comm_internal::CheckBlocks("recv_counts", recv_counts, {}, size(),
                                           /*check_overlap=*/false, &recv_displs_, &total);
    if (!st.ok()) return Fail(h, st);
    const size_t esize = ReduceDtypeBytes(dtype);
    const size_t me = static_cast<size_t>(rank());
    MOESHARD_RETURN_IF_ERROR(
        CheckBuffers(h, send, total * esize, recv, recv_counts[me] * esize, /*in_place_ok=*/false));
    LocalSlot& mine = group_->slot(rank());
    mine.send = send;
    return Run(h, [&] {
      std::vector<const void*>& srcs = srcs_;
      srcs.resize(static_cast<size_t>(size()));
      for (int p = 0; p < size(); ++p) {
        srcs[static_cast<size_t>(p)] = Bytes(group_->slot(p).send) + recv_displs_[me] * esize;
      }
      comm_internal::ReduceSumInRankOrder(dtype, srcs.data(), size(), recv_counts[me], recv);
      return Status::Ok();
    });
  }

  // Elements per all-reduce tile: 4 KiB of fp32, so the reduced tile is still in L1 when it is
  // copied to the n outputs.
  static constexpr size_t kTileElems = 1024;

  template <typename Body>
  Status Guard(CollectiveOp op, Body&& body) {
    try {
      return body();
    } catch (const std::exception& e) {
      CallHeader h;
      h.op = op;
      return Fail(h, ResourceExhaustedError(fmt::format("exception: {}", e.what())));
    }
  }

  // Runs the collective described by `h` (this rank's slot pointers already set); `work` runs
  // between the barriers after the headers matched.
  template <typename Work>
  Status Run(CallHeader h, Work&& work) {
    if (job_->aborted()) return job_->PeerAbortStatus();
    h.seq = ++seq_;
    LocalSlot& mine = group_->slot(rank());
    mine.header = h;
    job_->SetActivity(world_rank_, CollectiveOpName(h.op), &name());
    const LocalClock::time_point deadline = LocalClock::now() + job_->options().timeout;
    Status st = group_->Arrive(rank(), /*abortable=*/true, deadline, h.seq);
    if (!st.ok()) {
      job_->SetActivity(world_rank_, nullptr, nullptr);
      return st.code() == StatusCode::kAborted ? st : Fail(h, st);
    }
    Status result = Status::Ok();
    for (int p = 0; p < size() && result.ok(); ++p) {
      result = comm_internal::CheckSameCall(group_->slot(0).header, 0, group_->slot(p).header, p);
    }
    if (result.ok()) {
      // Whatever happens, this rank must reach the completion barrier: peers may be copying
      // from its buffers, and they wait for it there without a timeout.
      try {
        result = work();
      } catch (const std::exception& e) {
        result = ResourceExhaustedError(fmt::format("exception: {}", e.what()));
      }
    }
    (void)group_->Arrive(rank(), /*abortable=*/false, deadline, h.seq);
    job_->SetActivity(world_rank_, nullptr, nullptr);
    if (!result.ok()) return Fail(h, result);
    return Status::Ok();
  }

  // Prefixes `s` with this rank and the call, records it as the job's failure (a no-op when
  // another rank failed first) and returns it.
  Status Fail(const CallHeader& h, const Status& s) {
    Status prefixed(
        s.code(),
        fmt::format("{}{} on '{}': {}", comm_internal::RankPrefix(world_rank_, job_->world_size()),
                    CollectiveOpName(h.op), name(), s.message()));
    job_->Abort(world_rank_, prefixed);
    return prefixed;
  }

  Status CheckElemBytes(const CallHeader& h) {
    if (h.elem_bytes == 0) return Fail(h, InvalidArgumentError("elem_bytes: expected >= 1, got 0"));
    return Status::Ok();
  }

  Status CheckBuffers(const CallHeader& h, const void* send, size_t send_bytes, const void* recv,
                      size_t recv_bytes, bool in_place_ok) {
    if (send == nullptr && send_bytes > 0) {
      return Fail(h, InvalidArgumentError(fmt::format("send is null for {} bytes", send_bytes)));
    }
    if (recv == nullptr && recv_bytes > 0) {
      return Fail(h, InvalidArgumentError(fmt::format("recv is null for {} bytes", recv_bytes)));
    }
    if (in_place_ok && send == recv) return Status::Ok();
    if (comm_internal::Overlaps(send, send_bytes, recv, recv_bytes)) {
      return Fail(h, InvalidArgumentError(fmt::format(
                         "send [{} bytes] and recv [{} bytes] overlap{}", send_bytes, recv_bytes,
                         in_place_ok ? " (only exactly in place, send == recv, is allowed)" : "")));
    }
    return Status::Ok();
  }

  const std::shared_ptr<LocalGroup> group_;
  LocalJob* const job_;
  const int world_rank_;
  uint64_t seq_ = 0;
  // Resolved displacements of the current call; peers read send_displs_ through the slot.
  std::vector<size_t> send_displs_;
  std::vector<size_t> recv_displs_;
  std::vector<const void*> srcs_;  // [size()] reduction inputs
};

}  // namespace

Status RunLocalRanks(int num_ranks, const LocalCommOptions& options,
                     const std::function<Status(Communicator&)>& per_rank,
                     std::vector<Status>* rank_statuses) {
  if (num_ranks < 1) {
    return InvalidArgumentError(
        fmt::format("RunLocalRanks: num_ranks: expected >= 1, got {}", num_ranks));
  }
  std::shared_ptr<LocalJob> job;
  std::shared_ptr<LocalGroup> world;
  std::vector<Status> statuses;
  std::vector<std::thread> threads;
  try {
    job = std::make_shared<LocalJob>(num_ranks, options);
    std::vector<int> world_ranks(static_cast<size_t>(num_ranks));
    std::iota(world_ranks.begin(), world_ranks.end(), 0);
    world = job->NewGroup("world", world_ranks);
    statuses.resize(static_cast<size_t>(num_ranks));
    threads.reserve(static_cast<size_t>(num_ranks - 1));
  } catch (const std::exception& e) {
    return ResourceExhaustedError(fmt::format("RunLocalRanks: {} ranks: {}", num_ranks, e.what()));
  }

  auto run_rank = [&](int r) {
    Status s;
    try {
      LocalComm comm(world, r);
      s = per_rank(comm);
    } catch (const std::exception& e) {
      s = InternalError(fmt::format("uncaught exception in the rank function: {}", e.what()));
    } catch (...) {
      s = InternalError("uncaught exception of unknown type in the rank function");
    }
    if (!s.ok()) {
      // A no-op when this failure came from a collective (already recorded) or another rank
      // failed first.
      job->Abort(r, Status(s.code(), comm_internal::RankPrefix(r, num_ranks) + s.message()));
    }
    statuses[static_cast<size_t>(r)] = s;
    job->MarkExited(r);
  };

  for (int r = 1; r < num_ranks; ++r) {
    try {
      threads.emplace_back(run_rank, r);
    } catch (const std::system_error& e) {
      // Ranks already started find the job aborted at their next collective.
      job->Abort(r, ResourceExhaustedError(
                        fmt::format("{}RunLocalRanks: cannot start the thread of rank {}: {}",
                                    comm_internal::RankPrefix(r, num_ranks), r, e.what())));
      break;
    }
  }
  run_rank(0);  // the caller's thread is rank 0
  for (auto& t : threads) t.join();

  if (rank_statuses != nullptr) *rank_statuses = std::move(statuses);
  return job->root_cause();
}

}  // namespace moeshard
