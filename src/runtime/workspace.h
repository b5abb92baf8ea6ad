// Workspace: every buffer of the sharded MoE forward on one rank, sized once at Create from the
// LayerShape, the topology and max_tokens, and reused for every layer and call (Forward
// allocates nothing). Private to the runtime.
//
// Sizes (H, L, Lp, E, k, S_local: LayerShape):
//   T_max  max_tokens: tokens of the unit          C_max  ceil(T_max / tp): one rank's chunk
//   U_max  moe_tp * C_max: the chunks of one moe_ep rank's moe_tp peers (the "union")
//   R_max  rows one EP rank may receive: moe_ep * U_max * min(k, most expert slots of a rank)
//
// The activation buffers are the kernel backend's memory (KernelBackend::Allocate); the per-call
// counts of the collectives are host vectors.
//
// Thread safety: owned by one runtime; one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "moeshard/base/numeric.h"
#include "moeshard/base/status.h"
#include "moeshard/kernels/kernel_backend.h"
#include "moeshard/plan/topology.h"
#include "runtime/layer_shape.h"

namespace moeshard::internal {

struct WorkspaceSizes {
  int64_t max_tokens = 0;    // T_max
  int64_t max_chunk = 0;     // C_max
  int64_t max_union = 0;     // U_max
  int64_t max_received = 0;  // R_max (0 without expert parallelism)
};

// `max_expert_slots`: the most expert slots any rank of the plan holds.
WorkspaceSizes SizeWorkspace(const LayerShape& shape, const ResolvedTopology& topo,
                             int64_t max_tokens, int64_t max_expert_slots);

// `n` elements of T in one KernelBuffer (zero-filled), indexed like the vector it replaces.
template <typename T>
class BackendArray {
 public:
  BackendArray() = default;
  Status Allocate(KernelBackend& backend, int64_t n) {
    MOESHARD_ASSIGN_OR_RETURN(buffer_, backend.Allocate(n * static_cast<int64_t>(sizeof(T))));
    size_ = n;
    return Status::Ok();
  }
  T* data() const { return static_cast<T*>(buffer_.data()); }
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t Bytes() const { return size_ * static_cast<int64_t>(sizeof(T)); }
  T& operator[](int64_t i) const { return data()[i]; }

 private:
  KernelBuffer buffer_;
  int64_t size_ = 0;
};

struct Workspace {
  // Allocates every buffer for `sizes` from `backend`; the buffers a layout does not use stay
  // empty.
  static Result<Workspace> Create(KernelBackend& backend, const LayerShape& shape,
                                  const ResolvedTopology& topo, const WorkspaceSizes& sizes);

  // Bytes of every buffer.
  int64_t Bytes() const;

  WorkspaceSizes sizes;

  // Per-call counts of the collectives, filled by Forward from every rank's T.
  std::vector<int64_t> all_tokens;         // [world] T of each world rank's unit
  std::vector<size_t> mt_rows, mt_floats;  // [moe_tp] chunk rows / Lp floats of each moe_tp peer
  std::vector<size_t> tp_rows, tp_floats;  // [tp] chunk rows / H floats of each attention-TP peer

  BackendArray<float> stream;                        // [T_max, H] fp32: the residual stream
  BackendArray<float> xn;                            // [T_max, H] fp32: its pre-MoE norm
  BackendArray<float> logits;                        // [C_max, E] fp32: router logits
  BackendArray<int32_t> chunk_ids, union_ids;        // [C_max, k], [U_max, k] global experts
  BackendArray<float> chunk_w, union_w;              // [C_max, k], [U_max, k] routing weights
  BackendArray<float> lat;                           // [C_max, L] fp32 (latent MoE)
  BackendArray<bf16_t> chunk_rows, union_rows;       // [C_max, Lp], [U_max, Lp] expert inputs
  BackendArray<float> union_out, chunk_out;          // [U_max, Lp], [C_max, Lp] expert outputs
  BackendArray<float> ones;                          // [R_max] unit weights of received rows
  BackendArray<float> chunk_y;                       // [C_max, H] the chunk's new hidden states
  BackendArray<float> gate_buf, up_buf;              // [T_max or C_max, S_local] shared MLP
  BackendArray<float> shared_partial, shared_chunk;  // [T_max, H], [C_max, H] shared output
  BackendArray<float> shared_gate_logit;             // [C_max] shared-expert gate logits
};

}  // namespace moeshard::internal
