// The small interface each CPU instruction-set backend implements (private to kernels).
//
// The grouped GEMM driver (expert_gemm.cc) owns the task split and the epilogues' order; a
// backend supplies the inner pieces:
//   dot_rows  out[m, r] = sum_k x[m, k] * W[row_idx[r], k] for a block of tokens and weight rows,
//             dequantising W inside the loop (decode: few tokens per expert);
//   packed_gemm  the same product for many tokens, with the tokens packed in groups of 16
//             (PackedX below) and the result transposed, out[r, m] (prefill; bf16 and MXFP4
//             weights, see PackedFormat);
//   activate  h[i] = bf16(act(gate[i], up[i]));
//   to_bf16   fp32 -> bf16, round to nearest even;
//   quantized_rows_layout / quantize_rows  (optional) the integer 4-bit decode's inputs
//             quantized once per call for all of an expert's tasks (QuantizedRows).
// Backends: portable (plain C++, any CPU) and avx512 (AVX-512 BF16; only selected after a
// runtime CPU check, its translation unit is compiled with -mavx512bf16).
#pragma once

#include <cstdint>

#include "moeshard/base/numeric.h"
#include "moeshard/kernels/expert_gemm.h"
#include "moeshard/kernels/kernel_context.h"

namespace moeshard::internal {

// Columns per K block of the AVX-512 micro-kernels: a 6-row bf16 weight strip of 2048 columns
// (24 KiB) plus a 4-token input tile (16 KiB) fit the 48 KiB L1d, so the strip is reused from L1
// by every token tile. The driver sizes token blocks for min(K, kCpuKBlock) columns.
inline constexpr int64_t kCpuKBlock = 2048;

// One expert's weight matrix [rows, cols] in its format (layouts: expert_gemm.h).
struct MatrixRef {
  WeightFormat format = WeightFormat::kBf16;
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group = 32;      // values per scale along a row (fp8: block columns)
  int64_t block_rows = 1;  // kFp8Block: rows per scale block
  // kBf16 in the row-group layout (expert_gemm.h): Row() does not apply; element (r, c) is at
  // Bf16RowGroupsIndex(r, c, cols). dot_rows then takes row_idx in aligned runs of 16.
  bool row_groups = false;

  int64_t row_bytes = 0;  // bytes of one stored row (the weight-format table's, by ExpertMatrix)
  // kInt4Zp: zero points [rows, scale_cols], one byte each.
  const uint8_t* zeros = nullptr;
  // kInt4Zp act-order (portable dot path only): scale and zero columns per row, and the group
  // of each column for the rows before group_index_split ([0]) and from it on ([1]; interleaved
  // gate/up: even and odd rows).
  int64_t scale_cols = 0;
  const int32_t* group_index[2] = {nullptr, nullptr};
  int64_t group_index_split = 0;
  bool group_index_interleaved = false;
  // kNvfp4: the global scale of each row: global[1] for the up half of a gated w13 (rows from
  // global_split on, or the odd rows when interleaved), else global[0].
  float global[2] = {1.0f, 1.0f};
  int64_t global_split = 0;
  bool global_interleaved = false;

  int64_t RowBytes() const { return row_bytes; }
  const uint8_t* Row(int64_t r) const { return data + r * RowBytes(); }
  const int32_t* RowGroupIndex(int64_t r) const {
    const bool second = group_index_interleaved ? r % 2 == 1 : r >= group_index_split;
    return group_index[second ? 1 : 0];
  }
  float RowGlobal(int64_t r) const {
    const bool up = global_interleaved ? r % 2 == 1 : r >= global_split;
    return up ? global[1] : global[0];
  }
};

// The matrix of `expert` in w13 (`w13` true) or w2.
MatrixRef ExpertMatrix(const ExpertWeights& w, bool w13, int64_t expert);

// Tokens' inputs quantized for a backend's integer 4-bit decode, in the layout its kernels read
// for one matrix (CpuBackend::quantized_rows_layout): token t's values (int8 with
// DotRowsArgs::int8_inputs, else int16: q_bytes each) at q + t * ldq * q_bytes bytes, its scales
// at sx + t * ldu and, where the layout has them (with_negc: int8, and int4 and int4-zp on int16),
// the offset's share negc + t * ldu.
struct QuantizedRows {
  void* q = nullptr;
  float* sx = nullptr;
  float* negc = nullptr;
  int64_t ldq = 0;
  int64_t ldu = 0;
  int64_t q_bytes = 1;
  bool with_negc = false;

