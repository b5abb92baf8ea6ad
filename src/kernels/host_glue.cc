#include "kernels/host_glue.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"

namespace moeshard::internal {

void HostToExpertRows(const ExpertRowsArgs& a) {
  for (int64_t r = 0; r < a.num_rows; ++r) {
    const float* x = a.x + r * a.x_stride;
    bf16_t* row = a.rows + r * a.padded_cols;
    if (a.row_weights != nullptr) {
      // Llama-4: the expert sees x * w (top-1), and its output is taken with weight 1.
      const float wt = a.row_weights[r];
      for (int64_t i = 0; i < a.cols; ++i) row[i] = FloatToBf16(x[i] * wt);
      a.row_weights[r] = 1.0f;
    } else {
      for (int64_t i = 0; i < a.cols; ++i) row[i] = FloatToBf16(x[i]);
    }
    std::fill(row + a.cols, row + a.padded_cols, bf16_t{});
  }
}

void HostAddRows(const AddRowsArgs& a) {
  const int64_t n = a.num_rows * a.cols;
  if (a.gate_logits == nullptr) {
    for (int64_t i = 0; i < n; ++i) a.y[i] += a.x[i];
    return;
  }
  for (int64_t r = 0; r < a.num_rows; ++r) {
    const float g = 1.0f / (1.0f + std::exp(-a.gate_logits[r]));
    for (int64_t i = 0; i < a.cols; ++i) a.y[r * a.cols + i] += g * a.x[r * a.cols + i];
  }
}

void HostCopyRows(const CopyRowsArgs& a) {
  if (a.num_rows == 0 || a.row_bytes == 0) return;
  auto* dst = static_cast<std::byte*>(a.dst);
  const auto* src = static_cast<const std::byte*>(a.src);
  if (a.dst_stride == a.row_bytes && a.src_stride == a.row_bytes) {
    std::memmove(dst, src, static_cast<size_t>(a.num_rows * a.row_bytes));
    return;
  }
  for (int64_t r = 0; r < a.num_rows; ++r) {
    std::memmove(dst + r * a.dst_stride, src + r * a.src_stride, static_cast<size_t>(a.row_bytes));
  }
}

void HostConvert(const ConvertArgs& a) {
  MOESHARD_CHECK((a.src_dtype == DType::kF32 || a.src_dtype == DType::kBF16) &&
                     (a.dst_dtype == DType::kF32 || a.dst_dtype == DType::kBF16),
                 "Convert: expected F32 or BF16, got {} -> {}", DTypeName(a.src_dtype),
                 DTypeName(a.dst_dtype));
  if (a.src_dtype == a.dst_dtype) {
    std::memmove(a.dst, a.src, static_cast<size_t>(a.n) * (a.src_dtype == DType::kF32 ? 4 : 2));
    return;
  }
  if (a.src_dtype == DType::kBF16) {
    const auto* s = static_cast<const bf16_t*>(a.src);
    auto* d = static_cast<float*>(a.dst);
    for (int64_t i = 0; i < a.n; ++i) d[i] = Bf16ToFloat(s[i]);
    return;
  }
  const auto* s = static_cast<const float*>(a.src);
  auto* d = static_cast<bf16_t*>(a.dst);
  for (int64_t i = 0; i < a.n; ++i) d[i] = FloatToBf16(s[i]);
}

}  // namespace moeshard::internal
