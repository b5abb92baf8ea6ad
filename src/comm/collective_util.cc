#include "comm/collective_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "moeshard/base/numeric.h"

namespace moeshard {

const char* ReduceDtypeName(ReduceDtype dtype) {
  switch (dtype) {
    case ReduceDtype::kFloat32: return "fp32";
    case ReduceDtype::kBfloat16: return "bf16";
  }
  return "?";
}

size_t ReduceDtypeBytes(ReduceDtype dtype) {
  switch (dtype) {
    case ReduceDtype::kFloat32: return 4;
    case ReduceDtype::kBfloat16: return 2;
  }
  return 0;
}

namespace comm_internal {

const char* CollectiveOpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kBarrier: return "Barrier";
    case CollectiveOp::kBroadcast: return "Broadcast";
    case CollectiveOp::kAllReduceSum: return "AllReduceSum";
    case CollectiveOp::kReduceScatterSum: return "ReduceScatterSum";
    case CollectiveOp::kAllGatherV: return "AllGatherV";
    case CollectiveOp::kAllToAllV: return "AllToAllV";
    case CollectiveOp::kSplit: return "Split";
  }
  return "?";
}

std::string DescribeCall(const CallHeader& h) {
  const char* name = CollectiveOpName(h.op);
  const char* dtype = ReduceDtypeName(static_cast<ReduceDtype>(h.dtype));
  switch (h.op) {
    case CollectiveOp::kBarrier:
    case CollectiveOp::kSplit: return fmt::format("{}()", name);
    case CollectiveOp::kBroadcast:
      return fmt::format("{}(num_bytes={}, root={})", name, h.count, h.root);
    case CollectiveOp::kAllReduceSum:
      return fmt::format("{}(count={}, {})", name, h.count, dtype);
    case CollectiveOp::kReduceScatterSum: return fmt::format("{}({})", name, dtype);
    case CollectiveOp::kAllGatherV:
      return fmt::format("{}(send_count={}, elem_bytes={})", name, h.count, h.elem_bytes);
    case CollectiveOp::kAllToAllV: return fmt::format("{}(elem_bytes={})", name, h.elem_bytes);
  }
  return name;
}

Status CheckSameCall(const CallHeader& mine, int my_rank, const CallHeader& theirs,
                     int their_rank) {
  bool same = mine.op == theirs.op && mine.seq == theirs.seq;
  if (same) {
    switch (mine.op) {
      case CollectiveOp::kBarrier:
      case CollectiveOp::kSplit: break;
      case CollectiveOp::kBroadcast:
        same = mine.count == theirs.count && mine.root == theirs.root;
        break;
      case CollectiveOp::kAllReduceSum:
        same = mine.count == theirs.count && mine.dtype == theirs.dtype;
        break;
      case CollectiveOp::kReduceScatterSum:
        same = mine.dtype == theirs.dtype && mine.counts_hash == theirs.counts_hash;
        break;
      case CollectiveOp::kAllGatherV:
      case CollectiveOp::kAllToAllV: same = mine.elem_bytes == theirs.elem_bytes; break;
    }
  }
  if (same) return Status::Ok();
  std::string detail;
  if (mine.op == CollectiveOp::kReduceScatterSum && theirs.op == mine.op &&
      mine.counts_hash != theirs.counts_hash) {
    detail = " (recv_counts differ between the ranks)";
  }
  return InvalidArgumentError(fmt::format(
      "collective mismatch: rank {} called {} as collective #{}, rank {} called {} as "
      "collective #{}{} (all ranks must issue the same collectives, in the same order, with "
      "matching arguments)",
      my_rank, DescribeCall(mine), mine.seq, their_rank, DescribeCall(theirs), theirs.seq,
      detail));
}

