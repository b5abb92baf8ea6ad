// Building blocks the family descriptors compose (private to the config layer): a builder of
// TensorDef lists, and the tensor sets several families share (MLA, GQA and KDA attention,
// dense MLPs, routers, shared experts, embeddings). A shared block owns the names of its
// tensors; a family passes only the module path where the block sits.
//
// Thread safety: a builder is used by one thread; the blocks are pure.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moeshard/config/family.h"

namespace moeshard::family {

std::vector<int64_t> AllLayers(const ModelConfig& c);
std::vector<int64_t> MoeLayers(const ModelConfig& c);
std::vector<int64_t> DenseLayers(const ModelConfig& c);
std::vector<int64_t> LayersOf(const ModelConfig& c, AttentionKind kind);

enum class Quantizable {
  kNo,   // engines build it unquantized whatever the config says (routers, latent projections)
  kYes,  // quantized with the config's scheme unless its ignore list names the module
};

// Collects TensorDefs. Names given to it are relative to the language model; it prepends the
// family's text prefix ("language_model.") unless the list was made with prefix "".
class TensorList {
 public:
  TensorList(const ModelConfig& c, std::string prefix) : c_(c), prefix_(std::move(prefix)) {}
  // `rename` maps every full name (prefix included) to the checkpoint's, for layouts a prefix
  // cannot express (Qwen3.5: "model.X" -> "model.language_model.X", lm_head unchanged).
  TensorList(const ModelConfig& c, std::string prefix, std::string (*rename)(const std::string&))
      : c_(c), prefix_(std::move(prefix)), rename_(rename) {}

  // A linear weight [out, in] named by its module.
  TensorDef& Linear(const std::string& module, TensorCategory cat, int64_t out, int64_t in,
                    TpSplit split, const std::vector<int64_t>& layers,
                    Quantizable q = Quantizable::kYes, TensorRole role = TensorRole::kOther);
  // A plain tensor (norm, bias, conv, per-head vector) with its stored dtype.
  TensorDef& Vector(const std::string& name, TensorCategory cat, std::vector<int64_t> shape,
                    TpSplit split, const std::vector<int64_t>& layers, DType dtype,
                    TensorRole role = TensorRole::kOther);
  // A non-layer tensor on one stage (embeddings, head, final norms, vision tower).
  TensorDef& Global(const std::string& name, TensorCategory cat, std::vector<int64_t> shape,
                    TpSplit split, StagePlacement where, DType dtype);
  // A non-layer linear weight.
  TensorDef& GlobalLinear(const std::string& module, TensorCategory cat, int64_t out, int64_t in,
                          TpSplit split, StagePlacement where, Quantizable q);

  const ModelConfig& config() const { return c_; }
  // The list. A quantizable linear whose layers the ignore list treats differently (Qwen3.5
  // NVFP4 leaves layer 1's attention in bf16) is split here into one entry per treatment.
  std::vector<TensorDef> Take();

