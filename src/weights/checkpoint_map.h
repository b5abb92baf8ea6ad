// The mapping from a rank's tensors to checkpoint tensors (private to the weights layer).
//
// Each rank buffer (one plan TensorShard at one layer) is the union of Pieces: 2-D byte windows
// of checkpoint tensors copied into the buffer. The window is a Slice2D of the source tensor
// (offsets from the unpadded sizes); the destination is `dst_offset` plus `dst_row_stride` per
// window row, so padded rows and columns between windows stay untouched (zero):
//
//   source tensor bytes                         destination buffer (padded)
//   +---------------------------+               +-----------------------+----+
//   |    +-------------+        |  row r  ->    | window row r           | 0  |  dst_offset +
//   |    |   window    |        |               |                        | 0  |  r * stride
//   |    +-------------+        |               +------------------------+----+
//   +---------------------------+               |  zero padding rows          |
//
// A transposed piece (gpt-oss bf16 experts, stored [in, out]) writes window element (r, c) to
// destination element (c, r): dst_offset + c * dst_row_stride + r * element_bytes.
//
// The dummy source generates the same windows from a hash of (seed, source name, flat storage
// index), which is why dummy weights are layout-invariant by construction.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/plan/shard_plan.h"
#include "moeshard/weights/loader.h"
#include "moeshard/weights/safetensors.h"

namespace moeshard::internal {

struct Piece {
  int source_idx = 0;  // into the MappedTensor's sources
  Slice2D window;      // bytes of the source tensor; window.dst_row_stride set
  int64_t dst_offset = 0;
  bool transpose = false;
  int64_t element_bytes = 1;  // for transposed pieces

  int64_t rows() const { return window.row_end - window.row_begin; }
  int64_t cols() const { return window.col_end - window.col_begin; }
  int64_t bytes() const { return rows() * cols(); }
};

// One rank buffer and where its bytes come from.
struct MappedTensor {
  std::string name;  // concrete rank tensor name
  const TensorShard* shard = nullptr;
  int64_t layer = -1;
  std::vector<SourceTensorSpec> sources;  // distinct checkpoint tensors read
  std::vector<Piece> pieces;
  int64_t buffer_bytes = 0;  // padded
  int64_t data_bytes = 0;    // unpadded (what the pieces must cover exactly)
};

// "{layer}" replaced by `layer` (no-op when layer < 0).
std::string ConcreteName(const std::string& name, int64_t layer);

// Maps one plan tensor at one layer of `rank`. Errors are kInternal or kUnimplemented (a plan
// the loader cannot fill is a bug or a missing feature, not a user error).
Result<MappedTensor> MapRankTensor(const ShardPlan& plan, int64_t rank, const TensorShard& shard,
                                   int64_t layer);

}  // namespace moeshard::internal
