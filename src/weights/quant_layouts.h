// Checkpoint layouts of quantized linears (base/weight_format.h QuantLayout) and their
// conversion into the rank layout (private to the weights layer).
//
// A rank always holds the weight-format table's layout: codes U8 [out, in/2], scales
// [out, in/g], int4-zp zero points U8 [out, in/g], nvfp4 global scale F32 [1] (a multiplier).
// AWQ, GPTQ, compressed-tensors and ModelOpt store some of those parts differently; each such
// part is one checkpoint tensor with a SourceEncoding, which the loader reads as the rank
// layout's view of it: its windows (rows of the view, bytes of a row) are those of the view,
// and ReadEncoded produces them from the stored tensor. Sources: AutoAWQ's GEMM packer and
// vLLM awq.py (order 0,2,4,6,1,3,5,7); AutoGPTQ / vLLM gptq.py (qweight packed along the
// input, v1 zero points minus one); compressed-tensors pack_quantized.py (pack_to_int32,
// zero points packed along dim 0, +8 offsets on both codes and zeros, so w = (code - zero) *
// scale on the stored nibbles) and nvfp4_quantized.py (the global scale divides); vLLM
// modelopt.py (weight_scale_2 multiplies).
//
// Thread safety: pure functions; ReadEncoded only reads the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "moeshard/base/weight_format.h"
#include "moeshard/config/family.h"
#include "moeshard/weights/loader.h"
#include "moeshard/weights/safetensors.h"

namespace moeshard::internal {

// The checkpoint tensor holding `part` (kWeight, kScale, kZeroPoint, kGlobalScale) of a
// quantized linear [out, in] stored in q.layout: its leaf, stored dtype and shape, and how it
// converts. The view is the rank layout's (ViewOf).
struct StoredPart {
  std::string leaf;  // "qweight", "scales", "weight_zero_point", "weight_scale_2", ...
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  SourceEncoding encoding = SourceEncoding::kDirect;
};
StoredPart StoredPartOf(const WeightScheme& q, TensorPart part, int64_t out, int64_t in,
                        DType model_dtype);

// The rank-layout leaf of `part` in the format table ("weight_packed", "weight_zero_point", ...).
std::string RankLeaf(const WeightScheme& q, TensorPart part);

// `spec` for `part` of the linear `module` [out, in]: the stored tensor, with its view set to
// the rank layout's dtype and shape.
SourceTensorSpec EncodedSpec(const WeightScheme& q, TensorPart part, const std::string& module,
                             int64_t out, int64_t in, DType model_dtype, DummyKind kind);

// Rows [a, b) and bytes [cb, ce) of the view of `spec` (row r written at out + (r - a) *
// stride), converted from the stored tensor `info` of `file`. REQUIRES: spec.encoding is not
// kDirect and the window is within the view.
Status ReadEncoded(const SafetensorsFile& file, const TensorInfo& info,
                   const SourceTensorSpec& spec, int64_t a, int64_t b, int64_t cb, int64_t ce,
                   std::byte* out, int64_t stride);

}  // namespace moeshard::internal
