#include "runtime/workspace.h"

#include <algorithm>

namespace moeshard::internal {
namespace {

template <typename T>
int64_t VectorBytes(const std::vector<T>& v) {
  return static_cast<int64_t>(v.size() * sizeof(T));
}

template <typename T>
int64_t VectorBytes(const BackendArray<T>& v) {
  return v.Bytes();
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

Result<Workspace> Workspace::Create(KernelBackend& backend, const LayerShape& shape,
                                    const ResolvedTopology& topo, const WorkspaceSizes& z) {
  Workspace w;
  w.sizes = z;
  const int64_t H = shape.hidden, L = shape.routed_width, Lp = shape.routed_width_padded;
  const int64_t E = shape.num_experts, k = shape.top_k, S = shape.shared_width_local;
  const int64_t T_max = z.max_tokens, C_max = z.max_chunk, U_max = z.max_union;
  w.all_tokens.assign(topo.world, 0);
  w.mt_rows.assign(topo.moe_tp, 0);
  w.mt_floats.assign(topo.moe_tp, 0);
  w.tp_rows.assign(topo.tp, 0);
  w.tp_floats.assign(topo.tp, 0);
  auto& b = backend;
  MOESHARD_RETURN_IF_ERROR(w.stream.Allocate(b, T_max * H));
  MOESHARD_RETURN_IF_ERROR(w.xn.Allocate(b, T_max * H));
  MOESHARD_RETURN_IF_ERROR(w.logits.Allocate(b, C_max * E));
  MOESHARD_RETURN_IF_ERROR(w.chunk_ids.Allocate(b, C_max * k));
  MOESHARD_RETURN_IF_ERROR(w.chunk_w.Allocate(b, C_max * k));
  if (shape.latent) MOESHARD_RETURN_IF_ERROR(w.lat.Allocate(b, C_max * L));
  MOESHARD_RETURN_IF_ERROR(w.chunk_rows.Allocate(b, C_max * Lp));
  if (topo.moe_tp > 1) {
    MOESHARD_RETURN_IF_ERROR(w.union_ids.Allocate(b, U_max * k));
    MOESHARD_RETURN_IF_ERROR(w.union_w.Allocate(b, U_max * k));
    MOESHARD_RETURN_IF_ERROR(w.union_rows.Allocate(b, U_max * Lp));
    MOESHARD_RETURN_IF_ERROR(w.chunk_out.Allocate(b, C_max * Lp));
  }
  MOESHARD_RETURN_IF_ERROR(w.union_out.Allocate(b, U_max * Lp));
  MOESHARD_RETURN_IF_ERROR(w.chunk_y.Allocate(b, C_max * H));
  if (S > 0) {
    const int64_t rows = shape.shared_split ? T_max : C_max;
    MOESHARD_RETURN_IF_ERROR(w.gate_buf.Allocate(b, rows * S));
    MOESHARD_RETURN_IF_ERROR(w.up_buf.Allocate(b, rows * S));
    if (shape.shared_split) MOESHARD_RETURN_IF_ERROR(w.shared_partial.Allocate(b, T_max * H));
    if (shape.shared_split || shape.shared_gated) {
      MOESHARD_RETURN_IF_ERROR(w.shared_chunk.Allocate(b, C_max * H));
    }
    if (shape.shared_gated) MOESHARD_RETURN_IF_ERROR(w.shared_gate_logit.Allocate(b, C_max));
  }
  if (topo.moe_ep > 1) {
    MOESHARD_RETURN_IF_ERROR(w.ones.Allocate(b, z.max_received));
    for (int64_t i = 0; i < z.max_received; ++i) w.ones[i] = 1.0f;
  }
  return w;
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
