// ModelConfig: what moeshard reads from a Hugging Face `config.json`, normalised across the
// supported MoE families.
//
// Families: deepseek_v3 (DeepSeek-V3/R1, Kimi-K2/K2.5), kimi_k3 (language model nested under
// `text_config`; latent MoE; hybrid MLA/KDA attention), qwen3_moe, mixtral, gpt_oss. Field
// spellings differ per family (`n_routed_experts` vs `num_experts` vs `num_local_experts`,
// `num_experts_per_tok` vs `num_experts_per_token`); this struct uses one vocabulary
// (docs/glossary.md). Per-layer facts (attention kind, dense or MoE, sliding window) are
// expanded into `layers` so later layers never re-derive them.
//
// Thread safety: plain value type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moeshard/base/dtype.h"

namespace moeshard {

enum class ModelFamily { kDeepseekV3, kKimiK3, kQwen3Moe, kMixtral, kGptOss };

enum class AttentionKind {
  kMla,  // multi-head latent attention (DeepSeek-V3, Kimi): KV cache holds the compressed latent
  kGqa,  // grouped-query attention: KV cache holds num_kv_heads * head_dim keys and values
  kKda,  // Kimi Delta Attention (linear attention): fixed per-sequence state, no per-token KV
};

enum class ScoringFunc { kSoftmax, kSigmoid };

// How the router turns logits into (expert, weight) pairs.
enum class RoutingMethod {
  kSoftmaxTopK,          // softmax over all experts, top-k, optional renormalise (Qwen3, Mixtral)
  kSigmoidGroupedTopK,   // `noaux_tc`: sigmoid + correction bias, grouped top-k (DeepSeek, Kimi)
  kTopKThenSoftmax,      // top-k over logits, softmax over the k (gpt-oss)
};

enum class ExpertActivation {
  kSwiGlu,     // silu(gate) * up
  kSwiGluOai,  // gpt-oss: clamp 7, alpha 1.702, (up + 1), interleaved gate/up
  kSitu,       // Kimi-K3: beta*tanh(gate/beta)*sigmoid(gate) * beta_lin*tanh(up/beta_lin)
  kRelu2,      // relu(x)^2, not gated
  kGeluTanh,   // gelu_tanh(gate) * up
};

enum class QuantMethod {
  kNone,
  kFp8Block,  // fp8 e4m3 weights with [block_out, block_in] fp32 scales (DeepSeek-V3)
  kMxfp4,     // E2M1 weights, one E8M0 scale per 32 (compressed-tensors mxfp4, gpt-oss mxfp4)
  kInt4,      // symmetric int4 with per-group scales (compressed-tensors pack-quantized)
};

struct QuantizationConfig {
  QuantMethod method = QuantMethod::kNone;
  std::string quant_method;  // as written: "fp8", "compressed-tensors", "mxfp4", ""
  std::string format;        // compressed-tensors "format", e.g. "pack-quantized"
  int group_size = 0;        // elements per scale along the input dim (mxfp4 32, int4 32)
  int block_out = 0;         // fp8 block rows (128)
  int block_in = 0;          // fp8 block cols (128)
  // Modules the quantization skips. Entries are exact module names, "re:<regex>" (compressed-
  // tensors), or glob patterns with '*' (gpt-oss modules_to_not_convert).
  std::vector<std::string> ignore;

  bool enabled() const { return method != QuantMethod::kNone; }
  // Whether `module` (e.g. "model.layers.3.mlp.shared_experts.down_proj") stays unquantized.
  bool IsIgnored(const std::string& module) const;
};

struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0: no LoRA on q (q_proj is full rank)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool output_gate = false;  // Kimi-K3 MLA has a gated output
};

struct KdaConfig {
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  int64_t short_conv_kernel = 0;
  // Rows of KDA's low-rank projections (= head_dim for Kimi's f_a/g_a): TP must divide it.
  int64_t low_rank_dim = 0;
};

struct LayerSpec {
  AttentionKind attention = AttentionKind::kGqa;
  bool moe = false;      // routed experts (else a dense MLP of intermediate_size)
  bool sliding = false;  // sliding-window attention (gpt-oss alternates)
};

struct ModelConfig {
  std::string name;         // preset name or the path it came from
  std::string source;       // file the fields were read from (for error messages)
  std::string model_type;   // as written, e.g. "kimi_k3"
  std::string architecture; // architectures[0]
  ModelFamily family = ModelFamily::kDeepseekV3;
  DType dtype = DType::kBF16;  // torch_dtype: unquantized weights

  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t vocab_size = 0;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  int64_t num_mtp_layers = 0;  // DeepSeek num_nextn_predict_layers (not planned; reported)

  // Attention.
  int64_t num_attention_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // GQA head dim
  bool attention_bias = false;
  bool attention_sinks = false;  // gpt-oss per-head sinks
  int64_t sliding_window = 0;
  MlaConfig mla;
  KdaConfig kda;

  // Dense MLP (layers with moe == false).
  int64_t intermediate_size = 0;

  // MoE.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t num_shared_experts = 0;
  int64_t shared_expert_intermediate_size = 0;  // total width of all shared experts
  int64_t first_k_dense_replace = 0;
  // Width the routed experts run in: hidden_size, or the latent width of latent MoE.
  int64_t routed_expert_hidden_size = 0;
  bool latent_moe = false;
  bool latent_moe_use_norm = false;
  ScoringFunc scoring = ScoringFunc::kSoftmax;
  RoutingMethod routing = RoutingMethod::kSoftmaxTopK;
  bool norm_topk_prob = false;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool router_bias = false;          // gpt-oss router has a bias
  bool has_correction_bias = false;  // e_score_correction_bias (noaux_tc)
  bool expert_bias = false;          // gpt-oss experts have biases
  bool gate_up_fused = false;        // gpt-oss stores gate_up_proj fused, gate/up interleaved
  ExpertActivation activation = ExpertActivation::kSwiGlu;
  double situ_beta = 4.0;
  double situ_linear_beta = 25.0;
  double swiglu_limit = 7.0;
  double swiglu_alpha = 1.702;
  // The model's own floor for the per-partition intermediate size (vLLM's
  // min_moe_intermediate_per_partition, 256 for Kimi-K3); 0 when the model sets none.
  int64_t min_moe_intermediate_per_partition = 0;

  std::vector<LayerSpec> layers;  // [num_layers]
  QuantizationConfig quant;

  int64_t num_moe_layers() const;
  int64_t num_dense_layers() const { return num_layers - num_moe_layers(); }
  int64_t num_layers_of(AttentionKind kind) const;
  bool gated() const { return activation != ExpertActivation::kRelu2; }
};

const char* ModelFamilyName(ModelFamily family);  // "deepseek_v3", "kimi_k3", ...
const char* AttentionKindName(AttentionKind kind);
const char* ExpertActivationName(ExpertActivation act);
const char* QuantMethodName(QuantMethod method);
const char* RoutingMethodName(RoutingMethod method);

}  // namespace moeshard
