// Structure read from checkpoint tensor names: layer and expert indices, fused experts and the
// quantization scheme, summarised over a whole checkpoint (what `moeshard inspect` prints).
//
// ParseTensorName is deliberately family-agnostic and works on names alone, so per-family
// name mapping (DeepSeek/Kimi, Mixtral, Qwen3-MoE, gpt-oss) can build on it:
//   "model.layers.3.mlp.experts.17.down_proj.weight"  -> layer 3, expert 17, leaf "weight"
//   "model.layers.0.mlp.experts.gate_up_proj_blocks"  -> layer 0, fused experts
//   "model.layers.5.block_sparse_moe.experts.2.w1.weight" -> layer 5, expert 2
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moeshard/base/dtype.h"
#include "moeshard/weights/safetensors.h"

namespace moeshard {

struct TensorNameParts {
  std::optional<int64_t> layer_idx;   // N of a "layers.N" component pair
  std::optional<int64_t> expert_idx;  // N of an "experts.N" component pair
  bool in_experts = false;            // has an "experts" component (routed experts)
  bool in_shared_experts = false;     // has a "shared_experts" / "shared_expert" component
  std::string_view module;            // component after "experts[.N]", e.g. "down_proj"
  std::string_view leaf;              // last component, e.g. "weight", "weight_scale_inv"
};

// Splits `name` on '.'; numbers are decimal components of at most 9 digits (larger ones are not
// treated as indices). The views point into `name`.
TensorNameParts ParseTensorName(std::string_view name);

enum class ExpertQuantization {
  kNone,               // no quantization scale tensors recognised
  kFp8BlockScale,      // "weight_scale_inv" (DeepSeek-V3 128x128 fp8 blocks)
  kMxfp4Blocks,        // "_blocks" + "_scales" (gpt-oss MXFP4, U8-packed)
  kPackedWeightScale,  // "weight_packed" + "weight_scale" (compressed-tensors int4/fp4)
};
std::string_view ExpertQuantizationName(ExpertQuantization q);

struct CheckpointStructure {
  int64_t num_tensors = 0;
  int64_t total_bytes = 0;
  int64_t num_layers = 0;  // distinct layer indices
  std::optional<int64_t> max_layer_idx;
  std::map<int64_t, int64_t> experts_per_layer;  // layer -> routed experts (MoE layers only)
  int64_t num_moe_layers() const { return static_cast<int64_t>(experts_per_layer.size()); }
  bool fused_experts = false;  // experts stored as one tensor per layer (gate_up_proj ...)
  bool gate_up_fused = false;  // a "gate_up_proj" tensor exists (gpt-oss, Llama-4 style)
  bool shared_experts = false;
  std::vector<ExpertQuantization> quantization;  // every scheme recognised, in enum order
  std::map<DType, int64_t> bytes_by_dtype;
  std::map<DType, int64_t> tensors_by_dtype;
};

// Summarises the given tensors. For fused experts the expert count comes from the leading
// dimension of the fused tensor.
CheckpointStructure SummarizeCheckpoint(std::span<const TensorInfo* const> tensors);

}  // namespace moeshard
