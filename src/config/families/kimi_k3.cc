// Kimi-K3 (`kimi_k3`, KimiK3ForConditionalGeneration) as released (../shared/reference/
// checkpoints.md, kimi-k3-config.json): the language model (`kimi_linear`) nested under
// `text_config` with `quantization_config` inside it; every text tensor under
// "language_model."; hybrid KDA (linear attention) and MLA layers; attention residuals on every
// layer; layer 0 dense; latent MoE (hidden 7168 -> 3584) in `block_sparse_moe` with experts
// w1 (gate) / w3 (up) / w2 (down) in MXFP4, the latent projections BF16 although the
// quantization's ignore list does not name them; a MoonViT vision tower and a patch-merger
// projector without the prefix.
//
// Tensor-parallel splits follow SGLang models/kimi_k3.py and vLLM models/kimi_k3/nvidia:
// KDA q/k/v/g and f_b / b_proj column-parallel, f_a replicated, convs split per q/k/v, A_log
// stored as [head_dim] of which the first num_heads are read and split by head, dt_bias split,
// o_norm replicated, o_proj row-parallel; MLA's output gate g_proj column-parallel; attention
// residual norms and [1, H] projections replicated (ReplicatedLinear, quant_config=None);
// router, correction bias and latent projections replicated. The vision tower follows vLLM's
// default (mm_encoder_tp_mode "weights": wqkv per head, wo and fc1 row-, fc0 column-parallel)
// when TP divides its 12 heads and is replicated otherwise (vLLM falls back to data parallel;
// SGLang always replicates it); the projector is replicated. Every pipeline stage loads it.
#include <fmt/format.h>

#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

constexpr const char* kPrefix = "language_model.";

