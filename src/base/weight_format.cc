#include "moeshard/base/weight_format.h"

#include "base/check.h"
#include "moeshard/base/math.h"

namespace moeshard {
namespace {

// The table (see the header). Sources: DeepSeek-V3 `weight_block_size` [128, 128] with F32
// `weight_scale_inv`; OCP MX v1.0 (MXFP4: 32 E2M1 values per E8M0 scale); compressed-tensors
// pack-quantized int4 (`weight_packed`, BF16 `weight_scale` per group); AutoAWQ / AutoGPTQ
// (`qweight`, fp16 `scales`, 4-bit `qzeros`, group_size 128 by default); NVIDIA NVFP4 (16 E2M1
// values per E4M3 scale, an fp32 per-tensor scale).
constexpr WeightFormatSpec kTable[] = {
    {WeightFormat::kBf16, "bf16", 16, DType::kBF16, DType::kBool, ScaleLayout::kNone, 1, 1, true,
     false, "weight", ""},
    {WeightFormat::kFp8Block, "fp8-block", 8, DType::kF8E4M3, DType::kF32, ScaleLayout::kBlock2D,
     128, 128, false, false, "weight", "weight_scale_inv"},
    {WeightFormat::kMxfp4, "mxfp4", 4, DType::kU8, DType::kU8, ScaleLayout::kPerRow, 32, 1, true,
     false, "weight_packed", "weight_scale"},
    {WeightFormat::kInt4, "int4", 4, DType::kU8, DType::kBF16, ScaleLayout::kPerRow, 32, 1, false,
     false, "weight_packed", "weight_scale"},
    // AWQ / GPTQ int4 (group 128 by default; fp16 scales, 4-bit zero points) and the
    // compressed-tensors asymmetric spelling (`weight_zero_point`).
    {WeightFormat::kInt4Zp, "int4-zp", 4, DType::kU8, DType::kF16, ScaleLayout::kPerRow, 128, 1,
     false, true, "weight_packed", "weight_scale", DType::kU8, "weight_zero_point"},
    // NVFP4 (compressed-tensors nvfp4-pack-quantized names; ModelOpt spells the global scale
    // `weight_scale_2`).
    {WeightFormat::kNvfp4, "nvfp4", 4, DType::kU8, DType::kF8E4M3, ScaleLayout::kPerRow, 16, 1,
     true, false, "weight_packed", "weight_scale", DType::kBool, "", true, "weight_global_scale"},
};

}  // namespace

const WeightFormatSpec& FormatSpec(WeightFormat format) {
  for (const WeightFormatSpec& s : kTable) {
    if (s.format == format) return s;
  }
  MOESHARD_CHECK(false, "weight format {} has no table entry", static_cast<int>(format));
  return kTable[0];
}

std::string_view WeightFormatName(WeightFormat format) { return FormatSpec(format).name; }

const char* QuantLayoutName(QuantLayout layout) {
  switch (layout) {
    case QuantLayout::kNative: return "native";
    case QuantLayout::kAwq: return "awq";
    case QuantLayout::kGptq: return "gptq";
    case QuantLayout::kGptqV2: return "gptq_v2";
    case QuantLayout::kCompressedTensors: return "compressed-tensors";
    case QuantLayout::kModelOpt: return "modelopt";
    case QuantLayout::kFp8PerChannel: return "fp8-per-channel";
    case QuantLayout::kFp8PerTensor: return "fp8-per-tensor";
    case QuantLayout::kDeepseekV4: return "deepseek-v4";
  }
  return "?";
}

QuantLeaves CheckpointLeaves(const WeightScheme& q) {
  const WeightFormatSpec& s = q.spec();
  QuantLeaves l{s.weight_leaf, s.scale_leaf, s.zero_leaf, s.global_leaf, "", ""};
  switch (q.layout) {
    case QuantLayout::kAwq: l = {"qweight", "scales", "qzeros", "", "", ""}; break;
    case QuantLayout::kGptq:
    case QuantLayout::kGptqV2: l = {"qweight", "scales", "qzeros", "", "", "g_idx"}; break;
    case QuantLayout::kModelOpt: l.weight = "weight", l.global = "weight_scale_2"; break;
    case QuantLayout::kFp8PerChannel:
    case QuantLayout::kFp8PerTensor: l = {"weight", "weight_scale", "", "", "", ""}; break;
    case QuantLayout::kDeepseekV4: l = {"weight", "scale", "", "", "", ""}; break;
    case QuantLayout::kCompressedTensors:
      if (q.format == WeightFormat::kFp8Block) l = {"weight", "weight_scale", "", "", "", ""};
      break;
    case QuantLayout::kNative: break;
  }
  if (q.input_scale) {
    // compressed-tensors names NVFP4's activation scale input_global_scale, the rest input_scale.
    l.input = q.layout == QuantLayout::kCompressedTensors && q.format == WeightFormat::kNvfp4
                  ? "input_global_scale"
                  : "input_scale";
  }
  return l;
}

WeightScheme WeightScheme::Default(WeightFormat format) {
  const WeightFormatSpec& s = FormatSpec(format);
  return WeightScheme{format, s.default_group, s.default_block_rows};
}

DType WeightScheme::WeightDType(DType dense_dtype) const {
  return format == WeightFormat::kBf16 ? dense_dtype : spec().weight_dtype;
}

int64_t WeightScheme::WeightRowBytes(int64_t cols, DType dense_dtype) const {
  if (format == WeightFormat::kBf16) return cols * DTypeBits(dense_dtype) / 8;
  return cols * spec().element_bits / 8;
}

std::vector<int64_t> WeightScheme::WeightShape(int64_t rows, int64_t cols) const {
  return {rows, packed() ? CeilDiv(cols, 2) : cols};
}

int64_t WeightScheme::ScaleRows(int64_t rows) const {
  switch (spec().scale_layout) {
    case ScaleLayout::kNone: return 0;
    case ScaleLayout::kPerRow: return rows;
    case ScaleLayout::kBlock2D: return CeilDiv(rows, block_rows);
  }
  return 0;
}

int64_t WeightScheme::ScaleCols(int64_t cols) const {
  return spec().scale_layout == ScaleLayout::kNone ? 0 : CeilDiv(cols, group);
}

int64_t WeightScheme::ScaleRowBytes(int64_t cols) const {
  if (!has_scales()) return 0;
  return ScaleCols(cols) * DTypeBits(spec().scale_dtype) / 8;
}

std::vector<int64_t> WeightScheme::ScaleShape(int64_t rows, int64_t cols) const {
  if (!has_scales()) return {};
  return {ScaleRows(rows), ScaleCols(cols)};
}

int64_t WeightScheme::WeightBytes(int64_t rows, int64_t cols, DType dense_dtype) const {
  return rows * WeightRowBytes(cols, dense_dtype);
}

int64_t WeightScheme::ScaleBytes(int64_t rows, int64_t cols) const {
  return ScaleRows(rows) * ScaleRowBytes(cols);
}

int64_t WeightScheme::ZeroBytes(int64_t rows, int64_t cols) const {
  if (!has_zero_points()) return 0;
  return ScaleRows(rows) * ScaleCols(cols) * DTypeBits(spec().zero_dtype) / 8;
}

std::pair<int64_t, int64_t> WeightScheme::WeightSlice(bool rows, int64_t begin, int64_t end) const {
  if (rows) return {begin, end};
  return {WeightShape(1, begin)[1], WeightShape(1, end)[1]};
}

std::pair<int64_t, int64_t> WeightScheme::ScaleSlice(bool rows, int64_t begin, int64_t end) const {
  if (!rows && RowUniform()) return {0, ScaleCols(end - begin)};  // any block holds the row's scale
  const int64_t unit =
      rows ? (spec().scale_layout == ScaleLayout::kBlock2D ? block_rows : 1) : group;
  return {begin / unit, CeilDiv(end, unit)};
}

int64_t WeightScheme::RowGranule() const {
  if (spec().scale_layout == ScaleLayout::kBlock2D) return block_rows;
  // AWQ packs eight output columns into each qweight / qzeros word, GPTQ and compressed-tensors
  // eight output rows into each zero-point word.
  const bool packs_rows = format == WeightFormat::kInt4Zp && layout != QuantLayout::kNative;
  return packs_rows ? 8 : 1;
}

int64_t WeightScheme::ColGranule() const {
  if (!has_scales()) return packed() ? 2 : 1;
  if (RowUniform()) return 1;
  return group;
}

int64_t WeightScheme::SplitGranule() const { return Lcm(RowGranule(), ColGranule()); }

}  // namespace moeshard