uint64_t HashCounts(std::span<const size_t> counts) {
  uint64_t h = 1469598103934665603ull;
  for (size_t c : counts) {
    for (int b = 0; b < 8; ++b) {
      h ^= (static_cast<uint64_t>(c) >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

namespace {

// Elements per tile of the reduction: the fp32 accumulator (4 KiB) plus the n input tiles
// stay in L1 while the n inputs are streamed once each.
constexpr size_t kReduceTile = 1024;

void ReduceF32(const float* const* srcs, int n, size_t len, float* dst) {
  float acc[kReduceTile];
  for (size_t begin = 0; begin < len; begin += kReduceTile) {
    const size_t m = std::min(kReduceTile, len - begin);
    std::memcpy(acc, srcs[0] + begin, m * sizeof(float));
    for (int p = 1; p < n; ++p) {
      const float* src = srcs[p] + begin;
      for (size_t i = 0; i < m; ++i) acc[i] += src[i];
    }
    std::memcpy(dst + begin, acc, m * sizeof(float));
  }
}

void ReduceBf16(const bf16_t* const* srcs, int n, size_t len, bf16_t* dst) {
  float acc[kReduceTile];
  for (size_t begin = 0; begin < len; begin += kReduceTile) {
    const size_t m = std::min(kReduceTile, len - begin);
    const bf16_t* src0 = srcs[0] + begin;
    for (size_t i = 0; i < m; ++i) acc[i] = Bf16ToFloat(src0[i]);
    for (int p = 1; p < n; ++p) {
      const bf16_t* src = srcs[p] + begin;
      for (size_t i = 0; i < m; ++i) acc[i] += Bf16ToFloat(src[i]);
    }
    bf16_t* out = dst + begin;
    for (size_t i = 0; i < m; ++i) out[i] = FloatToBf16(acc[i]);
  }
}

}  // namespace

void ReduceSumInRankOrder(ReduceDtype dtype, const void* const* srcs, int n, size_t len,
                          void* dst) {
  if (len == 0) return;
  switch (dtype) {
    case ReduceDtype::kFloat32:
      ReduceF32(reinterpret_cast<const float* const*>(srcs), n, len, static_cast<float*>(dst));
      return;
    case ReduceDtype::kBfloat16:
      ReduceBf16(reinterpret_cast<const bf16_t* const*>(srcs), n, len,
                 static_cast<bf16_t*>(dst));
      return;
  }
}

void PackedDispls(std::span<const size_t> counts, std::vector<size_t>* displs) {
  displs->resize(counts.size());
  size_t offset = 0;
  for (size_t p = 0; p < counts.size(); ++p) {
    (*displs)[p] = offset;
    offset += counts[p];
  }
}

Status CheckBlocks(const char* what, std::span<const size_t> counts,
                   std::span<const size_t> displs, int n, bool check_overlap,
                   std::vector<size_t>* resolved, size_t* extent) {
  const size_t un = static_cast<size_t>(n);
  if (counts.size() != un) {
    return InvalidArgumentError(fmt::format("{}: expected {} entries (one per rank), got {}",
                                            what, n, counts.size()));
  }
  if (!displs.empty() && displs.size() != un) {
    return InvalidArgumentError(fmt::format(
        "{} displacements: expected {} entries (one per rank) or none (packed), got {}", what, n,
        displs.size()));
  }
  if (displs.empty()) {
    PackedDispls(counts, resolved);
  } else {
    resolved->assign(displs.begin(), displs.end());
  }
  *extent = 0;
  for (size_t p = 0; p < un; ++p) {
    const size_t end = (*resolved)[p] + counts[p];
    if (end < counts[p]) {
      return InvalidArgumentError(
          fmt::format("{}: block of rank {} overflows (displacement {} + count {})", what, p,
                      (*resolved)[p], counts[p]));
    }
    *extent = std::max(*extent, end);
  }
  if (check_overlap && !displs.empty()) {
    std::vector<int> order(un);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return (*resolved)[a] < (*resolved)[b]; });
    size_t prev_end = 0;
    int prev = -1;
    for (int p : order) {
      if (counts[p] == 0) continue;
      if (prev >= 0 && (*resolved)[p] < prev_end) {
        return InvalidArgumentError(fmt::format(
            "{}: blocks of rank {} [{}, {}) and rank {} [{}, {}) overlap", what, prev,
            (*resolved)[prev], prev_end, p, (*resolved)[p], (*resolved)[p] + counts[p]));
      }
      prev = p;
      prev_end = (*resolved)[p] + counts[p];
    }
  }
  return Status::Ok();
}

bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0 || a == nullptr || b == nullptr) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

std::string JoinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

std::string RankPrefix(int world_rank, int world_size) {
  return fmt::format("[rank {}/{}] ", world_rank, world_size);
}

}  // namespace comm_internal

// Non-virtual conveniences of Communicator, expressed through the V-variants.

Status Communicator::ReduceScatterSum(const float* send, float* recv, size_t recv_count) {
  std::vector<size_t> counts(static_cast<size_t>(size()), recv_count);
  return ReduceScatterSumV(send, recv, counts);
}

Status Communicator::ReduceScatterSum(const bf16_t* send, bf16_t* recv, size_t recv_count) {
  std::vector<size_t> counts(static_cast<size_t>(size()), recv_count);
  return ReduceScatterSumV(send, recv, counts);
}

// The equal-block forms move each block as one element of block_bytes bytes, so MPI's int
// counts never limit the block size.
Status Communicator::AllGather(const void* send, void* recv, size_t num_bytes) {
  const size_t count = num_bytes > 0 ? 1 : 0;
  std::vector<size_t> counts(static_cast<size_t>(size()), count);
  return AllGatherV(send, count, recv, counts, {}, std::max<size_t>(num_bytes, 1));
}

Status Communicator::AllToAll(const void* send, void* recv, size_t block_bytes) {
  std::vector<size_t> counts(static_cast<size_t>(size()), block_bytes > 0 ? 1 : 0);
  AllToAllVArgs args;
  args.elem_bytes = std::max<size_t>(block_bytes, 1);
  args.send = send;
  args.send_counts = counts;
  args.recv = recv;
  args.recv_counts = counts;
  return AllToAllV(args);
}

}  // namespace moeshard
