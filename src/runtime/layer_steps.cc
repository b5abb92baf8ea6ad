#include "runtime/layer_steps.h"

#include <algorithm>
#include <cstring>

namespace moeshard::internal {

LayerSteps::LayerSteps(const LayerParts& p)
    : kb_(*p.kernels),
      shape_(*p.shape),
      topo_(*p.topology),
      coords_(*p.coords),
      global_to_local_(p.global_to_local),
      groups_(*p.groups),
      ws_(*p.workspace) {}

Status LayerSteps::Run(const LayerWeights& ly, const LayerInput& in, const LayerCounts& counts) {
  const int64_t C = in.chunk.size();
  PreNorm(ly, in);
  const float* xc = ws_.xn.data() + in.chunk.begin * shape_.hidden;  // [C, H]
  MOESHARD_RETURN_IF_ERROR(RouteChunk(ly, in, xc));
  if (counts.experts != nullptr) CountExperts(ws_.chunk_ids.data(), C, counts.experts);
  ExpertInputs(ly, xc, C);
  Routed routed{.num_rows = C,
                .rows = ws_.chunk_rows.data(),
                .ids = ws_.chunk_ids.data(),
                .weights = ws_.chunk_w.data(),
                .output = ws_.union_out.data()};
  MOESHARD_RETURN_IF_ERROR(GatherMoeTp(C, &routed));
  if (counts.slots != nullptr) std::fill(counts.slots, counts.slots + counts.num_slots, 0);
  MOESHARD_RETURN_IF_ERROR(RoutedExperts(ly, &routed, counts));
  MOESHARD_RETURN_IF_ERROR(ReduceMoeTp(&routed));
  ToHidden(ly, routed, C);
  MOESHARD_RETURN_IF_ERROR(SharedExperts(ly, in, xc));
  return GatherUnit(in);
}

// The ids are read on the host, as the dispatcher reads them (the backends so far allocate host
// memory).
void LayerSteps::CountExperts(const int32_t* ids, int64_t num_rows, int64_t* counts) const {
  std::fill(counts, counts + shape_.num_experts, 0);
  for (int64_t i = 0; i < num_rows * shape_.top_k; ++i) {
    if (ids[i] >= 0 && ids[i] < shape_.num_experts) ++counts[ids[i]];
  }
}

void LayerSteps::CountSlots(const int32_t* expert_ids, int64_t num_rows,
                            const LayerCounts& counts) const {
  if (counts.slots == nullptr || coords_.moe_tp_rank != 0) return;
  for (int64_t i = 0; i < num_rows; ++i) {
    const int32_t slot = global_to_local_[expert_ids[i]];
    if (slot >= 0 && slot < counts.num_slots) ++counts.slots[slot];
  }
}

void LayerSteps::PreNorm(const LayerWeights& ly, const LayerInput& in) {
  const int64_t H = shape_.hidden;
  // The chunk, or all T tokens when TP-sharded shared experts need them.
  const TokenRange rows = shape_.shared_split ? TokenRange{0, in.num_tokens} : in.chunk;
  kb_.RmsNorm({.x = ws_.stream.data() + rows.begin * H,
               .x_stride = H,
               .num_tokens = rows.size(),
               .n = H,
               .weight = ly.pre_norm,
               .eps = shape_.rms_norm_eps,
               .y = ws_.xn.data() + rows.begin * H,
               .y_stride = H,
               .weight_offset = shape_.norm_weight_offset});
}

Status LayerSteps::RouteChunk(const LayerWeights& ly, const LayerInput& in, const float* xc) {
  const int64_t C = in.chunk.size(), k = shape_.top_k;
  if (in.given_ids != nullptr) {
    kb_.CopyRows({.dst = ws_.chunk_ids.data(),
                  .src = in.given_ids + in.chunk.begin * k,
                  .num_rows = 1,
                  .row_bytes = C * k * static_cast<int64_t>(sizeof(int32_t))});
    kb_.CopyRows({.dst = ws_.chunk_w.data(),
                  .src = in.given_weights + in.chunk.begin * k,
                  .num_rows = 1,
                  .row_bytes = C * k * static_cast<int64_t>(sizeof(float))});
    return Status::Ok();
  }
  if (C == 0) return Status::Ok();
  kb_.Linear(LinearArgs{.w = &ly.router,
                        .x = xc,
                        .x_stride = shape_.hidden,
                        .num_tokens = C,
                        .y = ws_.logits.data(),
                        .y_stride = shape_.num_experts,
                        .bias = ly.router_bias.empty() ? nullptr : ly.router_bias.data()});
  RoutingParams rp = ly.routing;
  rp.e_score_correction_bias = ly.correction_bias;
  return kb_.Route(
      rp,
      RoutingArgs{.router_logits = ws_.logits.data(),
                  .num_tokens = C,
                  .topk_ids = ws_.chunk_ids.data(),
                  .topk_weights = ws_.chunk_w.data(),
                  .token_ids = in.token_ids != nullptr ? in.token_ids + in.chunk.begin : nullptr});
}

void LayerSteps::ExpertInputs(const LayerWeights& ly, const float* xc, int64_t C) {
  const int64_t H = shape_.hidden, L = shape_.routed_width, Lp = shape_.routed_width_padded;
  const float* zsrc = xc;
  int64_t zstride = H;
  if (shape_.latent && C > 0) {
    kb_.Linear(LinearArgs{.w = &ly.latent_down,
                          .x = xc,
                          .x_stride = H,
                          .num_tokens = C,
                          .y = ws_.lat.data(),
                          .y_stride = L});
    if (ly.latent_norm != nullptr) {
      kb_.RmsNorm({.x = ws_.lat.data(),
                   .x_stride = L,
                   .num_tokens = C,
                   .n = L,
                   .weight = ly.latent_norm,
                   .eps = shape_.rms_norm_eps,
                   .y = ws_.lat.data(),
                   .y_stride = L});
    }
    zsrc = ws_.lat.data();
    zstride = L;
  }
  // bf16 [C, Lp], zero beyond the logical width. Llama-4: the expert sees x * w (top-1), and
  // its output is taken with weight 1.
  kb_.ToExpertRows({.x = zsrc,
                    .x_stride = zstride,
                    .num_rows = C,
                    .cols = L,
                    .padded_cols = Lp,
                    .rows = ws_.chunk_rows.data(),
                    .row_weights = shape_.weight_on_input ? ws_.chunk_w.data() : nullptr});
}

void LayerSteps::ToHidden(const LayerWeights& ly, const Routed& r, int64_t C) {
  const int64_t H = shape_.hidden, Lp = shape_.routed_width_padded;
  if (shape_.latent) {
    if (C == 0) return;
    kb_.Linear(LinearArgs{.w = &ly.latent_up,
                          .x = r.output,
                          .x_stride = Lp,
                          .num_tokens = C,
                          .y = ws_.chunk_y.data(),
                          .y_stride = H});
    return;
  }
  kb_.CopyRows({.dst = ws_.chunk_y.data(),
                .dst_stride = H * static_cast<int64_t>(sizeof(float)),
                .src = r.output,
                .src_stride = Lp * static_cast<int64_t>(sizeof(float)),
                .num_rows = C,
                .row_bytes = H * static_cast<int64_t>(sizeof(float))});
}

Status LayerSteps::GatherUnit(const LayerInput& in) {
  const int64_t H = shape_.hidden, C = in.chunk.size();
  const float* res = ws_.stream.data() + in.chunk.begin * H;
  kb_.AddRows({.y = ws_.chunk_y.data(), .x = res, .num_rows = C, .cols = H});
  // Every rank of the unit gets the unit's new hidden states.
  if (topo_.tp > 1) {
    return groups_.tp->AllGatherV(ws_.chunk_y.data(), C, ws_.stream.data(), ws_.tp_rows, {},
                                  H * sizeof(float));
  }
  kb_.CopyRows({.dst = ws_.stream.data(),
                .src = ws_.chunk_y.data(),
                .num_rows = 1,
                .row_bytes = C * H * static_cast<int64_t>(sizeof(float))});
  return Status::Ok();
}

}  // namespace moeshard::internal
