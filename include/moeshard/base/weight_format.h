// Weight formats: the one table that says how each format stores a linear weight [rows, cols]
// (rows = output features, cols = input features, nn.Linear layout). The planner sizes tensors
// from it, the loader slices checkpoints by it, the kernels decode by it and the runtime binds
// weights by it; nothing else restates a format's storage rules.
//
//   format     element  weight tensor               scale tensor                       granule
//   bf16       16 bit   BF16 [rows, cols]           none                               1 x 1
//   fp8-block   8 bit   F8_E4M3 [rows, cols]        F32 scale_inv                      block_rows x
//   group
//                                                   [ceil(rows/block_rows), ceil(cols/group)]
//   mxfp4       4 bit   U8 [rows, cols/2]           U8 E8M0 [rows, cols/32]            1 x 32
//   int4        4 bit   U8 [rows, cols/2]           BF16 [rows, cols/group]            1 x group
//   int4-zp     4 bit   U8 [rows, cols/2]           F16 [rows, cols/group]             1 x group
//                       + zero points U8 [rows, cols/group] (0..15, one per byte)
//   nvfp4       4 bit   U8 [rows, cols/2]           F8_E4M3 [rows, cols/16]            1 x 16
//                       + one F32 global scale per tensor
//
// Values: int4 (code - 8) x scale; int4-zp (code - zero) x scale (AWQ and GPTQ int4: asymmetric,
// unsigned codes, fp16 scales, groups of 32-128); nvfp4 E2M1 x E4M3 x global (NVIDIA NVFP4: the
// per-16 E4M3 scale and the tensor's fp32 global scale, multiplied; checkpoints that store the
// global scale's reciprocal are inverted by the loader). These are the kernels' layouts; the
// AWQ/GPTQ checkpoint layouts (int32-packed, transposed) are mapped onto them when loading.
//
// 4-bit formats pack two values per byte along the input dimension, the even column in the low
// nibble; a checkpoint may spell the same bytes as I32 [rows, cols/8] (compressed-tensors
// pack-quantized). The granule is the smallest slice a rank may hold along each dimension so
// that no scale is shared by two ranks. fp8 blocks are 128 x 128 in DeepSeek-V3, but the size
// comes from the checkpoint's config (`weight_block_size`) and travels in WeightScheme.
//
// Checkpoints store the same formats in other layouts (QuantLayout below): AutoAWQ and AutoGPTQ
// pack int32 words transposed, compressed-tensors packs asymmetric zero points along the output
// dimension, ModelOpt names NVFP4's leaves its own way. The rank layout is always the table's;
// the loader converts (weights/checkpoint_map.h).
//
// Thread safety: the table is immutable; everything here is a pure function.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "moeshard/base/dtype.h"

