// Scalar reference of every CPU MoE kernel: the oracle the optimised backends are tested
// against (STYLE.md's reference-oracle pattern).
//
// Deliberately obvious: per-token, per-expert loops, weights dequantised one element at a time
// from their encoded form, dot products accumulated in fp64, activations applied in fp32 with
// the scalar ApplyActivation; no rounding of activations to bf16. Slow; for tests and
// cross-layer checks (e.g. a sharded runtime compared with one rank).
//
// Thread safety: pure functions of their inputs.
#pragma once

#include <cstdint>

#include "moeshard/base/status.h"
#include "moeshard/kernels/expert_gemm.h"
#include "moeshard/kernels/moe_forward.h"
#include "moeshard/kernels/permute.h"
#include "moeshard/kernels/routing.h"

namespace moeshard::reference {

Status Route(const RoutingParams& params, const RoutingArgs& args);

// Same contract as moeshard::PermuteTokens, computed expert by expert with a full scan.
Status PermuteTokens(const PermuteParams& params, TokenPermutation* out);

// Which projection of an ExpertWeights view.
enum class Projection { kW13, kW2 };

// The dequantised weight W[expert][row][col] of one projection, decoded from its format.
// Row `row` of one [rows, cols] matrix stored in `scheme` (row-major; base/weight_format.h),
// dequantised exactly into out[0, cols). `data` and `scales` point at the matrix, `zeros` at its
// zero points (int4-zp) and `global` is its global scale (nvfp4). Act-order int4-zp
// (scheme.act_order): column c's scale and zero point are in column group_index[c] of rows of
// `scale_cols` (0: cols / group). The one scalar decoder every other path is tested against.
void DequantizeMatrixRow(const WeightScheme& scheme, const void* data, const void* scales,
                         int64_t rows, int64_t cols, int64_t row, float* out,
                         const uint8_t* zeros = nullptr, float global = 1.0f,
                         const int32_t* group_index = nullptr, int64_t scale_cols = 0);

float DequantizeWeight(const ExpertWeights& w, Projection proj, int64_t expert, int64_t row,
                       int64_t col);

// The oracle of KernelContextOptions::int8_activations: x[0, n) (bf16 values) in groups of
// `group`, each value replaced by q x d, d = max|x| / 127 of its group and q = round(x / d) to
// nearest even, found with the same fp32 steps as the kernels (the group's largest magnitude
// scaled by a power of two into [0.5, 1) first); d x q is exact here. A group holding an
// infinity or a NaN gives NaNs, a group of zeros zeros.
void Int8Inputs(const float* x, int64_t n, int64_t group, double* out);

// Same contract as moeshard::GroupedExpertGemm; with `int8_activations` the oracle of a
// KernelContext that has them: for experts Int8ActivationScheme takes, each token's inputs and
// its bf16-rounded activations pass through Int8Inputs before the two projections.
Status GroupedExpertGemm(const GroupedGemmParams& params, bool int8_activations = false);

// out[t] = sum over the token's local experts of weight * expert(x[t]), token by token, without
// any permutation (so it also checks permute/unpermute).
Status MoeExpertsForward(const MoeExpertsParams& params, bool int8_activations = false);

Status MoeForward(const MoeForwardParams& params);

}  // namespace moeshard::reference
