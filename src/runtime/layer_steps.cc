#include "runtime/layer_steps.h"

#include <algorithm>
#include <cstring>

#include "moeshard/kernels/routing.h"

namespace moeshard::internal {

LayerSteps::LayerSteps(const LayerParts& p)
    : kc_(*p.kernels),
      scratch_(*p.scratch),
      shape_(*p.shape),
      topo_(*p.topology),
      coords_(*p.coords),
      global_to_local_(p.global_to_local),
      groups_(*p.groups),
      ws_(*p.workspace) {}

Status LayerSteps::Run(const LayerWeights& ly, const LayerInput& in) {
  const int64_t C = in.chunk.size();
  PreNorm(ly, in);
  const float* xc = ws_.xn.data() + in.chunk.begin * shape_.hidden;  // [C, H]
  MOESHARD_RETURN_IF_ERROR(RouteChunk(ly, in, xc));
  ExpertInputs(ly, xc, C);
  Routed routed{.num_rows = C,
                .rows = ws_.chunk_rows.data(),
                .ids = ws_.chunk_ids.data(),
                .weights = ws_.chunk_w.data(),
                .output = ws_.union_out.data()};
  MOESHARD_RETURN_IF_ERROR(GatherMoeTp(C, &routed));
  MOESHARD_RETURN_IF_ERROR(RoutedExperts(ly, &routed));
  MOESHARD_RETURN_IF_ERROR(ReduceMoeTp(&routed));
  ToHidden(ly, routed, C);
  MOESHARD_RETURN_IF_ERROR(SharedExperts(ly, in, xc));
  return GatherUnit(in);
}

void LayerSteps::PreNorm(const LayerWeights& ly, const LayerInput& in) {
  const int64_t H = shape_.hidden;
  // The chunk, or all T tokens when TP-sharded shared experts need them.
  const TokenRange rows = shape_.shared_split ? TokenRange{0, in.num_tokens} : in.chunk;
  RmsNorm(ws_.stream.data() + rows.begin * H, H, rows.size(), H, ly.pre_norm, shape_.rms_norm_eps,
          ws_.xn.data() + rows.begin * H, H, shape_.norm_weight_offset);
}

Status LayerSteps::RouteChunk(const LayerWeights& ly, const LayerInput& in, const float* xc) {
  const int64_t C = in.chunk.size(), k = shape_.top_k;
  if (in.given_ids != nullptr) {
    std::memcpy(ws_.chunk_ids.data(), in.given_ids + in.chunk.begin * k, C * k * sizeof(int32_t));
    std::memcpy(ws_.chunk_w.data(), in.given_weights + in.chunk.begin * k, C * k * sizeof(float));
    return Status::Ok();
  }
  if (C == 0) return Status::Ok();
  Linear(kc_, scratch_,
         LinearArgs{.w = &ly.router,
                    .x = xc,
                    .x_stride = shape_.hidden,
                    .num_tokens = C,
                    .y = ws_.logits.data(),
                    .y_stride = shape_.num_experts,
                    .bias = ly.router_bias.empty() ? nullptr : ly.router_bias.data()});
  RoutingParams rp = ly.routing;
  rp.e_score_correction_bias = ly.correction_bias;
  return Route(
      kc_, rp,
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
    Linear(kc_, scratch_,
           LinearArgs{.w = &ly.latent_down,
                      .x = xc,
                      .x_stride = H,
                      .num_tokens = C,
                      .y = ws_.lat.data(),
                      .y_stride = L});
    if (ly.latent_norm != nullptr) {
      RmsNorm(ws_.lat.data(), L, C, L, ly.latent_norm, shape_.rms_norm_eps, ws_.lat.data(), L);
    }
    zsrc = ws_.lat.data();
    zstride = L;
  }
  // bf16 [C, Lp], zero beyond the logical width.
  for (int64_t c = 0; c < C; ++c) {
    bf16_t* row = ws_.chunk_rows.data() + c * Lp;
    if (shape_.weight_on_input) {
      // Llama-4: the expert sees x * w (top-1), and its output is taken with weight 1.
      const float wt = ws_.chunk_w[c];
      for (int64_t i = 0; i < L; ++i) row[i] = FloatToBf16(zsrc[c * zstride + i] * wt);
      ws_.chunk_w[c] = 1.0f;
    } else {
      for (int64_t i = 0; i < L; ++i) row[i] = FloatToBf16(zsrc[c * zstride + i]);
    }
    std::fill(row + L, row + Lp, bf16_t{});
  }
}

void LayerSteps::ToHidden(const LayerWeights& ly, const Routed& r, int64_t C) {
  const int64_t H = shape_.hidden, Lp = shape_.routed_width_padded;
  if (shape_.latent) {
    if (C == 0) return;
    Linear(kc_, scratch_,
           LinearArgs{.w = &ly.latent_up,
                      .x = r.output,
                      .x_stride = Lp,
                      .num_tokens = C,
                      .y = ws_.chunk_y.data(),
                      .y_stride = H});
    return;
  }
  for (int64_t c = 0; c < C; ++c) {
    std::memcpy(ws_.chunk_y.data() + c * H, r.output + c * Lp, H * sizeof(float));
  }
}

Status LayerSteps::GatherUnit(const LayerInput& in) {
  const int64_t H = shape_.hidden, C = in.chunk.size();
  const float* res = ws_.stream.data() + in.chunk.begin * H;
  for (int64_t i = 0; i < C * H; ++i) ws_.chunk_y[i] += res[i];
  // Every rank of the unit gets the unit's new hidden states.
  if (topo_.tp > 1) {
    return groups_.tp->AllGatherV(ws_.chunk_y.data(), C, ws_.stream.data(), ws_.tp_rows, {},
                                  H * sizeof(float));
  }
  std::memcpy(ws_.stream.data(), ws_.chunk_y.data(), C * H * sizeof(float));
  return Status::Ok();
}

}  // namespace moeshard::internal