namespace moeshard {

enum class WeightFormat {
  kBf16,      // unquantized (the model dtype; bf16 for every supported release)
  kFp8Block,  // fp8 e4m3fn with 2-D block scales (DeepSeek-V3 weight_scale_inv)
  kMxfp4,     // E2M1 with one E8M0 scale per 32 values (OCP MX)
  kInt4,      // symmetric int4 (nibble - 8) with one bf16 scale per group
  kInt4Zp,    // asymmetric int4 (nibble - zero) with one fp16 scale and zero point per group
  kNvfp4,     // E2M1 with one E4M3 scale per 16 values and an fp32 global scale per tensor
};
inline constexpr WeightFormat kAllWeightFormats[] = {WeightFormat::kBf16,   WeightFormat::kFp8Block,
                                                     WeightFormat::kMxfp4,  WeightFormat::kInt4,
                                                     WeightFormat::kInt4Zp, WeightFormat::kNvfp4};

enum class ScaleLayout {
  kNone,     // no scales
  kPerRow,   // one scale per `group` values of each row (mxfp4, int4)
  kBlock2D,  // one scale per [block_rows, group] block (fp8-block)
};

// How a checkpoint stores a quantized linear (module M):
//   kNative             the table's layout and leaves (M.weight + M.weight_scale_inv,
//   M.weight_packed
//                       + M.weight_scale, ...): DeepSeek fp8, gpt-oss / compressed-tensors mxfp4,
//                       compressed-tensors symmetric int4
//   kAwq                AutoAWQ GEMM (int4-zp): M.qweight I32 [in, out/8], eight output columns a
//                       word in nibble order 0,2,4,6,1,3,5,7; M.qzeros I32 [in/g, out/8] likewise;
//                       M.scales F16 [in/g, out]
//   kGptq               AutoGPTQ (int4-zp): M.qweight I32 [in/8, out], eight input rows a word in
//                       order; M.qzeros I32 [in/g, out/8] storing zero - 1; M.scales F16 [in/g,
//                       out]
//   kGptqV2             GPTQModel `checkpoint_format: gptq_v2`: as kGptq, zero stored as is
//   kCompressedTensors  compressed-tensors asymmetric int4 (int4-zp): M.weight_packed I32
//                       [out, in/8], M.weight_scale [out, in/g] in the model dtype,
//                       M.weight_zero_point I32 [out/8, in/g] packed along the output; NVFP4:
//                       M.weight_global_scale F32 [1] is a divisor (w = e2m1 * e4m3 / global)
//                       fp8 with block_structure: M.weight_scale F32 [out/br, in/g] (the
//                       fp8-block table's weight_scale_inv under another name)
//   kModelOpt           ModelOpt NVFP4: M.weight U8 [out, in/2], M.weight_scale F8_E4M3
//                       [out, in/16], M.weight_scale_2 F32 [] a multiplier
//   kFp8PerChannel      fp8 with one scale per output row (compressed-tensors `strategy:
//                       channel`): M.weight F8_E4M3 [out, in], M.weight_scale F32 [out, 1]
//   kFp8PerTensor       fp8 with one scale per tensor (compressed-tensors `strategy: tensor`,
//                       ModelOpt FP8): M.weight F8_E4M3 [out, in], M.weight_scale F32 [] or [1]
//   kDeepseekV4         DeepSeek-V4's release: fp8 M.weight F8_E4M3 [out, in] with M.scale
//                       F8_E8M0 [out/br, in/g] (powers of two, `scale_fmt: ue8m0`); MXFP4
//                       experts M.weight I8 [out, in/2] with M.scale F8_E8M0 [out, in/32]
// The two fp8 layouts are held as fp8-block with 1-row blocks as wide as the kernels' K block
// (kFp8RowUniformGroup): the rank's scale tensor repeats each row's scale across its blocks,
// so any split of either dimension keeps every scale whole (RowUniform()).
enum class QuantLayout {
  kNative,
  kAwq,
  kGptq,
  kGptqV2,
  kCompressedTensors,
  kModelOpt,
  kFp8PerChannel,
  kFp8PerTensor,
  kDeepseekV4,
};
inline constexpr int64_t kFp8RowUniformGroup = 2048;
const char* QuantLayoutName(QuantLayout layout);  // "native", "awq", "gptq", ...

struct WeightScheme;
// The checkpoint leaves (M.<leaf>) of a quantized linear in its scheme's layout; "" where the
// format has no such part.
struct QuantLeaves {
  std::string_view weight, scale, zero, global;
  std::string_view input;        // an activation scale stored per linear ("" when none)
  std::string_view group_index;  // GPTQ's g_idx ("" when none)
};
QuantLeaves CheckpointLeaves(const WeightScheme& scheme);

// One row of the table.
struct WeightFormatSpec {
  WeightFormat format;
  std::string_view name;  // "bf16", "fp8-block", "mxfp4", "int4", "int4-zp", "nvfp4"
  int element_bits;       // bits per weight value
  DType weight_dtype;     // storage dtype of the weight tensor
  DType scale_dtype;      // storage dtype of the scale tensor (kBool when none)
  ScaleLayout scale_layout;
  int64_t default_group;              // input-dimension values per scale
  int64_t default_block_rows;         // output rows per scale (kBlock2D), else 1
  bool fixed_group;                   // the group size is part of the format (mxfp4: 32)
  bool zero_points;                   // asymmetric formats store zero points (int4-zp)
  std::string_view weight_leaf;       // checkpoint leaf of the weight: "weight", "weight_packed"
  std::string_view scale_leaf;        // checkpoint leaf of the scales: "", "weight_scale_inv", ...
  DType zero_dtype = DType::kBool;    // storage of the zero points (kBool when none), per scale
  std::string_view zero_leaf = "";    // checkpoint leaf of the zero points
  bool global_scale = false;          // one F32 scale per tensor on top of the group scales
  std::string_view global_leaf = "";  // checkpoint leaf of the global scale
};

const WeightFormatSpec& FormatSpec(WeightFormat format);
std::string_view WeightFormatName(WeightFormat format);

// A format with the group and block sizes one checkpoint uses.
struct WeightScheme {
  WeightFormat format = WeightFormat::kBf16;
  int64_t group = 1;       // input-dimension values per scale (fp8: block columns)
  int64_t block_rows = 1;  // output rows per scale (fp8: block rows), else 1
  QuantLayout layout = QuantLayout::kNative;  // how checkpoints store it (loader only)
  // The checkpoint stores an activation scale per linear (ModelOpt; compressed-tensors with
  // static input activations), which the plan holds as the checkpoint does.
  bool input_scale = false;
  // GPTQ act-order (`desc_act: true`): input channel k belongs to group g_idx[k] (the
  // checkpoint's per-linear `g_idx`), not k / group, so every channel finds its scale and zero
  // point through g_idx. A rank holding a slice of the input keeps every group's scales and
  // zero points (vLLM's GPTQ layers do the same for row-parallel act-order weights).
  bool act_order = false;

