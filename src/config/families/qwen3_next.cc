// Qwen3-Next (`qwen3_next`: Qwen3-Next-80B-A3B Instruct / Thinking): hybrid attention, every
// `full_attention_interval`-th layer gated full attention (q_proj holds q and a per-head output
// gate interleaved, q/k norms over head_dim), the others Gated DeltaNet linear attention
// (`linear_attn.{in_proj_qkvz, in_proj_ba, conv1d, dt_bias, A_log, norm, out_proj}`, grouped by
// key head so a contiguous TP split gives each rank whole groups; the depthwise conv1d over
// [q, k, v] is split per block, vLLM mamba_v2_sharded_weight_loader). The MoE block is
// Qwen2-MoE's: softmax top-k (renormalised), a shared expert behind a [1, H] sigmoid gate. Its
// RMSNorms scale by (1 + w) (Qwen3NextRMSNorm). Sources: vLLM models/qwen3_next.py and
// layers/mamba/gdn/qwen_gdn_linear_attn.py, transformers configuration_qwen3_next.py. The
// multi-token-prediction weights (`mtp.*`) are not planned. Stored dtypes of A_log and the
// gated norm were not verified (planned F32 and the model dtype; header sizing uses the
// checkpoint's own).
#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

Status Parse(const ConfigFields& f, const ConfigFields& /*top*/, ModelConfig& c) {
  MOESHARD_RETURN_IF_ERROR(family::ParseQwenMoe(f, c));
  MOESHARD_ASSIGN_OR_RETURN(c.shared_expert_intermediate_size,
                            f.Int("shared_expert_intermediate_size", 0));
  c.num_shared_experts = c.shared_expert_intermediate_size > 0 ? 1 : 0;
  c.shared_expert_gate = c.num_shared_experts > 0;
  MOESHARD_ASSIGN_OR_RETURN(c.attn_output_gate, f.Bool("attn_output_gate", true));
  c.qk_norm = true;
  c.norm_plus_one = true;
  GdnConfig& g = c.gdn;
  MOESHARD_ASSIGN_OR_RETURN(g.num_k_heads, f.Int("linear_num_key_heads", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(g.num_v_heads, f.Int("linear_num_value_heads", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(g.k_head_dim, f.Int("linear_key_head_dim", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(g.v_head_dim, f.Int("linear_value_head_dim", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(g.conv_kernel, f.Int("linear_conv_kernel_dim", 4, 1));
  if (g.num_v_heads % g.num_k_heads != 0) {
    return f.Error("linear_num_value_heads",
                   fmt::format("a multiple of linear_num_key_heads ({})", g.num_k_heads),
                   std::to_string(g.num_v_heads));
  }
  // Layer kinds: an explicit `layer_types` (transformers 5) or every interval-th layer full.
  if (f.Has("layer_types")) {
    const nlohmann::json& lt = f.Raw("layer_types");
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.num_layers) {
      return f.Error("layer_types", fmt::format("an array of {} layer kinds", c.num_layers),
                     lt.dump());
    }
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const nlohmann::json& e = lt[static_cast<size_t>(i)];
      if (e != "linear_attention" && e != "full_attention") {
        return f.Error("layer_types", "\"linear_attention\" or \"full_attention\"", e.dump());
      }
      c.layers[static_cast<size_t>(i)].attention =
          e == "full_attention" ? AttentionKind::kGqa : AttentionKind::kGatedDeltaNet;
    }
  } else {
    MOESHARD_ASSIGN_OR_RETURN(int64_t interval, f.Int("full_attention_interval", 4, 1));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      c.layers[static_cast<size_t>(i)].attention =
          (i + 1) % interval == 0 ? AttentionKind::kGqa : AttentionKind::kGatedDeltaNet;
    }
  }
  return Status::Ok();
}

// Gated DeltaNet on `layers` (names relative to the model).
void AddGatedDeltaNet(family::TensorList& t, const std::vector<int64_t>& layers) {
  const ModelConfig& c = t.config();
  const GdnConfig& g = c.gdn;
  using C = TensorCategory;
  const int64_t H = c.hidden_size, kd = g.key_dim(), vd = g.value_dim();
  const std::string p = "model.layers.{layer}.linear_attn.";
  t.Linear(p + "in_proj_qkvz", C::kAttention, 2 * kd + 2 * vd, H, TpSplit::kColumn, layers);
  t.Linear(p + "in_proj_ba", C::kAttention, 2 * g.num_v_heads, H, TpSplit::kColumn, layers);
  t.Vector(p + "conv1d.weight", C::kAttention, {2 * kd + vd, 1, g.conv_kernel}, TpSplit::kColumn,
           layers, c.dtype)
      .section_sizes = {kd, kd, vd};
  t.Vector(p + "dt_bias", C::kAttention, {g.num_v_heads}, TpSplit::kColumn, layers, c.dtype);
  t.Vector(p + "A_log", C::kAttention, {g.num_v_heads}, TpSplit::kColumn, layers, DType::kF32);
  t.Vector(p + "norm.weight", C::kAttention, {g.v_head_dim}, TpSplit::kReplicated, layers, c.dtype);
  t.Linear(p + "out_proj", C::kAttention, H, vd, TpSplit::kRow, layers);
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, "");
  const std::vector<int64_t> moe = family::MoeLayers(c);
  family::AddEmbeddingsAndHead(t);
  family::AddLayerNorms(t);
  family::AddGqaAttention(t, family::LayersOf(c, AttentionKind::kGqa),
                          {.qk_norm = true, .q_gate = c.attn_output_gate});
  AddGatedDeltaNet(t, family::LayersOf(c, AttentionKind::kGatedDeltaNet));
  family::AddGatedMlp(t, "model.layers.{layer}.mlp", TensorCategory::kDenseMlp, c.intermediate_size,
                      family::DenseLayers(c));
  family::AddRouter(t, "model.layers.{layer}.mlp.gate", moe);
  family::AddSharedExperts(t, "model.layers.{layer}.mlp.shared_expert", moe);
  family::AddSharedExpertGate(t, "model.layers.{layer}.mlp.shared_expert_gate", moe);
  return t.Take();
}

ExpertLayout Experts(const ModelConfig& c) {
  return family::PerExpertLayout(c, "", "model.layers.{layer}.mlp", "gate_proj", "up_proj",
                                 "down_proj");
}

}  // namespace

const FamilyDescriptor& MoeshardFamily_qwen3_next() {
  static const FamilyDescriptor d{
      .name = "qwen3_next",
      .model_types = {"qwen3_next"},
      .summary = "Qwen3-Next: Gated DeltaNet + gated attention, softmax top-k, gated shared expert",
      .text_prefix = "",
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
