// Grouped expert GEMM with fused activation: y = act(x · W13ᵀ + b13) · W2ᵀ (+ b2), per local
// expert, over rows already grouped by expert (see permute.h).
//
// Weights use the nn.Linear [out, in] row-major layout, one matrix per local expert, with the
// PHYSICAL (possibly padded) sizes H = `hidden`, I = `intermediate`. Padded rows and columns
// must be zero; with zero padding the result on the logical part equals the unpadded shape and
// padded output columns are 0 (every activation maps (0, 0) to 0).
//
//   w13 ("gate_up"): [E_local, R13, H], R13 = 2*I for gated activations, I for ReLU².
//       gated, not interleaved: rows [0, I) are gate, rows [I, 2I) are up;
//       gated, interleaved (gpt-oss): row 2j is gate j, row 2j+1 is up j.
//   w2  ("down"):    [E_local, H, I].
//
// Weight formats (per expert matrix [rows, cols], `cols` = the input dimension), stored as the
// weight-format table says (base/weight_format.h), with the block / group sizes of the
// weights' WeightScheme:
//   kBf16     data bf16 [rows, cols]; no scales.
//   kFp8Block data fp8 e4m3fn (uint8) [rows, cols]; scales fp32 scale_inv
//             [ceil(rows/block_rows), ceil(cols/group)]; w = fp8 * scale (DeepSeek-V3
//             `weight_scale_inv`, 128 x 128 in the release; any block size is read).
//   kMxfp4    data uint8 [rows, cols/2], two E2M1 codes per byte, low nibble = even column;
//             scales uint8 E8M0 [rows, cols/32]; w = e2m1 * 2^(e - 127). cols % 32 == 0.
//   kInt4     data uint8 [rows, cols/2], low nibble = even column; scales bf16 [rows, cols/g];
//             w = (nibble - 8) * scale. g % 32 == 0 and cols % g == 0.
//   kInt4Zp   data as kInt4; scales fp16 [rows, cols/g]; zeros uint8 [rows, cols/g] (0..15);
//             w = (nibble - zero) * scale (AWQ, GPTQ). g % 32 == 0 and cols % g == 0.
//             Act-order (scheme.act_order, GPTQ desc_act): column c's scale and zero point are
//             those of group gidx[c] (w13_group_index, w2_group_index), and w2's scales and
//             zeros have w2_scale_cols columns (every group of the logical I when a rank holds
//             a slice of it). These run on the portable dot path on every instruction set,
//             unless SortActOrderExperts (below) sorted them by group.
//   kNvfp4    data as kMxfp4; scales fp8 e4m3fn [rows, cols/16]; one fp32 global scale per
//             tensor: w13_global [E_local, 2] (gate, up; [E_local, 1] when not gated), w2_global
//             [E_local]; w = e2m1 * e4m3 * global. cols % 16 == 0.
// Per-expert tensors are contiguous, experts back to back ([E_local, ...] above).
//
// bf16 row-group layout (ExpertWeights::bf16_row_groups, made by RepackBf16RowGroups): each
// expert matrix [rows, cols] is stored as [rows / 16][cols / 2][16] pairs of bf16, pair (g, p, l)
// = (w[16g + l][2p], w[16g + l][2p + 1]), the even column in the low half: the same bytes in an
// order where one 64-byte line holds one column pair of 16 consecutive rows. The AVX-512 kernels
// then multiply 16 output rows per vector with each token's pair broadcast, reading every input
// line once per 16 rows (the row-major dot products reread each token's inputs for every few
// rows). Requires H and I to be multiples of 16 (so every task's gate, up and down rows are
// whole groups) and gate/up not interleaved.
// Biases are fp32: w13_bias [E_local, R13] in w13's row order, w2_bias [E_local, H].
//
// Numerics (optimised backends): the input rows and the intermediate activation are rounded to
// bf16 (round to nearest even) and multiplied with the dequantised weights, with fp32
// accumulation; weights are dequantised inside the inner loop or a small strip at a time (AVX-512
// prefill of MXFP4: one 8-row strip into L1, where weights below 2^-126 flush to zero; SIMD
// prefill: 12-row strips into fp32, exact for bf16, MXFP4, int4 and int4-zp, one rounding of
// code x scale for fp8 and NVFP4), never copied whole. The SIMD backends' decode of 4-bit weights
// (up to 16 tokens per expert) multiplies on 16-bit integers: each token's bf16 inputs are
// quantized per scale group with a power-of-two scale, exact for every input within 2^6 of its
// group's largest magnitude and otherwise off by at most 2^-15 of it. The AVX-512 BF16 decode of
// int4-zp multiplies the codes (0-15) and subtracts zero x the group's input sum from each group's
// fp32 partial sum, so a group whose codes sit near its zero point cancels in fp32 (an error of
// about 2^-24 of 15 x the group's input magnitude sum); its NVFP4 decode applies each group's E4M3
// scale times the global one to the group's fp32 partial sum. Its prefill (16+ tokens per
// expert) decodes 8-row strips to bf16 exactly: int4-zp as code - zero with each group's fp16
// scale applied to its fp32 partial sums, NVFP4 as E2M1 x E4M3 with the global scale applied to
// the sums of each K block. The summation order differs
// between variants (vector widths, tiles, K blocks, vdpbf16ps pair sums) and between the decode
// and prefill kernels, so variants agree with the reference within rounding, not bit for bit;
// each variant is deterministic and independent of the thread count.
// Thread safety: one call at a time per KernelContext; parallel over the context's pool.
#pragma once

