// The MoE kernel backend catalog: each backend's alignment of the per-rank intermediate size
// (I_local) and of the hidden (or latent) width, which weight formats it runs, and where it
// applies. The backend, not the model, owns physical padding (vLLM PR 50583).
//
// Facts from ../shared/reference/backends-and-history.md; moeshard's own CPU kernels declare
// theirs as `moeshard-cpu` (kept equal to include/moeshard/kernels' constants by a test).
//
// Thread safety: the catalog is immutable after first use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/config/model_config.h"

namespace moeshard {

// What a backend allocates after loading beside the checkpoint's routed-expert tensors of one
// weight format (vLLM's process_weights_after_loading), as copies of some of them.
struct BackendWeightExtras {
  WeightFormat format = WeightFormat::kBf16;
  bool fp32_bias_copies = false;   // the bf16 expert biases become fp32 copies (+1x their bytes)
  bool scales_kept_twice = false;  // swizzled copies of the scales beside the originals (+1x)
  // fp8 block scales [.., N/bn, K/bk] (fp32) become per-column group scales [.., K/bk, N] in
  // the model dtype (bf16): Marlin's weight-only FP8. Applies to every fp8 linear of the rank.
  bool fp8_block_scales_per_column = false;
  std::string source;
};

struct BackendSpec {
  std::string name;
  std::string description;
  // I_local alignment; when `intermediate_align_small` > 0 it applies to I_local <=
  // `small_threshold` (ROCm AITER CK: 64 up to 192, else 128).
  int64_t intermediate_align = 1;
  int64_t intermediate_align_small = 0;
  int64_t small_threshold = 0;
  int64_t hidden_align = 1;
  std::vector<WeightFormat> formats;   // weight formats it runs
  bool ep_only = false;                // owns dispatch/combine; needs expert parallelism
  bool exact_expert_division = false;  // experts (slots) must divide by the EP size
  std::string source;                  // where the numbers come from
  std::vector<BackendWeightExtras> weight_extras = {};  // by format; none: the tensors alone

  // The alignment for a given raw I_local.
  int64_t IntermediateAlignFor(int64_t raw_local) const;
  bool Supports(WeightFormat format) const;
  // The extras for `format`, or null.
  const BackendWeightExtras* ExtrasFor(WeightFormat format) const;
};

const std::vector<BackendSpec>& BackendCatalog();

// By name; an unknown name lists the known ones.
Result<const BackendSpec*> FindBackend(const std::string& name);

// The backend `auto` picks for a model's expert format: triton (bf16), block-fp8 (fp8; marlin
// where the GPU has no native FP8), marlin (int4; mxfp4 of compressed-tensors checkpoints),
// and for quant_method "mxfp4" (gpt-oss) triton from compute capability 9.0 (gpu_sm 90; 0, an
// unknown GPU, counts as modern), marlin below.
const BackendSpec& DefaultBackend(const ModelConfig& model, bool native_fp8 = true, int gpu_sm = 0);

}  // namespace moeshard
