#include "moeshard/plan/backend.h"

#include <fmt/format.h>

#include <algorithm>

namespace moeshard {

int64_t BackendSpec::IntermediateAlignFor(int64_t raw_local) const {
  if (intermediate_align_small > 0 && raw_local <= small_threshold) return intermediate_align_small;
  return intermediate_align;
}

bool BackendSpec::Supports(WeightFormat method) const {
  return std::find(formats.begin(), formats.end(), method) != formats.end();
}

const BackendWeightExtras* BackendSpec::ExtrasFor(WeightFormat format) const {
  for (const BackendWeightExtras& e : weight_extras) {
    if (e.format == format) return &e;
  }
  return nullptr;
}

const std::vector<BackendSpec>& BackendCatalog() {
  using Q = WeightFormat;
  static const std::vector<BackendSpec> catalog = {
      {.name = "marlin",
       .description = "Marlin / batched Marlin weight-only GEMM (MXFP4, int4, AWQ/GPTQ, fp8)",
       .intermediate_align = 128,
       .hidden_align = 256,
       .formats = {Q::kMxfp4, Q::kInt4, Q::kInt4Zp, Q::kFp8Block},
       .source = "vLLM Marlin MoE tile families (n%64,k%128)/(n%128,k%64); I%128, H%256",
       .weight_extras = {{.format = Q::kFp8Block,
                          .fp8_block_scales_per_column = true,
                          .source = "vLLM marlin_utils_fp8.py prepare_moe_fp8_layer_for_marlin "
                                    "and prepare_fp8_layer_for_marlin: block scales "
                                    ".to(orig_dtype), transposed and repeat_interleave'd by "
                                    "block_n to [K/bk, N]; the weights repack in place "
                                    "(gptq_marlin_repack, same bytes)"}}},
      {.name = "flashinfer-cutlass",
       .description = "FlashInfer CUTLASS fused MoE (MXFP4 x BF16/MXFP8, bf16, fp8)",
       .intermediate_align = 128,
       .hidden_align = 128,
       .formats = {Q::kMxfp4, Q::kBf16, Q::kFp8Block},
       .source = "FlashInfer CUTLASS MoE: I%128, H%128"},
      {.name = "flashinfer-trtllm",
       .description = "FlashInfer TensorRT-LLM-gen MoE (MXFP4 x BF16/MXFP8)",
       .intermediate_align = 128,
       .hidden_align = 256,
       .formats = {Q::kMxfp4},
       .source = "FlashInfer TRT-LLM MoE: I%128 (older releases 256), H%256"},
      {.name = "deepgemm-megamoe",
       .description = "DeepGEMM MegaMoE (owns dispatch and combine; expert parallel only)",
       .intermediate_align = 512,
       .hidden_align = 512,
       .formats = {Q::kMxfp4},
       .ep_only = true,
       .exact_expert_division = true,
       .source = "DeepGEMM MegaMoE: multiples of 512 (MXFP4), EP only, exact expert division"},
      {.name = "deepgemm-mxfp4",
       .description = "DeepGEMM grouped GEMM for MXFP4",
       .intermediate_align = 128,
       .hidden_align = 128,
       .formats = {Q::kMxfp4},
       .source = "DeepGEMM MXFP4: I%128"},
      {.name = "block-fp8",
       .description = "block-scaled FP8 grouped GEMM (128x128 scales)",
       .intermediate_align = 128,
       .hidden_align = 128,
       .formats = {Q::kFp8Block},
       .source = "block FP8: I%128 (I=1536 at TP8 gives 192: rejected)"},
      {.name = "flashinfer-fp8",
       .description = "FlashInfer FP8 MoE",
       .intermediate_align = 16,
       .hidden_align = 16,
       .formats = {Q::kFp8Block},
       .source = "FlashInfer FP8: I%16"},
      {.name = "triton",
       .description = "Triton fused MoE (vLLM's generic path; bf16 and fp8)",
       .intermediate_align = 64,
       .hidden_align = 1,
       .formats = {Q::kBf16, Q::kFp8Block, Q::kMxfp4, Q::kInt4},
       .source = "vLLM generic fallback: I%64",
       .weight_extras = {{.format = Q::kMxfp4,
                          .fp32_bias_copies = true,
                          .scales_kept_twice = true,
                          .source = "vLLM Mxfp4MoEMethod.process_weights_after_loading, Triton "
                                    "branch: w13/w2 biases .to(torch.float32); _swizzle_mxfp4 "
                                    "keeps w13/w2_weight_scale registered beside the swizzled "
                                    "scales (docs/uneven-shards.md; the swizzled layouts' own "
                                    "padding is not modelled)"}}},
      {.name = "aiter-ck",
       .description = "ROCm AITER CK fused MoE (bf16)",
       .intermediate_align = 128,
       .intermediate_align_small = 64,
       .small_threshold = 192,
       .hidden_align = 1,
       .formats = {Q::kBf16, Q::kFp8Block},
       .source = "ROCm AITER CK bf16: 64 if I_local <= 192, else 128"},
      {.name = "aiter-mxfp4",
       .description = "ROCm AITER MXFP4 MoE (padding must be zero-filled)",
       .intermediate_align = 256,
       .hidden_align = 256,
       .formats = {Q::kMxfp4},
       .source = "ROCm AITER MXFP4: I%256, H%256, zero-filled padding"},
      {.name = "cpu",
       .description = "emulation / plain CPU path (no alignment: 96 stays 96)",
       .intermediate_align = 1,
       .hidden_align = 1,
       .formats = {Q::kBf16, Q::kFp8Block, Q::kMxfp4, Q::kInt4, Q::kInt4Zp, Q::kNvfp4},
       .source = "emulation / plain CPU: none"},
      {.name = "cpu-amx",
       .description = "CPU AMX grouped GEMM (I%32, else a silent slow fallback)",
       .intermediate_align = 32,
       .hidden_align = 32,
       .formats = {Q::kBf16, Q::kInt4},
       .source = "CPU AMX grouped GEMM: multiple of 32"},
      {.name = "moeshard-cpu",
       .description = "moeshard's own CPU kernels (AVX-512 BF16, SIMD, portable); any shape",
       .intermediate_align = 1,
       .hidden_align = 1,
       .formats = {Q::kBf16, Q::kFp8Block, Q::kMxfp4, Q::kInt4, Q::kInt4Zp, Q::kNvfp4},
       .source = "include/moeshard/kernels: no shape constraint beyond the quantization group"},
  };
  return catalog;
}

Result<const BackendSpec*> FindBackend(const std::string& name) {
  std::string names;
  for (const BackendSpec& b : BackendCatalog()) {
    if (b.name == name) return &b;
    names += (names.empty() ? "" : ", ") + b.name;
  }
  return InvalidArgumentError(
      fmt::format("plan: '--moe-backend {}': unknown backend (known: auto, {})", name, names));
}

const BackendSpec& DefaultBackend(const ModelConfig& model, bool native_fp8, int gpu_sm) {
  std::string name = "triton";
  switch (model.expert_scheme().format) {
    case WeightFormat::kBf16: name = "triton"; break;
    // vLLM Fp8MoEMethod: use_marlin = not has_device_capability(89).
    case WeightFormat::kFp8Block: name = native_fp8 ? "block-fp8" : "marlin"; break;
    // vLLM Mxfp4MoEMethod (quant_method "mxfp4", gpt-oss), get_mxfp4_backend: Marlin when the
    // device capability's major is below 9 (or triton_kernels is missing), else Triton's
    // matmul_ogs (FlashInfer on SM100 when installed: not chosen here). Compressed-tensors
    // MXFP4 (Kimi-K3) takes its own MoE method, on Marlin.
    case WeightFormat::kMxfp4:
      name = model.quant.quant_method == "mxfp4" && (gpu_sm == 0 || gpu_sm >= 90) ? "triton"
                                                                                  : "marlin";
      break;
    case WeightFormat::kInt4: name = "marlin"; break;
    case WeightFormat::kInt4Zp: name = "marlin"; break;
    // The GPU backends' NVFP4 alignments are not in the catalog yet: plan without padding.
    case WeightFormat::kNvfp4: name = "cpu"; break;
  }
  return **FindBackend(name);
}

}  // namespace moeshard