#include <cstdint>
#include <vector>

#include "moeshard/base/dtype.h"
#include "moeshard/base/status.h"
#include "moeshard/base/weight_format.h"

namespace moeshard {

class KernelContext;

enum class Activation {
  kSwiGlu,         // silu(gate) * up
  kSwiGluOai,      // gpt-oss: g = min(gate, limit); u = clamp(up, -limit, limit);
                   //          (u + 1) * g * sigmoid(alpha * g)
  kSiTu,           // Kimi-K3: g' = beta * tanh(gate / beta) * sigmoid(gate);
                   //          u' = linear_beta * tanh(up / linear_beta); g' * u'
  kReluSquared,    // non-gated: relu(up)^2
  kGeluTanhGated,  // gelu_tanh(gate) * up
  kSwiGluClamp,    // DeepSeek-V4: silu(min(gate, limit)) * clamp(up, -limit, limit) (vLLM
                   //   SiluAndMulWithClamp; no alpha, no +1)
};
const char* ActivationName(Activation act);
bool IsGated(Activation act);

struct ActivationParams {
  Activation kind = Activation::kSwiGlu;
  float swiglu_limit = 7.0f;       // kSwiGluOai and kSwiGluClamp clamp
  float swiglu_alpha = 1.702f;     // kSwiGluOai sigmoid slope
  float situ_beta = 4.0f;          // kSiTu `activation_situ_beta`
  float situ_linear_beta = 25.0f;  // kSiTu `activation_situ_linear_beta`
};

// Scalar definition of the activation (shared by every backend's epilogue and the reference).
// For non-gated kinds `gate` is ignored.
float ApplyActivation(const ActivationParams& act, float gate, float up);

// A non-owning view of one MoE layer's local expert weights (layout above).
struct ExpertWeights {
  WeightScheme scheme;  // format and group / block sizes
  int64_t num_experts_local = 0;
  int64_t hidden = 0;        // H, physical
  int64_t intermediate = 0;  // I, physical
  bool gated = true;         // must equal IsGated(activation)
  bool gate_up_interleaved = false;
  bool bf16_row_groups = false;  // kBf16 only: the row-group layout above

  const void* w13 = nullptr;         // [E_local, R13, H] (format-dependent element, see above)
  const void* w13_scales = nullptr;  // format-dependent (null for kBf16)
  const void* w2 = nullptr;          // [E_local, H, I]
  const void* w2_scales = nullptr;
  const uint8_t* w13_zeros = nullptr;  // kInt4Zp: [E_local, R13, H / g]
  const uint8_t* w2_zeros = nullptr;   // kInt4Zp: [E_local, H, I / g]
  const float* w13_global = nullptr;   // kNvfp4: [E_local, 2] (gate, up) or [E_local, 1]
  const float* w2_global = nullptr;    // kNvfp4: [E_local]
  const float* w13_bias = nullptr;     // optional [E_local, R13] fp32
  const float* w2_bias = nullptr;      // optional [E_local, H] fp32
  // Act-order int4-zp: the group of each input column, w13 [E_local, 2, H] (gate, up; [E_local,
  // 1, H] when not gated) and w2 [E_local, I]; w2's scale (and zero-point) columns per row
  // (0: I / g).
  const int32_t* w13_group_index = nullptr;
  const int32_t* w2_group_index = nullptr;
  int64_t w2_scale_cols = 0;
  // Act-order experts sorted by group (SortActOrderExperts): input column c of expert e's w13 is
  // column w13_input_perm[e * H + c] of x, [E_local, H]; null otherwise.
  const int32_t* w13_input_perm = nullptr;

