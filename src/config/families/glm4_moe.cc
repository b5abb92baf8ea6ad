// GLM-4.5, GLM-4.5-Air, GLM-4.6 (`glm4_moe`): GQA with q/k/v biases (attention_bias; no o
// bias) and optional q/k norms over head_dim (use_qk_norm), partial rotary; dense first
// `first_k_dense_replace` layers, then DeepSeek-style MoE: sigmoid scores with
// e_score_correction_bias, `noaux_tc` grouped top-k (n_group / topk_group), renormalised,
// times routed_scaling_factor, one shared expert of moe_intermediate_size (transformers
// modeling_glm4_moe.py Glm4MoeTopkRouter / Glm4MoeMoE; vLLM glm4_moe.py). Tensors
// `model.layers.L.mlp.{gate, gate.e_score_correction_bias, shared_experts.*,
// experts.E.{gate,up,down}_proj}`. The multi-token-prediction layer (num_nextn_predict_layers)
// is stored as layer num_hidden_layers and not planned, as for DeepSeek-V3.
#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

Status Parse(const ConfigFields& f, const ConfigFields& /*top*/, ModelConfig& c) {
  MOESHARD_RETURN_IF_ERROR(family::ParseGqa(f, c));
  MOESHARD_ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size,
                            f.Int("moe_intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts,
                            f.IntAlias({"n_routed_experts", "num_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts_per_tok,
                            f.IntAlias({"num_experts_per_tok"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_shared_experts, f.Int("n_shared_experts", 1));
  c.shared_expert_intermediate_size = c.num_shared_experts * c.moe_intermediate_size;
  MOESHARD_ASSIGN_OR_RETURN(c.first_k_dense_replace, f.Int("first_k_dense_replace", 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_mtp_layers, f.Int("num_nextn_predict_layers", 0));
  MOESHARD_ASSIGN_OR_RETURN(bool qk_norm, f.Bool("use_qk_norm", false));
  c.qk_norm = qk_norm;
  // Glm4MoeTopkRouter: always sigmoid with the correction bias (the config has no scoring key).
  c.scoring = ScoringFunc::kSigmoid;
  c.routing = RoutingMethod::kSigmoidGroupedTopK;
  c.has_correction_bias = true;
  MOESHARD_ASSIGN_OR_RETURN(c.n_group, f.Int("n_group", 1, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.topk_group, f.Int("topk_group", 1, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool("norm_topk_prob", true));
  MOESHARD_ASSIGN_OR_RETURN(c.routed_scaling_factor, f.Double("routed_scaling_factor", 1.0));
  MOESHARD_RETURN_IF_ERROR(f.Choice("hidden_act", "silu", {"silu"}).status());
  c.activation = ExpertActivation::kSwiGlu;
  c.routed_expert_hidden_size = c.hidden_size;
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerSpec{});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    c.layers[static_cast<size_t>(i)].moe = i >= c.first_k_dense_replace;
  }
  return Status::Ok();
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, "");
  const std::vector<int64_t> moe = family::MoeLayers(c);
  family::AddEmbeddingsAndHead(t);
  family::AddLayerNorms(t);
  family::AddGqaAttention(t, family::AllLayers(c),
                          {.qkv_bias = c.attention_bias, .qk_norm = c.qk_norm});
  family::AddGatedMlp(t, "model.layers.{layer}.mlp", TensorCategory::kDenseMlp, c.intermediate_size,
                      family::DenseLayers(c));
  family::AddRouter(t, "model.layers.{layer}.mlp.gate", moe);
  family::AddSharedExperts(t, "model.layers.{layer}.mlp.shared_experts", moe);
  return t.Take();
}

ExpertLayout Experts(const ModelConfig& c) {
  return family::PerExpertLayout(c, "", "model.layers.{layer}.mlp", "gate_proj", "up_proj",
                                 "down_proj");
}

}  // namespace

const FamilyDescriptor& MoeshardFamily_glm4_moe() {
  static const FamilyDescriptor d{
      .name = "glm4_moe",
      .model_types = {"glm4_moe"},
      .summary = "GLM-4.5/4.6: GQA with q/k/v biases, dense first layers, noaux_tc, shared expert",
      .text_prefix = "",
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
