#include "plan/model_tensors.h"

#include <fmt/format.h>

#include <functional>

#include "moeshard/base/math.h"

namespace moeshard::internal {
namespace {

std::vector<int64_t> LayersWhere(const ModelConfig& m, const std::function<bool(const LayerSpec&)>& f) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < m.num_layers; ++i) {
    if (f(m.layers[i])) out.push_back(i);
  }
  return out;
}

class Builder {
 public:
  explicit Builder(const ModelConfig& m) : m_(m) {}

  // A linear weight [out, in]; quantized unless the quantization config ignores the module.
  // Routers are never quantized (engines build them without a quant method).
  void Linear(const std::string& module, TensorCategory cat, int64_t out, int64_t in, Split split,
              const std::vector<int64_t>& layers, bool quantizable = true, int64_t unit = 1) {
    if (layers.empty()) return;
    LogicalTensor t;
    t.name = module + ".weight";
    t.category = cat;
    t.dtype = m_.dtype;
    t.shape = {out, in};
    t.split = split;
    t.unit = unit;
    t.layers = layers;
    const std::string probe = ProbeName(module, layers.front());
    if (quantizable && m_.quant.enabled() && !m_.quant.IsIgnored(probe) &&
        !(m_.family == ModelFamily::kGptOss)) {  // gpt-oss quantizes only the experts
      t.quant = m_.quant.method;
    }
    out_.push_back(std::move(t));
  }

  void Bias(const std::string& name, TensorCategory cat, int64_t n, Split split,
            const std::vector<int64_t>& layers, DType dtype) {
    Vector(name, cat, {n}, split, layers, dtype);
  }

  void Vector(const std::string& name, TensorCategory cat, std::vector<int64_t> shape, Split split,
              const std::vector<int64_t>& layers, DType dtype) {
    if (layers.empty()) return;
    LogicalTensor t;
    t.name = name;
    t.category = cat;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.split = split;
    t.layers = layers;
    out_.push_back(std::move(t));
  }

  void Global(const std::string& name, TensorCategory cat, std::vector<int64_t> shape, Split split,
              Where where) {
    LogicalTensor t;
    t.name = name;
    t.category = cat;
    t.dtype = m_.dtype;
    t.shape = std::move(shape);
    t.split = split;
    t.where = where;
    out_.push_back(std::move(t));
  }

  std::vector<LogicalTensor> Take() { return std::move(out_); }

 private:
  // The module name a quantization ignore list is matched against, with the family's prefix
  // (Kimi-K3 nests the language model under language_model.).
  std::string ProbeName(const std::string& module, int64_t layer) const {
    std::string name = module;
    const std::string ph = "{layer}";
    if (auto pos = name.find(ph); pos != std::string::npos) {
      name.replace(pos, ph.size(), std::to_string(layer));
    }
    if (m_.family == ModelFamily::kKimiK3) name = "language_model." + name;
    return name;
  }

  const ModelConfig& m_;
  std::vector<LogicalTensor> out_;
};

}  // namespace

QuantStorage QuantizedLinear(QuantMethod method, const QuantizationConfig& quant,
                             const std::vector<int64_t>& shape, DType model_dtype) {
  const int64_t out = shape[0], in = shape[1];
  switch (method) {
    case QuantMethod::kNone:
      return {model_dtype, shape, model_dtype, {}, "", "weight"};
    case QuantMethod::kFp8Block:
      return {DType::kF8E4M3, shape, DType::kF32,
              {CeilDiv(out, quant.block_out), CeilDiv(in, quant.block_in)}, "weight_scale_inv",
              "weight"};
    case QuantMethod::kMxfp4:
      return {DType::kU8, {out, CeilDiv(in, 2)}, DType::kU8, {out, CeilDiv(in, 32)},
              "weight_scale", "weight_packed"};
    case QuantMethod::kInt4:
      return {DType::kU8, {out, CeilDiv(in, 2)}, DType::kBF16,
              {out, CeilDiv(in, quant.group_size)}, "weight_scale", "weight_packed"};
  }
  return {model_dtype, shape, model_dtype, {}, "", "weight"};
}

std::vector<int64_t> StageLayers(int64_t num_layers, int64_t pp, int64_t stage) {
  std::vector<int64_t> sizes(pp, num_layers / pp);
  const int64_t rem = num_layers % pp;
  for (int64_t i = 2; i < rem + 2; ++i) sizes[pp - i] += 1;
  int64_t begin = 0;
  for (int64_t s = 0; s < stage; ++s) begin += sizes[s];
  std::vector<int64_t> out;
  for (int64_t i = 0; i < sizes[stage]; ++i) out.push_back(begin + i);
  return out;
}