  // The rows from token t on.
  QuantizedRows From(int64_t t) const {
    QuantizedRows r = *this;
    if (q != nullptr) r.q = static_cast<uint8_t*>(q) + t * ldq * q_bytes;
    if (sx != nullptr) r.sx = sx + t * ldu;
    if (negc != nullptr) r.negc = negc + t * ldu;
    return r;
  }
};

struct DotRowsArgs {
  const MatrixRef* w = nullptr;
  const bf16_t* x = nullptr;  // [num_tokens, ldx] bf16; the first w->cols columns are used
  int64_t ldx = 0;
  int64_t num_tokens = 0;
  const int32_t* row_idx = nullptr;  // [num_rows] rows of w
  int64_t num_rows = 0;
  float* out = nullptr;  // [num_tokens, ldo] fp32; columns [0, num_rows) written
  int64_t ldo = 0;
  float* work = nullptr;  // backend work space of WorkFloats(...) floats
  // Quantize each token's inputs to int8 per scale group (KernelContextOptions::
  // int8_activations; only for schemes Int8InputScheme takes, on the SIMD backends).
  bool int8_inputs = false;
  // Optional: the tokens' inputs quantized ahead by quantize_rows with the same int8_inputs
  // (token 0's at row 0), in the layout quantized_rows_layout gave for w and num_tokens; the
  // integer decode then does not quantize x.
  const QuantizedRows* quantized = nullptr;
};

// Tokens packed for packed_gemm: groups of kPackedGroup tokens; group g is [KP][16] uint32 at
// data + g * group_stride, where KP = ceil(K / 2) and element (kp, t) holds the bf16 pair
// (x[t, 2kp], x[t, 2kp + 1]) with the even column in the low half (the pair order vdpbf16ps
// multiplies with a weight row's consecutive pair). Tokens past the last real one and the odd
// column past an odd K are zero.
inline constexpr int64_t kPackedGroup = 16;
inline int64_t PackedPairs(int64_t k) { return (k + 1) / 2; }

// Weight schemes packed_gemm takes. MXFP4 is decoded a strip at a time into bf16 with its E8M0
// scale folded in, which is exact (an E2M1 value times a power of two has at most 2 significant
// bits) except that weights below 2^-126 in magnitude flush to zero; NVFP4 likewise with its
// E4M3 block scale (2 x 4 significant bits, from 2^-10 to 2688: exact) and the row's global
// scale applied to the sums. fp8-block, int4 and int4-zp scales would round if folded: their
// strips are decoded unscaled (fp8: value x 2^-8, int4: nibble - 8, int4-zp: code - zero, all
// exact in bf16) and each scale group's partial sums are scaled, which needs groups of whole
// column pairs (int4, int4-zp: whole 32-column decode steps). Act-order GPTQ stays on the dot
// path (its groups are not runs of columns). The kernels take K in blocks of kPackedKBlockCols
// columns, each inside whole scale groups or within one: a group must divide the block or be a
// multiple of it (a group of 96 would be split by a block edge).
inline constexpr int64_t kPackedKBlockCols = 1024;
inline bool PackedGroupFitsKBlocks(int64_t group) {
  return group > 0 && (kPackedKBlockCols % group == 0 || group % kPackedKBlockCols == 0);
}
inline bool PackedFormat(const WeightScheme& q) {
  switch (q.format) {
    case WeightFormat::kBf16:
    case WeightFormat::kMxfp4: return true;
    case WeightFormat::kFp8Block: return q.group % 2 == 0 && PackedGroupFitsKBlocks(q.group);
    case WeightFormat::kInt4: return q.group % 32 == 0 && PackedGroupFitsKBlocks(q.group);
    case WeightFormat::kInt4Zp:
      return q.group % 32 == 0 && PackedGroupFitsKBlocks(q.group) && !q.act_order;
    case WeightFormat::kNvfp4: return q.group == 16;
  }
  return false;
}
// Bytes of PackedGemmArgs::work per weight column.
inline constexpr int64_t kPackedWorkBytesPerCol = 32;

struct PackedGemmArgs {
  const MatrixRef* w = nullptr;      // of a scheme PackedFormat takes
  const int32_t* row_idx = nullptr;  // [num_rows] rows of w
  int64_t num_rows = 0;
  const uint32_t* x = nullptr;  // packed tokens (see above), K = w->cols
  int64_t group_stride = 0;     // uint32 elements between groups (>= KP * 16)
  int64_t num_groups = 0;
  float* out = nullptr;  // out[r * ldo + t] for r < num_rows, t < 16 * num_groups + num_rem
  int64_t ldo = 0;
  void* work = nullptr;  // kPackedWorkBytesPerCol * w->cols bytes (decoded weight rows)
  // Up to kPackedMaxRem more tokens, unpacked (bf16 rows rem_x + t * rem_ldx), multiplied with
  // dot products on each weight strip while it is in L1: out columns 16 * num_groups + t. An
  // expert's last few tokens go here instead of into a zero-padded group of 16.
  const bf16_t* rem_x = nullptr;
  int64_t rem_ldx = 0;
  int64_t num_rem = 0;
};
// Most tokens PackedGemmArgs::rem_x may hold: a dot product on an L1-resident strip costs about
// what the packed form costs per real token, so remainders up to here avoid padding a group of
// 16; 8 rows of 1024 columns (16 KiB) stay in L1 beside the 16 KiB strip.
inline constexpr int64_t kPackedMaxRem = 8;

struct CpuBackend {
  const char* name;
  void (*dot_rows)(const DotRowsArgs& args);
  void (*activate)(const ActivationParams& act, const float* gate, const float* up, int64_t n,
                   bf16_t* h);
  void (*to_bf16)(const float* src, int64_t n, bf16_t* dst);
  // Floats of DotRowsArgs::work needed for a block of `num_tokens` tokens and `cols` columns.
  int64_t (*work_floats)(int64_t num_tokens, int64_t cols);
  // Optional (null: the backend has no packed path and every expert takes dot_rows; then
  // pack_group and store_transposed are null too).
  void (*packed_gemm)(const PackedGemmArgs& args);
  // Packs `num_tokens` (<= 16) rows of x (row t is x + rows[t] * ldx elements, fp32 rounded to
  // nearest even or bf16, `cols` used) into one group of KP * 16 uint32, zero-filling the
  // missing tokens.
  void (*pack_group)(const void* x, DType x_dtype, int64_t ldx, const int32_t* rows,
                     int64_t num_tokens, int64_t cols, uint32_t* group);
  // y[t * ldy + r] = tile[r * ldt + t] (+ bias[r] when non-null) for r < num_rows,
  // t < num_tokens: a packed task's transposed output back into token rows.
  void (*store_transposed)(const float* tile, int64_t ldt, int64_t num_rows, int64_t num_tokens,
                           const float* bias, float* y, int64_t ldy);
  // out[i] = (accumulate ? out[i] : 0) + sum over s < num_rows of weights[s] * rows[s][i], for
  // i < n, the terms added in order of s: one token's expert outputs summed (unpermute).
  void (*weighted_sum)(const float* const* rows, const float* weights, int64_t num_rows, int64_t n,
                       float* out, bool accumulate);
  // The multiply-add instruction the kernels are bound by, and a register-only loop of it for the
  // roofline: `iterations` rounds of independent multiply-adds; returns a value depending on
  // every one (so nothing is optimised away) and adds the FLOPs it did to *flops.
  const char* peak_instruction;
  float (*peak_loop)(int64_t iterations, float seed, double* flops);
  // The read-bandwidth probe in this instruction set's widest loads: XOR-folds `bytes` (a
  // multiple of 256) from p in access pattern `pattern` < read_patterns and returns a value
  // that depends on every byte. Patterns (the bandwidth reported is the best of them, so the
  // yardstick is what the core can pull, not what one pattern gets):
  //   0: one sequential stream, hardware prefetch only;
  //   1: 4 interleaved sequential streams (the buffer cut in equal parts), each
  //      software-prefetched 2 KiB ahead;
  //   2: the same streams prefetched 1 KiB ahead, like the decode kernels' row streams.
  uint64_t (*read_stream)(const uint8_t* p, int64_t bytes, int pattern);
  int read_patterns;
  // Optional (null where dot_rows quantizes no inputs): whether dot_rows on `num_tokens` tokens
  // of `w` (with DotRowsArgs::int8_inputs = int8) can take them quantized ahead
  // (DotRowsArgs::quantized), so a caller quantizes each token once for all its tasks; then the
  // layout's sizes (ldq, ldu, q_bytes of *layout; its pointers untouched) and the scratch bytes
  // quantize_rows needs.
  bool (*quantized_rows_layout)(const MatrixRef& w, int64_t num_tokens, bool int8,
                                QuantizedRows* layout, int64_t* scratch_bytes);
  // Quantizes num_tokens rows of x (ldx apart; w.cols columns) into the rows of `out` (its sizes
  // from quantized_rows_layout for w, int8 and at least num_tokens); `scratch` 8-byte aligned.
  void (*quantize_rows)(const MatrixRef& w, bool int8, const bf16_t* x, int64_t ldx,
                        int64_t num_tokens, const QuantizedRows& out, void* scratch);
};

const CpuBackend& PortableBackend();
// REQUIRES: CpuSupportsAvx512Bf16().
const CpuBackend& Avx512Backend();
// The Highway backend of a SIMD instruction set (kAvx512Vnni, kAvx512, kAvx2Vnni, kAvx2, kNeon,
// kSve; simd_backend.cc), or nullptr when this build did not compile that target.
const CpuBackend* SimdBackendFor(CpuIsa isa);
// Whether this build has the SIMD backend of `isa` and the CPU supports its target.
bool CpuSupportsSimd(CpuIsa isa);
// The SIMD backend the avx512-bf16 kernels hand int8 inputs and the shapes they have no kernels
// for: avx512-vnni where the CPU has AVX512_VNNI, else avx512; nullptr where neither runs.
const CpuBackend* Avx512SimdFallback();
// The backend of a resolved instruction set (KernelContext::isa()).
inline const CpuBackend& CpuBackendFor(CpuIsa isa) {
  if (isa == CpuIsa::kAvx512Bf16) return Avx512Backend();
  if (const CpuBackend* b = SimdBackendFor(isa)) return *b;
  return PortableBackend();
}

}  // namespace moeshard::internal
