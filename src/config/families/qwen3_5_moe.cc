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
// (sglang-jax #1251, miles #1317, mbridge #145, realizar #134) and a public header dump of
// Qwen3.5-35B-A3B (14 shards, 1,811 tensors, 35,951,822,704 parameters; tests/checkpoints/
// README.md), which also gives the DeltaNet's A_log [32] and gated norm [128] as F32 (the rest
// BF16).
//
// The vision tower `model.visual.*` (vision_config; vLLM qwen3_vl.py Qwen3_VisionTransformer,
// which qwen3_5.py builds; transformers Qwen3_5MoeVisionConfig for the defaults): a Conv3d
// patch embedding `patch_embed.proj` [Hv, in_channels, temporal_patch_size, P, P] with bias, a
// learned position table `pos_embed` [num_position_embeddings, Hv], `depth` pre-norm blocks
// (`norm1`, `norm2` LayerNorms; `attn.qkv` [3 Hv, Hv] and `attn.proj` [Hv, Hv]; `mlp.linear_fc1`
// [Iv, Hv] and `mlp.linear_fc2` [Hv, Iv], all with biases) and the patch merger `merger.{norm
// [Hv], linear_fc1 [M, M], linear_fc2 [out_hidden_size, M]}` over M = Hv * spatial_merge_size^2.
// Splits as vLLM's default mm_encoder_tp_mode "weights": qkv per head (QKVParallelLinear: q, k
// and v each split), proj and linear_fc2 row-, linear_fc1 column-parallel (the merger's too),
// norms, patch embedding and position table replicated; only when TP divides the heads (vLLM
// has no fallback there; moeshard plans the data-parallel mode, replicated). Every pipeline
// stage loads it. Not planned: the MTP weights (`mtp.*`, recognised).
#include <fmt/format.h>

#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

// vision_config, with transformers' Qwen3_5MoeVisionConfig defaults. Absent: a text-only
// checkpoint (no model.visual.*).
Status ParseVision(const ConfigFields& top, ModelConfig& c) {
  if (!top.Has("vision_config")) return Status::Ok();
  MOESHARD_ASSIGN_OR_RETURN(ConfigFields v, top.Object("vision_config"));
  VisionConfig& x = c.vision;
  MOESHARD_ASSIGN_OR_RETURN(x.num_layers, v.Int("depth", 27, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.hidden_size, v.Int("hidden_size", 1152, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.intermediate_size, v.Int("intermediate_size", 4304, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.num_heads, v.Int("num_heads", 16, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.in_channels, v.Int("in_channels", 3, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.patch_size, v.Int("patch_size", 16, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.temporal_patch_size, v.Int("temporal_patch_size", 2, 1));
  MOESHARD_ASSIGN_OR_RETURN(int64_t merge, v.Int("spatial_merge_size", 2, 1));
  x.merge_tokens = merge * merge;
  MOESHARD_ASSIGN_OR_RETURN(x.num_positions, v.Int("num_position_embeddings", 2304, 1));
  MOESHARD_ASSIGN_OR_RETURN(int64_t out, v.Int("out_hidden_size", 3584, 1));
  x.qkv_hidden_size = x.hidden_size;
  x.linear_bias = true;
  x.norm_bias = true;
  if (out != c.hidden_size) {
    return v.Error("out_hidden_size",
                   fmt::format("the language model's hidden_size ({}): the merger feeds the "
                               "text embedding",
                               c.hidden_size),
                   std::to_string(out));
  }
  if (x.hidden_size % x.num_heads != 0) {
    return v.Error("hidden_size", fmt::format("a multiple of num_heads ({})", x.num_heads),
                   std::to_string(x.hidden_size));
  }
  if (v.Has("deepstack_visual_indexes") && !v.Raw("deepstack_visual_indexes").empty()) {
    // Qwen3-VL's deepstack mergers; Qwen3.5 has none (Qwen3_5MoeVisionConfig has no such key).
    return v.Error("deepstack_visual_indexes", "[] (Qwen3.5 has no deepstack mergers)",
                   v.Raw("deepstack_visual_indexes").dump());
  }
  return Status::Ok();
}

// The vision tower and patch merger under model.visual. (see the file comment).
void AddVision(const ModelConfig& c, std::vector<TensorDef>& out) {
  const VisionConfig& v = c.vision;
  if (v.num_layers == 0) return;
  family::TensorList t(c, "");
  const auto rep = TpSplit::kReplicated, col = TpSplit::kColumn, row = TpSplit::kRow;
  const int64_t Hv = v.hidden_size, Iv = v.intermediate_size, M = Hv * v.merge_tokens;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, TpSplit split,
                 int64_t sections = 1) {
    family::AddVisionTensor(t, name, std::move(shape), split, v.num_heads, sections);
  };
  const std::string p = "model.visual.";
  add(p + "patch_embed.proj.weight",
      {Hv, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size}, rep);
  add(p + "patch_embed.proj.bias", {Hv}, rep);
  add(p + "pos_embed.weight", {v.num_positions, Hv}, rep);
  for (int64_t b = 0; b < v.num_layers; ++b) {
    const std::string k = fmt::format("{}blocks.{}.", p, b);
    for (const char* norm : {"norm1", "norm2"}) {
      add(k + norm + ".weight", {Hv}, rep);
      add(k + norm + ".bias", {Hv}, rep);
    }
    add(k + "attn.qkv.weight", {3 * Hv, Hv}, col, 3);
    add(k + "attn.qkv.bias", {3 * Hv}, col, 3);
    add(k + "attn.proj.weight", {Hv, Hv}, row);
    add(k + "attn.proj.bias", {Hv}, rep);  // a row-parallel layer's bias is added once, whole
    add(k + "mlp.linear_fc1.weight", {Iv, Hv}, col);
    add(k + "mlp.linear_fc1.bias", {Iv}, col);
    add(k + "mlp.linear_fc2.weight", {Hv, Iv}, row);
    add(k + "mlp.linear_fc2.bias", {Hv}, rep);
  }
  add(p + "merger.norm.weight", {Hv}, rep);
  add(p + "merger.norm.bias", {Hv}, rep);
  add(p + "merger.linear_fc1.weight", {M, M}, col);
  add(p + "merger.linear_fc1.bias", {M}, col);
  add(p + "merger.linear_fc2.weight", {c.hidden_size, M}, row);
  add(p + "merger.linear_fc2.bias", {c.hidden_size}, rep);
  for (TensorDef& d : t.Take()) out.push_back(std::move(d));
}

std::string CheckpointName(const std::string& name) {
  if (name.rfind("model.", 0) == 0) return "model.language_model." + name.substr(6);
  return name;  // lm_head.weight
}

Status Parse(const ConfigFields& f, const ConfigFields& top, ModelConfig& c) {
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
  MOESHARD_RETURN_IF_ERROR(family::ParseQwenHybrid(f, c));
  return ParseVision(top, c);
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, "", CheckpointName);
  // A_log and the gated norm are F32 in the release (header dump, see above).
  family::AddQwenHybridTensors(
      t, {.split_projections = true, .a_log_dtype = DType::kF32, .norm_dtype = DType::kF32});
  std::vector<TensorDef> out = t.Take();
  AddVision(c, out);
  return out;
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
          "Qwen3.5/3.6-MoE: Qwen3-Next's hybrid with split DeltaNet projections, fused experts, "
          "a ViT",
      .text_prefix = "model.language_model.",
      .nested_text_config = true,
      .mtp_prefix = "mtp.",
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
