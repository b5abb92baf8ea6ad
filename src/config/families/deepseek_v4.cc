// DeepSeek-V4 (`deepseek_v4`, DeepseekV4ForCausalLM: DeepSeek-V4-Flash, -Flash-Base, -Pro).
//
// Layout, as the release stores it (DeepSeek's own naming, no "model." prefix; vLLM maps it
// with _make_deepseek_v4_weights_mapper):
//   embed.weight [V, H], head.weight [V, H], norm.weight [H] (bf16); hc_head_{fn [hc, hc*H],
//   base [hc], scale [1]} (fp32, the final hyper-connection collapse);
//   per layer L: attn_norm / ffn_norm [H] (bf16; ffn_norm is the MoE block's input norm);
//   hc_{attn,ffn}_{fn [(2+hc)*hc, hc*H], base [(2+hc)*hc], scale [3]} (fp32, the mHC mixing);
//   attn.{wq_a [q_lora, H], q_norm [q_lora], wq_b [heads*head_dim, q_lora], wkv [head_dim, H],
//   kv_norm [head_dim], wo_a [o_groups*o_lora, heads*head_dim/o_groups], wo_b [H,
//   o_groups*o_lora], attn_sink [heads] fp32};
//   on layers with compress ratio r > 0 (c = 2 when r = 4, overlapping windows, else 1):
//   attn.compressor.{ape [r, c*head_dim] fp32, wkv / wgate [c*head_dim, H] bf16, norm
//   [head_dim]}; on r = 4 layers the lightning indexer attn.indexer.{wq_b [index_heads *
//   index_head_dim, q_lora], weights_proj [index_heads, H] bf16, compressor.{ape [4,
//   2*index_head_dim], wkv, wgate [2*index_head_dim, H], norm [index_head_dim]}};
//   ffn.gate.weight [E, H] (bf16 router), ffn.gate.bias [E] fp32 (the noaux_tc correction
//   bias; vLLM maps it to e_score_correction_bias) on score-routed layers and
//   ffn.gate.tid2eid [V, k] int32 (token id -> experts) on the first num_hash_layers layers;
//   ffn.shared_experts.{w1, w3, w2} (gate, up, down; n_shared_experts * moe_intermediate_size
//   wide); ffn.experts.E.{w1, w3, w2}. The multi-token-prediction block (mtp.0.*) is not
//   planned (engines load it for speculative decoding only; vLLM skips "mtp.").
//
// The MoE block (vLLM DeepseekV4MoE, DeepSeek's reference Gate / Expert / MoE): every layer is
// MoE; scores s = sqrt(softplus(logit)) in fp32, experts chosen by s + bias (score layers) or
// read from tid2eid by token id (hash layers), weights the unbiased s renormalised
// (norm_topk_prob) times routed_scaling_factor; experts and shared expert use a clamped SwiGLU
// (swiglu_limit: gate clamped above, up both ways; vLLM SiluAndMulWithClamp); the shared
// expert's output is added. The manifold-constrained hyper-connections (hc_mult streams mixed
// by hc_pre / hc_post around the attention and the MoE sub-layer) are planned and loaded; the
// MoE runtime runs the block between them (its input is hc_pre's mixed stream, as the engine's
// ffn() receives it), with the plain residual every family's layer has (moe_runtime.h).
//
// Attention (AttentionKind::kCompressedMqa) is planned and loaded, not run. Tensor-parallel
// splits follow vLLM deepseek_v4.py / deepseek_v4_attention.py / deepseek_compressor.py:
// wq_a and wkv replicated (a fused ReplicatedLinear), q_norm / kv_norm replicated, wq_b and
// wo_a column-parallel (wo_a by output group, so TP must divide o_groups), wo_b row-parallel,
// attn_sink split by head, the compressors and the indexer replicated (vLLM: "no tensor
// parallel, just replicated"; DeepSeek's reference splits the indexer by head instead), the
// mHC tensors, router, bias and tid2eid replicated, embed / head vocab-parallel, shared
// experts column / row.
//
// Stored dtypes (DeepSeek's reference inference/model.py comments: "rmsnorm in the checkpoint
// is stored in bf16", compressor "wkv and wgate in the checkpoint is stored in bf16", "lm_head
// in the checkpoint is stored in bf16", "wo_a is FP8 in checkpoint"; tid2eid int32, gate.bias,
// attn_sink, ape and hc_* fp32; tid2eid is I64 in the checkpoint): the linears are fp8 e4m3
// with 128 x 128 block scales; the
// routed experts are MXFP4 (`expert_dtype` "fp4": E2M1 packed two per byte, one E8M0 scale per
// 32; vLLM DeepseekV4FP8Config -> Mxfp4MoEMethod) or fp8 like the rest (`expert_dtype` "fp8",
// DeepSeek-V4-Flash-Base). The router, the indexer's weights_proj and the compressors' wkv /
// wgate are built unquantized (quant_config=None) and stored bf16.
//
// The release spells the scale leaf `scale` (not `weight_scale_inv` / `weight_scale`), stores
// the fp8 linears' scales as E8M0 bytes (`scale_fmt` "ue8m0", 1 byte per 128 x 128 block) and
// the MXFP4 experts as an I8 `weight` with an F8_E8M0 `scale`: the checkpoint layout
// QuantLayout::kDeepseekV4, which the loader converts into the rank layout (the fp8 scales
// widened to the F32 the CPU kernels read: the plan holds 4 bytes a block where the checkpoint
// has 1, ~0.02% of the fp8 bytes). The MTP block is stored under `mtp.N.` (FamilyDescriptor::
// mtp_prefix): reported as multi-token prediction, not loaded.
//
// The tensor list and dtypes are checked against the released index as a third-party Rust
// crate freezes it for DeepSeek-V4-Flash-0731 (the same backbone; its DSpark draft replaces the
// MTP block): 6 model-level tensors, 1,565 / 1,576 / 1,569 tensors per layer for ratio-0,
// ratio-4 and ratio-128 layers (4,706 for the 3 hash layers, 58,179 for layers 3-39, 4,721 for
// 40-42), and its per-shard sizes (one layer per shard): layer 0's shard, 3,566,321,192
// bytes, is this list's 3,566,148,952 bytes of data plus a ~172 KB header only with tid2eid
// I64 [129280, 6], bf16 compressor projections and an fp8 wo_a; layer 2's and 3's agree too.
//
// Sources: vLLM vllm/model_executor/models/deepseek_v4.py, layers/deepseek_v4_attention.py,
// layers/deepseek_compressor.py, layers/fused_moe/router/fused_topk_bias_router.py
// (_topk_softplus_sqrt_torch), layers/activation.py (SiluAndMulWithClamp); SGLang
// python/sglang/srt/models/deepseek_v4.py (MQALayer: compress ratios {0, 4, 128}, one KV head);
// DeepSeek's reference inference/model.py as copied in public repositories (Gate, Expert, MoE,
// Compressor, Indexer, Attention, Block, ParallelHead); the released config.json of
// DeepSeek-V4-Flash as reproduced in third-party repositories (models/README.md).
#include <fmt/format.h>

