// MiniMax-M2, M2.1, M2.5 (`minimax_m2`): GQA (head_dim 128, partial rotary) whose q/k norms
// normalise the whole projection (`qk_norm_type` "per_layer": RMSNorm over num_heads * head_dim
// and num_kv_heads * head_dim, split over TP with an all-reduced variance in vLLM
// MiniMaxText01RMSNormTP), every layer MoE, no shared expert. Routing: sigmoid scores, top-k of
// score + e_score_correction_bias, weights the unbiased scores renormalised (vLLM minimax_m2.py
// with fused_topk_bias; transformers MiniMaxM2TopKRouter). `intermediate_size` is the expert
// width. Tensors `model.layers.L.block_sparse_moe.{gate (F32), e_score_correction_bias (F32),
// experts.E.{w1 (gate), w3 (up), w2 (down)}}`; the released config quantizes to block fp8
// (`fmt` "float8_e4m3fn"). transformers maps `num_experts` to `num_local_experts`.
#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

Status Parse(const ConfigFields& f, const ConfigFields& /*top*/, ModelConfig& c) {
  MOESHARD_RETURN_IF_ERROR(family::ParseGqa(f, c));
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size, f.Int("intermediate_size", std::nullopt, 1));
  c.intermediate_size = c.moe_intermediate_size;
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts,
                            f.IntAlias({"num_local_experts", "num_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts_per_tok, f.Int("num_experts_per_tok", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(int64_t shared, f.Int("shared_intermediate_size", 0));
  if (shared != 0) {
    return f.Error("shared_intermediate_size", "0 (the MiniMax-M2 releases have no shared expert)",
                   std::to_string(shared));
  }
  MOESHARD_RETURN_IF_ERROR(f.Choice("scoring_func", "sigmoid", {"sigmoid"}).status());
  MOESHARD_ASSIGN_OR_RETURN(c.has_correction_bias, f.Bool("use_routing_bias", true));
  MOESHARD_ASSIGN_OR_RETURN(bool qk_norm, f.Bool("use_qk_norm", true));
  if (qk_norm) {
    MOESHARD_RETURN_IF_ERROR(f.Choice("qk_norm_type", "per_layer", {"per_layer"}).status());
  }
  c.qk_norm = qk_norm;
  MOESHARD_RETURN_IF_ERROR(f.Choice("hidden_act", "silu", {"silu"}).status());
  c.scoring = ScoringFunc::kSigmoid;
  c.routing = RoutingMethod::kSigmoidGroupedTopK;  // one group: plain biased top-k
  c.norm_topk_prob = true;
  c.activation = ExpertActivation::kSwiGlu;
  c.routed_expert_hidden_size = c.hidden_size;
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerSpec{AttentionKind::kGqa, true, false});
  return Status::Ok();
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, "");
  family::AddEmbeddingsAndHead(t);
  family::AddLayerNorms(t);
  const std::vector<int64_t> all = family::AllLayers(c);
  family::AddGqaAttention(t, all, {});
  if (c.qk_norm) {
    const std::string p = "model.layers.{layer}.self_attn.";
    t.Vector(p + "q_norm.weight", TensorCategory::kAttention, {c.num_attention_heads * c.head_dim},
             TpSplit::kColumn, all, c.dtype);
    t.Vector(p + "k_norm.weight", TensorCategory::kAttention, {c.num_kv_heads * c.head_dim},
             TpSplit::kKvColumn, all, c.dtype)
        .unit = c.head_dim;
  }
  family::AddRouter(t, "model.layers.{layer}.block_sparse_moe.gate", family::MoeLayers(c),
                    {.weight_dtype = DType::kF32,
                     .correction_bias_module = "model.layers.{layer}.block_sparse_moe"});
  return t.Take();
}

ExpertLayout Experts(const ModelConfig& c) {
  return family::PerExpertLayout(c, "", "model.layers.{layer}.block_sparse_moe", "w1", "w3", "w2");
}

}  // namespace

const FamilyDescriptor& MoeshardFamily_minimax_m2() {
  static const FamilyDescriptor d{
      .name = "minimax_m2",
      .model_types = {"minimax_m2"},
      .summary = "MiniMax-M2: GQA with full-width q/k norms, sigmoid top-k with a routing bias",
      .text_prefix = "",
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
