#include "runtime/workspace.h"

#include <algorithm>

namespace moeshard::internal {
namespace {

template <typename T>
int64_t VectorBytes(const std::vector<T>& v) {
  return static_cast<int64_t>(v.size() * sizeof(T));
}

}  // namespace

WorkspaceSizes SizeWorkspace(const LayerShape& shape, const ResolvedTopology& topo,
                             int64_t max_tokens, int64_t max_expert_slots) {
  WorkspaceSizes s;
  s.max_tokens = max_tokens;
  s.max_chunk = (max_tokens + topo.tp - 1) / topo.tp;
  s.max_union = topo.moe_tp * s.max_chunk;
  // A sender's token sends at most min(k, slots on the receiver) rows to one EP rank.
  s.max_received =
      topo.moe_ep > 1 ? topo.moe_ep * s.max_union * std::min(shape.top_k, max_expert_slots) : 0;
  return s;
}

Workspace::Workspace(const LayerShape& shape, const ResolvedTopology& topo, const WorkspaceSizes& z)
    : sizes(z) {
  const int64_t H = shape.hidden, L = shape.routed_width, Lp = shape.routed_width_padded;
  const int64_t E = shape.num_experts, k = shape.top_k, S = shape.shared_width_local;
  const int64_t T_max = z.max_tokens, C_max = z.max_chunk, U_max = z.max_union;
  all_tokens.assign(topo.world, 0);
  mt_rows.assign(topo.moe_tp, 0);
  mt_floats.assign(topo.moe_tp, 0);
  tp_rows.assign(topo.tp, 0);
  tp_floats.assign(topo.tp, 0);
  stream.assign(T_max * H, 0.0f);
  xn.assign(T_max * H, 0.0f);
  logits.assign(C_max * E, 0.0f);
  chunk_ids.assign(C_max * k, 0);
  chunk_w.assign(C_max * k, 0.0f);
  if (shape.latent) lat.assign(C_max * L, 0.0f);
  chunk_rows.assign(C_max * Lp, bf16_t{});
  if (topo.moe_tp > 1) {
    union_ids.assign(U_max * k, 0);
    union_w.assign(U_max * k, 0.0f);
    union_rows.assign(U_max * Lp, bf16_t{});
    chunk_out.assign(C_max * Lp, 0.0f);
  }
  union_out.assign(U_max * Lp, 0.0f);
  chunk_y.assign(C_max * H, 0.0f);
  if (S > 0) {
    const int64_t rows = shape.shared_split ? T_max : C_max;
    gate_buf.assign(rows * S, 0.0f);
    up_buf.assign(rows * S, 0.0f);
    if (shape.shared_split) shared_partial.assign(T_max * H, 0.0f);
    if (shape.shared_split || shape.shared_gated) shared_chunk.assign(C_max * H, 0.0f);
    if (shape.shared_gated) shared_gate_logit.assign(C_max, 0.0f);
  }
  if (topo.moe_ep > 1) ones.assign(z.max_received, 1.0f);
}

int64_t Workspace::Bytes() const {
  return VectorBytes(all_tokens) + VectorBytes(mt_rows) + VectorBytes(mt_floats) +
         VectorBytes(tp_rows) + VectorBytes(tp_floats) + VectorBytes(stream) + VectorBytes(xn) +
         VectorBytes(logits) + VectorBytes(chunk_ids) + VectorBytes(union_ids) +
         VectorBytes(chunk_w) + VectorBytes(union_w) + VectorBytes(lat) + VectorBytes(chunk_rows) +
         VectorBytes(union_rows) + VectorBytes(union_out) + VectorBytes(chunk_out) +
         VectorBytes(ones) + VectorBytes(chunk_y) + VectorBytes(gate_buf) + VectorBytes(up_buf) +
         VectorBytes(shared_partial) + VectorBytes(shared_chunk) + VectorBytes(shared_gate_logit);
}

}  // namespace moeshard::internal
