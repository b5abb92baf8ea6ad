// ModelConfig: what moeshard reads from a Hugging Face `config.json`, normalised across the
// supported MoE families.
//
// Each family's descriptor (config/family.h, src/config/families/) reads its own spellings
// (`n_routed_experts` vs `num_experts` vs `num_local_experts`, `num_experts_per_tok` vs
// `num_experts_per_token`, Kimi-K3's `moe_router_activation_func`) into this one vocabulary
// (docs/glossary.md), including the MoE block variant (routing, shared experts, latent
// projections, biases). Per-layer facts (attention kind, dense or MoE, sliding window) are
// expanded into `layers` so later layers never re-derive them.
//
// Thread safety: plain value type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moeshard/base/dtype.h"
#include "moeshard/base/weight_format.h"

namespace moeshard {

struct FamilyDescriptor;  // config/family.h

enum class AttentionKind {
  kMla,  // multi-head latent attention (DeepSeek-V3, Kimi): KV cache holds the compressed latent
  kGqa,  // grouped-query attention: KV cache holds num_kv_heads * head_dim keys and values
  kKda,  // Kimi Delta Attention (linear attention): fixed per-sequence state, no per-token KV
  kGatedDeltaNet,  // Qwen3-Next / Qwen3.5 linear attention: fixed per-sequence state
  // DeepSeek-V4: multi-query attention over one latent KV head (head_dim wide) in a sliding
  // window, plus, on layers with a compress ratio r > 0, that KV compressed r:1 (r = 4: sparse,
  // a lightning indexer picks index_topk compressed entries; r = 128: all of them).
  kCompressedMqa,
};

enum class ScoringFunc { kSoftmax, kSigmoid };

// How the router turns logits into (expert, weight) pairs.
enum class RoutingMethod {
  kSoftmaxTopK,         // softmax over all experts, top-k, optional renormalise (Qwen3, Mixtral)
  kSigmoidGroupedTopK,  // `noaux_tc`: sigmoid + correction bias, grouped top-k (DeepSeek, Kimi)
  kTopKThenSoftmax,     // top-k over logits, softmax over the k (gpt-oss)
  kSoftmaxGroupedTopK,  // softmax, groups scored by their best expert (DeepSeek-V2
                        // `group_limited_greedy`)
  kTopKThenSigmoid,     // top-k over logits, sigmoid of each (Llama-4)
  // DeepSeek-V4 `sqrtsoftplus`: s = sqrt(softplus(logit)), top-k of s + correction bias,
  // weights the unbiased s; on its first `num_hash_layers` layers (LayerSpec::hash_routing)
  // the experts come from a token-id table instead.
  kSqrtSoftplusTopK,
};

enum class ExpertActivation {
  kSwiGlu,       // silu(gate) * up
  kSwiGluOai,    // gpt-oss: clamp 7, alpha 1.702, (up + 1), interleaved gate/up
  kSitu,         // Kimi-K3: beta*tanh(gate/beta)*sigmoid(gate) * beta_lin*tanh(up/beta_lin)
  kRelu2,        // relu(x)^2, not gated
  kGeluTanh,     // gelu_tanh(gate) * up
  kSwiGluClamp,  // DeepSeek-V4: silu(min(gate, limit)) * clamp(up, -limit, limit)
};

struct QuantizationConfig {
  // The format of the quantized weights with the group / block sizes the config gives
  // (base/weight_format.h); kBf16 when the model is not quantized.
  WeightScheme scheme;
  std::string quant_method;  // as written: "fp8", "compressed-tensors", "mxfp4", ""
  std::string format;        // compressed-tensors "format", e.g. "pack-quantized"
  // compressed-tensors pack-quantized (int4) stores a `<module>.weight_shape` I64 [2] beside
  // each quantized weight; mxfp4-pack-quantized does not.
  bool weight_shape_meta = false;
  // Modules the quantization skips. Entries are exact module names, "re:<regex>" (compressed-
  // tensors), or glob patterns with '*' (gpt-oss modules_to_not_convert).
  std::vector<std::string> ignore;
  // Set when the routed experts are stored in another scheme than the other linears
  // (DeepSeek-V4-Flash: MXFP4 experts beside fp8 block-scaled linears, `expert_dtype`).
  std::optional<WeightScheme> experts;