Status ParseLinearAttention(const ConfigFields& f, ModelConfig& c) {
  MOESHARD_ASSIGN_OR_RETURN(ConfigFields l, f.Object("linear_attn_config"));
  MOESHARD_ASSIGN_OR_RETURN(c.kda.num_heads, l.Int("num_heads", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.kda.head_dim, l.Int("head_dim", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.kda.short_conv_kernel, l.Int("short_conv_kernel_size", 4, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.kda.full_rank_gate, l.Bool("use_full_rank_gate", false));
  c.kda.low_rank_dim = c.kda.head_dim;
  std::vector<int> seen(static_cast<size_t>(c.num_layers), 0);
  for (const char* key : {"kda_layers", "full_attn_layers"}) {
    // 1-based layer numbers, as Kimi-Linear writes them.
    MOESHARD_ASSIGN_OR_RETURN(std::vector<int64_t> list, l.IntList(key, 1, c.num_layers));
    for (int64_t n : list) {
      if (seen[static_cast<size_t>(n - 1)]++) {
        return l.Error(key, "each layer in exactly one of kda_layers and full_attn_layers",
                       fmt::format("layer {} listed twice", n));
      }
      c.layers[static_cast<size_t>(n - 1)].attention =
          std::string_view(key) == "kda_layers" ? AttentionKind::kKda : AttentionKind::kMla;
    }
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (!seen[static_cast<size_t>(i)]) {
      return l.Error("kda_layers", "every layer in kda_layers or full_attn_layers",
                     fmt::format("layer {} in neither", i + 1));
    }
  }
  return Status::Ok();
}

Status Parse(const ConfigFields& f, const ConfigFields& top, ModelConfig& c) {
  MOESHARD_ASSIGN_OR_RETURN(c.num_attention_heads, f.Int("num_attention_heads", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_kv_heads, f.Int("num_key_value_heads", c.num_attention_heads, 1));
  MOESHARD_RETURN_IF_ERROR(family::ParseMla(f, c));
  MOESHARD_ASSIGN_OR_RETURN(c.mla.output_gate, f.Bool("mla_use_output_gate", false));
  MOESHARD_ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size,
                            f.Int("moe_intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts,
                            f.IntAlias({"num_experts", "n_routed_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(
      c.num_experts_per_tok,
      f.IntAlias({"num_experts_per_token", "num_experts_per_tok"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_shared_experts,
                            f.IntAlias({"num_shared_experts", "n_shared_experts"}, 0));
  c.shared_expert_intermediate_size = c.num_shared_experts * c.moe_intermediate_size;
  MOESHARD_ASSIGN_OR_RETURN(c.first_k_dense_replace, f.Int("first_k_dense_replace", 0));
  MOESHARD_ASSIGN_OR_RETURN(int64_t freq, f.Int("moe_layer_freq", 1, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_mtp_layers, f.Int("num_nextn_predict_layers", 0));
  MOESHARD_ASSIGN_OR_RETURN(c.attn_res_block_size, f.Int("attn_res_block_size", 0));
  MOESHARD_ASSIGN_OR_RETURN(c.routed_expert_hidden_size,
                            f.Int("routed_expert_hidden_size", c.hidden_size, 1));
  c.latent_moe = c.routed_expert_hidden_size != c.hidden_size;
  MOESHARD_ASSIGN_OR_RETURN(c.latent_moe_use_norm, f.Bool("latent_moe_use_norm", false));
  MOESHARD_RETURN_IF_ERROR(family::ParseDeepseekRouting(f, c));
  MOESHARD_ASSIGN_OR_RETURN(std::string act, f.Choice("hidden_act", "situ", {"situ", "silu"}));
  if (act == "situ") {
    c.activation = ExpertActivation::kSitu;
    MOESHARD_ASSIGN_OR_RETURN(c.situ_beta, f.Double("activation_situ_beta", 4.0));
    MOESHARD_ASSIGN_OR_RETURN(c.situ_linear_beta, f.Double("activation_situ_linear_beta", 25.0));
  } else {
    c.activation = ExpertActivation::kSwiGlu;
  }
  // Not in the released config; vLLM's default for Kimi-K3 (models.md).
  c.min_moe_intermediate_per_partition = 256;
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerSpec{});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    c.layers[static_cast<size_t>(i)].attention = AttentionKind::kMla;
    c.layers[static_cast<size_t>(i)].moe =
        i >= c.first_k_dense_replace && (i - c.first_k_dense_replace) % freq == 0;
  }
  if (f.Has("linear_attn_config")) MOESHARD_RETURN_IF_ERROR(ParseLinearAttention(f, c));
  return family::ParseMoonVit(top, c);
}

// Kimi Delta Attention on `layers`.
void AddKdaAttention(family::TensorList& t, const std::vector<int64_t>& layers) {
  const ModelConfig& c = t.config();
  const KdaConfig& k = c.kda;
  using C = TensorCategory;
  const int64_t H = c.hidden_size, P = k.num_heads * k.head_dim;
  const std::string p = "model.layers.{layer}.self_attn.";
  for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
    t.Linear(p + proj, C::kAttention, P, H, TpSplit::kColumn, layers);
  }
  for (const char* conv : {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"}) {
    t.Vector(p + conv, C::kAttention, {P, 1, k.short_conv_kernel}, TpSplit::kColumn, layers,
             DType::kF32);
  }
  // Stored as [head_dim] (128); the engines read the first num_heads (96) and split them.
  TensorDef& a_log = t.Vector(p + "A_log", C::kAttention, {std::max(k.head_dim, k.num_heads)},
                              TpSplit::kColumn, layers, DType::kF32);
  a_log.split_extent = k.num_heads;
  t.Vector(p + "dt_bias", C::kAttention, {P}, TpSplit::kColumn, layers, DType::kF32);
  t.Linear(p + "f_a_proj", C::kAttention, k.low_rank_dim, H, TpSplit::kReplicated, layers);
  t.Linear(p + "f_b_proj", C::kAttention, P, k.low_rank_dim, TpSplit::kColumn, layers);
  t.Linear(p + "b_proj", C::kAttention, k.num_heads, H, TpSplit::kColumn, layers);
  if (k.full_rank_gate) {
    t.Linear(p + "g_proj", C::kAttention, P, H, TpSplit::kColumn, layers);
  } else {
    t.Linear(p + "g_a_proj", C::kAttention, k.low_rank_dim, H, TpSplit::kReplicated, layers);
    t.Linear(p + "g_b_proj", C::kAttention, P, k.low_rank_dim, TpSplit::kColumn, layers);
  }
  t.Vector(p + "o_norm.weight", C::kAttention, {k.head_dim}, TpSplit::kReplicated, layers,
           DType::kF32);
  t.Linear(p + "o_proj", C::kAttention, H, P, TpSplit::kRow, layers);
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, kPrefix);
  using C = TensorCategory;
  const int64_t H = c.hidden_size;
  const std::vector<int64_t> all = family::AllLayers(c), moe = family::MoeLayers(c);
  family::AddEmbeddingsAndHead(t);
  family::AddLayerNorms(t);
  if (c.attn_res_block_size > 0) {
    // Attention residuals: per layer and once after the last layer, a norm and a [1, H]
    // scoring projection for each residual stream (replicated, never quantized).
    for (const char* s : {"self_attention_res", "mlp_res"}) {
      const std::string p = fmt::format("model.layers.{{layer}}.{}_", s);
      t.Vector(p + "norm.weight", C::kNorm, {H}, TpSplit::kReplicated, all, c.dtype);
      t.Vector(p + "proj.weight", C::kNorm, {1, H}, TpSplit::kReplicated, all, c.dtype);
    }
    t.Global("model.output_attn_res_norm.weight", C::kNorm, {H}, TpSplit::kReplicated,
             StagePlacement::kLastStage, c.dtype);
    t.Global("model.output_attn_res_proj.weight", C::kNorm, {1, H}, TpSplit::kReplicated,
             StagePlacement::kLastStage, c.dtype);
  }
  AddKdaAttention(t, family::LayersOf(c, AttentionKind::kKda));
  family::AddMlaAttention(t, family::LayersOf(c, AttentionKind::kMla));
  family::AddGatedMlp(t, "model.layers.{layer}.mlp", C::kDenseMlp, c.intermediate_size,
                      family::DenseLayers(c));
  const std::string moe_module = "model.layers.{layer}.block_sparse_moe";
  family::AddRouter(t, moe_module + ".gate", moe);
  family::AddSharedExperts(t, moe_module + ".shared_experts", moe);
  if (c.latent_moe) {
    const int64_t L = c.routed_expert_hidden_size;
    t.Linear(moe_module + ".routed_expert_down_proj", C::kLatentProj, L, H, TpSplit::kReplicated,
             moe, family::Quantizable::kNo, TensorRole::kLatentDown);
    t.Linear(moe_module + ".routed_expert_up_proj", C::kLatentProj, H, L, TpSplit::kReplicated, moe,
             family::Quantizable::kNo, TensorRole::kLatentUp);
    if (c.latent_moe_use_norm) {
      t.Vector(moe_module + ".routed_expert_norm.weight", C::kLatentProj, {L}, TpSplit::kReplicated,
               moe, c.dtype, TensorRole::kLatentNorm);
    }
  }
  std::vector<TensorDef> out = t.Take();
  family::AddMoonVit(c, out);
  return out;
}

ExpertLayout Experts(const ModelConfig& c) {
  return family::PerExpertLayout(c, kPrefix, "model.layers.{layer}.block_sparse_moe", "w1", "w3",
                                 "w2");
}

}  // namespace

const FamilyDescriptor& MoeshardFamily_kimi_k3() {
  static const FamilyDescriptor d{
      .name = "kimi_k3",
      .model_types = {"kimi_k3"},
      .summary = "Kimi-K3: KDA + MLA, attention residuals, latent MoE, MXFP4 experts, MoonViT",
      .text_prefix = kPrefix,
      .nested_text_config = true,
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
