// Pieces shared by every communicator backend, so that they agree bit for bit: the deterministic
// reduction kernel, the split of a reduction into per-rank chunks, argument validation, and the
// call header ranks exchange to detect mismatched collectives before any data moves.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/comm/communicator.h"

namespace moeshard::comm_internal {

enum class CollectiveOp : uint32_t {
  kBarrier,
  kBroadcast,
  kAllReduceSum,
  kReduceScatterSum,
  kAllGatherV,
  kAllToAllV,
  kSplit,
};
const char* CollectiveOpName(CollectiveOp op);

// What a rank says about the collective it is entering. Ranks compare headers before moving
// data: a mismatch (different op, count, root, element size or dtype) is an error on every rank
// instead of a hang or silent corruption. Fields an op does not use are 0.
struct CallHeader {
  CollectiveOp op = CollectiveOp::kBarrier;
  uint32_t dtype = 0;        // ReduceDtype for reductions
  uint64_t seq = 0;          // index of this collective on its communicator (1-based)
  uint64_t count = 0;        // Broadcast: bytes; AllReduce: elements; AllGatherV: send count
  uint64_t elem_bytes = 0;   // AllGatherV, AllToAllV
  uint64_t counts_hash = 0;  // ReduceScatterSum: hash of recv_counts
  int64_t root = 0;          // Broadcast
  uint64_t peer_count = 0;   // AllToAllV over MPI: elements this rank sends to the receiver
};

// "AllReduceSum(count=100, bf16)"-style description of a header.
std::string DescribeCall(const CallHeader& h);

// OK when `theirs` (from rank their_rank) is the same call as `mine`; otherwise InvalidArgument
// naming both calls ("collective mismatch: ...").
Status CheckSameCall(const CallHeader& mine, int my_rank, const CallHeader& theirs, int their_rank);

// FNV-1a of a count array (for comparing ReduceScatter block layouts across ranks).
uint64_t HashCounts(std::span<const size_t> counts);

// Start of rank r's chunk when `count` elements are split over n ranks as evenly as possible:
// chunk r = [ChunkBegin(count, n, r), ChunkBegin(count, n, r + 1)).
inline size_t ChunkBegin(size_t count, int n, int r) {
  const size_t q = count / static_cast<size_t>(n);
  const size_t rem = count % static_cast<size_t>(n);
  const size_t ur = static_cast<size_t>(r);
  return q * ur + (ur < rem ? ur : rem);
}

// dst[i] = narrow(((widen(srcs[0][i]) + widen(srcs[1][i])) + ...) + widen(srcs[n-1][i])) for
// i in [0, len), in fp32 and in rank order, rounding once (RNE) for bf16. srcs: n pointers to
// [len] elements of `dtype`; dst: [len], may alias srcs[k] only exactly (same pointer).
// Element i's value depends only on the inputs' element i, so any split of [0, len) into
// pieces gives the same bits.
void ReduceSumInRankOrder(ReduceDtype dtype, const void* const* srcs, int n, size_t len, void* dst);

// Fills `displs` ([counts.size()]) with exclusive prefix sums of counts (the packed layout).
void PackedDispls(std::span<const size_t> counts, std::vector<size_t>* displs);

// Validates the per-peer count and displacement arrays of a V-collective: counts has `n`
// entries, displs has n or 0 entries; `what` names the argument in messages ("recv_counts").
// When check_overlap, the blocks [displs[p], displs[p] + counts[p]) must not overlap (receive
// buffers). On success *resolved holds the displacements (packed when displs is empty) and
// *extent the number of elements the buffer spans.
Status CheckBlocks(const char* what, std::span<const size_t> counts, std::span<const size_t> displs,
                   int n, bool check_overlap, std::vector<size_t>* resolved, size_t* extent);

// True when [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes);

// "0, 1, 3" for a list of ranks.
std::string JoinRanks(const std::vector<int>& ranks);

// "[rank r/n] " — the prefix of every message a rank produces.
std::string RankPrefix(int world_rank, int world_size);

}  // namespace moeshard::comm_internal
