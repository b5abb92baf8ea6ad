// Encoding fp32 expert weights into the kernels' weight formats, and owning containers.
//
// Used by tests (encode randn/10 weights, then compare backends with the reference dequantising
// the same encoded bytes), by benchmarks (random encoded weights generated in place, in
// parallel, without an fp32 copy) and by anyone producing weights in memory. Encodings:
//   kBf16      round to nearest even.
//   kFp8Block  per block_rows x group block (128 x 128 in DeepSeek-V3): scale = amax / 448 (1
//              when the block is all zero), fp8 = RNE(w / scale), saturating.
//   kMxfp4     per 32 values of a row: e = FloatToE8M0Ceil(amax / 6), code = nearest E2M1 of
//              w / 2^(e-127).
//   kInt4      per g values of a row: scale = bf16(amax / 7) (1 when zero), nibble =
//              clamp(round(w / scale), -8, 7) + 8.
//   kInt4Zp    per g values of a row (AWQ's asymmetric min/max): scale = fp16((max - min) / 15)
//              (1 when max == min), zero = clamp(round(-min / scale), 0, 15), nibble =
//              clamp(round(w / scale) + zero, 0, 15).
//   kNvfp4     per tensor global = amax / (6 * 448) (1 when zero); per 16 values of a row
//              scale = e4m3(amax16 / 6 / global), code = nearest E2M1 of w / (scale * global).
//              A gated w13 gets one global per half (gate, up), as checkpoints store them.
// Layouts are those of expert_gemm.h.
//
// Thread safety: pure functions, except that the parallel generator uses the context.
#pragma once

#include <cstdint>
#include <vector>

#include "moeshard/base/aligned_buffer.h"
#include "moeshard/kernels/expert_gemm.h"

namespace moeshard {

class KernelContext;

// Encodes w [rows, cols] fp32 row-major into data (scheme.WeightBytes), scales
// (scheme.ScaleBytes) and, for int4-zp, zeros (scheme.ZeroBytes). For nvfp4 `global` is the
// tensor's global scale: used as given when *global > 0, else computed from w and written.
// REQUIRES: the format's divisibility rules (checked); zeros / global non-null where used.
void QuantizeMatrix(const WeightScheme& scheme, const float* w, int64_t rows, int64_t cols,
                    uint8_t* data, uint8_t* scales, uint8_t* zeros = nullptr,
                    float* global = nullptr);
// The nvfp4 global scale of the values w[0, n): amax / (6 * 448), 1 when all zero.
float Nvfp4GlobalScale(const float* w, int64_t n);

// Owns the buffers an ExpertWeights view points into. Moving keeps `view` valid (the buffers'
// storage does not move). The weight data live in huge-page advised AlignedBuffers.
struct OwnedExpertWeights {
  AlignedBuffer w13, w2;
  std::vector<uint8_t> w13_scales, w2_scales;
  std::vector<uint8_t> w13_zeros, w2_zeros;  // int4-zp
  std::vector<float> w13_global, w2_global;  // nvfp4
  std::vector<float> w13_bias, w2_bias;
  ExpertWeights view;
};

struct ExpertWeightsShape {
  WeightScheme scheme;
  int64_t num_experts_local = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  bool gated = true;
  bool gate_up_interleaved = false;
};

// Encodes fp32 weights: w13 [E, R13, H], w2 [E, H, I]; biases optional ([E, R13], [E, H]).
OwnedExpertWeights EncodeExpertWeights(const ExpertWeightsShape& shape, const float* w13,
                                       const float* w2, const float* w13_bias = nullptr,
                                       const float* w2_bias = nullptr);

// Random encoded weights for benchmarks, generated in parallel on the context's pool from a
// counter-based hash of (seed, index): bf16 values of magnitude about 0.05, fp8 codes of
// block-quantized Gaussian weights (as released fp8 checkpoints hold them: few subnormal codes),
// or random codes with a fixed scale (MXFP4, int4, int4-zp with zero point 8, nvfp4). No biases.
OwnedExpertWeights MakeRandomExpertWeights(KernelContext& ctx, const ExpertWeightsShape& shape,
                                           uint64_t seed);

}  // namespace moeshard