  bool enabled() const { return scheme.quantized(); }
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
  // `use_full_rank_gate`: one full-rank output gate g_proj [heads*head_dim, H] instead of the
  // low-rank g_a_proj / g_b_proj pair (Kimi-K3).
  bool full_rank_gate = false;
};

// Gated DeltaNet linear attention (Qwen3-Next `linear_*` keys).
struct GdnConfig {
  int64_t num_k_heads = 0;  // linear_num_key_heads (K)
  int64_t num_v_heads = 0;  // linear_num_value_heads (Vh, a multiple of K)
  int64_t k_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t conv_kernel = 0;  // linear_conv_kernel_dim
  int64_t key_dim() const { return num_k_heads * k_head_dim; }
  int64_t value_dim() const { return num_v_heads * v_head_dim; }
};

// DeepSeek-V4's attention (AttentionKind::kCompressedMqa): a low-rank q (wq_a -> q_norm -> wq_b
// over num_attention_heads heads of head_dim), one shared KV head (wkv -> kv_norm), a grouped
// low-rank output (wo_a per o_groups, wo_b), per-head sinks; the compressor and indexer on
// compressed layers.
struct CompressedMqaConfig {
  int64_t head_dim = 0;       // width of every q head and of the one KV head (512)
  int64_t rope_head_dim = 0;  // qk_rope_head_dim: the rotary part of head_dim
  int64_t q_lora_rank = 0;
  int64_t o_lora_rank = 0;
  int64_t o_groups = 0;       // output projection groups (heads per group = heads / o_groups)
  int64_t window = 0;         // sliding_window: tokens every layer keeps uncompressed
  int64_t index_n_heads = 0;  // lightning indexer (compress ratio 4)
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;  // compressed entries the indexer selects per query
};

// Manifold-constrained hyper-connections (DeepSeek-V4 mHC): hc_mult residual streams mixed
// around every sub-layer by [(2 + hc) * hc, hc * H] fp32 projections and a Sinkhorn
// normalisation. Planned and loaded; the MoE runtime runs the block between hc_pre and hc_post.
struct HyperConnectionConfig {
  int64_t hc_mult = 0;  // 0: plain residual connections
  int64_t sinkhorn_iters = 0;
  double eps = 0.0;
};

// A vision tower and its projector into the language model: Kimi's MoonViT + patch merger,
// Qwen3.5's ViT (Qwen3-VL's) + patch merger, Llama-4's ViT + pixel-shuffle adapter + projector.
// Each family's descriptor reads its own vision_config keys into these fields.
struct VisionConfig {
  int64_t num_layers = 0;  // 0: no vision tower
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t qkv_hidden_size = 0;  // width of q, k and v each
  int64_t num_heads = 0;
  int64_t patch_size = 0;
  int64_t temporal_patch_size = 1;  // frames per patch (Qwen3.5's Conv3d patch embedding)
  int64_t in_channels = 3;
  int64_t pos_emb_height = 0;  // MoonViT's 2-D position table
  int64_t pos_emb_width = 0;
  // Rows of a learned 1-D position table (Qwen3.5 num_position_embeddings; Llama-4
  // (image_size / patch_size)^2 patches plus the class token).
  int64_t num_positions = 0;
  // Patches merged into one projector input (MoonViT merge_kernel_size h*w, Qwen3.5
  // spatial_merge_size^2, Llama-4 1 / pixel_shuffle_ratio^2).
  int64_t merge_tokens = 1;
  // Llama-4's pixel-shuffle MLP: intermediate_size -> projector_input_dim -> projector_output_dim
  // (= vision_output_dim, the projector's input).
  int64_t projector_input_dim = 0;
  int64_t projector_output_dim = 0;
  bool projector_bias = false;  // Llama-4 multi_modal_projector_bias
  bool linear_bias = true;      // biases on the encoder's linears (`linear_bias`)
  bool norm_bias = true;        // LayerNorm (weight + bias) rather than RMSNorm (`norm_type`)
  // `mm_projector_type`: "patchmerger" normalises before the projection (pre_norm, with
  // biases; Kimi-K2.5), "patchmergerv2" after it (post_norm over the text width; Kimi-K3).
  bool projector_post_norm = false;
};

struct LayerSpec {
  AttentionKind attention = AttentionKind::kGqa;
  bool moe = false;      // routed experts (else a dense MLP of intermediate_size)
  bool sliding = false;  // sliding-window attention (gpt-oss alternates)
  // kCompressedMqa: the layer's KV compression ratio (0: sliding window only; 4; 128).
  int64_t compress_ratio = 0;
  // The routed experts come from a token-id table (DeepSeek-V4's first num_hash_layers).
  bool hash_routing = false;
};

struct ModelConfig {
  std::string name;                          // preset name or the path it came from
  std::string source;                        // file the fields were read from (for error messages)
  std::string model_type;                    // as written, e.g. "kimi_k3"
  std::string architecture;                  // architectures[0]
  const FamilyDescriptor* family = nullptr;  // never null in a parsed config
  DType dtype = DType::kBF16;                // torch_dtype: unquantized weights

  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t vocab_size = 0;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  // DeepSeek num_nextn_predict_layers: stored as decoder layers [num_layers, num_layers + n);
  // loaded only for speculative decoding, so not planned (reported as such).
  int64_t num_mtp_layers = 0;
  // Kimi-K3 attention residuals (`attn_res_block_size`): every layer carries residual-mixing
  // norms and projections; 0 when the model has none.
  int64_t attn_res_block_size = 0;

