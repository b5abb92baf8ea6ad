// Dense operations of the MoE block outside the routed experts, as every kernel backend offers
// them (kernel_backend.h): linear layers in every weight format a plan can give them (router,
// latent projections, shared experts), RMSNorm, and the gated MLP of the shared experts.
//
// Numerics (the CPU backend): activations stay fp32; weights are dequantised exactly (row by row
// into a per-thread fp32 scratch row) and every output element is one fp32 dot product in a fixed
// order that does not depend on the thread count or on how many rows or tokens a call has. A
// replicated weight therefore gives bitwise-identical results on every layout, and a column-split
// weight gives the same bits for the columns a rank holds. Other backends must keep the first
// property (independent of thread count, rows and tokens per call): the sharded runtime relies
// on it for identical hidden states on every rank of a unit.
//
// Thread safety: plain argument structs.
#pragma once

#include <cstdint>

#include "moeshard/base/numeric.h"
#include "moeshard/base/weight_format.h"
#include "moeshard/kernels/expert_gemm.h"

namespace moeshard {

// A [rows, cols] weight (nn.Linear [out, in]) as one rank holds it, stored as `scheme` says
// (base/weight_format.h); unquantized weights are bf16 or (`f32`) fp32.
struct DenseWeight {
  WeightScheme scheme;
  bool f32 = false;  // unquantized fp32 rather than bf16
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;      // the weight tensor
  const void* scales = nullptr;    // the scale tensor (quantized formats)
  const uint8_t* zeros = nullptr;  // int4-zp: zero points [rows, scale_cols]
  float global = 1.0f;             // nvfp4: the tensor's global scale (a multiplier)
  // Act-order int4-zp (GPTQ desc_act): the group of each column [cols], and the scale (and
  // zero-point) columns per row: every group's when the rank holds a slice of the input (0:
  // cols / g).
  const int32_t* group_index = nullptr;
  int64_t scale_cols = 0;
};

// y[t, r] (+)= sum_c x[t, c] * W[r, c] (+ bias[r]).
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

// y[t, :] = x[t, :] * rsqrt(mean(x[t, :]^2) + eps) * (weight_offset + weight), over `n` columns
// (fp32 math, sequential sum; offset 1 for Gemma-style norms). x and y may alias.
struct RmsNormArgs {
  const float* x = nullptr;  // [num_tokens, x_stride] fp32
  int64_t x_stride = 0;
  int64_t num_tokens = 0;
  int64_t n = 0;
  const bf16_t* weight = nullptr;  // [n] bf16
  float eps = 1e-6f;
  float* y = nullptr;  // [num_tokens, y_stride] fp32
  int64_t y_stride = 0;
  float weight_offset = 0.0f;
};

// The gated MLP of the shared experts on the columns a rank holds:
//   gate = x Wgᵀ, up = x Wuᵀ ([num_tokens, S_local]), h = act(gate, up), y (+)= h Wdᵀ.
struct GatedMlpArgs {
  const DenseWeight* gate = nullptr;  // [S_local, H]
  const DenseWeight* up = nullptr;    // [S_local, H]
  const DenseWeight* down = nullptr;  // [H, S_local]
  ActivationParams activation;
  const float* x = nullptr;  // [num_tokens, x_stride] fp32
  int64_t x_stride = 0;
  int64_t num_tokens = 0;
  float* gate_buf = nullptr;  // [num_tokens, gate.rows] fp32 scratch
  float* up_buf = nullptr;    // [num_tokens, gate.rows] fp32 scratch
  float* y = nullptr;         // [num_tokens, y_stride] fp32
  int64_t y_stride = 0;
  bool accumulate = false;
};

}  // namespace moeshard
