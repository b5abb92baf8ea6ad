// Qwen3.5 / Qwen3.6 MoE (`qwen3_5_moe`: Qwen3.5-35B-A3B, 122B-A10B, 397B-A17B, Qwen3.6-35B-A3B):
// a vision-language wrapper whose language model (`text_config`, model_type qwen3_5_moe_text) is
// Qwen3-Next's hybrid: Gated DeltaNet with separate projections (`linear_attn.in_proj_qkv`,
// split per q / k / v block, and `in_proj_z`, `in_proj_b`, `in_proj_a`), gated full attention,
// (1 + w) norms, every layer MoE with softmax top-k (renormalised: the config has no
// norm_topk_prob and vLLM defaults it to true) and a sigmoid-gated shared expert. Tensors under
// `model.language_model.` (lm_head.weight at the top); bf16 releases store the experts fused and
// out-major (`mlp.experts.gate_up_proj` [E, 2I, H], gate rows first; `down_proj` [E, H, I]),
// quantized ones per expert. Sources: vLLM models/qwen3_5.py and configs/qwen3_5_moe.py,
// transformers configuration_qwen3_5_moe.py; the on-disk layout from four third-party loaders
// (sglang-jax #1251, miles #1317, mbridge #145, realizar #134). Not planned: the vision tower
// (`model.visual.*`) and the MTP weights (`mtp.*`).
#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

std::string CheckpointName(const std::string& name) {
  if (name.rfind("model.", 0) == 0) return "model.language_model." + name.substr(6);
  return name;  // lm_head.weight
}

Status Parse(const ConfigFields& f, const ConfigFields& /*top*/, ModelConfig& c) {
  MOESHARD_RETURN_IF_ERROR(family::ParseGqa(f, c));
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size,
                            f.Int("moe_intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts,
                            f.IntAlias({"num_experts", "num_local_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts_per_tok, f.Int("num_experts_per_tok", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool("norm_topk_prob", true));
  MOESHARD_RETURN_IF_ERROR(f.Choice("hidden_act", "silu", {"silu"}).status());
  c.activation = ExpertActivation::kSwiGlu;
  c.scoring = ScoringFunc::kSoftmax;
  c.routing = RoutingMethod::kSoftmaxTopK;
  c.routed_expert_hidden_size = c.hidden_size;
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerSpec{AttentionKind::kGqa, true, false});
  return family::ParseQwenHybrid(f, c);
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, "", CheckpointName);
  family::AddQwenHybridTensors(t, /*split_projections=*/true);
  return t.Take();
}

ExpertLayout Experts(const ModelConfig& c) {
  const std::string moe = "model.language_model.layers.{layer}.mlp";
  if (c.quant.enabled()) {
    return family::PerExpertLayout(c, "", moe, "gate_proj", "up_proj", "down_proj");
  }
  ExpertLayout x;
  x.rank_prefix = moe + ".experts.";
  x.fused = true;
  x.fused_gate_up = moe + ".experts.gate_up_proj";
  x.fused_down = moe + ".experts.down_proj";
  return x;
}

}  // namespace

const FamilyDescriptor& MoeshardFamily_qwen3_5_moe() {
  static const FamilyDescriptor d{
      .name = "qwen3_5_moe",
      .model_types = {"qwen3_5_moe"},
      .summary =
          "Qwen3.5/3.6-MoE: Qwen3-Next's hybrid with split DeltaNet projections, fused experts",
      .text_prefix = "model.language_model.",
      .nested_text_config = true,
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
