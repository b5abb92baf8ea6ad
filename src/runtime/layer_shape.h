// LayerShape: the widths and switches of the sharded MoE forward on one rank, fixed at Create
// from the plan and shared by the runtime's parts (weight binding checks shapes against it,
// the workspace sizes buffers from it, the layer steps loop over it). Private to the runtime.
//
// Thread safety: a plain value.
#pragma once

#include <cstdint>

#include "moeshard/base/status.h"
#include "moeshard/kernels/expert_gemm.h"
#include "moeshard/kernels/routing.h"
#include "moeshard/plan/shard_plan.h"

namespace moeshard::internal {

struct LayerShape {
  int64_t hidden = 0;               // H: hidden_size, the residual stream's width
  int64_t routed_width = 0;         // L: the experts' logical input width (latent width or H)
  int64_t routed_width_padded = 0;  // Lp: the experts' padded input width (rows sent, outputs)
  int64_t num_experts = 0;          // E: global (logical) routed experts
  int64_t top_k = 0;                // k
  int64_t shared_width_local = 0;   // S_local: shared-expert intermediate columns held here
  bool latent = false;              // latent MoE: the experts run at width L != H
  bool shared_split = false;        // shared experts column/row split over attention TP
  bool shared_gated = false;        // shared output scaled by sigmoid(shared_out_gate . x)
  bool weight_on_input = false;     // top-1 routing weight applied to the expert input
  float rms_norm_eps = 0.0f;
  float norm_weight_offset = 0.0f;  // 1 for Gemma-style (1 + w) norms
  RoutingParams routing;            // the model's (hash layers override theirs per layer)
  ActivationParams activation;
};

// The shape of `plan`'s forward on `rank_plan`'s rank. Unimplemented / InvalidArgument for
// what the runtime cannot run (naming the flag or config field).
Result<LayerShape> ResolveLayerShape(const ShardPlan& plan, const RankPlan& rank_plan);

}  // namespace moeshard::internal
