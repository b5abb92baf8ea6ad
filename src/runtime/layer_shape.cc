#include "runtime/layer_shape.h"

#include <fmt/format.h>

#include "moeshard/runtime/moe_runtime.h"
#include "runtime/layer_weights.h"

namespace moeshard::internal {

Result<LayerShape> ResolveLayerShape(const ShardPlan& plan, const RankPlan& rank_plan) {
  const ModelConfig& m = plan.model;
  const int64_t tp = plan.topology.tp;
  LayerShape s;
  s.hidden = m.hidden_size;
  s.latent = m.latent_moe;
  s.routed_width = plan.hidden.logical;
  s.routed_width_padded = plan.hidden.padded_local;
  s.num_experts = m.num_experts;
  s.top_k = m.num_experts_per_tok;
  s.rms_norm_eps = static_cast<float>(m.rms_norm_eps);
  s.norm_weight_offset = m.norm_plus_one ? 1.0f : 0.0f;
  s.routing = KernelRoutingParams(m);
  s.activation = KernelActivationParams(m);
  if (!s.latent && s.routed_width != s.hidden) {
    return InternalError(
        fmt::format("runtime: routed hidden {} != hidden_size {}", s.routed_width, s.hidden));
  }
  if (s.latent && plan.options.latent_proj == LatentProjMode::kSharded && tp > 1) {
    return UnimplementedError(
        "runtime: '--latent-proj sharded': the runtime runs replicated latent projections only "
        "(drop the flag)");
  }
  if (m.num_shared_experts > 0) {
    const TensorShard* t = FindShard(rank_plan, TensorRole::kSharedGate, TensorPart::kWeight);
    s.shared_width_local = t != nullptr ? t->local_shape[0] : 0;
    s.shared_split = plan.options.shared_experts == SharedExpertsMode::kSharded && tp > 1;
    s.shared_gated = m.shared_expert_gate;
  }
  s.weight_on_input = m.router_weight_on_input;
  if (s.weight_on_input && s.top_k != 1) {
    return InvalidArgumentError(
        fmt::format("runtime: routing weights on the expert input need top-1 routing (as vLLM's "
                    "apply_router_weight_on_input), got num_experts_per_tok {}",
                    s.top_k));
  }
  return s;
}

}  // namespace moeshard::internal