std::vector<LogicalTensor> EnumerateTensors(const ModelConfig& m, const PlanOptions& options,
                                            int64_t pp) {
  Builder b(m);
  using C = TensorCategory;
  const DType f32 = DType::kF32;
  const std::vector<int64_t> all = LayersWhere(m, [](const LayerSpec&) { return true; });
  const std::vector<int64_t> moe = LayersWhere(m, [](const LayerSpec& l) { return l.moe; });
  const std::vector<int64_t> dense = LayersWhere(m, [](const LayerSpec& l) { return !l.moe; });
  const std::vector<int64_t> mla =
      LayersWhere(m, [](const LayerSpec& l) { return l.attention == AttentionKind::kMla; });
  const std::vector<int64_t> gqa =
      LayersWhere(m, [](const LayerSpec& l) { return l.attention == AttentionKind::kGqa; });
  const std::vector<int64_t> kda =
      LayersWhere(m, [](const LayerSpec& l) { return l.attention == AttentionKind::kKda; });
  const int64_t H = m.hidden_size;

  // Embeddings and head (vocab-parallel). A tied head shares the embedding unless the last
  // stage is another rank (PP > 1), where it holds its own copy.
  b.Global("model.embed_tokens.weight", C::kEmbedding, {m.vocab_size, H}, Split::kColumn,
           Where::kFirstStage);
  if (!m.tie_word_embeddings || pp > 1) {
    b.Global("lm_head.weight", C::kLmHead, {m.vocab_size, H}, Split::kColumn, Where::kLastStage);
  }
  b.Global("model.norm.weight", C::kNorm, {H}, Split::kReplicated, Where::kLastStage);

  b.Vector("model.layers.{layer}.input_layernorm.weight", C::kNorm, {H}, Split::kReplicated, all, m.dtype);
  b.Vector("model.layers.{layer}.post_attention_layernorm.weight", C::kNorm, {H}, Split::kReplicated, all, m.dtype);

  // MLA: LoRA down-projections replicated, up-projections split by heads.
  if (!mla.empty()) {
    const MlaConfig& a = m.mla;
    const int64_t nh = m.num_attention_heads;
    const int64_t qk = a.qk_nope_head_dim + a.qk_rope_head_dim;
    const std::string p = "model.layers.{layer}.self_attn.";
    if (a.q_lora_rank > 0) {
      b.Linear(p + "q_a_proj", C::kAttention, a.q_lora_rank, H, Split::kReplicated, mla);
      b.Vector(p + "q_a_layernorm.weight", C::kAttention, {a.q_lora_rank}, Split::kReplicated, mla, m.dtype);
      b.Linear(p + "q_b_proj", C::kAttention, nh * qk, a.q_lora_rank, Split::kColumn, mla);
    } else {
      b.Linear(p + "q_proj", C::kAttention, nh * qk, H, Split::kColumn, mla);
    }
    b.Linear(p + "kv_a_proj_with_mqa", C::kAttention, a.kv_lora_rank + a.qk_rope_head_dim, H,
             Split::kReplicated, mla);
    b.Vector(p + "kv_a_layernorm.weight", C::kAttention, {a.kv_lora_rank}, Split::kReplicated, mla, m.dtype);
    b.Linear(p + "kv_b_proj", C::kAttention, nh * (a.qk_nope_head_dim + a.v_head_dim),
             a.kv_lora_rank, Split::kColumn, mla);
    if (a.output_gate) {
      b.Linear(p + "g_proj", C::kAttention, nh * a.v_head_dim, H, Split::kColumn, mla);
    }
    b.Linear(p + "o_proj", C::kAttention, H, nh * a.v_head_dim, Split::kRow, mla);
  }

  // GQA: KV heads replicated when fewer than TP.
  if (!gqa.empty()) {
    const std::string p = "model.layers.{layer}.self_attn.";
    const int64_t q = m.num_attention_heads * m.head_dim, kv = m.num_kv_heads * m.head_dim;
    b.Linear(p + "q_proj", C::kAttention, q, H, Split::kColumn, gqa);
    b.Linear(p + "k_proj", C::kAttention, kv, H, Split::kKvColumn, gqa, true, m.head_dim);
    b.Linear(p + "v_proj", C::kAttention, kv, H, Split::kKvColumn, gqa, true, m.head_dim);
    b.Linear(p + "o_proj", C::kAttention, H, q, Split::kRow, gqa);
    if (m.attention_bias) {
      b.Bias(p + "q_proj.bias", C::kAttention, q, Split::kColumn, gqa, m.dtype);
      b.Bias(p + "k_proj.bias", C::kAttention, kv, Split::kKvColumn, gqa, m.dtype);
      b.Bias(p + "v_proj.bias", C::kAttention, kv, Split::kKvColumn, gqa, m.dtype);
      b.Bias(p + "o_proj.bias", C::kAttention, H, Split::kReplicated, gqa, m.dtype);
    }
    if (m.attention_sinks) {
      b.Vector(p + "sinks", C::kAttention, {m.num_attention_heads}, Split::kColumn, gqa, m.dtype);
    }
    if (m.family == ModelFamily::kQwen3Moe) {
      b.Vector(p + "q_norm.weight", C::kAttention, {m.head_dim}, Split::kReplicated, gqa, m.dtype);
      b.Vector(p + "k_norm.weight", C::kAttention, {m.head_dim}, Split::kReplicated, gqa, m.dtype);
    }
  }

  // KDA (Kimi Delta Attention), following Kimi-Linear's module layout.
  if (!kda.empty()) {
    const KdaConfig& k = m.kda;
    const int64_t width = k.num_heads * k.head_dim;
    const std::string p = "model.layers.{layer}.self_attn.";
    for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
      b.Linear(p + proj, C::kAttention, width, H, Split::kColumn, kda);
    }
    for (const char* conv : {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"}) {
      b.Vector(p + conv, C::kAttention, {width, 1, k.short_conv_kernel}, Split::kColumn, kda, m.dtype);
    }
    b.Vector(p + "A_log", C::kAttention, {k.num_heads}, Split::kColumn, kda, f32);
    b.Vector(p + "dt_bias", C::kAttention, {width}, Split::kColumn, kda, f32);
    b.Linear(p + "f_a_proj", C::kAttention, k.low_rank_dim, H, Split::kReplicated, kda);
    b.Linear(p + "f_b_proj", C::kAttention, width, k.low_rank_dim, Split::kColumn, kda);
    b.Linear(p + "b_proj", C::kAttention, k.num_heads, H, Split::kColumn, kda);
    b.Linear(p + "g_a_proj", C::kAttention, k.low_rank_dim, H, Split::kReplicated, kda);
    b.Linear(p + "g_b_proj", C::kAttention, width, k.low_rank_dim, Split::kColumn, kda);
    b.Vector(p + "o_norm.weight", C::kAttention, {k.head_dim}, Split::kReplicated, kda, m.dtype);
    b.Linear(p + "o_proj", C::kAttention, H, width, Split::kRow, kda);
  }

  // Dense MLP layers.
  {
    const std::string p = "model.layers.{layer}.mlp.";
    const int64_t I = m.intermediate_size;
    b.Linear(p + "gate_proj", C::kDenseMlp, I, H, Split::kColumn, dense);
    b.Linear(p + "up_proj", C::kDenseMlp, I, H, Split::kColumn, dense);
    b.Linear(p + "down_proj", C::kDenseMlp, H, I, Split::kRow, dense);
  }

  // Router (never quantized), correction bias.
  {
    const std::string gate = m.family == ModelFamily::kMixtral ? "model.layers.{layer}.block_sparse_moe.gate"
                             : m.family == ModelFamily::kGptOss ? "model.layers.{layer}.mlp.router"
                                                                : "model.layers.{layer}.mlp.gate";
    b.Linear(gate, C::kRouter, m.num_experts, H, Split::kReplicated, moe, false);
    if (m.router_bias) b.Bias(gate + ".bias", C::kRouter, m.num_experts, Split::kReplicated, moe, m.dtype);
    if (m.has_correction_bias) {
      b.Vector(gate + ".e_score_correction_bias", C::kRouter, {m.num_experts}, Split::kReplicated, moe, f32);
    }
  }

  // Shared experts: TP-sharded (column/row) or replicated.
  if (m.num_shared_experts > 0) {
    const std::string p = "model.layers.{layer}.mlp.shared_experts.";
    const int64_t S = m.shared_expert_intermediate_size;
    const bool sharded = options.shared_experts == SharedExpertsMode::kSharded;
    b.Linear(p + "gate_proj", C::kSharedExperts, S, H, sharded ? Split::kColumn : Split::kReplicated, moe);
    b.Linear(p + "up_proj", C::kSharedExperts, S, H, sharded ? Split::kColumn : Split::kReplicated, moe);
    b.Linear(p + "down_proj", C::kSharedExperts, H, S, sharded ? Split::kRow : Split::kReplicated, moe);
  }

  // Latent MoE projections and norm: H -> latent before the experts, latent -> H after.
  if (m.latent_moe) {
    const std::string p = "model.layers.{layer}.mlp.";
    const int64_t L = m.routed_expert_hidden_size;
    const bool sharded = options.latent_proj == LatentProjMode::kSharded;
    b.Linear(p + "latent_down_proj", C::kLatentProj, L, H, sharded ? Split::kColumn : Split::kReplicated, moe);
    b.Linear(p + "latent_up_proj", C::kLatentProj, H, L, sharded ? Split::kRow : Split::kReplicated, moe);
    if (m.latent_moe_use_norm) {
      b.Vector(p + "latent_norm.weight", C::kLatentProj, {L}, Split::kReplicated, moe, m.dtype);
    }
  }
  return b.Take();
}

}  // namespace moeshard::internal
