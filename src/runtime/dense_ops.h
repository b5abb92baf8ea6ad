// Dense operations of the MoE block outside the routed experts: linear layers in every weight
// format a plan can give them (router, latent projections, shared experts), RMSNorm, and the
// gated MLP of the shared experts. Private to the runtime.
//
// Numerics: activations stay fp32; weights are dequantised exactly (row by row into a per-thread
// fp32 scratch row) and every output element is one fp32 dot product in a fixed order that does
// not depend on the thread count or on how many rows or tokens a call has. A replicated weight
// therefore gives bitwise-identical results on every layout, and a column-split weight gives
// the same bits for the columns a rank holds.
//
// Thread safety: one call at a time per DenseScratch; parallel over the KernelContext's pool.
#pragma once

#include <cstdint>
#include <vector>

#include "moeshard/base/numeric.h"
#include "moeshard/base/status.h"
#include "moeshard/kernels/expert_gemm.h"
#include "moeshard/kernels/kernel_context.h"

namespace moeshard::internal {

// A [rows, cols] weight (nn.Linear [out, in]) as one rank holds it, stored as `scheme` says
// (base/weight_format.h); unquantized weights are bf16 or (`f32`) fp32.
struct DenseWeight {
  WeightScheme scheme;
  bool f32 = false;  // unquantized fp32 rather than bf16
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;      // the weight tensor
  const void* scales = nullptr;    // the scale tensor (quantized formats)
  const uint8_t* zeros = nullptr;  // int4-zp: zero points [rows, cols / g]
  float global = 1.0f;             // nvfp4: the tensor's global scale (a multiplier)
};

// Per-thread fp32 rows for dequantisation: [num_threads, max_cols].
struct DenseScratch {
  int64_t max_cols = 0;
  std::vector<float> rows;
  void Reserve(int num_threads, int64_t cols);
};

// Dequantises row r of w into out[0, w.cols).
void DequantizeRow(const DenseWeight& w, int64_t r, float* out);

struct LinearArgs {
  const DenseWeight* w = nullptr;
  const float* x = nullptr;  // [num_tokens, x_stride] fp32, first w.cols columns used
  int64_t x_stride = 0;
  int64_t num_tokens = 0;
  float* y = nullptr;  // [num_tokens, y_stride] fp32, columns [0, w.rows) written
  int64_t y_stride = 0;
  bool accumulate = false;      // y += instead of y =
  const float* bias = nullptr;  // optional [w.rows] fp32
};

// y[t, r] (+)= sum_c x[t, c] * W[r, c] (+ bias[r]). REQUIRES: scratch reserved for w.cols.
void Linear(KernelContext& ctx, DenseScratch& scratch, const LinearArgs& args);

// y[t, :] = x[t, :] * rsqrt(mean(x[t, :]^2) + eps) * (weight_offset + weight), over `n`
// columns (fp32 math, sequential sum; offset 1 for Gemma-style norms). x and y: [num_tokens,
// stride] fp32; may alias. weight: [n] bf16.
void RmsNorm(const float* x, int64_t x_stride, int64_t num_tokens, int64_t n, const bf16_t* weight,
             float eps, float* y, int64_t y_stride, float weight_offset = 0.0f);

// The gated MLP of the shared experts on the columns a rank holds:
//   gate = x Wgᵀ, up = x Wuᵀ ([num_tokens, S_local]), h = act(gate, up), y (+)= h Wdᵀ.
// gate_buf, up_buf: [num_tokens, gate.rows] fp32 scratch.
struct GatedMlpArgs {
  const DenseWeight* gate = nullptr;  // [S_local, H]
  const DenseWeight* up = nullptr;    // [S_local, H]
  const DenseWeight* down = nullptr;  // [H, S_local]
  ActivationParams activation;
  const float* x = nullptr;  // [num_tokens, x_stride] fp32
  int64_t x_stride = 0;
  int64_t num_tokens = 0;
  float* gate_buf = nullptr;
  float* up_buf = nullptr;
  float* y = nullptr;  // [num_tokens, y_stride] fp32
  int64_t y_stride = 0;
  bool accumulate = false;
};
void GatedMlp(KernelContext& ctx, DenseScratch& scratch, const GatedMlpArgs& args);

}  // namespace moeshard::internal
