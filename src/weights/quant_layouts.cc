// Checkpoint layouts of quantized linears: see quant_layouts.h.
#include "weights/quant_layouts.h"

#include <fmt/format.h>

#include <cstring>

#include "base/check.h"
#include "moeshard/base/math.h"
#include "moeshard/base/numeric.h"

namespace moeshard {

const char* SourceEncodingName(SourceEncoding encoding) {
  switch (encoding) {
    case SourceEncoding::kDirect: return "direct";
    case SourceEncoding::kAwqCodes: return "awq-codes";
    case SourceEncoding::kAwqZeros: return "awq-zeros";
    case SourceEncoding::kGptqCodes: return "gptq-codes";
    case SourceEncoding::kGptqZeros: return "gptq-zeros";
    case SourceEncoding::kGptqV2Zeros: return "gptq-v2-zeros";
    case SourceEncoding::kTransposedF16: return "transposed-f16";
    case SourceEncoding::kCtZeros: return "ct-zeros";
    case SourceEncoding::kBf16ToF16: return "bf16-to-f16";
    case SourceEncoding::kReciprocalF32: return "reciprocal-f32";
    case SourceEncoding::kScalarF32: return "scalar-f32";
    case SourceEncoding::kRowScale: return "row-scale";
    case SourceEncoding::kTensorScale: return "tensor-scale";
    case SourceEncoding::kE8M0ToF32: return "e8m0-to-f32";
  }
  return "?";
}

bool RowUniformEncoding(SourceEncoding e) {
  return e == SourceEncoding::kRowScale || e == SourceEncoding::kTensorScale;
}

namespace internal {
namespace {

// AWQ's GEMM packer puts output column order[i] of each group of eight into nibble i, order =
// 0,2,4,6,1,3,5,7; column j therefore sits in nibble kAwqNibble[j].
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

uint32_t Word(const std::vector<std::byte>& buf, int64_t row, int64_t col, int64_t row_words) {
  uint32_t w;
  std::memcpy(&w, buf.data() + (row * row_words + col) * 4, 4);
  return w;
}

uint8_t Nibble(uint32_t word, int position) {
  return static_cast<uint8_t>((word >> (4 * position)) & 0xfu);
}

// Reads stored rows [r0, r1) x bytes [c0, c1) of `info` into a dense buffer.
Result<std::vector<std::byte>> ReadRect(const SafetensorsFile& file, const TensorInfo& info,
                                        int64_t row_bytes, int64_t r0, int64_t r1, int64_t c0,
                                        int64_t c1) {
  std::vector<std::byte> buf(static_cast<size_t>((r1 - r0) * (c1 - c0)));
  if (buf.empty()) return buf;
  const Slice2D w{.base_offset = 0,
                  .row_bytes = row_bytes,
                  .row_begin = r0,
                  .row_end = r1,
                  .col_begin = c0,
                  .col_end = c1,
                  .dst_row_stride = c1 - c0};
  MOESHARD_RETURN_IF_ERROR(file.ReadSlice2D(info, w, std::span<std::byte>(buf)));
  return buf;
}

// One ReadEncoded call: rows [a, b) and bytes [cb, ce) of the view of `spec`, row r written
// at out + (r - a) * stride; out_rows is the view's row count.
struct EncodedWindow {
  const SafetensorsFile& file;
  const TensorInfo& info;
  const SourceTensorSpec& spec;
  int64_t a = 0, b = 0, cb = 0, ce = 0;
  std::byte* out = nullptr;
  int64_t stride = 0;
  int64_t out_rows = 0;

