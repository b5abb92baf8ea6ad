#include "comm/collective_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
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
    case CollectiveOp::kAllReduceSum: return fmt::format("{}(count={}, {})", name, h.count, dtype);
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
      my_rank, DescribeCall(mine), mine.seq, their_rank, DescribeCall(theirs), theirs.seq, detail));
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

// fp32 -> bf16, round to nearest even, NaN kept quiet: FloatToBf16 written with a select
// instead of a branch so that the loops below vectorise. Same bits (tested).
inline uint16_t FloatToBf16Bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

inline float Bf16BitsToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

// The loops take their length as a template parameter where they can: GCC's -O2 vectorises
// only loops whose trip count is known (the "very cheap" cost model), so full tiles use
// M = kReduceTile and only the tail runs the generic (M = 0: length m) version.
#define MOESHARD_INLINE inline __attribute__((always_inline))

template <size_t M>
MOESHARD_INLINE void ReduceF32Tile(const float* const* srcs, int n, size_t m,
                                   float* __restrict dst) {
  const size_t len = M != 0 ? M : m;
  float acc[kReduceTile];
  std::memcpy(acc, srcs[0], len * sizeof(float));
  for (int p = 1; p < n; ++p) {
    const float* __restrict src = srcs[p];
    for (size_t i = 0; i < len; ++i) acc[i] += src[i];
  }
  std::memcpy(dst, acc, len * sizeof(float));
}

template <size_t M>
MOESHARD_INLINE void ReduceBf16Tile(const uint16_t* const* srcs, int n, size_t m,
                                    uint16_t* __restrict dst) {
  const size_t len = M != 0 ? M : m;
  float acc[kReduceTile];
  const uint16_t* __restrict src0 = srcs[0];
  for (size_t i = 0; i < len; ++i) acc[i] = Bf16BitsToFloat(src0[i]);
  for (int p = 1; p < n; ++p) {
    const uint16_t* __restrict src = srcs[p];
    for (size_t i = 0; i < len; ++i) acc[i] += Bf16BitsToFloat(src[i]);
  }
  for (size_t i = 0; i < len; ++i) dst[i] = FloatToBf16Bits(acc[i]);
}

// Full tiles, compiled for several instruction sets and picked at load time (GCC function
// multiversioning): wider vectors change nothing in the result, since every element is an
// independent chain of IEEE additions in rank order (no FMA: there is no multiply, and ISO C++
// mode compiles with -ffp-contract=off).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MOESHARD_REDUCE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MOESHARD_REDUCE_CLONES
#endif

MOESHARD_REDUCE_CLONES void ReduceF32FullTile(const float* const* srcs, int n, size_t m,
                                              float* dst) {
  ReduceF32Tile<kReduceTile>(srcs, n, m, dst);
}

MOESHARD_REDUCE_CLONES void ReduceBf16FullTile(const uint16_t* const* srcs, int n, size_t m,
                                               uint16_t* dst) {
  ReduceBf16Tile<kReduceTile>(srcs, n, m, dst);
}

template <typename T, typename Tile, typename TailTile>
void ReduceTiled(const void* const* srcs, int n, size_t len, void* dst, Tile tile, TailTile tail) {
  const T* ptrs[64];
  std::vector<const T*> heap;
  const T** p = ptrs;
  if (n > 64) {
    heap.resize(static_cast<size_t>(n));
    p = heap.data();
  }
  T* out = static_cast<T*>(dst);
  for (size_t begin = 0; begin < len; begin += kReduceTile) {
    for (int r = 0; r < n; ++r) p[r] = static_cast<const T*>(srcs[r]) + begin;
    const size_t m = std::min(kReduceTile, len - begin);
    if (m == kReduceTile) {
      tile(p, n, m, out + begin);
    } else {
      tail(p, n, m, out + begin);
    }
  }
}

}  // namespace

void ReduceSumInRankOrder(ReduceDtype dtype, const void* const* srcs, int n, size_t len,
                          void* dst) {
  if (len == 0) return;
  switch (dtype) {
    case ReduceDtype::kFloat32:
      ReduceTiled<float>(srcs, n, len, dst, ReduceF32FullTile, ReduceF32Tile<0>);
      return;
    case ReduceDtype::kBfloat16:
      static_assert(sizeof(bf16_t) == sizeof(uint16_t));
      ReduceTiled<uint16_t>(srcs, n, len, dst, ReduceBf16FullTile, ReduceBf16Tile<0>);
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

Status CheckBlocks(const char* what, std::span<const size_t> counts, std::span<const size_t> displs,
                   int n, bool check_overlap, std::vector<size_t>* resolved, size_t* extent) {
  const size_t un = static_cast<size_t>(n);
  if (counts.size() != un) {
    return InvalidArgumentError(
        fmt::format("{}: expected {} entries (one per rank), got {}", what, n, counts.size()));
  }
  if (!displs.empty() && displs.size() != un) {
    return InvalidArgumentError(
        fmt::format("{} displacements: expected {} entries (one per rank) or none (packed), got {}",
                    what, n, displs.size()));
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
    // Reused per thread (each rank is one thread): no allocation in the steady state.
    thread_local std::vector<int> order;
    order.resize(un);
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

namespace {
// Per-peer counts for the equal-block forms: on the stack up to 256 ranks, so steady-state
// collectives do not allocate (and nested collectives each have their own).
class EqualCounts {
 public:
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): inline_ is filled up to n, read up to n
  EqualCounts(int num_ranks, size_t count) {
    const size_t n = static_cast<size_t>(num_ranks);
    if (n <= kInline) {
      std::fill(inline_, inline_ + n, count);
      span_ = std::span<const size_t>(inline_, n);
    } else {
      heap_.assign(n, count);
      span_ = heap_;
    }
  }
  EqualCounts(const EqualCounts&) = delete;
  EqualCounts& operator=(const EqualCounts&) = delete;
  std::span<const size_t> span() const { return span_; }

 private:
  static constexpr size_t kInline = 256;
  size_t inline_[kInline];
  std::vector<size_t> heap_;
  std::span<const size_t> span_;
};
}  // namespace

Status Communicator::ReduceScatterSum(const float* send, float* recv, size_t recv_count) {
  const EqualCounts counts(size(), recv_count);
  return ReduceScatterSumV(send, recv, counts.span());
}

Status Communicator::ReduceScatterSum(const bf16_t* send, bf16_t* recv, size_t recv_count) {
  const EqualCounts counts(size(), recv_count);
  return ReduceScatterSumV(send, recv, counts.span());
}

// The equal-block forms move each block as one element of block_bytes bytes, so MPI's int
// counts never limit the block size.
Status Communicator::AllGather(const void* send, void* recv, size_t num_bytes) {
  const size_t count = num_bytes > 0 ? 1 : 0;
  const EqualCounts counts(size(), count);
  return AllGatherV(send, count, recv, counts.span(), {}, std::max<size_t>(num_bytes, 1));
}

Status Communicator::AllToAll(const void* send, void* recv, size_t block_bytes) {
  const EqualCounts equal(size(), block_bytes > 0 ? 1 : 0);
  const std::span<const size_t> counts = equal.span();
  AllToAllVArgs args;
  args.elem_bytes = std::max<size_t>(block_bytes, 1);
  args.send = send;
  args.send_counts = counts;
  args.recv = recv;
  args.recv_counts = counts;
  return AllToAllV(args);
}

}  // namespace moeshard
