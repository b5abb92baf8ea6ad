#include "kernels/cpu/dense_ops.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "moeshard/kernels/reference.h"

namespace moeshard::internal {
namespace {

// Eight independent partial sums, combined pairwise at the end: lets the compiler vectorise
// the loop without -ffast-math, and fixes the summation order (it depends only on `n`).
float Dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

void DenseScratch::Reserve(int num_threads, int64_t cols) {
  max_cols = std::max(max_cols, cols);
  const size_t need = static_cast<size_t>(num_threads) * static_cast<size_t>(max_cols);
  if (rows.size() < need) rows.resize(need);
}

void DequantizeRow(const DenseWeight& w, int64_t r, float* out) {
  if (w.f32) {
    const float* p = static_cast<const float*>(w.data) + r * w.cols;
    std::copy(p, p + w.cols, out);
    return;
  }
  reference::DequantizeMatrixRow(w.scheme, w.data, w.scales, w.rows, w.cols, r, out, w.zeros,
                                 w.global, w.group_index, w.scale_cols);
}

void Linear(ThreadPool& pool, DenseScratch& scratch, const LinearArgs& a) {
  MOESHARD_CHECK(a.w != nullptr, "Linear: null weight");
  scratch.Reserve(pool.num_threads(), a.w->cols);
  if (a.num_tokens == 0 || a.w->rows == 0) return;
  struct Job {
    const LinearArgs* a;
    DenseScratch* s;
  } job{&a, &scratch};
  // Captures one pointer: std::function stores it inline (no allocation per call).
  const Job* j = &job;
  pool.ParallelFor(a.w->rows, 0, [j](int64_t begin, int64_t end, int thread_idx) {
    const LinearArgs& a = *j->a;
    float* row = j->s->rows.data() + static_cast<size_t>(thread_idx) * j->s->max_cols;
    for (int64_t r = begin; r < end; ++r) {
      DequantizeRow(*a.w, r, row);
      const float b = a.bias ? a.bias[r] : 0.0f;
      for (int64_t t = 0; t < a.num_tokens; ++t) {
        const float v = Dot(a.x + t * a.x_stride, row, a.w->cols) + b;
        float& y = a.y[t * a.y_stride + r];
        y = a.accumulate ? y + v : v;
      }
    }
  });
}

void RmsNorm(const RmsNormArgs& a) {
  const int64_t n = a.n;
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const float* xr = a.x + t * a.x_stride;
    float* yr = a.y + t * a.y_stride;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(n) + a.eps);
    for (int64_t i = 0; i < n; ++i) {
      yr[i] = xr[i] * inv * (a.weight_offset + Bf16ToFloat(a.weight[i]));
    }
  }
}

void GatedMlp(ThreadPool& pool, DenseScratch& scratch, const GatedMlpArgs& a) {
  const int64_t s = a.gate->rows;
  Linear(pool, scratch,
         LinearArgs{.w = a.gate,
                    .x = a.x,
                    .x_stride = a.x_stride,
                    .num_tokens = a.num_tokens,
                    .y = a.gate_buf,
                    .y_stride = s});
  Linear(pool, scratch,
         LinearArgs{.w = a.up,
                    .x = a.x,
                    .x_stride = a.x_stride,
                    .num_tokens = a.num_tokens,
                    .y = a.up_buf,
                    .y_stride = s});
  for (int64_t i = 0; i < a.num_tokens * s; ++i) {
    a.gate_buf[i] = ApplyActivation(a.activation, a.gate_buf[i], a.up_buf[i]);
  }
  Linear(pool, scratch,
         LinearArgs{.w = a.down,
                    .x = a.gate_buf,
                    .x_stride = s,
                    .num_tokens = a.num_tokens,
                    .y = a.y,
                    .y_stride = a.y_stride,
                    .accumulate = a.accumulate});
}

}  // namespace moeshard::internal