 private:
  TensorDef& Add(TensorDef t);
  const ModelConfig& c_;
  std::string prefix_;
  std::string (*rename_)(const std::string&) = nullptr;
  std::vector<TensorDef> out_;
  // Quantizable linears: their index in out_ and module template as the ignore list names it.
  std::vector<std::pair<size_t, std::string>> quantizable_;
  TensorDef dropped_;  // returned for a per-layer tensor on no layer (not listed)
};

// model.embed_tokens, model.norm and lm_head (vocab-parallel). A tied head is not stored: it is
// listed with `tied_source` so the planner can give the last stage its own copy under PP.
void AddEmbeddingsAndHead(TensorList& t);
// input_layernorm and post_attention_layernorm on every layer (the second is the MoE block's
// input norm).
void AddLayerNorms(TensorList& t);
// DeepSeek-style multi-head latent attention on `layers` (q LoRA or full q, the compressed KV,
// optional output gate g_proj): LoRA down-projections replicated, up-projections split by head.
void AddMlaAttention(TensorList& t, const std::vector<int64_t>& layers);
struct GqaOptions {
  // gpt-oss's MXFP4 covers only the experts: its attention stays bf16 whatever the config says.
  Quantizable quant = Quantizable::kYes;
  bool bias = false;      // q/k/v/o biases (gpt-oss)
  bool qkv_bias = false;  // q/k/v biases only (Qwen2-MoE, GLM-4.5)
  bool sinks = false;     // per-head attention sinks (gpt-oss)
  bool qk_norm = false;   // q_norm / k_norm over head_dim (Qwen3)
  // q_proj also holds a per-head output gate, interleaved per head ([q_h, gate_h], Qwen3-Next
  // attn_output_gate): twice the rows, still split by head.
  bool q_gate = false;
};
// Grouped-query attention: q column-parallel, k/v split by KV head (replicated when fewer KV
// heads than TP), o row-parallel.
void AddGqaAttention(TensorList& t, const std::vector<int64_t>& layers, const GqaOptions& o);
// A gated dense MLP `<module>.{gate,up,down}_proj` of width `width` on `layers`.
void AddGatedMlp(TensorList& t, const std::string& module, TensorCategory cat, int64_t width,
                 const std::vector<int64_t>& layers, TensorRole gate_role = TensorRole::kOther,
                 TensorRole up_role = TensorRole::kOther,
                 TensorRole down_role = TensorRole::kOther);
// The router `<module>` [E, H] (never quantized), with its bias and the noaux_tc correction
// bias when the config has them.
struct RouterOptions {
  std::optional<DType> weight_dtype;  // stored dtype of the weight (default: the model's)
  // Where `e_score_correction_bias` sits (default: the router module; MiniMax-M2 keeps it on
  // the sparse block, `block_sparse_moe.e_score_correction_bias`).
  std::string correction_bias_module;
};
void AddRouter(TensorList& t, const std::string& module, const std::vector<int64_t>& layers,
               const RouterOptions& o = {});
// Shared experts at `<module>` (gate/up column-parallel, down row-parallel by default).
void AddSharedExperts(TensorList& t, const std::string& module, const std::vector<int64_t>& layers);
// The shared experts' output gate `<module>` [1, H] (Qwen2-MoE's shared_expert_gate: a plain
// torch Linear in every engine, so replicated and never quantized).
void AddSharedExpertGate(TensorList& t, const std::string& module,
                         const std::vector<int64_t>& layers);

struct GdnOptions {
  // Qwen3.5's in_proj_qkv (split per q / k / v block) and in_proj_z / _b / _a instead of
  // Qwen3-Next's grouped in_proj_qkvz / in_proj_ba.
  bool split_projections = false;
  // Stored dtypes of A_log [num_v_heads] and the gated norm [v_head_dim], which differ between
  // releases (nullopt: the model's dtype).
  std::optional<DType> a_log_dtype = std::nullopt;
  std::optional<DType> norm_dtype = std::nullopt;
};
// Gated DeltaNet on `layers`.
void AddGatedDeltaNet(TensorList& t, const std::vector<int64_t>& layers, const GdnOptions& o);
// Everything but the routed experts of a Qwen hybrid model (Qwen3-Next, Qwen3.5-MoE).
void AddQwenHybridTensors(TensorList& t, const GdnOptions& o);

// The per-expert layout of DeepSeek-style checkpoints: `<moe>.experts.{expert}.<gate|up|down>`
// with rank tensors `<moe>.experts.w13_*` (names relative to the text prefix).
ExpertLayout PerExpertLayout(const ModelConfig& c, const std::string& prefix,
                             const std::string& moe_module, const std::string& gate,
                             const std::string& up, const std::string& down);

}  // namespace moeshard::family

namespace moeshard {
class ConfigFields;
}

