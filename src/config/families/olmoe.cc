// OLMoE (`olmoe`: OLMoE-1B-7B): GQA whose q_norm / k_norm normalise the whole projection
// (RMSNorm over num_heads * head_dim and num_kv_heads * head_dim, transformers
// modular_olmoe.py; vLLM all-gathers q and k before them, so the norms are replicated), softmax
// top-k routing without renormalisation (norm_topk_prob false), no shared expert, every layer
// MoE, experts `mlp.experts.E.{gate,up,down}_proj`. transformers maps `num_local_experts` to
// `num_experts` (OlmoeConfig.attribute_map).
#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

Status Parse(const ConfigFields& f, const ConfigFields& /*top*/, ModelConfig& c) {
  MOESHARD_RETURN_IF_ERROR(family::ParseGqa(f, c));
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size, f.Int("intermediate_size", std::nullopt, 1));
  c.intermediate_size = c.moe_intermediate_size;
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts,
                            f.IntAlias({"num_experts", "num_local_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts_per_tok,
                            f.IntAlias({"num_experts_per_tok"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool("norm_topk_prob", false));
  MOESHARD_RETURN_IF_ERROR(f.Choice("hidden_act", "silu", {"silu"}).status());
  c.activation = ExpertActivation::kSwiGlu;
  c.scoring = ScoringFunc::kSoftmax;
  c.routing = RoutingMethod::kSoftmaxTopK;
  c.routed_expert_hidden_size = c.hidden_size;
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerSpec{AttentionKind::kGqa, true, false});
  return Status::Ok();
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, "");
  family::AddEmbeddingsAndHead(t);
  family::AddLayerNorms(t);
  const std::vector<int64_t> all = family::AllLayers(c);
  family::AddGqaAttention(t, all, {.bias = c.attention_bias});
  const std::string p = "model.layers.{layer}.self_attn.";
  t.Vector(p + "q_norm.weight", TensorCategory::kAttention, {c.num_attention_heads * c.head_dim},
           TpSplit::kReplicated, all, c.dtype);
  t.Vector(p + "k_norm.weight", TensorCategory::kAttention, {c.num_kv_heads * c.head_dim},
           TpSplit::kReplicated, all, c.dtype);
  family::AddRouter(t, "model.layers.{layer}.mlp.gate", family::MoeLayers(c));
  return t.Take();
}

ExpertLayout Experts(const ModelConfig& c) {
  return family::PerExpertLayout(c, "", "model.layers.{layer}.mlp", "gate_proj", "up_proj",
                                 "down_proj");
}

}  // namespace

const FamilyDescriptor& MoeshardFamily_olmoe() {
  static const FamilyDescriptor d{
      .name = "olmoe",
      .model_types = {"olmoe"},
      .summary = "OLMoE: GQA with full-width q/k norms, softmax top-8 without renormalising",
      .text_prefix = "",
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