  int64_t w13_rows() const { return gated ? 2 * intermediate : intermediate; }
  // Scale columns per row of w13 (`w13`) or w2.
  int64_t ScaleCols(bool w13) const {
    return !w13 && w2_scale_cols > 0 ? w2_scale_cols
                                     : scheme.ScaleCols(w13 ? hidden : intermediate);
  }
  // Act-order: the group index of row `row` of expert `e`'s w13 ([H]) or w2 ([I]).
  const int32_t* GroupIndex(bool w13, int64_t e, int64_t row) const {
    if (!w13) return w2_group_index + e * intermediate;
    const int64_t parts = gated ? 2 : 1;
    const bool up = gated && (gate_up_interleaved ? row % 2 == 1 : row >= intermediate);
    return w13_group_index + (e * parts + (up ? 1 : 0)) * hidden;
  }
  // kNvfp4: the global scale of row `row` of expert `e`'s w13 (gate or up half) or w2.
  float W13Global(int64_t e, int64_t row) const {
    if (!gated) return w13_global[e];
    const bool up = gate_up_interleaved ? row % 2 == 1 : row >= intermediate;
    return w13_global[2 * e + (up ? 1 : 0)];
  }
};

// Element index of w[row][col] within one expert matrix of `cols` columns in the bf16 row-group
// layout (above).
inline int64_t Bf16RowGroupsIndex(int64_t row, int64_t col, int64_t cols) {
  return ((row / 16 * (cols / 2) + col / 2) * 16 + row % 16) * 2 + col % 2;
}

// Whether the shape and format of `weights` fit the bf16 row-group layout (the rules above), as
// InvalidArgument naming the numbers when not; the flag itself is not looked at.
Status CheckBf16RowGroupShape(const ExpertWeights& weights);

// Rewrites bf16 weights (w13 and w2, every expert) from row-major into the row-group layout in
// place, experts in parallel over the context's pool (each thread through a buffer of one expert
// matrix), and sets bf16_row_groups. `w13` and `w2` are the writable buffers `weights` views.
// InvalidArgument (naming the numbers) when the format is not bf16, the layout is already set,
// or a shape rule above fails.
Status RepackBf16RowGroups(KernelContext& ctx, ExpertWeights* weights, void* w13, void* w2);

// The writable buffers of one layer's act-order experts that SortActOrderExperts rewrites (the
// ones `weights` views).
struct ActOrderBuffers {
  void* w13 = nullptr;
  void* w13_scales = nullptr;
  uint8_t* w13_zeros = nullptr;
  void* w2 = nullptr;
};

// Act-order GPTQ experts (int4-zp, scheme.act_order) rewritten in place so that every group's
// columns are contiguous, as without act-order: each expert's w13 columns sorted by its g_idx
// (stable), w2's columns by w2's g_idx, and w13's rows (gate and up, with their scales and zero
// points) in w2's sorted column order, so the intermediate comes out in the order w2 reads it.
// The products and sums are the same; only x must be read through the input order, which goes
// to `input_perm` ([E_local, H]; the GEMM gathers each expert's inputs through it). On success
// `weights` becomes the sorted view: act_order false, no group indices, w13_input_perm set.
// Returns false, changing nothing, where the sort cannot make whole groups: a group with other
// than `group` columns, gate and up with different g_idx, w2 split by TP (its scales cover every
// group of the logical I), biases (their rows would move too), or a group that is not a multiple
// of 32. Experts in parallel over the context's pool.
Result<bool> SortActOrderExperts(KernelContext& ctx, ExpertWeights* weights,
                                 const ActOrderBuffers& buffers, std::vector<int32_t>* input_perm);
// The view of act-order experts SortActOrderExperts sorted, given the view as loaded and their
// input order: act_order false, no group indices, w13_input_perm = input_perm.
void ViewSortedByGroup(ExpertWeights* weights, const int32_t* input_perm);

// Bytes of one expert's data + scales + zero points for the matrix [rows, cols] in `scheme` (the
// global scale, 4 bytes per tensor, is not counted).
int64_t ExpertMatrixBytes(const WeightScheme& scheme, int64_t rows, int64_t cols);

// Checks the shape rules above (InvalidArgument naming the field and numbers).
Status ValidateExpertWeights(const ExpertWeights& w, const ActivationParams& act);

struct GroupedGemmParams {
  const ExpertWeights* weights = nullptr;
  ActivationParams activation;
  const void* x_sorted = nullptr;  // [num_rows, H] row-major, kF32 or kBF16, grouped by expert
  DType x_dtype = DType::kBF16;
  // Optional gather: when set, grouped row r is row x_rows[r] of x_sorted (e.g. the unsorted
  // tokens and TokenPermutation::sorted_token_idx), so no sorted copy of the input is made.
  const int32_t* x_rows = nullptr;
  const int64_t* expert_offsets = nullptr;  // [E_local + 1], non-decreasing, [0] = 0;
                                            // num_rows = expert_offsets[E_local]
  float* y_sorted = nullptr;                // out: [num_rows, H] fp32, unweighted expert outputs
  bool add_down_bias = true;  // false: skip w2_bias (the runtime adds it on one TP rank only)
};

// The grouped GEMM on the context's instruction set. Experts with no rows cost nothing.
Status GroupedExpertGemm(KernelContext& ctx, const GroupedGemmParams& params);

}  // namespace moeshard