  // The format's defaults (fp8 128 x 128, mxfp4 32, int4 32, int4-zp 128, nvfp4 16).
  static WeightScheme Default(WeightFormat format);
  const WeightFormatSpec& spec() const { return FormatSpec(format); }
  bool quantized() const { return format != WeightFormat::kBf16; }
  // Every scale of a row holds the same value (per-channel and per-tensor fp8).
  bool RowUniform() const {
    return layout == QuantLayout::kFp8PerChannel || layout == QuantLayout::kFp8PerTensor;
  }
  bool packed() const { return spec().element_bits == 4; }

  // Storage of one [rows, cols] matrix. `dense_dtype` is the unquantized storage dtype (the
  // model dtype) and only matters for kBf16.
  DType WeightDType(DType dense_dtype = DType::kBF16) const;
  int64_t WeightRowBytes(int64_t cols, DType dense_dtype = DType::kBF16) const;
  std::vector<int64_t> WeightShape(int64_t rows, int64_t cols) const;  // in weight dtype units
  bool has_scales() const { return spec().scale_layout != ScaleLayout::kNone; }
  int64_t ScaleRows(int64_t rows) const;
  int64_t ScaleCols(int64_t cols) const;
  int64_t ScaleRowBytes(int64_t cols) const;
  std::vector<int64_t> ScaleShape(int64_t rows, int64_t cols) const;  // empty when none
  int64_t WeightBytes(int64_t rows, int64_t cols, DType dense_dtype = DType::kBF16) const;
  int64_t ScaleBytes(int64_t rows, int64_t cols) const;
  // Zero points: one per scale (int4-zp), else none; the global scale: one F32 per tensor.
  bool has_zero_points() const { return spec().zero_points; }
  int64_t ZeroBytes(int64_t rows, int64_t cols) const;
  bool has_global_scale() const { return spec().global_scale; }

  // Storage coordinates of the logical slice [begin, end) of the output (`rows`) or input
  // dimension: rows stay rows; along the input, the weight counts its storage elements
  // (packed: bytes) and the scales count groups (fp8: block rows along the output).
  std::pair<int64_t, int64_t> WeightSlice(bool rows, int64_t begin, int64_t end) const;
  std::pair<int64_t, int64_t> ScaleSlice(bool rows, int64_t begin, int64_t end) const;

  // Smallest slice of the output (rows) and input (cols) dimension a rank may hold so that
  // every scale stays on one rank (and, for layouts that pack eight output rows into one int32
  // word, every word); a dimension that is rows of one tensor and columns of
  // another (the MoE intermediate) needs SplitGranule().
  int64_t RowGranule() const;
  int64_t ColGranule() const;
  int64_t SplitGranule() const;  // lcm of the two

  bool operator==(const WeightScheme&) const = default;
};

}  // namespace moeshard