  uint8_t* dst() const { return reinterpret_cast<uint8_t*>(out); }
};

// AWQ (stored [in, out/8]: input rows, words of eight outputs) or GPTQ (stored [in/8, out]:
// words of eight input rows, outputs) codes. View bytes [cb, ce) of output rows [a, b): input
// columns [2 cb, 2 ce).
Status ReadPackedCodes(const EncodedWindow& w) {
  const int64_t a = w.a, b = w.b, stride = w.stride;
  const int64_t i0 = 2 * w.cb, i1 = 2 * w.ce;
  uint8_t* dst = w.dst();
  if (w.spec.encoding == SourceEncoding::kAwqCodes) {
    const int64_t words = CeilDiv(w.out_rows, 8), w0 = a / 8, w1 = CeilDiv(b, 8);
    MOESHARD_ASSIGN_OR_RETURN(std::vector<std::byte> buf,
                              ReadRect(w.file, w.info, words * 4, i0, i1, w0 * 4, w1 * 4));
    for (int64_t o = a; o < b; ++o) {
      for (int64_t i = i0; i < i1; i += 2) {
        const uint8_t lo = Nibble(Word(buf, i - i0, o / 8 - w0, w1 - w0), kAwqNibble[o % 8]);
        const uint8_t hi = Nibble(Word(buf, i + 1 - i0, o / 8 - w0, w1 - w0), kAwqNibble[o % 8]);
        dst[(o - a) * stride + (i - i0) / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
    return Status::Ok();
  }
  const int64_t r0 = i0 / 8, r1 = CeilDiv(i1, 8);
  MOESHARD_ASSIGN_OR_RETURN(std::vector<std::byte> buf,
                            ReadRect(w.file, w.info, w.out_rows * 4, r0, r1, a * 4, b * 4));
  for (int64_t o = a; o < b; ++o) {
    for (int64_t i = i0; i < i1; i += 2) {
      const uint8_t lo = Nibble(Word(buf, i / 8 - r0, o - a, b - a), static_cast<int>(i % 8));
      const uint8_t hi =
          Nibble(Word(buf, (i + 1) / 8 - r0, o - a, b - a), static_cast<int>((i + 1) % 8));
      dst[(o - a) * stride + (i - i0) / 2] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
  return Status::Ok();
}

// AWQ / GPTQ zero points, stored [in/g, out/8]: view bytes [cb, ce) are groups.
Status ReadPackedZeros(const EncodedWindow& w) {
  const int64_t a = w.a, b = w.b, cb = w.cb, ce = w.ce;
  const int64_t words = CeilDiv(w.out_rows, 8), w0 = a / 8, w1 = CeilDiv(b, 8);
  MOESHARD_ASSIGN_OR_RETURN(std::vector<std::byte> buf,
                            ReadRect(w.file, w.info, words * 4, cb, ce, w0 * 4, w1 * 4));
  const int add = w.spec.encoding == SourceEncoding::kGptqZeros ? 1 : 0;  // v1 stores zero - 1
  for (int64_t o = a; o < b; ++o) {
    const int nibble =
        w.spec.encoding == SourceEncoding::kAwqZeros ? kAwqNibble[o % 8] : static_cast<int>(o % 8);
    for (int64_t gi = cb; gi < ce; ++gi) {
      w.dst()[(o - a) * w.stride + (gi - cb)] =
          static_cast<uint8_t>(Nibble(Word(buf, gi - cb, o / 8 - w0, w1 - w0), nibble) + add);
    }
  }
  return Status::Ok();
}

// compressed-tensors zero points, stored [out/8, in/g]: words of eight output rows, groups.
Status ReadCtZeros(const EncodedWindow& w) {
  const int64_t a = w.a, b = w.b, cb = w.cb, ce = w.ce;
  const int64_t groups = w.spec.view_shape[1], r0 = a / 8, r1 = CeilDiv(b, 8);
  MOESHARD_ASSIGN_OR_RETURN(std::vector<std::byte> buf,
                            ReadRect(w.file, w.info, groups * 4, r0, r1, cb * 4, ce * 4));
  for (int64_t o = a; o < b; ++o) {
    for (int64_t gi = cb; gi < ce; ++gi) {
      w.dst()[(o - a) * w.stride + (gi - cb)] =
          Nibble(Word(buf, o / 8 - r0, gi - cb, ce - cb), static_cast<int>(o % 8));
    }
  }
  return Status::Ok();
}

// View F16 [out, in/g], bytes [cb, ce) = groups [cb/2, ce/2); stored F16 [in/g, out].
Status ReadTransposedF16(const EncodedWindow& w) {
  const int64_t a = w.a, b = w.b;
  const int64_t g0 = w.cb / 2, g1 = w.ce / 2;
  MOESHARD_ASSIGN_OR_RETURN(std::vector<std::byte> buf,
                            ReadRect(w.file, w.info, w.out_rows * 2, g0, g1, a * 2, b * 2));
  for (int64_t o = a; o < b; ++o) {
    for (int64_t gi = g0; gi < g1; ++gi) {
      std::memcpy(w.out + (o - a) * w.stride + (gi - g0) * 2,
                  buf.data() + ((gi - g0) * (b - a) + (o - a)) * 2, 2);
    }
  }
  return Status::Ok();
}

// Stored BF16, viewed as F16 of the same shape.
Status ReadBf16ToF16(const EncodedWindow& w) {
  const int64_t a = w.a, b = w.b, cb = w.cb, ce = w.ce;
  const int64_t row_bytes = w.spec.view_shape[1] * 2;
  MOESHARD_ASSIGN_OR_RETURN(std::vector<std::byte> buf,
                            ReadRect(w.file, w.info, row_bytes, a, b, cb, ce));
  for (int64_t r = a; r < b; ++r) {
    for (int64_t c = 0; c < (ce - cb) / 2; ++c) {
      bf16_t v;
      std::memcpy(&v.bits, buf.data() + (r - a) * (ce - cb) + c * 2, 2);
      const fp16_t h = FloatToHalf(Bf16ToFloat(v));
      std::memcpy(w.out + (r - a) * w.stride + c * 2, &h, 2);
    }
  }
  return Status::Ok();
}

// View F32 [rows, blocks], bytes [cb, ce) = blocks [cb/4, ce/4); stored one byte a block.
Status ReadE8M0ToF32(const EncodedWindow& w) {
  const int64_t a = w.a, b = w.b, cb = w.cb, ce = w.ce;
  const int64_t blocks = w.spec.view_shape[1];
  MOESHARD_ASSIGN_OR_RETURN(std::vector<std::byte> buf,
                            ReadRect(w.file, w.info, blocks, a, b, cb / 4, ce / 4));
  for (int64_t r = a; r < b; ++r) {
    for (int64_t c = 0; c < (ce - cb) / 4; ++c) {
      const float v = E8M0ToFloat(static_cast<uint8_t>(buf[(r - a) * ((ce - cb) / 4) + c]));
      std::memcpy(w.out + (r - a) * w.stride + c * 4, &v, 4);
    }
  }
  return Status::Ok();
}

// Each view row repeats its stored scale (per row, or the tensor's one).
Status ReadRepeatedScale(const EncodedWindow& w) {
  const int64_t a = w.a, b = w.b;
  const bool per_row = w.spec.encoding == SourceEncoding::kRowScale;
  MOESHARD_ASSIGN_OR_RETURN(std::vector<std::byte> buf,
                            ReadRect(w.file, w.info, 4, per_row ? a : 0, per_row ? b : 1, 0, 4));
  for (int64_t r = a; r < b; ++r) {
    for (int64_t c = 0; c < (w.ce - w.cb) / 4; ++c) {
      std::memcpy(w.out + (r - a) * w.stride + c * 4, buf.data() + (per_row ? (r - a) * 4 : 0), 4);
    }
  }
  return Status::Ok();
}

// One F32 scalar, as stored or (NVFP4's global scale, which divides) its reciprocal.
Status ReadScalarF32(const EncodedWindow& w) {
  MOESHARD_ASSIGN_OR_RETURN(std::vector<std::byte> buf, ReadRect(w.file, w.info, 4, 0, 1, 0, 4));
  float v;
  std::memcpy(&v, buf.data(), 4);
  if (w.spec.encoding == SourceEncoding::kReciprocalF32) {
    if (!(v > 0.0f)) {
      return InvalidArgumentError(fmt::format(
          "load: '{}': expected a positive NVFP4 global scale, got {}", w.spec.name, v));
    }
    v = 1.0f / v;
  }
  std::memcpy(w.out, &v, 4);
  return Status::Ok();
}

}  // namespace

std::string RankLeaf(const WeightScheme& q, TensorPart part) {
  const WeightFormatSpec& s = q.spec();
  switch (part) {
    case TensorPart::kWeight: return std::string(s.weight_leaf);
    case TensorPart::kScale: return std::string(s.scale_leaf);
    case TensorPart::kZeroPoint: return std::string(s.zero_leaf);
    case TensorPart::kGlobalScale: return std::string(s.global_leaf);
    case TensorPart::kShapeMeta: return "weight_shape";
    case TensorPart::kInputScale: return std::string(CheckpointLeaves(q).input);
    case TensorPart::kGroupIndex: return std::string(CheckpointLeaves(q).group_index);
    case TensorPart::kValue: break;
  }
  return "";
}

StoredPart StoredPartOf(const WeightScheme& q, TensorPart part, int64_t out, int64_t in,
                        DType model_dtype) {
  const int64_t groups = CeilDiv(in, q.group);
  const QuantLeaves leaves = CheckpointLeaves(q);
  const bool awq = q.layout == QuantLayout::kAwq;
  const bool gptq = q.layout == QuantLayout::kGptq || q.layout == QuantLayout::kGptqV2;
  using E = SourceEncoding;
  switch (part) {
    case TensorPart::kWeight:
      if (awq) return {"qweight", DType::kI32, {in, CeilDiv(out, 8)}, E::kAwqCodes};
      if (gptq) return {"qweight", DType::kI32, {CeilDiv(in, 8), out}, E::kGptqCodes};
      if (q.layout == QuantLayout::kDeepseekV4 && q.packed()) {  // the same bytes as I8
        return {std::string(leaves.weight), DType::kI8, q.WeightShape(out, in), E::kDirect};
      }
      // compressed-tensors (4-bit: U8, or the same bytes as I32 [out, in/8]; fp8), ModelOpt.
      return {std::string(leaves.weight), q.WeightDType(model_dtype), q.WeightShape(out, in),
              E::kDirect};
    case TensorPart::kScale:
      if (awq || gptq) return {"scales", DType::kF16, {groups, out}, E::kTransposedF16};
      if (q.format == WeightFormat::kInt4Zp) {  // compressed-tensors: the model dtype
        return {"weight_scale",
                model_dtype,
                {out, groups},
                model_dtype == DType::kBF16 ? E::kBf16ToF16 : E::kDirect};
      }
      if (q.layout == QuantLayout::kDeepseekV4) {
        return {std::string(leaves.scale), DType::kF8E8M0, q.ScaleShape(out, in),
                q.format == WeightFormat::kFp8Block ? E::kE8M0ToF32 : E::kDirect};
      }
      if (q.layout == QuantLayout::kFp8PerChannel) {
        return {std::string(leaves.scale), DType::kF32, {out, 1}, E::kRowScale};
      }
      if (q.layout == QuantLayout::kFp8PerTensor) {
        return {std::string(leaves.scale), DType::kF32, {}, E::kTensorScale};
      }
      return {std::string(leaves.scale), q.spec().scale_dtype, q.ScaleShape(out, in), E::kDirect};
    case TensorPart::kZeroPoint:
      if (awq) return {"qzeros", DType::kI32, {groups, CeilDiv(out, 8)}, E::kAwqZeros};
      if (gptq) {
        return {"qzeros",
                DType::kI32,
                {groups, CeilDiv(out, 8)},
                q.layout == QuantLayout::kGptq ? E::kGptqZeros : E::kGptqV2Zeros};
      }
      return {"weight_zero_point", DType::kI32, {CeilDiv(out, 8), groups}, E::kCtZeros};
    case TensorPart::kGlobalScale:
      if (q.layout == QuantLayout::kModelOpt) {
        return {std::string(leaves.global), DType::kF32, {}, E::kScalarF32};
      }
      return {std::string(leaves.global), DType::kF32, {1}, E::kReciprocalF32};
    case TensorPart::kShapeMeta:
    case TensorPart::kInputScale:
    case TensorPart::kGroupIndex:
    case TensorPart::kValue: break;
  }
  MOESHARD_CHECK(false, "part {} of a quantized linear has no stored tensor",
                 static_cast<int>(part));
  return {};
}

SourceTensorSpec EncodedSpec(const WeightScheme& q, TensorPart part, const std::string& module,
                             int64_t out, int64_t in, DType model_dtype, DummyKind kind) {
  const StoredPart sp = StoredPartOf(q, part, out, in, model_dtype);
  SourceTensorSpec spec{module + "." + sp.leaf, sp.dtype, sp.shape, kind, {}};
  spec.encoding = sp.encoding;
  switch (part) {
    case TensorPart::kWeight:
      spec.view_dtype = DType::kU8;
      spec.view_shape = q.WeightShape(out, in);
      break;
    case TensorPart::kScale:
      spec.view_dtype = q.spec().scale_dtype;
      spec.view_shape = q.ScaleShape(out, in);
      break;
    case TensorPart::kZeroPoint:
      spec.view_dtype = q.spec().zero_dtype;
      spec.view_shape = q.ScaleShape(out, in);
      break;
    default:
      spec.view_dtype = DType::kF32;
      spec.view_shape = {1};
      break;
  }
  return spec;
}

Status ReadEncoded(const SafetensorsFile& file, const TensorInfo& info,
                   const SourceTensorSpec& spec, int64_t a, int64_t b, int64_t cb, int64_t ce,
                   std::byte* out, int64_t stride) {
  using E = SourceEncoding;
  if (b <= a || ce <= cb) return Status::Ok();
  const EncodedWindow w{.file = file,
                        .info = info,
                        .spec = spec,
                        .a = a,
                        .b = b,
                        .cb = cb,
                        .ce = ce,
                        .out = out,
                        .stride = stride,
                        .out_rows = spec.view_shape.empty() ? 1 : spec.view_shape[0]};
  switch (spec.encoding) {
    case E::kAwqCodes:
    case E::kGptqCodes: return ReadPackedCodes(w);
    case E::kAwqZeros:
    case E::kGptqZeros:
    case E::kGptqV2Zeros: return ReadPackedZeros(w);
    case E::kCtZeros: return ReadCtZeros(w);
    case E::kTransposedF16: return ReadTransposedF16(w);
    case E::kBf16ToF16: return ReadBf16ToF16(w);
    case E::kE8M0ToF32: return ReadE8M0ToF32(w);
    case E::kRowScale:
    case E::kTensorScale: return ReadRepeatedScale(w);
    case E::kReciprocalF32:
    case E::kScalarF32: return ReadScalarF32(w);
    case E::kDirect: break;
  }
  return InternalError(fmt::format("load: '{}': encoding {} is not a conversion", spec.name,
                                   SourceEncodingName(spec.encoding)));
}

}  // namespace internal
}  // namespace moeshard