#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

// Sub-layer parameters of DeepSeek-V4 attention: compress ratio 4 overlaps two windows.
int64_t CompressorWidth(int64_t ratio, int64_t head_dim) { return (ratio == 4 ? 2 : 1) * head_dim; }

Status Parse(const ConfigFields& f, const ConfigFields& /*top*/, ModelConfig& c) {
  CompressedMqaConfig& a = c.cmqa;
  MOESHARD_ASSIGN_OR_RETURN(c.num_attention_heads, f.Int("num_attention_heads", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_kv_heads, f.Int("num_key_value_heads", 1, 1));
  if (c.num_kv_heads != 1) {
    return f.Error("num_key_value_heads", "1 (DeepSeek-V4 attention has one shared KV head)",
                   std::to_string(c.num_kv_heads));
  }
  MOESHARD_ASSIGN_OR_RETURN(a.head_dim, f.Int("head_dim", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(a.rope_head_dim, f.Int("qk_rope_head_dim", std::nullopt, 0));
  if (a.rope_head_dim > a.head_dim) {
    return f.Error("qk_rope_head_dim", fmt::format("<= head_dim ({})", a.head_dim),
                   std::to_string(a.rope_head_dim));
  }
  c.head_dim = a.head_dim;
  MOESHARD_ASSIGN_OR_RETURN(a.q_lora_rank, f.Int("q_lora_rank", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(a.o_lora_rank, f.Int("o_lora_rank", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(a.o_groups, f.Int("o_groups", std::nullopt, 1));
  if (c.num_attention_heads % a.o_groups != 0) {
    return f.Error("o_groups",
                   fmt::format("a divisor of num_attention_heads ({})", c.num_attention_heads),
                   std::to_string(a.o_groups));
  }
  MOESHARD_ASSIGN_OR_RETURN(a.window, f.Int("sliding_window", std::nullopt, 1));
  c.sliding_window = a.window;

  // One ratio per decoder layer; entries past num_hidden_layers belong to the MTP block(s)
  // (Flash ships 44 for 43 layers, Flash-0731 46).
  MOESHARD_ASSIGN_OR_RETURN(std::vector<int64_t> ratios, f.IntList("compress_ratios", 0, 1 << 20));
  if (static_cast<int64_t>(ratios.size()) < c.num_layers) {
    return f.Error("compress_ratios",
                   fmt::format("one ratio per decoder layer ({} at least)", c.num_layers),
                   fmt::format("{} entries", ratios.size()));
  }
  bool indexed = false;
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerSpec{});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const int64_t r = ratios[static_cast<size_t>(i)];
    if (r != 0 && r != 4 && r != 128) {
      return f.Error("compress_ratios",
                     "0 (sliding window only), 4 (compressed sparse) or 128 (heavily compressed) "
                     "per layer, as vLLM and SGLang support",
                     fmt::format("{} for layer {}", r, i));
    }
    LayerSpec& l = c.layers[static_cast<size_t>(i)];
    l.attention = AttentionKind::kCompressedMqa;
    l.compress_ratio = r;
    l.moe = true;
    indexed = indexed || r == 4;
  }
  if (indexed) {
    MOESHARD_ASSIGN_OR_RETURN(a.index_n_heads, f.Int("index_n_heads", std::nullopt, 1));
    MOESHARD_ASSIGN_OR_RETURN(a.index_head_dim, f.Int("index_head_dim", std::nullopt, 1));
    MOESHARD_ASSIGN_OR_RETURN(a.index_topk, f.Int("index_topk", std::nullopt, 1));
  }
  MOESHARD_ASSIGN_OR_RETURN(c.hc.hc_mult, f.Int("hc_mult", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.hc.sinkhorn_iters, f.Int("hc_sinkhorn_iters", 20, 0));
  MOESHARD_ASSIGN_OR_RETURN(c.hc.eps, f.Double("hc_eps", 1e-6));

  // The MoE block.
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size,
                            f.Int("moe_intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts,
                            f.IntAlias({"n_routed_experts", "num_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts_per_tok, f.Int("num_experts_per_tok", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_shared_experts, f.Int("n_shared_experts", 0));
  c.shared_expert_intermediate_size = c.num_shared_experts * c.moe_intermediate_size;
  MOESHARD_ASSIGN_OR_RETURN(c.num_mtp_layers, f.Int("num_nextn_predict_layers", 0));
  MOESHARD_RETURN_IF_ERROR(f.Choice("scoring_func", "sqrtsoftplus", {"sqrtsoftplus"}).status());
  c.routing = RoutingMethod::kSqrtSoftplusTopK;
  c.scoring = ScoringFunc::kSigmoid;  // unused by this routing (kept for reports)
  // vLLM builds the correction bias only for topk_method "noaux_tc".
  if (f.Has("topk_method")) {
    MOESHARD_RETURN_IF_ERROR(f.Choice("topk_method", std::nullopt, {"noaux_tc"}).status());
    c.has_correction_bias = true;
  }
  MOESHARD_ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool("norm_topk_prob", true));
  MOESHARD_ASSIGN_OR_RETURN(c.routed_scaling_factor, f.Double("routed_scaling_factor", 1.0));
  MOESHARD_ASSIGN_OR_RETURN(int64_t hash_layers, f.Int("num_hash_layers", 0));
  if (hash_layers > c.num_layers) {
    return f.Error("num_hash_layers", fmt::format("<= num_hidden_layers ({})", c.num_layers),
                   std::to_string(hash_layers));
  }
  for (int64_t i = 0; i < hash_layers; ++i) c.layers[static_cast<size_t>(i)].hash_routing = true;
  MOESHARD_RETURN_IF_ERROR(f.Choice("hidden_act", "silu", {"silu"}).status());
  MOESHARD_ASSIGN_OR_RETURN(c.swiglu_limit, f.Double("swiglu_limit", 0.0));
  if (c.swiglu_limit < 0) {
    return f.Error("swiglu_limit", "a limit > 0, or 0 for no clamp",
                   fmt::format("{}", c.swiglu_limit));
  }
  // DeepSeek's reference clamps when swiglu_limit > 0 (vLLM when it is set).
  c.activation = c.swiglu_limit > 0 ? ExpertActivation::kSwiGluClamp : ExpertActivation::kSwiGlu;
  c.routed_expert_hidden_size = c.hidden_size;

  // expert_dtype: the routed experts' storage under the fp8 quantization (vLLM
  // DeepseekV4FP8Config: "fp4" MXFP4 experts, the default; "fp8" block-fp8 like the rest).
  MOESHARD_ASSIGN_OR_RETURN(std::string expert_dtype,
                            f.Choice("expert_dtype", "fp4", {"fp4", "fp8"}));
  if (expert_dtype == "fp4" && c.quant.scheme.format == WeightFormat::kFp8Block) {
    c.quant.experts = WeightScheme::Default(WeightFormat::kMxfp4);
  }
  // The release's leaves (`<module>.scale`), E8M0 fp8 block scales and I8-spelled MXFP4
  // experts (base/weight_format.h QuantLayout::kDeepseekV4): the loader converts.
  if (c.quant.scheme.format == WeightFormat::kFp8Block) {
    c.quant.scheme.layout = QuantLayout::kDeepseekV4;
    if (c.quant.experts) c.quant.experts->layout = QuantLayout::kDeepseekV4;
  }
  return Status::Ok();
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, "");
  using C = TensorCategory;
  using Q = family::Quantizable;
  const CompressedMqaConfig& a = c.cmqa;
  const int64_t H = c.hidden_size, V = c.vocab_size, nh = c.num_attention_heads;
  const int64_t hc = c.hc.hc_mult, mix = (2 + hc) * hc;
  const auto rep = TpSplit::kReplicated;
  const std::vector<int64_t> all = family::AllLayers(c);

  t.Global("embed.weight", C::kEmbedding, {V, H}, TpSplit::kColumn, StagePlacement::kFirstStage,
           c.dtype);
  TensorDef& head = t.Global("head.weight", C::kLmHead, {V, H}, TpSplit::kColumn,
                             StagePlacement::kLastStage, c.dtype);
  if (c.tie_word_embeddings) head.tied_source = "embed.weight";
  t.Global("norm.weight", C::kNorm, {H}, rep, StagePlacement::kLastStage, c.dtype);
  t.Global("hc_head_fn", C::kNorm, {hc, hc * H}, rep, StagePlacement::kLastStage, DType::kF32);
  t.Global("hc_head_base", C::kNorm, {hc}, rep, StagePlacement::kLastStage, DType::kF32);
  t.Global("hc_head_scale", C::kNorm, {1}, rep, StagePlacement::kLastStage, DType::kF32);

  const std::string l = "layers.{layer}.";
  t.Vector(l + "attn_norm.weight", C::kNorm, {H}, rep, all, c.dtype);
  t.Vector(l + "ffn_norm.weight", C::kNorm, {H}, rep, all, c.dtype, TensorRole::kPreMoeNorm);
  for (const char* sub : {"attn", "ffn"}) {
    const std::string p = l + "hc_" + sub + "_";
    t.Vector(p + "fn", C::kNorm, {mix, hc * H}, rep, all, DType::kF32);
    t.Vector(p + "base", C::kNorm, {mix}, rep, all, DType::kF32);
    t.Vector(p + "scale", C::kNorm, {3}, rep, all, DType::kF32);
  }

  // Attention on every layer; compressors and indexers where the ratio asks for them.
  const std::string at = l + "attn.";
  t.Linear(at + "wq_a", C::kAttention, a.q_lora_rank, H, rep, all);
  t.Vector(at + "q_norm.weight", C::kAttention, {a.q_lora_rank}, rep, all, c.dtype);
  t.Linear(at + "wq_b", C::kAttention, nh * a.head_dim, a.q_lora_rank, TpSplit::kColumn, all);
  t.Linear(at + "wkv", C::kAttention, a.head_dim, H, rep, all);
  t.Vector(at + "kv_norm.weight", C::kAttention, {a.head_dim}, rep, all, c.dtype);
  t.Linear(at + "wo_a", C::kAttention, a.o_groups * a.o_lora_rank, nh * a.head_dim / a.o_groups,
           TpSplit::kColumn, all);
  t.Linear(at + "wo_b", C::kAttention, H, a.o_groups * a.o_lora_rank, TpSplit::kRow, all);
  t.Vector(at + "attn_sink", C::kAttention, {nh}, TpSplit::kColumn, all, DType::kF32);
  // A compressor over `width`-wide rows on `layers` (its ape per position in the window).
  auto compressor = [&](const std::string& p, int64_t ratio, int64_t head_dim,
                        const std::vector<int64_t>& layers) {
    const int64_t w = CompressorWidth(ratio, head_dim);
    t.Vector(p + "ape", C::kAttention, {ratio, w}, rep, layers, DType::kF32);
    t.Linear(p + "wkv", C::kAttention, w, H, rep, layers, Q::kNo);
    t.Linear(p + "wgate", C::kAttention, w, H, rep, layers, Q::kNo);
    t.Vector(p + "norm.weight", C::kAttention, {head_dim}, rep, layers, c.dtype);
  };
  for (int64_t ratio : {int64_t{4}, int64_t{128}}) {
    std::vector<int64_t> layers;
    for (int64_t i : all) {
      if (c.layers[static_cast<size_t>(i)].compress_ratio == ratio) layers.push_back(i);
    }
    compressor(at + "compressor.", ratio, a.head_dim, layers);
    if (ratio == 4) {
      t.Linear(at + "indexer.wq_b", C::kAttention, a.index_n_heads * a.index_head_dim,
               a.q_lora_rank, rep, layers);
      t.Linear(at + "indexer.weights_proj", C::kAttention, a.index_n_heads, H, rep, layers, Q::kNo);
      compressor(at + "indexer.compressor.", ratio, a.index_head_dim, layers);
    }
  }

  // The MoE block: router on every layer, the correction bias on score-routed layers, the
  // token table on hash layers.
  std::vector<int64_t> hashed, scored;
  for (int64_t i : all) {
    (c.layers[static_cast<size_t>(i)].hash_routing ? hashed : scored).push_back(i);
  }
  t.Linear(l + "ffn.gate", C::kRouter, c.num_experts, H, rep, all, Q::kNo, TensorRole::kRouter);
  if (c.has_correction_bias) {
    t.Vector(l + "ffn.gate.bias", C::kRouter, {c.num_experts}, rep, scored, DType::kF32,
             TensorRole::kCorrectionBias);
  }
  // I64 in the release: its shards' sizes leave no room for anything else (see the header);
  // the engines hold it as int32 (vLLM, DeepSeek's reference), the runtime converts.
  t.Vector(l + "ffn.gate.tid2eid", C::kRouter, {V, c.num_experts_per_tok}, rep, hashed, DType::kI64,
           TensorRole::kHashTable);
  if (c.num_shared_experts > 0) {
    const std::string s = l + "ffn.shared_experts.";
    const int64_t S = c.shared_expert_intermediate_size;
    t.Linear(s + "w1", C::kSharedExperts, S, H, TpSplit::kColumn, all, Q::kYes,
             TensorRole::kSharedGate);
    t.Linear(s + "w3", C::kSharedExperts, S, H, TpSplit::kColumn, all, Q::kYes,
             TensorRole::kSharedUp);
    t.Linear(s + "w2", C::kSharedExperts, H, S, TpSplit::kRow, all, Q::kYes,
             TensorRole::kSharedDown);
  }
  return t.Take();
}

ExpertLayout Experts(const ModelConfig& c) {
  return family::PerExpertLayout(c, "", "layers.{layer}.ffn", "w1", "w3", "w2");
}

}  // namespace

const FamilyDescriptor& MoeshardFamily_deepseek_v4() {
  static const FamilyDescriptor d{
      .name = "deepseek_v4",
      .model_types = {"deepseek_v4"},
      .summary =
          "DeepSeek-V4-Flash/Pro: compressed sparse MQA, mHC, sqrtsoftplus and hash "
          "routing, clamped SwiGLU",
      .text_prefix = "",
      .mtp_prefix = "mtp.",
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
