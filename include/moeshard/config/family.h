// Model families as data: one FamilyDescriptor per family says how its config.json is read,
// which tensors its checkpoints hold (by role, with their names, shapes, stored dtypes and
// whether they are quantized), how the routed experts are stored, and where the language model
// sits in the checkpoint (a "language_model." prefix for multimodal wrappers).
//
// The planner, the loader, sizing from checkpoint headers, `inspect` and the runtime all read
// the descriptor: no other file spells a checkpoint tensor name. A descriptor lives in
// src/config/families/<name>.cc and is registered by that file existing (CMake generates the
// registry), so adding a family is one descriptor file, one preset in models/ and its tests
// (docs/families.md).
//
// Names are templates: "{layer}" stands for a decoder layer index, "{expert}" for a routed
// expert index. Linear weights are named by their module ("...self_attn.q_proj"); the leaves
// ("weight", "weight_packed", "weight_scale", ...) come from the weight-format table
// (base/weight_format.h), so a format's spelling has one owner too.
//
// Thread safety: descriptors are immutable statics; the functions are pure.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moeshard/base/dtype.h"
#include "moeshard/base/status.h"
#include "moeshard/base/weight_format.h"
#include "moeshard/config/model_config.h"

namespace moeshard {

enum class TensorCategory {
  kEmbedding,
  kAttention,
  kDenseMlp,
  kRouter,
  kSharedExperts,
  kLatentProj,
  kRoutedExperts,
  kNorm,  // layer norms, and Kimi-K3's attention-residual mixing tensors
  kLmHead,
  kVision,  // vision tower and multimodal projector
};
inline constexpr TensorCategory kAllCategories[] = {
    TensorCategory::kEmbedding,     TensorCategory::kAttention,     TensorCategory::kDenseMlp,
    TensorCategory::kRouter,        TensorCategory::kSharedExperts, TensorCategory::kLatentProj,
    TensorCategory::kRoutedExperts, TensorCategory::kNorm,          TensorCategory::kLmHead,
    TensorCategory::kVision};
inline constexpr size_t kNumCategories = std::size(kAllCategories);
const char* TensorCategoryName(TensorCategory category);  // "routed_experts", ...

// What the MoE runtime needs a tensor for; everything else is kOther (planned and loaded, not
// run by the MoE layer).
enum class TensorRole {
  kOther,
  kPreMoeNorm,      // the norm in front of the MoE block (post_attention_layernorm)
  kRouter,          // [E, H]
  kRouterBias,      // [E]
  kCorrectionBias,  // [E] fp32 e_score_correction_bias (noaux_tc)
  kHashTable,       // [vocab, top_k] I64 or I32: the experts of each token id (hash routing)
  kSharedGate,      // [S, H]
  kSharedUp,        // [S, H]
  kSharedDown,      // [H, S]
  kSharedGateProj,  // [1, H]: the per-token sigmoid gate on the shared experts' output
  kLatentDown,      // [L, H]: hidden -> latent before the routed experts
  kLatentUp,        // [H, L]: latent -> hidden after them
  kLatentNorm,      // [L]
  kExpertsW13,      // routed experts, rank layout (plan/shard_plan.h)
  kExpertsW2,
  kExpertsW13Bias,
  kExpertsW2Bias,
};
const char* TensorRoleName(TensorRole role);

// Which part of a (possibly quantized) tensor a shard is.
enum class TensorPart {
  kWeight,       // the weight values (quantized storage where the format says so)
  kScale,        // the format's scales
  kShapeMeta,    // compressed-tensors `weight_shape` I64 [2]: the logical [out, in]
  kZeroPoint,    // the format's zero points (int4-zp: U8 [out, in/g], one per byte)
  kGlobalScale,  // the format's per-tensor scale (nvfp4: F32, a multiplier)
  kInputScale,   // a checkpoint's activation scale (ModelOpt input_scale, compressed-tensors
                 // input_global_scale): F32, one per tensor; loaded as stored, unused on CPU
  kGroupIndex,   // GPTQ g_idx: I32 [in], the group of each input channel (i / g without
                 // act-order); loaded as stored
  kValue,        // a plain tensor (norm, bias, conv, ...)
};

// How attention tensor parallelism splits a tensor (the engines' parallel linear classes).
enum class TpSplit {
  kReplicated,  // every rank of the stage holds all of it (ReplicatedLinear, norms)
  kColumn,      // dim 0 split (ColumnParallelLinear, VocabParallelEmbedding, per-head vectors)
  kRow,         // dim 1 split (RowParallelLinear)
  kKvColumn,    // dim 0 split in units of `unit` (KV heads), replicated when heads < TP
};

// Which pipeline stage holds a non-layer tensor.
enum class StagePlacement {
  kLayers,      // per decoder layer: the stage holding the layer
  kFirstStage,  // embeddings
  kLastStage,   // final norm, head
  kEveryStage,  // every stage loads it (Kimi-K3's vision tower: neither engine guards it by
                // pipeline rank)
};

// One logical tensor of a model as its checkpoint stores it, before any rank is chosen.
struct TensorDef {
  std::string name;     // full checkpoint name (prefix included); a module name when `linear`
  bool linear = false;  // [out, in] weight: storage and leaves from `format`
  TensorRole role = TensorRole::kOther;
  TensorCategory category = TensorCategory::kAttention;
  DType dtype = DType::kBF16;  // stored dtype (linear: the unquantized dtype)
  std::vector<int64_t> shape;  // logical; [out, in] for linear weights
  TpSplit split = TpSplit::kReplicated;
  int64_t unit = 1;  // kKvColumn: head_dim
  // The split dimension holds `sections` equal blocks, each split over TP on its own (a fused
  // q/k/v weight under QKVParallelLinear): rank r holds slice r of every block.
  int64_t sections = 1;
  // Non-empty: the split dimension holds these blocks of unequal sizes instead, each split
  // over TP on its own (Qwen3-Next's depthwise conv over q, k and v: [key, key, value] rows,
  // vLLM mamba_v2_sharded_weight_loader); `sections` is then their count.
  std::vector<int64_t> section_sizes;
  // Only the first `split_extent` entries of the split dimension are split (and read); the
  // rest is stored but read by no rank (0: the whole dimension). Kimi-K3 stores A_log as
  // [head_dim] = 128 entries of which the engines read the first num_heads = 96.
  int64_t split_extent = 0;
  // > 0: split only when TP divides this head count, else replicated (vLLM runs the vision
  // encoder data-parallel when its heads do not divide the TP size).
  int64_t split_heads = 0;
  WeightScheme format;      // linear: how the checkpoint stores it (kBf16 when unquantized)
  bool shape_meta = false;  // linear: the checkpoint also stores `<module>.weight_shape`
  StagePlacement where = StagePlacement::kLayers;
  std::vector<int64_t> layers;  // kLayers: the decoder layers that hold it, ascending
  // Non-empty: the checkpoint does not store this tensor; it is a copy of `tied_source` (a
  // tied lm_head), planned only where it lives on another pipeline stage than its source.
  std::string tied_source;
};

// How a family stores its routed experts.
struct ExpertLayout {
  // Rank tensors are `rank_prefix` + "w13_weight", "w13_weight_scale", "w2_bias", ...
  // ("{layer}" placeholder).
  std::string rank_prefix;
  bool fused = false;  // one tensor per layer over all experts (gpt-oss) instead of per expert
  // Per expert: module templates ("{layer}", "{expert}"); gate empty for ungated experts.
  std::string gate, up, down;
  // Fused over experts [E, ...]: module names ("{layer}"), with gate/up rows interleaved (row
  // 2j gate j, 2j+1 up j) when `gate_up_interleaved`.
  std::string fused_gate_up, fused_down;
  bool gate_up_interleaved = false;
  // Fused, unquantized: stored input-major ([E, in, out]); the loader transposes.
  bool fused_in_major = false;
  // Fused, quantized: suffixes of the weight and scale tensors ("_blocks", "_scales"); the
  // weight is [E, out, in / group, group / 2] (the block's bytes as the last dimension).
  std::string fused_weight_suffix, fused_scale_suffix;
  std::string bias_suffix;  // fused biases: module + suffix ("_bias"); empty: no biases
  DType bias_dtype = DType::kBF16;
};

class ConfigFields;  // src/config/config_fields.h

struct FamilyDescriptor {
  std::string_view name;                      // "kimi_k3"
  std::vector<std::string_view> model_types;  // config.json model_type values it reads
  std::string_view summary;                   // one line for --help and inspect
  // Prefix of every language-model tensor in the checkpoint ("language_model." for Kimi-K3
  // and Kimi-K2.5); the vision tower is named without it.
  std::string_view text_prefix;
  // Whether config.json nests the language model under `text_config`.
  bool nested_text_config = false;
  // dtype of compressed-tensors `weight_shape` tensors in this family's releases.
  DType shape_meta_dtype = DType::kI64;
  // Prefix of multi-token-prediction weights the checkpoint stores apart from the decoder layers
  // ("mtp." for Qwen3-Next and Qwen3.5: `mtp.fc`, `mtp.layers.0.*`, ...; DeepSeek-V4:
  // `mtp.0.*`); empty when the family stores none that way. Recognised and not planned, like
  // DeepSeek-V3's layer-N MTP layer.
  std::string_view mtp_prefix = {};
  // Reads the family's keys into `c` (the common ones are read before: hidden_size,
  // num_hidden_layers, vocab_size, dtype, quantization).
  Status (*parse)(const ConfigFields& text, const ConfigFields& top, ModelConfig& c) = nullptr;
  // Every non-routed tensor of the model.
  std::vector<TensorDef> (*tensors)(const ModelConfig& c) = nullptr;
  ExpertLayout (*experts)(const ModelConfig& c) = nullptr;
};

// Every registered family, sorted by name.
std::span<const FamilyDescriptor* const> Families();
// The family that reads `model_type`; nullptr when none.
const FamilyDescriptor* FindFamily(std::string_view model_type);
// "deepseek_v3 (deepseek_v3, kimi_k2), gpt_oss, ..." for error messages.
std::string KnownModelTypes();

// "{layer}" / "{expert}" replaced by the values (no-op for a negative value).
std::string ExpandName(std::string_view name_template, int64_t layer, int64_t expert = -1);

// Whether checkpoint tensor `name` is a multi-token-prediction weight of `m`: a decoder layer
// index in [num_layers, num_layers + num_mtp_layers) (DeepSeek, GLM), or a name under the
// family's `mtp_prefix` (Qwen3-Next, Qwen3.5). Engines load these only for speculative decoding,
// so they are reported, not planned. `mtp_layer`, when given, receives the layer the weight
// belongs to as the MTP layers are numbered after the decoder layers (DeepSeek-V3's 61;
// Qwen's `mtp.layers.0` is num_layers + 0), or -1 for a prefixed weight outside a layer.
bool IsMtpTensor(const ModelConfig& m, std::string_view name, int64_t* mtp_layer = nullptr);

// A checkpoint tensor name split into a template and its indices: the number after the first
// "layers." becomes "{layer}" and the number after the first "experts." "{expert}".
struct NameKey {
  std::string key;  // the template
  int64_t layer = -1;
  int64_t expert = -1;
};
NameKey KeyOfName(std::string_view name);

}  // namespace moeshard
