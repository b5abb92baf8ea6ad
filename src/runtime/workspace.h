// Workspace: every buffer of the sharded MoE forward on one rank, sized once at Create from the
// LayerShape, the topology and max_tokens, and reused for every layer and call (Forward
// allocates nothing). Private to the runtime.
//
// Sizes (H, L, Lp, E, k, S_local: LayerShape):
//   T_max  max_tokens: tokens of the unit          C_max  ceil(T_max / tp): one rank's chunk
//   U_max  moe_tp * C_max: the chunks of one moe_ep rank's moe_tp peers (the "union")
//   R_max  rows one EP rank may receive: moe_ep * U_max * min(k, most expert slots of a rank)
//
// Thread safety: owned by one runtime; one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "moeshard/base/numeric.h"
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

struct Workspace {
  // Allocates every buffer for `sizes`; the buffers a layout does not use stay empty.
  Workspace(const LayerShape& shape, const ResolvedTopology& topo, const WorkspaceSizes& sizes);
  Workspace() = default;

  // Bytes of every buffer.
  int64_t Bytes() const;

  WorkspaceSizes sizes;

  // Per-call counts of the collectives, filled by Forward from every rank's T.
  std::vector<int64_t> all_tokens;         // [world] T of each world rank's unit
  std::vector<size_t> mt_rows, mt_floats;  // [moe_tp] chunk rows / Lp floats of each moe_tp peer
  std::vector<size_t> tp_rows, tp_floats;  // [tp] chunk rows / H floats of each attention-TP peer

  std::vector<float> stream;                        // [T_max, H] fp32: the residual stream
  std::vector<float> xn;                            // [T_max, H] fp32: its pre-MoE norm
  std::vector<float> logits;                        // [C_max, E] fp32: router logits
  std::vector<int32_t> chunk_ids, union_ids;        // [C_max, k], [U_max, k] global experts
  std::vector<float> chunk_w, union_w;              // [C_max, k], [U_max, k] routing weights
  std::vector<float> lat;                           // [C_max, L] fp32 (latent MoE)
  std::vector<bf16_t> chunk_rows, union_rows;       // [C_max, Lp], [U_max, Lp] expert inputs
  std::vector<float> union_out, chunk_out;          // [U_max, Lp], [C_max, Lp] expert outputs
  std::vector<float> ones;                          // [R_max] unit weights of received rows
  std::vector<float> chunk_y;                       // [C_max, H] the chunk's new hidden states
  std::vector<float> gate_buf, up_buf;              // [T_max or C_max, S_local] shared MLP
  std::vector<float> shared_partial, shared_chunk;  // [T_max, H], [C_max, H] shared output
  std::vector<float> shared_gate_logit;             // [C_max] shared-expert gate logits
};

}  // namespace moeshard::internal