namespace moeshard::family {

// Config reading shared by families.
// GQA attention fields: num_attention_heads, num_key_value_heads (default: the heads),
// head_dim (default hidden / heads, or required when `head_dim_required`), attention_bias.
Status ParseGqa(const ConfigFields& f, ModelConfig& c, bool head_dim_required = false,
                bool attention_bias_default = false);
// The Qwen MoE text model (Qwen3-MoE, and Qwen2-MoE before its shared expert): GQA, softmax
// top-k renormalised when norm_topk_prob, MoE every `decoder_sparse_step` layers except
// `mlp_only_layers`, the expert count as `num_experts` or `num_local_experts` (transformers 5).
// `norm_topk_prob_default` is the family's config default when the key is absent: false for
// Qwen2MoeConfig and Qwen3MoeConfig, true for Qwen3NextConfig.
Status ParseQwenMoe(const ConfigFields& f, ModelConfig& c, bool norm_topk_prob_default = false);
// The Qwen hybrid-attention keys after the MoE ones (Qwen3-Next, Qwen3.5-MoE): the gated shared
// expert, the gated full attention, (1 + w) norms, the Gated DeltaNet `linear_*` sizes and the
// layer kinds (`layer_types`, or every `full_attention_interval`-th layer full).
Status ParseQwenHybrid(const ConfigFields& f, ModelConfig& c);
// The MLA fields of DeepSeek-V3 and Kimi (q_lora_rank, kv_lora_rank, head dims).
Status ParseMla(const ConfigFields& f, ModelConfig& c);
// The defaults of the routing keys a config may leave out: DeepSeek-V3's (sigmoid, noaux_tc,
// renormalised) or DeepSeek-V2's (DeepseekV2Config: softmax, greedy, not renormalised).
struct DeepseekDefaults {
  const char* scoring = "sigmoid";
  const char* topk_method = "noaux_tc";
  bool norm_topk_prob = true;
};
inline constexpr DeepseekDefaults kDeepseekV2Defaults{"softmax", "greedy", false};
// DeepSeek-style routing: sigmoid (noaux_tc, correction bias) or softmax scores (greedy, or
// group-limited by each group's best expert), grouped top-k, renormalisation, scaling. Kimi-K3
// spells the keys moe_router_activation_func, num_expert_group and moe_renormalize; both
// spellings are read.
Status ParseDeepseekRouting(const ConfigFields& f, ModelConfig& c, const DeepseekDefaults& d = {});
// The DeepSeek-V3 text model (Kimi-K2, K2-Thinking, K2.5's backbone; DeepSeek-V2 with its
// defaults): MLA on every layer, dense first layers, shared experts, SwiGLU.
Status ParseDeepseekText(const ConfigFields& f, ModelConfig& c, const DeepseekDefaults& d = {});
// Its tensors under `t`'s prefix, and its per-expert layout.
void AddDeepseekTextTensors(TensorList& t);
ExpertLayout DeepseekExperts(const ModelConfig& c, const std::string& prefix);

}  // namespace moeshard::family

namespace moeshard::family {

// A tensor of a vision tower or multimodal projector (category vision, without the text prefix,
// loaded by every pipeline stage: no engine guards the tower by pipeline rank). `split` applies
// only when TP divides `heads` (vLLM's default mm_encoder_tp_mode "weights"; otherwise the tower
// runs data-parallel, replicated); `heads` 0: split whatever the TP. `sections`: equal blocks of
// the split dimension split on their own (a fused q/k/v).
TensorDef& AddVisionTensor(TensorList& t, const std::string& name, std::vector<int64_t> shape,
                           TpSplit split, int64_t heads, int64_t sections = 1);

// MoonViT (Kimi-K2.5, Kimi-K3): `vision_config` at the top level of config.json.
Status ParseMoonVit(const ConfigFields& top, ModelConfig& c);
// Its tensors, without the text prefix: encoder blocks `vision_tower.encoder.blocks.B.{wqkv,
// wo, mlp.fc0, mlp.fc1, norm0, norm1}`, final_layernorm, patch_embed.{pos_emb, proj}, and the
// patch-merger projector `mm_projector.*`. Splits follow vLLM kimi_k25_vit.py in its default
// mm_encoder_tp_mode "weights" (wqkv per head, wo / fc1 row-, fc0 column-parallel) when TP
// divides the heads, else replicated (its data-parallel fallback); norms, patch embedding and
// projector replicated (ReplicatedLinear). Every pipeline stage loads it.
void AddMoonVit(const ModelConfig& c, std::vector<TensorDef>& out);

}  // namespace moeshard::family