  // Attention.
  int64_t num_attention_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // GQA head dim
  bool attention_bias = false;
  bool attention_sinks = false;  // gpt-oss per-head sinks
  bool qk_norm = false;          // q_norm / k_norm over head_dim (GLM-4.5 use_qk_norm)
  // Full attention gates its output per head: q_proj holds q and the gate, interleaved per
  // head (Qwen3-Next attn_output_gate).
  bool attn_output_gate = false;
  // RMSNorms scale by (1 + w) rather than w (Gemma-style; Qwen3-Next's Qwen3NextRMSNorm).
  bool norm_plus_one = false;
  int64_t sliding_window = 0;
  MlaConfig mla;
  KdaConfig kda;
  GdnConfig gdn;
  CompressedMqaConfig cmqa;
  HyperConnectionConfig hc;

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
  // The shared experts' output is scaled per token by sigmoid(shared_expert_gate . x), a
  // [1, H] weight (Qwen2-MoE, Qwen3-Next, Qwen3.5-MoE).
  bool shared_expert_gate = false;
  // The routing weight multiplies the expert's input instead of its output (Llama-4; vLLM
  // `apply_router_weight_on_input`, top-1 only).
  bool router_weight_on_input = false;
  ExpertActivation activation = ExpertActivation::kSwiGlu;
  double situ_beta = 4.0;
  double situ_linear_beta = 25.0;
  double swiglu_limit = 7.0;  // kSwiGluOai and kSwiGluClamp clamp
  double swiglu_alpha = 1.702;
  // The model's own floor for the per-partition intermediate size (vLLM's
  // min_moe_intermediate_per_partition, 256 for Kimi-K3); 0 when the model sets none.
  int64_t min_moe_intermediate_per_partition = 0;

  std::vector<LayerSpec> layers;  // [num_layers]
  QuantizationConfig quant;
  VisionConfig vision;

  int64_t num_moe_layers() const;
  int64_t num_dense_layers() const { return num_layers - num_moe_layers(); }
  int64_t num_layers_of(AttentionKind kind) const;
  bool gated() const { return activation != ExpertActivation::kRelu2; }
  // The family's name ("kimi_k3"); "?" before parsing.
  std::string_view family_name() const;
  // The routed experts' storage format (the quantization scheme, or kBf16).
  const WeightScheme& expert_scheme() const {
    return quant.experts ? *quant.experts : quant.scheme;
  }
  // Layers whose experts come from a token-id table (LayerSpec::hash_routing).
  int64_t num_hash_layers() const;
};

const char* AttentionKindName(AttentionKind kind);
const char* ExpertActivationName(ExpertActivation act);
const char* RoutingMethodName(RoutingMethod method);

}  // namespace moeshard
