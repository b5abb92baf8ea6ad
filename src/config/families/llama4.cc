// Llama-4 Scout and Maverick (`llama4`: Llama4ForConditionalGeneration, the language model
// `llama4_text` nested under text_config, its tensors under "language_model."): GQA without
// biases (the q/k norm is a weightless L2 norm), MoE every `interleave_moe_layer_step` layers
// (Scout: all, Maverick: every second; transformers Llama4TextConfig.moe_layers, vLLM
// llama4.py), the others dense of `intermediate_size_mlp`. The MoE block: top-1 over the router
// logits, the weight sigmoid(logit) applied to the expert's input (vLLM
// apply_router_weight_on_input), plus one shared expert of `intermediate_size` (not gated).
// Experts are stored fused and input-major: `feed_forward.experts.gate_up_proj` [E, H, 2I]
// (gate columns first, then up) and `down_proj` [E, I, H].
#include <set>

#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

constexpr const char* kPrefix = "language_model.";

Status Parse(const ConfigFields& f, const ConfigFields& /*top*/, ModelConfig& c) {
  MOESHARD_RETURN_IF_ERROR(family::ParseGqa(f, c));
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size, f.Int("intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size_mlp", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts,
                            f.IntAlias({"num_local_experts", "num_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts_per_tok, f.Int("num_experts_per_tok", 1, 1));
  if (c.num_experts_per_tok != 1) {
    return f.Error("num_experts_per_tok",
                   "1 (Llama-4 applies the routing weight to the expert input, top-1 only)",
                   std::to_string(c.num_experts_per_tok));
  }
  MOESHARD_ASSIGN_OR_RETURN(int64_t step, f.Int("interleave_moe_layer_step", 1, 1));
  std::set<int64_t> moe_layers;
  if (f.Has("moe_layers")) {
    MOESHARD_ASSIGN_OR_RETURN(std::vector<int64_t> l, f.IntList("moe_layers", 0, c.num_layers - 1));
    moe_layers.insert(l.begin(), l.end());
  } else {
    for (int64_t i = step - 1; i < c.num_layers; i += step) moe_layers.insert(i);
  }
  MOESHARD_RETURN_IF_ERROR(f.Choice("hidden_act", "silu", {"silu"}).status());
  c.num_shared_experts = 1;
  c.shared_expert_intermediate_size = c.moe_intermediate_size;
  c.activation = ExpertActivation::kSwiGlu;
  c.scoring = ScoringFunc::kSigmoid;
  c.routing = RoutingMethod::kTopKThenSigmoid;
  c.router_weight_on_input = true;
  c.routed_expert_hidden_size = c.hidden_size;
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerSpec{});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    c.layers[static_cast<size_t>(i)].moe = moe_layers.count(i) > 0;
  }
  return Status::Ok();
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, kPrefix);
  const std::vector<int64_t> moe = family::MoeLayers(c);
  family::AddEmbeddingsAndHead(t);
  family::AddLayerNorms(t);
  family::AddGqaAttention(t, family::AllLayers(c), {});
  family::AddGatedMlp(t, "model.layers.{layer}.feed_forward", TensorCategory::kDenseMlp,
                      c.intermediate_size, family::DenseLayers(c));
  family::AddRouter(t, "model.layers.{layer}.feed_forward.router", moe);
  family::AddSharedExperts(t, "model.layers.{layer}.feed_forward.shared_expert", moe);
  return t.Take();
}

ExpertLayout Experts(const ModelConfig& /*c*/) {
  ExpertLayout x;
  const std::string base = std::string(kPrefix) + "model.layers.{layer}.feed_forward.experts.";
  x.rank_prefix = base;
  x.fused = true;
  x.fused_gate_up = base + "gate_up_proj";
  x.fused_down = base + "down_proj";
  x.gate_up_interleaved = false;
  x.fused_in_major = true;
  return x;
}

}  // namespace

const FamilyDescriptor& MoeshardFamily_llama4() {
  static const FamilyDescriptor d{
      .name = "llama4",
      .model_types = {"llama4"},
      .summary = "Llama-4: GQA, interleaved MoE, top-1 sigmoid on the expert input, shared expert",
      .text_prefix = kPrefix,
      .nested_text_config = true,
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
