// AVX-512 backend: native bf16 dot products (vdpbf16ps, _mm512_dpbf16_ps), weights dequantised
// to bf16 32 values at a time inside the inner loop (or, for the packed path's quantised
// formats, one L1 strip at a time).
//
// This translation unit is compiled with -mavx512f/bw/vl/bf16 -mfma -mf16c; nothing here may run
// before CpuSupportsAvx512Bf16() said yes (KernelContext only selects it then).
//
// Two forms (docs/PERFORMANCE.md has the measurements behind the choices):
// - dot_rows, dot-product form, for few tokens per expert (decode; int4 with zero points and
//   NVFP4 here up to 16 tokens in 128-column blocks, else through the SIMD backend's kernels):
//   weights stay [out, in] row-major like the inputs, acc[i][j] (16 fp32 lanes) +=
//   dpbf16(x[i, k:k+32], w[j, k:k+32]), reduced horizontally at the end. Up to 16 tokens the
//   rows are walked as 4 sequential prefetched streams (the memory-bound decode walk); beyond,
//   MR x NR = 4 x 6 tiles (24 accumulators + 4 inputs + 1 weight = 29 of 32 zmm) over K blocks
//   that keep a 6-row strip in L1 while every token tile passes over it. Quantised formats need
//   per-group partial sums before the fp32 scale FMA, so they use at most 4 x 4 (MXFP4, int4)
//   or 4 x 2 (fp8) tiles.
// - packed_gemm, outer-product form, for 16+ tokens per expert (bf16, MXFP4, fp8-block, int4):
//   see the section "packed (prefill) micro-kernels" below.
// - dot_rows on bf16 weights in the row-group layout (expert_gemm.h), every token count: 16
//   output rows per vector, each token's column pair broadcast; see "row-group micro-kernels".
// GCC 12's AVX-512 intrinsics initialise their "undefined" pass-through operands from
// themselves (_mm256_undefined_pd etc.), which -Wuninitialized reports once inlined here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <type_traits>

#include "base/check.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/roofline_avx512.h"
#include "moeshard/base/math.h"
#include "moeshard/kernels/cpu_constraints.h"

namespace moeshard::internal {
namespace {

constexpr int kMaxMr = 4;
// Sequential weight streams per thread in decode: the bandwidth probe (roofline_avx512.h) finds
// 4 interleaved prefetched streams the best read pattern of these cores; 6 or more are slower.
constexpr int kDecodeStreams = 4;
// Token counts up to this take the streaming decode walk (the packed path starts at 16).
constexpr int64_t kDecodeMaxTokens = 16;
// L1 budget of the decode walk's bf16 inputs (all its tokens): the L1d less 16 KiB for the
// weight streams' prefetched lines and the outputs, at least 16 KiB (so 16 KiB on a 32 KiB L1d,
// where it was measured first, and 32 KiB on Zen 5's 48 KiB). Measured on Zen 5 (one core, 64
// MXFP4 or int4 rows of 7168 columns in L2, 12-16 tokens): 0.62-0.68 TSC cycles per vdpbf16ps
// with 32 KiB against 0.68-0.74 with 16 (longer K blocks: fewer horizontal sums and tile
// restarts); end to end at 8-16 tokens per expert within the host's noise (docs/PERFORMANCE.md).
int64_t DecodeXBytes() {
  static const int64_t bytes = [] {
    const long l1 = ::sysconf(_SC_LEVEL1_DCACHE_SIZE);  // 0 or -1 where unknown
    return std::clamp<int64_t>(int64_t{l1} - 16 * 1024, 16 * 1024, 64 * 1024);
  }();
  return bytes;
}

// Software prefetch distance along each weight row (and on into the next row of a decode
// stream). The hardware prefetchers fetch the streams into L2; the software prefetch brings
// each line into L1 this far ahead of its use. Measured on this VM's cores (one thread, the
// decode walk over real expert rows, median of 200+ interleaved runs): 1 KiB streams 8-20 %
// faster than 2 KiB, 512 B and 3 KiB are slower than 1 KiB.
constexpr int64_t kPrefetchBytes = 1024;

inline __m512bh AsBh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }

// A bf16 pair (4 bytes, any alignment) as one 32-bit lane.
inline uint32_t LoadPair(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The decode walks' stream split: `count` list entries cut into S runs of consecutive entries
// (per = CeilDiv(count, S) each); step s takes entry q * per + s of every run q that has one.
// Writes those positions to pos and returns how many there are.
template <int S>
int StreamStep(int64_t count, int64_t per, int64_t s, int64_t (&pos)[S]) {
  int n = 0;
  for (int q = 0; q < S && q * per + s < count; ++q) pos[n++] = q * per + s;
  return n;
}

inline __mmask32 TailMask32(int64_t n) {
  return n >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint32_t{1} << n) - 1u);
}

// Horizontal sum. (GCC 12's _mm512_reduce_add_ps / extract intrinsics trip -Wuninitialized on
// their internal _mm256_undefined_*; full-width shuffles avoid them.)
inline float HSum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));  // + other 256-bit half
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));  // + neighbouring 128-bit lane
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));        // + other 64 bits of the lane
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));        // + neighbouring float
  return _mm512_cvtss_f32(v);
}

// Horizontal sums of four vectors at once: [sum(a0), sum(a1), sum(a2), sum(a3)].
inline __m128 HSum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  // Per 128-bit lane: [a0 0+2, a1 0+2, a0 1+3, a1 1+3], and the same for a2, a3.
  const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  // Per lane: partial sums of a0, a1, a2, a3; then the four lanes are added.
  __m512 s = _mm512_add_ps(_mm512_shuffle_ps(s01, s23, 0x44), _mm512_shuffle_ps(s01, s23, 0xEE));
  s = _mm512_add_ps(s, _mm512_shuffle_f32x4(s, s, 0x4E));
  s = _mm512_add_ps(s, _mm512_shuffle_f32x4(s, s, 0xB1));
  return _mm512_castps512_ps128(s);
}

inline __m512bh LoadX(const bf16_t* p) { return AsBh(_mm512_loadu_si512(p)); }
inline __m512bh LoadXTail(const bf16_t* p, __mmask32 m) {
  return AsBh(_mm512_maskz_loadu_epi16(m, p));
}

// --- weight decoders: 32 consecutive weights of tile row j at column k, as bf16 ------------

struct Bf16Decoder {
  static constexpr int kMaxNr = 6;
  static constexpr bool kScaled = false;
  const uint8_t* rows[kMaxNr];
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): entries past nr are never read
  Bf16Decoder(const MatrixRef& m, const int32_t* row_idx, int nr) {
    for (int j = 0; j < nr; ++j) rows[j] = m.Row(row_idx[j]);
  }
  // Rows given directly (bf16, column k at row + 2 * k).
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): entries past nr are never read
  Bf16Decoder(const uint8_t* const* row_ptrs, int nr) {
    for (int j = 0; j < nr; ++j) rows[j] = row_ptrs[j];
  }
  __m512bh Load(int j, int64_t k) const { return AsBh(_mm512_loadu_si512(rows[j] + 2 * k)); }
  __m512bh LoadTail(int j, int64_t k, __mmask32 m) const {
    return AsBh(_mm512_maskz_loadu_epi16(m, rows[j] + 2 * k));
  }
  void Prefetch(int j, int64_t k) const {
    _mm_prefetch(reinterpret_cast<const char*>(rows[j] + 2 * k + kPrefetchBytes), _MM_HINT_T0);
  }
  [[maybe_unused]] static constexpr int64_t kValuesPerLine = 32;  // unscaled: no line test
  int64_t GroupCols() const { return 0; }
  __m512 Scale(int, int64_t) const { return _mm512_set1_ps(1.0f); }
};

// Row r's scales, one per scale group: fp8 blocks (fp32, one row of scales per block_rows weight
// rows, the last column block possibly partial) and int4 (bf16, one row per weight row).
inline const float* Fp8ScaleRow(const MatrixRef& m, int64_t r) {
  return reinterpret_cast<const float*>(m.scales) + (r / m.block_rows) * CeilDiv(m.cols, m.group);
}
inline const bf16_t* Int4ScaleRow(const MatrixRef& m, int64_t r) {
  return reinterpret_cast<const bf16_t*>(m.scales) + r * (m.cols / m.group);
}

// fp8 e4m3fn codes decode to bf16 of the value times 2^-8, exactly (Convert); the 2^8 goes into
// the block scale.
struct Fp8Decoder {
  static constexpr int kMaxNr = 2;
  static constexpr bool kScaled = true;
  const uint8_t* rows[kMaxNr];
  const float* scales[kMaxNr];
  int64_t group;  // block columns
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): entries past nr are never read
  Fp8Decoder(const MatrixRef& m, const int32_t* row_idx, int nr) : group(m.group) {
    for (int j = 0; j < nr; ++j) {
      rows[j] = m.Row(row_idx[j]);
      scales[j] = Fp8ScaleRow(m, row_idx[j]);
    }
  }
  // 32 E4M3 codes -> bf16 of value x 2^-8 (exact; the scale carries the 2^8). A normal code
  // (exponent e >= 1) is sign | (e + 112) << 7 | m << 4 in bf16: the code sign-extended to 16
  // bits and moved up 4 puts m at bits 4-6, e at 7-10 and copies of the sign at 11-15, so one
  // vpternlog keeps bits 4-10 and 15 and sets 112 << 7 (bits 11-13). Three instructions and a
  // test per 32 codes. A subnormal code (e = 0, m x 2^-9, and zero) takes a word-table lookup by
  // m, then its sign: two more, only for the steps that hold one (quantized Gaussian weights
  // rarely do: about 1 in 10^4 codes when a block's largest value maps to 448). The NaN codes
  // (0x7f, 0xff) decode as 480 x 2^-8, as the fp16 route two versions back did.
  static __m512bh Convert(__m256i bytes) {
    alignas(64) static constexpr std::array<uint16_t, 32> kSubnormal = {
        0, 0x3700, 0x3780, 0x37c0, 0x3800, 0x3820, 0x3840, 0x3860};  // m x 2^-17, m = 0..7
    const __m512i w = _mm512_cvtepi8_epi16(bytes);  // sign at bits 7-15, e at 3-6, m at 0-2
    constexpr int kAndOr = 0xea, kOrAnd = 0xf8;     // a & b | c; a | b & c
    __m512i r = _mm512_ternarylogic_epi32(_mm512_slli_epi16(w, 4),
                                          _mm512_set1_epi16(static_cast<int16_t>(0x87f0)),
                                          _mm512_set1_epi16(0x3800), kAndOr);
    const __mmask32 subnormal = _mm512_testn_epi16_mask(w, _mm512_set1_epi16(0x78));
    if (subnormal != 0) [[unlikely]] {
      // Index bits 0-4 are m and e's two low bits (0 here).
      r = _mm512_mask_permutexvar_epi16(r, subnormal, w, _mm512_load_si512(kSubnormal.data()));
      r = _mm512_ternarylogic_epi32(r, w, _mm512_set1_epi16(static_cast<int16_t>(0x8000)), kOrAnd);
    }
    return AsBh(r);
  }
  __m512bh Load(int j, int64_t k) const {
    return Convert(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[j] + k)));
  }
  __m512bh LoadTail(int j, int64_t k, __mmask32 m) const {
    return Convert(_mm256_maskz_loadu_epi8(m, rows[j] + k));
  }
  void Prefetch(int j, int64_t k) const {
    _mm_prefetch(reinterpret_cast<const char*>(rows[j] + k + kPrefetchBytes), _MM_HINT_T0);
  }
  static constexpr int64_t kValuesPerLine = 64;
  int64_t GroupCols() const { return group; }
  __m512 Scale(int j, int64_t g) const { return _mm512_set1_ps(scales[j][g] * 256.0f); }
};

// Packed nibbles (low nibble = even column) -> 32 bf16 through a 16-entry word table (vpermw).
inline __m512bh NibblesToBf16(const uint8_t* p, __m512i table) {
  const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  // Word 2i <- low nibble of byte i, word 2i+1 <- high nibble: (d | d << 12) & 0x000F000F.
  const __m512i idx =
      _mm512_and_si512(_mm512_or_si512(d, _mm512_slli_epi32(d, 12)), _mm512_set1_epi32(0x000F000F));
  return AsBh(_mm512_permutexvar_epi16(idx, table));
}

__m512i MakeTable(const std::array<float, 16>& values) {
  alignas(64) uint16_t words[32] = {};  // twice: Nibbles128ToBf16 looks up 5-bit indices
  for (int i = 0; i < 32; ++i) words[i] = FloatToBf16(values[static_cast<size_t>(i % 16)]).bits;
  return _mm512_load_si512(words);
}

const std::array<float, 256>& E8M0Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int e = 0; e < 256; ++e) t[static_cast<size_t>(e)] = E8M0ToFloat(static_cast<uint8_t>(e));
    return t;
  }();
  return table;
}

// E2M1 codes times an E8M0 power of two: the E2M1 value is exact in bf16, the scale is applied
// in fp32 per 32-column group.
struct Mxfp4Decoder {
  static constexpr int kMaxNr = 4;
  static constexpr bool kScaled = true;
  const uint8_t* rows[kMaxNr];
  const uint8_t* scales[kMaxNr];
  __m512i table;
  const float* e8m0;
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): entries past nr are never read
  Mxfp4Decoder(const MatrixRef& m, const int32_t* row_idx, int nr) {
    static const __m512i kTable = MakeTable(kFp4E2M1Values);
    table = kTable;
    e8m0 = E8M0Table().data();
    for (int j = 0; j < nr; ++j) {
      rows[j] = m.Row(row_idx[j]);
      scales[j] = m.scales + row_idx[j] * (m.cols / m.group);
    }
  }
  __m512bh Load(int j, int64_t k) const { return NibblesToBf16(rows[j] + k / 2, table); }
  __m512bh LoadTail(int j, int64_t k, __mmask32) const { return Load(j, k); }  // cols % 32 == 0
  void Prefetch(int j, int64_t k) const {
    _mm_prefetch(reinterpret_cast<const char*>(rows[j] + k / 2 + kPrefetchBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(scales[j] + k / 32 + kPrefetchBytes / 16),
                 _MM_HINT_T0);
  }
  static constexpr int64_t kValuesPerLine = 128;
  int64_t GroupCols() const { return kCpuMxfp4GroupSize; }
  __m512 Scale(int j, int64_t g) const { return _mm512_set1_ps(e8m0[scales[j][g]]); }
  static bool BlockDecodes(int64_t group_cols) { return group_cols == 32; }
  // Defined with the block decode below.
  __m512 BlockScale(int j, int64_t k) const;
};

// Column k's scale group: a shift where the group is a power of two (32, 64 and 128, the groups
// checkpoints use), else a division. The 4-bit decode walk asks several times per 128 columns,
// and a 64-bit division there took longer than the block's products.
struct GroupOf {
  int64_t group;
  int shift;
  explicit GroupOf(int64_t g)
      : group(g),
        shift(std::has_single_bit(static_cast<uint64_t>(g))
                  ? std::countr_zero(static_cast<uint64_t>(g))
                  : -1) {}
  int64_t operator()(int64_t k) const { return shift >= 0 ? k >> shift : k / group; }
};

std::array<float, 16> Int4Values() {
  std::array<float, 16> v{};
  for (int i = 0; i < 16; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i - 8);
  return v;
}

struct Int4Decoder {
  static constexpr int kMaxNr = 4;
  static constexpr bool kScaled = true;
  const uint8_t* rows[kMaxNr];
  const bf16_t* scales[kMaxNr];
  __m512i table;
  GroupOf group_of;  // group_of.group: the scale group's columns
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): entries past nr are never read
  Int4Decoder(const MatrixRef& m, const int32_t* row_idx, int nr) : group_of(m.group) {
    static const __m512i kTable = MakeTable(Int4Values());
    table = kTable;
    for (int j = 0; j < nr; ++j) {
      rows[j] = m.Row(row_idx[j]);
      scales[j] = Int4ScaleRow(m, row_idx[j]);
    }
  }
  __m512bh Load(int j, int64_t k) const { return NibblesToBf16(rows[j] + k / 2, table); }
  __m512bh LoadTail(int j, int64_t k, __mmask32) const { return Load(j, k); }  // cols % g == 0
  void Prefetch(int j, int64_t k) const {
    _mm_prefetch(reinterpret_cast<const char*>(rows[j] + k / 2 + kPrefetchBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(scales[j] + group_of(k) + kPrefetchBytes / 8),
                 _MM_HINT_T0);
  }
  static constexpr int64_t kValuesPerLine = 128;
  int64_t GroupCols() const { return group_of.group; }
  __m512 Scale(int j, int64_t g) const { return _mm512_set1_ps(Bf16ToFloat(scales[j][g])); }
  // Decode in 128-column blocks (NibbleTile): groups of 32 or 64 columns, or whole blocks.
  static bool BlockDecodes(int64_t group_cols) {
    return group_cols == 32 || group_cols == 64 || group_cols % 128 == 0;
  }
  __m512 BlockScale(int j, int64_t k) const;
};

std::array<float, 16> CodeValues() {
  std::array<float, 16> v{};
  for (int i = 0; i < 16; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i);
  return v;
}

// AWQ/GPTQ int4, (code - zero) x scale with an fp16 scale and a zero-point byte per group; the
// decode walk only (the SIMD backend's kernels take more tokens). The codes 0-15 are exact in
// bf16, and each group's partial sum of code x input loses zero x (the group's input sum):
// sum (code - z) x = sum code x - z sum x, with the input sums made once per call
// (Nibble128InputSums).
struct Int4ZpDecoder {
  static constexpr int kMaxNr = 4;
  const uint8_t* rows[kMaxNr];
  const fp16_t* scales[kMaxNr];
  const uint8_t* zeros[kMaxNr];
  __m512i table;
  GroupOf group_of;  // group_of.group: the scale group's columns
  int64_t cols;
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): entries past nr are never read
  Int4ZpDecoder(const MatrixRef& m, const int32_t* row_idx, int nr)
      : group_of(m.group), cols(m.cols) {
    static const __m512i kTable = MakeTable(CodeValues());
    table = kTable;
    const int64_t groups = m.cols / m.group;
    for (int j = 0; j < nr; ++j) {
      rows[j] = m.Row(row_idx[j]);
      scales[j] = reinterpret_cast<const fp16_t*>(m.scales) + row_idx[j] * groups;
      zeros[j] = m.zeros + row_idx[j] * groups;
    }
  }
  void Prefetch(int j, int64_t k) const {
    _mm_prefetch(reinterpret_cast<const char*>(rows[j] + k / 2 + kPrefetchBytes), _MM_HINT_T0);
    const int64_t g = group_of(k);
    _mm_prefetch(reinterpret_cast<const char*>(scales[j] + g + kPrefetchBytes / 8), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(zeros[j] + g + kPrefetchBytes / 8), _MM_HINT_T0);
  }
  int64_t GroupCols() const { return group_of.group; }
  static bool BlockDecodes(int64_t group_cols) {
    return group_cols == 32 || group_cols == 64 || group_cols % 128 == 0;
  }
  // The scales and the zero points of the 128-column block at k, per 128-bit lane (lane L:
  // columns 32L..32L+31).
  __m512 BlockScale(int j, int64_t k) const;
  __m512 BlockZero(int j, int64_t k) const;
};

// NVFP4: E2M1 codes (as MXFP4's) with an E4M3 scale per 16 columns and an fp32 global scale per
// row's tensor; the decode walk only (the SIMD backend's kernels take more tokens). Lane f of
// NibbleTile's partial sums covers columns 8f..8f+7 of its block, inside one group of 16, so
// the block's 8 scales spread over two lanes each.
struct Nvfp4Decoder {
  static constexpr int kMaxNr = 4;
  const uint8_t* rows[kMaxNr];
  const uint8_t* scales[kMaxNr];
  float global[kMaxNr];
  __m512i table;
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): entries past nr are never read
  Nvfp4Decoder(const MatrixRef& m, const int32_t* row_idx, int nr) {
    static const __m512i kTable = MakeTable(kFp4E2M1Values);
    table = kTable;
    for (int j = 0; j < nr; ++j) {
      rows[j] = m.Row(row_idx[j]);
      scales[j] = m.scales + row_idx[j] * (m.cols / 16);
      global[j] = m.RowGlobal(row_idx[j]);
    }
  }
  void Prefetch(int j, int64_t k) const {
    _mm_prefetch(reinterpret_cast<const char*>(rows[j] + k / 2 + kPrefetchBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(scales[j] + k / 16 + kPrefetchBytes / 8),
                 _MM_HINT_T0);
  }
  static int64_t GroupCols() { return 16; }
  static bool BlockDecodes(int64_t group_cols) { return group_cols == 16; }
  __m512 BlockScale(int j, int64_t k) const;
};

// Decoders whose groups have zero points (their tiles need the inputs' group sums).
template <class Dec>
constexpr bool kZeroPoints = std::is_same_v<Dec, Int4ZpDecoder>;
// Decoders with only the 128-column block form (NibbleTile), no per-32-column Tile.
template <class Dec>
constexpr bool kBlocksOnly = kZeroPoints<Dec> || std::is_same_v<Dec, Nvfp4Decoder>;

// --- 4-bit weights in blocks of 128 columns (the decode walk) -------------------------------
//
// 64 bytes of packed nibbles are 128 weights in four vectors: read as 32 words, word i holds
// columns 4i..4i+3 (one per nibble), and vector v takes nibble v of every word, shifted down by
// 4v bits, through one word-table lookup (vpermw on the low 5 bits of each word: the 16-entry
// table is stored twice, so the next nibble's low bit does not matter). That is 3 shifts and 4
// lookups per 128 weights; the byte-table decode before it (two vpshufb per nibble half and one
// byte interleave per vector) took 11 instructions, 8 of them on the shuffle ports, and bounded
// the 4-bit decode on these cores (measured, one Zen 4 core, 4 prefetched streams of MXFP4 rows:
// 16.4 GB/s before, 24.8 GB/s with this decode and the scale below, against 20-24 GB/s for a
// plain summing read). The weights come out in a fixed order within the block (Nibble128Column);
// each token's inputs are put in that order once per call. Lane L (128 bits) of every vector
// holds columns 32L..32L+31 of the block, so one scale group of 32 columns is one lane.
inline void Nibbles128ToBf16(const uint8_t* p, __m512i table, __m512bh (&v)[4]) {
  const __m512i b = _mm512_loadu_si512(p);
  v[0] = AsBh(_mm512_permutexvar_epi16(b, table));
  v[1] = AsBh(_mm512_permutexvar_epi16(_mm512_srli_epi16(b, 4), table));
  v[2] = AsBh(_mm512_permutexvar_epi16(_mm512_srli_epi16(b, 8), table));
  v[3] = AsBh(_mm512_permutexvar_epi16(_mm512_srli_epi16(b, 12), table));
}

// The block column of position p in Nibbles128ToBf16's order: vector p / 32, word p % 32.
constexpr int Nibble128Column(int p) { return 4 * (p % 32) + p / 32; }

// dst[t * ldd, :] = src[t, :] in the block order (cols % 128 == 0). Output vector v of a block
// takes words v, v + 4, ..., v + 28 of each input vector q (columns 32q..32q+31) into its words
// 8q..8q+7: two two-source word permutes and a blend per output vector.
void Nibble128Order(const bf16_t* src, int64_t lds, int64_t num_tokens, int64_t cols, bf16_t* dst,
                    int64_t ldd) {
  // Word i of output vector v: the block column's word in the input pair holding it (q % 2).
  alignas(64) static constexpr std::array<std::array<uint16_t, 32>, 4> kIndex = [] {
    std::array<std::array<uint16_t, 32>, 4> idx{};
    for (int p = 0; p < 128; ++p) {
      idx[static_cast<size_t>(p / 32)][static_cast<size_t>(p % 32)] =
          static_cast<uint16_t>(Nibble128Column(p) % 64);
    }
    return idx;
  }();
  for (int64_t t = 0; t < num_tokens; ++t) {
    const bf16_t* x = src + t * lds;
    bf16_t* y = dst + t * ldd;
    for (int64_t k0 = 0; k0 < cols; k0 += 128) {
      __m512i in[4];
      for (int q = 0; q < 4; ++q) in[q] = _mm512_loadu_si512(x + k0 + 32 * q);
      for (int v = 0; v < 4; ++v) {
        const __m512i idx = _mm512_load_si512(kIndex[static_cast<size_t>(v)].data());
        const __m512i lo = _mm512_permutex2var_epi16(in[0], idx, in[1]);  // words 0-15
        const __m512i hi = _mm512_permutex2var_epi16(in[2], idx, in[3]);  // words 16-31
        _mm512_storeu_si512(y + k0 + 32 * v, _mm512_mask_blend_epi16(0xffff0000U, lo, hi));
      }
    }
  }
}

// After each ordered row's cols columns (x[t * ldx + cols ...], as floats): per 128-column block
// the 16 lanes NibbleTile's partial sums take, summed over the inputs alone (lane f: columns
// 8f..8f+7 of the block), by the same products with ones, for the zero points' terms.
void Nibble128InputSums(bf16_t* x, int64_t ldx, int64_t num_tokens, int64_t cols) {
  const __m512bh ones = AsBh(_mm512_set1_epi16(0x3f80));
  for (int64_t t = 0; t < num_tokens; ++t) {
    const bf16_t* row = x + t * ldx;
    float* sums = reinterpret_cast<float*>(x + t * ldx + cols);
    for (int64_t k0 = 0; k0 < cols; k0 += 128) {
      __m512 s = _mm512_dpbf16_ps(_mm512_setzero_ps(), LoadX(row + k0), ones);
      s = _mm512_dpbf16_ps(s, LoadX(row + k0 + 32), ones);
      s = _mm512_dpbf16_ps(s, LoadX(row + k0 + 64), ones);
      s = _mm512_dpbf16_ps(s, LoadX(row + k0 + 96), ones);
      _mm512_storeu_ps(sums + k0 / 8, s);
    }
  }
}

// [s0 x 4, s1 x 4, s2 x 4, s3 x 4] as fp32 bits from four kBytes-wide values s0..s3 (8 or 16
// bits) in the low 32 or 64 bits of every 128-bit lane of `v`: value L goes to the top of each
// dword of lane L, the other bytes are zero (one vpshufb; vpermb would need AVX512_VBMI, which
// Cooper Lake's AVX-512 BF16 lacks).
template <int kBytes>
inline __m512i ValuesToLaneTops(__m512i v) {
  // Dword byte b of lane L: byte kBytes * L + b - (4 - kBytes) of the lane for the top kBytes
  // bytes; index 0x80 (a zero) below them.
  auto lane = [](int value) {
    unsigned idx = 0;
    for (int b = 0; b < 4; ++b) {
      const int src = b >= 4 - kBytes ? kBytes * value + b - (4 - kBytes) : 0x80;
      idx |= static_cast<unsigned>(src) << (8 * b);
    }
    return static_cast<int>(idx);
  };
  const __m512i idx =
      _mm512_setr_epi32(lane(0), lane(0), lane(0), lane(0), lane(1), lane(1), lane(1), lane(1),
                        lane(2), lane(2), lane(2), lane(2), lane(3), lane(3), lane(3), lane(3));
  return _mm512_shuffle_epi8(v, idx);
}

// The E8M0 scales of the block's four groups over the lanes, exactly as E8M0ToFloat: e << 23 is
// the fp32 2^(e - 127) for 1 <= e <= 254 (one vpshufb and one shift); one vfixupimmps then
// turns the two other codes' floats, +0 (e = 0) and +inf (e = 255), into 2^-127 (an fp32
// subnormal, the first operand, kept) and a quiet NaN (0x7fc00000, the infinity quietened).
// Table nibbles by input class: QNaN, SNaN, zero, +1, -inf, +inf, negative, positive.
inline __m512 E8m0BlockScale(const uint8_t* e4) {
  const __m512i v = _mm512_set1_epi32(static_cast<int>(LoadPair(e4)));
  const __m512 pow2 = _mm512_castsi512_ps(_mm512_srli_epi32(ValuesToLaneTops<1>(v), 1));
  constexpr int kTable = 0x11211011;  // zero: keep the first operand; +inf: QNaN(input); else input
  return _mm512_fixupimm_ps(_mm512_castsi512_ps(_mm512_set1_epi32(0x00400000)), pow2,
                            _mm512_set1_epi32(kTable), 0);
}

inline __m512 Mxfp4Decoder::BlockScale(int j, int64_t k) const {
  return E8m0BlockScale(scales[j] + k / 32);
}

inline __m512 Int4Decoder::BlockScale(int j, int64_t k) const {
  const bf16_t* s = scales[j] + group_of(k);
  const int64_t group = group_of.group;
  if (group == 32) {  // bf16 scales are the top halves of their fp32
    uint64_t four = 0;
    std::memcpy(&four, s, sizeof(four));
    return _mm512_castsi512_ps(ValuesToLaneTops<2>(_mm512_set1_epi64(static_cast<int64_t>(four))));
  }
  if (group == 64) {
    const __m512 two = _mm512_setr_ps(Bf16ToFloat(s[0]), Bf16ToFloat(s[1]), 0, 0, 0, 0, 0, 0, 0, 0,
                                      0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 two);
  }
  return _mm512_set1_ps(Bf16ToFloat(*s));
}

// Four, two or one per-group value(s) of a 128-column block spread over the lanes: lane L takes
// the group of columns 32L..32L+31.
inline __m512 GroupsToLanes(__m128 four, int64_t group) {
  if (group == 32) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                 _mm512_castps128_ps512(four));
  }
  if (group == 64) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_castps128_ps512(four));
  }
  return _mm512_broadcastss_ps(four);
}

// The block's four, two or one per-group values of type T (group 32, 64 or more) in the low
// bytes, by fixed-size copies.
template <class T>
inline int64_t BlockGroupBits(const T* p, int64_t group) {
  int64_t bits = 0;
  if (group == 32) {
    std::memcpy(&bits, p, 4 * sizeof(T));
  } else if (group == 64) {
    std::memcpy(&bits, p, 2 * sizeof(T));
  } else {
    std::memcpy(&bits, p, sizeof(T));
  }
  return bits;
}

inline __m512 Int4ZpDecoder::BlockScale(int j, int64_t k) const {
  const int64_t group = group_of.group;
  const __m128i bits = _mm_cvtsi64_si128(BlockGroupBits(scales[j] + group_of(k), group));
  return GroupsToLanes(_mm_cvtph_ps(bits), group);
}

inline __m512 Int4ZpDecoder::BlockZero(int j, int64_t k) const {
  const int64_t group = group_of.group;
  const __m128i bytes = _mm_cvtsi64_si128(BlockGroupBits(zeros[j] + group_of(k), group));
  return GroupsToLanes(_mm_cvtepi32_ps(_mm_cvtepu8_epi32(bytes)), group);
}

// The E4M3 scales as fp16 bits (the byte shifted up 7 and its sign bit moved to the top: the
// value times 2^-8, subnormals included; the 2^8 goes into the global scale), then two lanes
// each.
inline __m512 Nvfp4Decoder::BlockScale(int j, int64_t k) const {
  uint64_t eight = 0;
  std::memcpy(&eight, scales[j] + k / 16, 8);
  const __m128i bytes = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(eight)));
  const __m128i t = _mm_slli_epi16(bytes, 7);
  const __m128i h = _mm_add_epi16(t, _mm_and_si128(t, _mm_set1_epi16(0x4000)));
  const __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f * global[j]));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                               _mm512_castps256_ps512(f));
}

// --- micro-kernels ---------------------------------------------------------------------------

// out[i * ldo + j] (+)= the horizontal sum of acc[i][j].
template <int MR, int NR>
inline void StoreTile(const __m512 (&acc)[MR][NR], float* out, int64_t ldo, bool accumulate) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    int j = 0;
#pragma GCC unroll 2
    for (; j + 4 <= NR; j += 4) {
      __m128 v = HSum4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
      if (accumulate) v = _mm_add_ps(v, _mm_loadu_ps(out + i * ldo + j));
      _mm_storeu_ps(out + i * ldo + j, v);
    }
#pragma GCC unroll 8
    for (; j < NR; ++j) {
      const float v = HSum(acc[i][j]);
      out[i * ldo + j] = accumulate ? out[i * ldo + j] + v : v;
    }
  }
}

// out[i * ldo + j] = sum_k x[i, k] * w[j, k] for i < MR, j < NR.
// Columns [kbegin, kend) only; `accumulate` adds to out instead of overwriting it (K blocks
// after the first). REQUIRES: kbegin is a multiple of the decoder's group.
template <class Dec, int MR, int NR>
void Tile(const Dec& d, const bf16_t* x, int64_t ldx, int64_t kbegin, int64_t kend, float* out,
          int64_t ldo, bool accumulate) {
  const int64_t cols = kend;
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  if constexpr (!Dec::kScaled) {
    int64_t k = kbegin;
    for (; k + 32 <= cols; k += 32) {
      __m512bh xv[MR];
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) xv[i] = LoadX(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        d.Prefetch(j, k);
        const __m512bh wv = d.Load(j, k);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv[i], wv);
      }
    }
    if (k < cols) {
      const __mmask32 m = TailMask32(cols - k);
      __m512bh xv[MR];
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) xv[i] = LoadXTail(x + i * ldx + k, m);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        const __m512bh wv = d.LoadTail(j, k, m);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv[i], wv);
      }
    }
  } else if (d.GroupCols() == 32) {
    // One scale per 32-column step (MXFP4, int4 g32): scale each step's dot product directly.
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t k = kbegin; k < cols; k += 32) {
      __m512bh xv[MR];
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) xv[i] = LoadX(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        if (k % Dec::kValuesPerLine == 0) d.Prefetch(j, k);
        const __m512bh wv = d.Load(j, k);
        const __m512 sc = d.Scale(j, k / 32);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          acc[i][j] = _mm512_fmadd_ps(_mm512_dpbf16_ps(zero, xv[i], wv), sc, acc[i][j]);
        }
      }
    }
  } else {
    const int64_t group_cols = d.GroupCols();
    for (int64_t k0 = kbegin, g = kbegin / group_cols; k0 < cols; k0 += group_cols, ++g) {
      const int64_t kend = k0 + group_cols < cols ? k0 + group_cols : cols;
      __m512 part[MR][NR];
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) part[i][j] = _mm512_setzero_ps();
      }
      int64_t k = k0;
      for (; k + 32 <= kend; k += 32) {
        __m512bh xv[MR];
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) xv[i] = LoadX(x + i * ldx + k);
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) {
          if (k % Dec::kValuesPerLine == 0) d.Prefetch(j, k);
          const __m512bh wv = d.Load(j, k);
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) part[i][j] = _mm512_dpbf16_ps(part[i][j], xv[i], wv);
        }
      }
      if (k < kend) {
        const __mmask32 m = TailMask32(kend - k);
        __m512bh xv[MR];
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) xv[i] = LoadXTail(x + i * ldx + k, m);
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) {
          const __m512bh wv = d.LoadTail(j, k, m);
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) part[i][j] = _mm512_dpbf16_ps(part[i][j], xv[i], wv);
        }
      }
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        const __m512 sc = d.Scale(j, g);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_fmadd_ps(part[i][j], sc, acc[i][j]);
      }
    }
  }
  StoreTile<MR, NR>(acc, out, ldo, accumulate);
}

template <class Dec>
using TileFn = void (*)(const Dec&, const bf16_t*, int64_t, int64_t, int64_t, float*, int64_t,
                        bool);

// Tile over 4-bit weights in 128-column blocks: x in the block order (Nibble128Order); the four
// products of a block share one scale vector (per lane: the group's scale).
template <class Dec, int MR, int NR>
void NibbleTile(const Dec& d, const bf16_t* x, int64_t ldx, int64_t kbegin, int64_t kend,
                float* out, int64_t ldo, bool accumulate) {
  const __m512 zero = _mm512_setzero_ps();
  const __m512i table = d.table;
  const uint8_t* rows[NR];
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j) rows[j] = d.rows[j];
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = zero;
  }
  for (int64_t k = kbegin; k < kend; k += 128) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      d.Prefetch(j, k);
      __m512bh w[4];
      Nibbles128ToBf16(rows[j] + k / 2, table, w);
      const __m512 sc = d.BlockScale(j, k);
      __m512 zp = zero;
      if constexpr (kZeroPoints<Dec>) zp = d.BlockZero(j, k);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const bf16_t* xi = x + i * ldx + k;
        __m512 part = _mm512_dpbf16_ps(zero, LoadX(xi), w[0]);
        part = _mm512_dpbf16_ps(part, LoadX(xi + 32), w[1]);
        part = _mm512_dpbf16_ps(part, LoadX(xi + 64), w[2]);
        part = _mm512_dpbf16_ps(part, LoadX(xi + 96), w[3]);
        if constexpr (kZeroPoints<Dec>) {  // less zero x the inputs' sums (after the row's columns)
          const float* sums = reinterpret_cast<const float*>(x + i * ldx + d.cols) + k / 8;
          part = _mm512_fnmadd_ps(zp, _mm512_loadu_ps(sums), part);
        }
        acc[i][j] = _mm512_fmadd_ps(part, sc, acc[i][j]);
      }
    }
  }
  StoreTile<MR, NR>(acc, out, ldo, accumulate);
}

// The tiles of every MR x NR, Tile's or (kBlocks) NibbleTile's.
template <class Dec, bool kBlocks, int MR, int... NRs>
constexpr std::array<TileFn<Dec>, sizeof...(NRs)> TileRow(std::integer_sequence<int, NRs...>) {
  if constexpr (kBlocks) {
    return {&NibbleTile<Dec, MR, NRs + 1>...};
  } else {
    return {&Tile<Dec, MR, NRs + 1>...};
  }
}

template <class Dec, bool kBlocks = false>
struct TileTable {
  using Seq = std::make_integer_sequence<int, Dec::kMaxNr>;
  std::array<std::array<TileFn<Dec>, Dec::kMaxNr>, kMaxMr> fns = {
      TileRow<Dec, kBlocks, 1>(Seq{}), TileRow<Dec, kBlocks, 2>(Seq{}),
      TileRow<Dec, kBlocks, 3>(Seq{}), TileRow<Dec, kBlocks, 4>(Seq{})};
};

// 4-bit decoders whose decode walk takes 128-column blocks.
template <class Dec>
constexpr bool kNibbleBlocks =
    std::is_same_v<Dec, Mxfp4Decoder> || std::is_same_v<Dec, Int4Decoder> || kBlocksOnly<Dec>;

// Wide tiles of the fp8 decode walk: up to kWideMr tokens times the step's rows (up to 2), when a
// call has more than kMaxMr tokens. The MR x NR tiles decode each row once per kMaxMr tokens, and
// at 5-16 tokens the fp8 decode costs about as much as the products. Tall tiles (up to 8 tokens
// x one row) decode once per 8 tokens but load every token's inputs once per row: 8 loads per 8
// products (with everything in L1 they reach about half the vdpbf16ps peak, and little more
// without the decode). The wide tiles load each input once for both rows. Their 8 x 2 partial sums
// and sums do not fit the 32 registers with the inputs (the sums spill; they change once per scale
// block). Measured (Qwen3, Kimi-K2 and Kimi-K3 shapes, 8 tokens per expert, three alternated
// pairs): 0.86-0.88x the time of the tall tiles; tiles of up to 6 tokens took 1.03-1.04x the time
// of these, and tiles of up to 5 and up to 4 (the MR x NR tiles) 1.06-1.09x and 1.15-1.17x the time
// of up to 6. Tokens are split into tiles of balanced sizes.
constexpr int kWideMr = 8;

struct Fp8WideTable {
  using Seq = std::make_integer_sequence<int, Fp8Decoder::kMaxNr>;
  std::array<std::array<TileFn<Fp8Decoder>, Fp8Decoder::kMaxNr>, kWideMr> fns = {
      TileRow<Fp8Decoder, false, 1>(Seq{}), TileRow<Fp8Decoder, false, 2>(Seq{}),
      TileRow<Fp8Decoder, false, 3>(Seq{}), TileRow<Fp8Decoder, false, 4>(Seq{}),
      TileRow<Fp8Decoder, false, 5>(Seq{}), TileRow<Fp8Decoder, false, 6>(Seq{}),
      TileRow<Fp8Decoder, false, 7>(Seq{}), TileRow<Fp8Decoder, false, 8>(Seq{})};
};

template <class Dec>
void DotRowsImpl(const DotRowsArgs& a) {
  const int64_t cols = a.w->cols;
  // K blocks: a whole multiple of the decoder's scale group.
  int64_t group = 0;
  if (a.num_rows > 0) group = Dec(*a.w, a.row_idx, 1).GroupCols();
  auto k_block = [&](int64_t kc) { return group > 0 ? RoundUp(kc, group) : kc; };
  if (a.num_tokens <= kDecodeMaxTokens) {
    // Decode (few tokens): memory-bound. The rows are cut into kDecodeStreams runs of
    // consecutive list entries (consecutive weight rows: the driver lists row blocks in order)
    // and each tile takes one row of every run, so the reads are kDecodeStreams long sequential
    // streams whose prefetches run on into the next row. K blocks walk each row in order, so
    // blocking does not break the streams; it keeps the inputs (and, for several token tiles,
    // the rows' block) in L1.
    constexpr int kStreams = std::min(kDecodeStreams, Dec::kMaxNr);
    // K block: the inputs of all the tokens stay within DecodeXBytes() of L1 (one token: usually
    // all of K), so the weight streams do not evict them.
    const int64_t kc =
        k_block(std::max<int64_t>(256, DecodeXBytes() / (2 * a.num_tokens) / 256 * 256));
    const int64_t per = CeilDiv(a.num_rows, int64_t{kStreams});
    // 4-bit weights in 128-column blocks, the inputs put in the blocks' order once (in work;
    // with zero points each row followed by its block sums, cols / 8 floats). The decoders with
    // only this form come here only so (DotRows).
    const decltype(TileTable<Dec, true>::fns)* fns = nullptr;
    if constexpr (!kBlocksOnly<Dec>) {
      static constexpr TileTable<Dec> kTable;
      fns = &kTable.fns;
    }
    const bf16_t* x = a.x;
    int64_t ldx = a.ldx;
    if constexpr (kNibbleBlocks<Dec>) {
      static constexpr TileTable<Dec, true> kNibbleTable;
      if (a.num_rows > 0 && cols % 128 == 0 && Dec::BlockDecodes(group)) {
        auto* ordered = reinterpret_cast<bf16_t*>(a.work);
        ldx = kZeroPoints<Dec> ? cols + cols / 4 : cols;
        Nibble128Order(a.x, a.ldx, a.num_tokens, cols, ordered, ldx);
        if constexpr (kZeroPoints<Dec>) Nibble128InputSums(ordered, ldx, a.num_tokens, cols);
        fns = &kNibbleTable.fns;
        x = ordered;
      }
    }
    for (int64_t s = 0; s < per; ++s) {
      int64_t col[kStreams];
      const int nr = StreamStep(a.num_rows, per, s, col);
      int32_t idx[kStreams];
      for (int j = 0; j < nr; ++j) idx[j] = a.row_idx[col[j]];
      const Dec d(*a.w, idx, nr);
      float tile[kDecodeMaxTokens * kStreams];
      for (int64_t k0 = 0; k0 < cols; k0 += kc) {
        const int64_t k1 = std::min(cols, k0 + kc);
        if constexpr (std::is_same_v<Dec, Fp8Decoder>) {
          static constexpr Fp8WideTable kWide;
          if (a.num_tokens > kMaxMr) {  // the wide tiles (kWideMr)
            const int64_t tiles = CeilDiv(a.num_tokens, int64_t{kWideMr});
            int64_t m0 = 0;
            for (int64_t t = 0; t < tiles; ++t) {
              const int mr = static_cast<int>(CeilDiv(a.num_tokens - m0, tiles - t));
              kWide.fns[static_cast<size_t>(mr - 1)][static_cast<size_t>(nr - 1)](
                  d, x + m0 * ldx, ldx, k0, k1, tile + m0 * kStreams, kStreams, k0 > 0);
              m0 += mr;
            }
            continue;
          }
        }
        for (int64_t m0 = 0; m0 < a.num_tokens; m0 += kMaxMr) {
          const int mr = static_cast<int>(std::min<int64_t>(kMaxMr, a.num_tokens - m0));
          (*fns)[static_cast<size_t>(mr - 1)][static_cast<size_t>(nr - 1)](
              d, x + m0 * ldx, ldx, k0, k1, tile + m0 * kStreams, kStreams, k0 > 0);
        }
      }
      for (int64_t m = 0; m < a.num_tokens; ++m) {
        for (int j = 0; j < nr; ++j) a.out[m * a.ldo + col[j]] = tile[m * kStreams + j];
      }
    }
    return;
  }
  if constexpr (!kBlocksOnly<Dec>) {
    static constexpr TileTable<Dec> kTable;
    const int64_t kc = k_block(kCpuKBlock);
    for (int64_t k0 = 0; k0 < cols; k0 += kc) {
      const int64_t k1 = std::min(cols, k0 + kc);
      for (int64_t r0 = 0; r0 < a.num_rows; r0 += Dec::kMaxNr) {
        const int nr = static_cast<int>(std::min<int64_t>(Dec::kMaxNr, a.num_rows - r0));
        const Dec d(*a.w, a.row_idx + r0, nr);
        for (int64_t m0 = 0; m0 < a.num_tokens; m0 += kMaxMr) {
          const int mr = static_cast<int>(std::min<int64_t>(kMaxMr, a.num_tokens - m0));
          kTable.fns[static_cast<size_t>(mr - 1)][static_cast<size_t>(nr - 1)](
              d, a.x + m0 * a.ldx, a.ldx, k0, k1, a.out + m0 * a.ldo + r0, a.ldo, k0 > 0);
        }
      }
    }
  }
}

// --- row-group micro-kernels (bf16 weights in the row-group layout) ---------------------------
//
// One weight vector is a column pair of 16 consecutive rows (expert_gemm.h), so
// acc[i][j] (16 output rows of group j, token i) += dpbf16(w_j[kp], bcast(x_i pair kp)): no
// horizontal sums, no padding of the token count, and each 64-byte line of a token's inputs
// serves 16 pairs of every group of the tile. Measured on this VM (one core, Kimi-K2 gate_up
// rows, paired with the row-major decode walk): 10 % more bandwidth at 1 token per expert and
// 30-40 % more at 3-4, where the row-major walk's rereads of the inputs slow its streams.
// Tiles are up to kRgMaxMr tokens x kRgStreams groups (24 accumulators); the groups of a tile
// come from kRgStreams runs of consecutive groups, so the reads are that many sequential
// streams (as in the decode walk), prefetched kPrefetchBytes ahead by the first token tile.
constexpr int kRgMaxMr = 6;
constexpr int kRgStreams = 4;
// Pairs per K block when several token tiles reuse a tile's groups: 4 x 1024 pairs x 64 bytes =
// 256 KiB stays in L2 (one token tile streams the whole K instead). Measured (Qwen3 and Kimi-K2
// shapes at 512 tokens): 1024 pairs 5-10 % faster than blocks of 128 held in L1, which the
// tokens' inputs then share; whole rows of 3584 pairs, past L2, 8 % slower.
constexpr int64_t kRgKBlockPairs = 1024;

template <int MR, int NR>
void RowGroupTile(const uint32_t* const* groups, const bf16_t* x, int64_t ldx, int64_t kp0,
                  int64_t kp1, float* const* out, int64_t ldo, bool accumulate, bool prefetch) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  const uint32_t* g[NR];
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j) g[j] = groups[j];
  const uint8_t* xb = reinterpret_cast<const uint8_t*>(x);
  auto step = [&](int64_t kp) {
    __m512bh wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = AsBh(_mm512_loadu_si512(g[j] + kp * 16));
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv =
          AsBh(_mm512_set1_epi32(static_cast<int>(LoadPair(xb + 2 * (i * ldx + 2 * kp)))));
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv[j], xv);
    }
  };
  if (prefetch) {
    for (int64_t kp = kp0; kp < kp1; ++kp) {
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(g[j] + kp * 16) + kPrefetchBytes, _MM_HINT_T0);
      }
      step(kp);
    }
  } else {
    for (int64_t kp = kp0; kp < kp1; ++kp) step(kp);
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      float* o = out[j] + i * ldo;
      _mm512_storeu_ps(o, accumulate ? _mm512_add_ps(acc[i][j], _mm512_loadu_ps(o)) : acc[i][j]);
    }
  }
}

using RowGroupTileFn = void (*)(const uint32_t* const*, const bf16_t*, int64_t, int64_t, int64_t,
                                float* const*, int64_t, bool, bool);

template <int MR, int... NRs>
constexpr std::array<RowGroupTileFn, sizeof...(NRs)> RowGroupRow(
    std::integer_sequence<int, NRs...>) {
  return {&RowGroupTile<MR, NRs + 1>...};
}

struct RowGroupTable {
  using Seq = std::make_integer_sequence<int, kRgStreams>;
  std::array<std::array<RowGroupTileFn, kRgStreams>, kRgMaxMr> fns = {
      RowGroupRow<1>(Seq{}), RowGroupRow<2>(Seq{}), RowGroupRow<3>(Seq{}),
      RowGroupRow<4>(Seq{}), RowGroupRow<5>(Seq{}), RowGroupRow<6>(Seq{})};
};

// dot_rows for the row-group layout. REQUIRES: row_idx is aligned runs of 16 consecutive rows
// (the driver's gate, up and down blocks are whole groups).
void RowGroupDot(const DotRowsArgs& a) {
  static constexpr RowGroupTable kTable;
  MOESHARD_CHECK(a.num_rows % 16 == 0 && (a.num_rows == 0 || a.row_idx[0] % 16 == 0),
                 "row-group dot: rows must be whole groups of 16, got {} rows from row {}",
                 a.num_rows, a.num_rows > 0 ? a.row_idx[0] : -1);
  const int64_t pairs = a.w->cols / 2;
  const int64_t group_stride = pairs * 16;  // uint32 per group
  const uint32_t* data = reinterpret_cast<const uint32_t*>(a.w->data);
  const int64_t num_groups = a.num_rows / 16;
  const int64_t per = CeilDiv(num_groups, int64_t{kRgStreams});
  // Token tiles of balanced sizes, at most kRgMaxMr each.
  const int64_t num_tiles = CeilDiv(a.num_tokens, int64_t{kRgMaxMr});
  const int64_t kb = num_tiles > 1 ? kRgKBlockPairs : pairs;
  for (int64_t s = 0; s < per; ++s) {
    int64_t pos[kRgStreams];
    const int nr = StreamStep(num_groups, per, s, pos);
    const uint32_t* g[kRgStreams];
    float* o[kRgStreams];
    for (int j = 0; j < nr; ++j) {
      g[j] = data + a.row_idx[16 * pos[j]] / 16 * group_stride;
      o[j] = a.out + 16 * pos[j];
    }
    for (int64_t kp0 = 0; kp0 < pairs; kp0 += kb) {
      const int64_t kp1 = std::min(pairs, kp0 + kb);
      int64_t m0 = 0;
      for (int64_t t = 0; t < num_tiles; ++t) {
        const int mr = static_cast<int>(CeilDiv(a.num_tokens - m0, num_tiles - t));
        float* ot[kRgStreams];
        for (int j = 0; j < nr; ++j) ot[j] = o[j] + m0 * a.ldo;
        kTable.fns[static_cast<size_t>(mr - 1)][static_cast<size_t>(nr - 1)](
            g, a.x + m0 * a.ldx, a.ldx, kp0, kp1, ot, a.ldo, kp0 > 0, t == 0);
        m0 += mr;
      }
    }
  }
}

// The backend the formats without native kernels here run on.
const CpuBackend& SimdFallback() {
  const CpuBackend* b = Avx512SimdFallback();
  return b != nullptr ? *b : PortableBackend();
}

void DotRows(const DotRowsArgs& a) {
  if (a.w->row_groups) return RowGroupDot(a);
  switch (a.w->format) {
    case WeightFormat::kBf16: return DotRowsImpl<Bf16Decoder>(a);
    case WeightFormat::kFp8Block: return DotRowsImpl<Fp8Decoder>(a);
    case WeightFormat::kMxfp4: return DotRowsImpl<Mxfp4Decoder>(a);
    case WeightFormat::kInt4: return DotRowsImpl<Int4Decoder>(a);
    // AWQ/GPTQ int4 and NVFP4 decode here in 128-column blocks; with more tokens or other shapes
    // they take the SIMD backend's AVX-512 kernels (16-bit integer decode, fp32 strips for many
    // tokens): every CPU with AVX-512 BF16 has its AVX-512 F/BW/DQ/VL.
    case WeightFormat::kInt4Zp:
      if (a.num_tokens <= kDecodeMaxTokens && a.w->cols % 128 == 0 &&
          Int4ZpDecoder::BlockDecodes(a.w->group) && a.w->group_index[0] == nullptr) {
        return DotRowsImpl<Int4ZpDecoder>(a);
      }
      return SimdFallback().dot_rows(a);
    case WeightFormat::kNvfp4:
      if (a.num_tokens <= kDecodeMaxTokens && a.w->cols % 128 == 0 && a.w->group == 16) {
        return DotRowsImpl<Nvfp4Decoder>(a);
      }
      return SimdFallback().dot_rows(a);
  }
}

// --- packed (prefill) micro-kernels ----------------------------------------------------------
//
// Outer-product form for many tokens: the tokens are packed in groups of 16 ([pair][16] uint32,
// see PackedX in cpu_backend.h), so one vector holds the same column pair of 16 tokens, and each
// weight row's pair is broadcast straight from its [out, in] row (no weight repacking):
// acc[i][j] (16 tokens of group i, weight row j) += dpbf16(x_pack[i][kp], bcast(w[j][kp])).
// MR x NR = 3 groups x 8 rows: 24 accumulators, and per pair 3 vector loads and 8 broadcasts
// for 24 vdpbf16ps (measured on this VM's cores: 3 x 8 sustains 75-80 % of the vdpbf16ps peak
// with 32-128 tokens per expert, 2 x 12 only 60-75 % at 32-48 tokens). Group counts are tiled
// 3, 3, ..., ending 2 + 2 or 2 rather than 3 + 1 (a 1-group tile is broadcast-bound). There is no
// horizontal reduction: each accumulator is 16 finished outputs, stored as out[row][token]. Tokens
// are padded to 16, so this form pays off from about a group of tokens per expert; fewer tokens use
// the dot-product kernels above. An expert's last n % 16 tokens, when few (PackedGemmArgs::rem_x),
// are not padded: the dot-product tiles multiply them on each strip while it is in L1 (measured:
// Qwen3 shapes at 512 tokens, 32 per expert, 5-6 % faster than padding them).

constexpr int kPackedMr = 3;
constexpr int kPackedNr = 8;
// Column pairs per K block: an 8-row strip of 512 pairs is 16 KiB and stays in L1 while every
// token tile of the call passes over it; the tiles' packed inputs (96 KiB per 48 tokens) come
// from L2.
constexpr int64_t kPackedKBlockPairs = kPackedKBlockCols / 2;
// Distance of the in-row L1 prefetch (the L2 prefetch of the next strip brings the lines close).
constexpr int64_t kPackedPrefetchBytes = 1024;

// One pair kp of rows w[0..NR) for groups x[0..MR): acc[i][j] += dpbf16(x_i[kp], bcast(w_j[kp])),
// the weight pair from load_w(j, kp).
template <int MR, int NR, class LoadW>
inline void PackedStep(const uint32_t* x, int64_t gstride, int64_t kp, const LoadW& load_w,
                       __m512 (&acc)[MR][NR]) {
  __m512bh xv[MR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) xv[i] = AsBh(_mm512_loadu_si512(x + i * gstride + kp * 16));
#pragma GCC unroll 16
  for (int j = 0; j < NR; ++j) {
    const __m512bh wv = AsBh(_mm512_set1_epi32(static_cast<int>(load_w(j, kp))));
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv[i], wv);
  }
}

// acc += pairs [kp0, kp1) of rows w (bf16 pairs, [out, in] rows), and with `half` pair kp1's even
// column alone (odd K). Each 16 pairs first call prefetch(kp) (the caller's prefetches, if any).
template <int MR, int NR, class Prefetch>
inline void PackedSteps(const uint8_t* const* w, const uint32_t* x, int64_t gstride, int64_t kp0,
                        int64_t kp1, bool half, const Prefetch& prefetch, __m512 (&acc)[MR][NR]) {
  auto full = [&](int j, int64_t kp) { return LoadPair(w[j] + 4 * kp); };
  int64_t kp = kp0;
  for (; kp + 16 <= kp1; kp += 16) {
    prefetch(kp);
#pragma GCC unroll 16
    for (int u = 0; u < 16; ++u) PackedStep<MR, NR>(x, gstride, kp + u, full, acc);
  }
  for (; kp < kp1; ++kp) PackedStep<MR, NR>(x, gstride, kp, full, acc);
  if (half) {
    PackedStep<MR, NR>(
        x, gstride, kp1,
        [&](int j, int64_t p) {
          uint16_t v;
          std::memcpy(&v, w[j] + 4 * p, 2);
          return static_cast<uint32_t>(v);
        },
        acc);
  }
}

// The raw rows a strip's first token tile prefetches into L2 for the strip that follows
// (addressed like this block's pairs: pair kp of row j at rows[j] + (kp << shift), shift the log2
// of the stored bytes per pair: bf16 2, fp8 1, 4-bit 0), n of them.
struct NextRows {
  const uint8_t* const* rows = nullptr;
  int64_t n = 0;
  int shift = 2;
  int64_t end = 0;  // pairs kp < end lie inside the rows (the next K block may be shorter)
};

// Every 64 bytes of the next rows: the line of each at pair kp (a multiple of 16), into L2. The
// first line of each 4 KiB page is loaded instead: on this VM a software prefetch into a page not
// yet in the TLB did nothing (Zen 5, 2026-12-05: with a load per new page the next strip's decode
// stopped waiting on memory, and the packed fp8 prefill at 512 tokens took 0.62x the time), and a
// load walks the page tables. Its value is unused.
inline void PrefetchNext(const NextRows& next, int64_t kp) {
  const int64_t b = kp << next.shift;
  if (b % 64 != 0) return;
  uint8_t touched = 0;
  const bool inside = kp < next.end;  // a load must stay inside the matrix, a prefetch need not
  for (int64_t j = 0; j < next.n; ++j) {
    const uint8_t* p = next.rows[j] + b;
    if (inside && (reinterpret_cast<uintptr_t>(p) & 4095) < 64) {
      touched ^= *reinterpret_cast<const volatile uint8_t*>(p);
    } else {
      _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
    }
  }
  asm volatile("" : : "r"(touched));
}

// Pairs [kp0, kp1) of rows w[0..NR) for groups x[0..MR); `half` adds pair kp1 with only its
// even column (odd K). Writes or adds (accumulate) out[j * ldo + 16 * i + lane].
template <int MR, int NR>
void PackedTile(const uint8_t* const* w, NextRows next, const uint32_t* x, int64_t gstride,
                int64_t kp0, int64_t kp1, bool half, float* out, int64_t ldo, bool accumulate) {
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  // One 64-byte line of every row per 16 pairs. The strip's first token tile (the one given
  // next rows) streams bf16 rows from memory: each is prefetched a short distance ahead into L1
  // (a decoded strip is in L1 already), and the rows the caller will multiply or decode next are
  // fetched into L2 alongside, so the next strip does not start on a cold miss per row.
  auto prefetch = [&](int64_t kp) {
    if (next.n == 0) return;
    if (next.shift == 2) {
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(w[j] + 4 * kp + kPackedPrefetchBytes),
                     _MM_HINT_T0);
      }
    }
    PrefetchNext(next, kp);
  };
  PackedSteps<MR, NR>(w, x, gstride, kp0, kp1, half, prefetch, acc);
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      float* o = out + j * ldo + 16 * i;
      const __m512 prev = accumulate ? _mm512_loadu_ps(o) : _mm512_setzero_ps();
      _mm512_storeu_ps(o, _mm512_add_ps(acc[i][j], prev));
    }
  }
}

using PackedTileFn = void (*)(const uint8_t* const*, NextRows, const uint32_t*, int64_t, int64_t,
                              int64_t, bool, float*, int64_t, bool);

// The rows whose scales (along the columns: MXFP4, NVFP4) to prefetch into L2 while a strip
// decodes, for the same columns: idx[0..n), with each row's scale groups and the K block's first
// group (divided once per strip, not per row).
struct StripNext {
  const int32_t* idx = nullptr;
  int n = 0;
  int64_t scale_groups = 0;
  int64_t scale_g0 = 0;
};

// While an MXFP4 or NVFP4 strip decodes its row j of nr: prefetches the scales of next rows j,
// j + nr, ... (their data comes with the tiles, NextRows).
inline void PrefetchNextScales(const MatrixRef& m, StripNext next, int j, int nr) {
  for (int i = j; i < next.n; i += nr) {
    _mm_prefetch(
        reinterpret_cast<const char*>(m.scales + next.idx[i] * next.scale_groups + next.scale_g0),
        _MM_HINT_T1);
  }
}

// Decodes columns [k0, k1) (multiples of 32) of MXFP4 rows row_idx[0..nr) into bf16 rows of
// dst (row j at dst + j * cols * 2 bytes, columns in place) with the E8M0 scale folded in. For
// scale codes 2..252 the power of two is added to the exponent field of each nonzero E2M1 bf16
// (NibblesToBf16; exponents 126..129, so the sum stays in 1..254): exact, and 8 instructions per
// 32 weights where the fp32 route took 14 (measured on Zen 4, three alternated pairs: 0.89x the
// MXFP4 time at Qwen3's shapes and 512 tokens, 0.92-0.98x at Kimi-K2's from 128 tokens). Other
// codes (2^-127 and 2^-126, whose products may fall below bf16's normal range; 2^126 and up, which
// may overflow; NaN) take the fp32 route: E2M1 -> fp32 by a 16-entry table, times the scale, ->
// bf16 (vcvtneps2bf16 flushes results below 2^-126 to zero). Both give the same bits where both
// apply. The `next` rows' scales are prefetched for the same columns.
void DecodeMxfp4Strip(const MatrixRef& m, const int32_t* row_idx, int nr, StripNext next,
                      int64_t k0, int64_t k1, uint8_t* dst) {
  static const __m512i kWords = MakeTable(kFp4E2M1Values);
  const __m512 table = _mm512_loadu_ps(kFp4E2M1Values.data());
  const float* e8m0 = E8M0Table().data();
  const int64_t groups = m.cols / m.group;
  const __m512i nibble = _mm512_set1_epi32(0xf);
  for (int j = 0; j < nr; ++j) {
    PrefetchNextScales(m, next, j, nr);
    const uint8_t* row = m.Row(row_idx[j]);
    const uint8_t* scale = m.scales + row_idx[j] * groups;
    uint8_t* out = dst + j * m.cols * 2;
    for (int64_t k = k0; k < k1; k += 32) {
      const int e = scale[k / 32];
      if (e >= 2 && e <= 252) {
        const __m512bh codes = NibblesToBf16(row + k / 2, kWords);
        const __m512i v = reinterpret_cast<const __m512i&>(codes);
        const __mmask32 nonzero = _mm512_test_epi16_mask(v, _mm512_set1_epi16(0x7fff));
        const auto shift = static_cast<int16_t>((e - 127) * 128);  // to the exponent field
        _mm512_storeu_si512(out + 2 * k,
                            _mm512_mask_add_epi16(v, nonzero, v, _mm512_set1_epi16(shift)));
        continue;
      }
      const __m512i d =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2)));
      const __m512 sc = _mm512_set1_ps(e8m0[e]);
      const __m512 even =
          _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_and_si512(d, nibble), table), sc);
      const __m512 odd = _mm512_mul_ps(
          _mm512_permutexvar_ps(_mm512_and_si512(_mm512_srli_epi32(d, 4), nibble), table), sc);
      const __m256bh eb = _mm512_cvtneps_pbh(even);
      const __m256bh ob = _mm512_cvtneps_pbh(odd);
      const __m512i pairs = _mm512_or_si512(
          _mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(eb)),
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(ob)), 16));
      _mm512_storeu_si512(out + 2 * k, pairs);
    }
  }
}

// Packed formats whose strips are scaled per group after the products (PackedTileScaled), as the
// dot path scales its per-group partial sums: fp8 block, int4 and int4-zp, whose scales do not
// fold into bf16 exactly (their strips are decoded without them: fp8 value x 2^-8, int4
// nibble - 8, int4-zp code - zero, all exact in bf16), and NVFP4, whose row's global scale is
// applied once per K block (PackedScaleGroup).
bool ScaledPacked(WeightFormat f) {
  return f == WeightFormat::kFp8Block || f == WeightFormat::kInt4 || f == WeightFormat::kInt4Zp ||
         f == WeightFormat::kNvfp4;
}

// The columns one scale of the packed path covers: the format's group, except NVFP4's, whose
// block scales are folded into the strip and whose global scale covers the whole K block.
int64_t PackedScaleGroup(const MatrixRef& m) {
  return m.format == WeightFormat::kNvfp4 ? 2 * kPackedKBlockPairs : m.group;
}

// The bf16 word table of code - zero for the 16 codes (`codes`: 0..15 as floats), twice, as
// MakeTable's: exact, for zero points up to 255.
inline __m512i ZeroPointTable(__m512 codes, uint8_t zero) {
  const __m512 v = _mm512_sub_ps(codes, _mm512_set1_ps(static_cast<float>(zero)));
  const __m512bh t = _mm512_cvtne2ps_pbh(v, v);
  return reinterpret_cast<const __m512i&>(t);
}

// Columns [k0, k1) of rows row_idx[0..nr) of an fp8-block, int4 or int4-zp matrix as unscaled
// bf16 rows of dst (row j at dst + j * cols * 2 bytes, columns in place).
void DecodeRawStrip(const MatrixRef& m, const int32_t* row_idx, int nr, int64_t k0, int64_t k1,
                    uint8_t* dst) {
  static const __m512i kInt4Table = MakeTable(Int4Values());
  const bool fp8 = m.format == WeightFormat::kFp8Block;
  const bool zero_points = m.format == WeightFormat::kInt4Zp;
  const int64_t groups = zero_points ? m.cols / m.group : 0;
  const __m512 codes = _mm512_loadu_ps(CodeValues().data());
  for (int j = 0; j < nr; ++j) {
    const uint8_t* row = m.Row(row_idx[j]);
    const uint8_t* zeros = zero_points ? m.zeros + row_idx[j] * groups : nullptr;
    auto* out = reinterpret_cast<bf16_t*>(dst + j * m.cols * 2);
    if (!fp8) {  // groups of whole 32-column steps (cols % 32 == 0, PackedFormat); k0 starts one
      // One division per row, not per group: a 64-bit divide per 32 columns took half the
      // strip decode's time for int4 g32 (perf, Qwen3 at 512 tokens).
      const int64_t step = zero_points ? m.group : k1 - k0;
      for (int64_t k = k0, g = k0 / m.group; k < k1; ++g) {
        const int64_t end = std::min(k1, k + step);
        const __m512i table = zero_points ? ZeroPointTable(codes, zeros[g]) : kInt4Table;
        for (; k < end; k += 32) {
          const __m512bh v = NibblesToBf16(row + k / 2, table);
          _mm512_storeu_si512(out + k, reinterpret_cast<const __m512i&>(v));
        }
      }
      continue;
    }
    // Whole steps by plain loads and stores (masked stores are slow on Zen 4), then the tail.
    int64_t k = k0;
    for (; k + 32 <= k1; k += 32) {
      const __m512bh v =
          Fp8Decoder::Convert(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k)));
      _mm512_storeu_si512(out + k, reinterpret_cast<const __m512i&>(v));
    }
    if (k < k1) {
      const __mmask32 mask = TailMask32(k1 - k);
      const __m512bh v = Fp8Decoder::Convert(_mm256_maskz_loadu_epi8(mask, row + k));
      _mm512_mask_storeu_epi16(out + k, mask, reinterpret_cast<const __m512i&>(v));
    }
  }
}

// E4M3 code -> float, every code.
const std::array<float, 256>& E4M3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c)
      t[static_cast<size_t>(c)] = Fp8E4M3ToFloat(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

// Columns [k0, k1) of NVFP4 rows row_idx[0..nr) into bf16 rows of dst (as DecodeMxfp4Strip) with
// the E4M3 block scales folded in, exactly (PackedFormat); the global scale is left to the sums.
// 32 columns are two scale groups: one word table holds both groups' 16 products (E2M1 values
// times the group's scale, words 0-15 and 16-31), and the upper 16 columns look up the second
// half. cols % 16 == 0, so a last step may hold one group.
void DecodeNvfp4Strip(const MatrixRef& m, const int32_t* row_idx, int nr, StripNext next,
                      int64_t k0, int64_t k1, uint8_t* dst) {
  const __m512 values = _mm512_loadu_ps(kFp4E2M1Values.data());
  const float* e4m3 = E4M3Table().data();
  const int64_t groups = m.cols / 16;
  const __m512i second =
      _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0x00100010, 0x00100010, 0x00100010, 0x00100010,
                        0x00100010, 0x00100010, 0x00100010, 0x00100010);
  auto index = [](__m128i bytes) {  // NibblesToBf16's word indices
    const __m512i d = _mm512_cvtepu8_epi32(bytes);
    return _mm512_and_si512(_mm512_or_si512(d, _mm512_slli_epi32(d, 12)),
                            _mm512_set1_epi32(0x000F000F));
  };
  for (int j = 0; j < nr; ++j) {
    PrefetchNextScales(m, next, j, nr);
    const uint8_t* row = m.Row(row_idx[j]);
    const uint8_t* scale = m.scales + row_idx[j] * groups;
    auto* out = reinterpret_cast<bf16_t*>(dst + j * m.cols * 2);
    int64_t k = k0;
    for (; k + 32 <= k1; k += 32) {
      const __m512 lo = _mm512_mul_ps(values, _mm512_set1_ps(e4m3[scale[k / 16]]));
      const __m512 hi = _mm512_mul_ps(values, _mm512_set1_ps(e4m3[scale[k / 16 + 1]]));
      const __m512bh t = _mm512_cvtne2ps_pbh(hi, lo);
      const __m512i idx = _mm512_or_si512(
          index(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2))), second);
      _mm512_storeu_si512(out + k,
                          _mm512_permutexvar_epi16(idx, reinterpret_cast<const __m512i&>(t)));
    }
    if (k < k1) {  // one group of 16
      const __m512 lo = _mm512_mul_ps(values, _mm512_set1_ps(e4m3[scale[k / 16]]));
      const __m512bh t = _mm512_cvtne2ps_pbh(lo, lo);
      const __m512i idx = index(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k / 2)));
      _mm512_mask_storeu_epi16(out + k, 0xffff,
                               _mm512_permutexvar_epi16(idx, reinterpret_cast<const __m512i&>(t)));
    }
  }
}

// The scales of up to N weight rows of a ScaledPacked matrix: At(j, g) is row j's scale of
// packed scale group g (PackedScaleGroup; fp8: times 2^8, which DecodeRawStrip took out; NVFP4:
// the row's global scale). The row addresses are found once per strip, not once per group (they
// divide by the block rows).
template <int N>
struct ScaleRows {
  WeightFormat format = WeightFormat::kBf16;
  const void* row[N];  // the rows' scale rows (fp32, bf16 or fp16; NVFP4: unused)
  float global[N];     // NVFP4: the rows' global scales
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): entries past nr are never read
  ScaleRows(const MatrixRef& m, const int32_t* row_idx, int nr) : format(m.format) {
    for (int j = 0; j < nr; ++j) {
      const int32_t r = row_idx[j];
      row[j] = nullptr;
      global[j] = 1.0f;
      if (format == WeightFormat::kFp8Block) row[j] = Fp8ScaleRow(m, r);
      if (format == WeightFormat::kInt4) row[j] = Int4ScaleRow(m, r);
      if (format == WeightFormat::kInt4Zp) {
        row[j] = reinterpret_cast<const fp16_t*>(m.scales) + r * (m.cols / m.group);
      }
      if (format == WeightFormat::kNvfp4) global[j] = m.RowGlobal(r);
    }
  }
  // Rows j0..j0+nr of `from` (no address found again).
  template <int M>
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): entries past nr are never read
  ScaleRows(const ScaleRows<M>& from, int j0, int nr) : format(from.format) {
    for (int j = 0; j < nr; ++j) {
      row[j] = from.row[j0 + j];
      global[j] = from.global[j0 + j];
    }
  }
  float At(int j, int64_t g) const {
    switch (format) {
      case WeightFormat::kFp8Block: return static_cast<const float*>(row[j])[g] * 256.0f;
      case WeightFormat::kInt4: return Bf16ToFloat(static_cast<const bf16_t*>(row[j])[g]);
      case WeightFormat::kInt4Zp: return _cvtsh_ss(static_cast<const fp16_t*>(row[j])[g].bits);
      case WeightFormat::kNvfp4: return global[j];
      case WeightFormat::kBf16:
      case WeightFormat::kMxfp4: break;
    }
    return 1.0f;
  }
};

// A DecodeRawStrip strip (unscaled bf16 rows in L1) as rows for the dot tiles, with each row's
// group scales: the tiles keep per-group partial sums and scale them, so the unpacked remainder
// tokens need one horizontal sum per K block, not one per scale group.
struct ScaledStripDecoder {
  static constexpr int kMaxNr = 2;  // MR x NR partial sums and sums: 16 registers
  static constexpr bool kScaled = true;
  static constexpr int64_t kValuesPerLine = 32;
  const uint8_t* rows[kMaxNr];
  ScaleRows<kMaxNr> scales;
  int64_t group;
  // Strip rows j0..j0+nr, with their scale rows from the strip's (`strip_scales`).
  template <int M>
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): entries past nr are never read
  ScaledStripDecoder(const MatrixRef& m, const uint8_t* const* strip_rows,
                     const ScaleRows<M>& strip_scales, int j0, int nr)
      : scales(strip_scales, j0, nr), group(PackedScaleGroup(m)) {
    for (int j = 0; j < nr; ++j) rows[j] = strip_rows[j0 + j];
  }
  __m512bh Load(int j, int64_t k) const { return AsBh(_mm512_loadu_si512(rows[j] + 2 * k)); }
  __m512bh LoadTail(int j, int64_t k, __mmask32 mask) const {
    return AsBh(_mm512_maskz_loadu_epi16(mask, rows[j] + 2 * k));
  }
  void Prefetch(int, int64_t) const {}  // the strip is in L1
  int64_t GroupCols() const { return group; }
  __m512 Scale(int j, int64_t g) const { return _mm512_set1_ps(scales.At(j, g)); }
};

// PackedTile for the scaled formats over a whole K block: pairs [kp0, kp1) of strip rows
// w[0..NR) (scale rows `sr`) for groups x[0..MR), one scale group (group / 2 pairs) at a time;
// each group's partial sums are scaled into running sums, sum = fma(part_g, scale_g, sum), which
// start from out (accumulate) or zero and are stored at the end: the same operations, in the same
// order, as one fma per group into out. The running sums live in an L1 buffer (the partial sums
// take 24 of the 32 registers). One call per token tile and K block, where a call per scale group
// and tile (re-reading and re-writing out each time) took 1.2x the time for int4 g32 (measured on
// Zen 5, one core, everything in L2: 0.50 against 0.41 TSC cycles per vdpbf16ps; fp8 g128 even).
template <int MR, int NR>
void PackedTileScaled(const uint8_t* const* w, const ScaleRows<kPackedNr>& sr, int64_t group,
                      NextRows next, const uint32_t* x, int64_t gstride, int64_t kp0, int64_t kp1,
                      bool half, float* out, int64_t ldo, bool accumulate) {
  alignas(64) float sum[MR][NR][16];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      const __m512 prev =
          accumulate ? _mm512_loadu_ps(out + j * ldo + 16 * i) : _mm512_setzero_ps();
      _mm512_store_ps(sum[i][j], prev);
    }
  }
  const int64_t group_pairs = group / 2;
  auto prefetch = [&](int64_t kp) { PrefetchNext(next, kp); };
  // The half pair (odd K) belongs to the group holding column 2 kp1, which may start at kp1.
  for (int64_t g0 = kp0; g0 < kp1 || (half && g0 == kp1); g0 += group_pairs) {
    const int64_t g1 = std::min(kp1, g0 + group_pairs);
    const bool half_here = half && kp1 < g0 + group_pairs;
    __m512 part[MR][NR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) part[i][j] = _mm512_setzero_ps();
    }
    PackedSteps<MR, NR>(w, x, gstride, g0, g1, half_here, prefetch, part);
    const int64_t g = 2 * g0 / group;
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      const __m512 sc = _mm512_set1_ps(sr.At(j, g));
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        _mm512_store_ps(sum[i][j], _mm512_fmadd_ps(part[i][j], sc, _mm512_load_ps(sum[i][j])));
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j)
      _mm512_storeu_ps(out + j * ldo + 16 * i, _mm512_load_ps(sum[i][j]));
  }
}

using PackedTileScaledFn = void (*)(const uint8_t* const*, const ScaleRows<kPackedNr>&, int64_t,
                                    NextRows, const uint32_t*, int64_t, int64_t, int64_t, bool,
                                    float*, int64_t, bool);

// The packed tiles of every MR x NR, PackedTile's or (kScaled) PackedTileScaled's.
template <bool kScaled, int MR, int... NRs>
constexpr auto PackedRow(std::integer_sequence<int, NRs...>) {
  if constexpr (kScaled) {
    return std::array<PackedTileScaledFn, sizeof...(NRs)>{&PackedTileScaled<MR, NRs + 1>...};
  } else {
    return std::array<PackedTileFn, sizeof...(NRs)>{&PackedTile<MR, NRs + 1>...};
  }
}

template <bool kScaled>
struct PackedTable {
  using Seq = std::make_integer_sequence<int, kPackedNr>;
  std::array<decltype(PackedRow<kScaled, 1>(Seq{})), kPackedMr> fns = {
      PackedRow<kScaled, 1>(Seq{}), PackedRow<kScaled, 2>(Seq{}), PackedRow<kScaled, 3>(Seq{})};
};

// The unpacked remainder tokens (PackedGemmArgs::rem_x) times columns [c0, c1) of a strip in L1:
// dot-product tiles of up to 4 rows x kMaxMr tokens (`make(j0, n)`: the decoder of strip rows
// j0..j0+n), written (c0 at the matrix's first column) or added into their out columns.
template <class Dec, class MakeDecoder>
void PackedRemainder(const PackedGemmArgs& a, int nr, int64_t c0, int64_t c1,
                     const MakeDecoder& make, float* rem_out) {
  static constexpr TileTable<Dec> kDotTable;
  constexpr int kRemRows = std::min(4, Dec::kMaxNr);
  for (int j0 = 0; j0 < nr; j0 += kRemRows) {
    const int nrj = std::min(kRemRows, nr - j0);
    const Dec d = make(j0, nrj);
    for (int64_t m0 = 0; m0 < a.num_rem; m0 += kMaxMr) {
      const int mr = static_cast<int>(std::min<int64_t>(kMaxMr, a.num_rem - m0));
      float t[kMaxMr * kRemRows];
      kDotTable.fns[static_cast<size_t>(mr - 1)][static_cast<size_t>(nrj - 1)](
          d, a.rem_x + m0 * a.rem_ldx, a.rem_ldx, c0, c1, t, kRemRows, false);
      for (int i = 0; i < mr; ++i) {
        for (int j = 0; j < nrj; ++j) {
          float& o = rem_out[(j0 + j) * a.ldo + m0 + i];
          const float v = t[i * kRemRows + j];
          o = c0 > 0 ? o + v : v;
        }
      }
    }
  }
}

// One strip's rows for one K block: decoded into work (MXFP4, fp8, int4) or the stored bf16 rows
// with the rows to prefetch after them (`next`, num_next).
struct PackedStrip {
  const uint8_t* rows[kPackedNr];
  const uint8_t* next[kPackedNr];  // NextRows: the raw rows after this strip
  int64_t num_next = 0;
  int next_shift = 2;
  int64_t next_end = 0;  // NextRows::end
};

PackedStrip LoadPackedStrip(const PackedGemmArgs& a, int64_t s, int64_t num_strips, int nr,
                            int64_t kp0, uint8_t* work) {
  PackedStrip st{};
  const int64_t cols = a.w->cols;
  const int64_t r0 = s * kPackedNr;
  const WeightFormat f = a.w->format;
  st.next_shift = f == WeightFormat::kBf16 ? 2 : f == WeightFormat::kFp8Block ? 1 : 0;
  // What comes after this strip (fetched by its first token tile): the next strip of this K
  // block, else the first strip of the next K block (addressed relative to this block's pairs).
  if (s + 1 < num_strips) {
    st.num_next = std::min<int64_t>(kPackedNr, a.num_rows - r0 - kPackedNr);
    for (int64_t j = 0; j < st.num_next; ++j) st.next[j] = a.w->Row(a.row_idx[r0 + kPackedNr + j]);
    st.next_end = cols / 2;
  } else if (2 * (kp0 + kPackedKBlockPairs) < cols) {
    st.num_next = std::min<int64_t>(kPackedNr, a.num_rows);
    st.next_end = cols / 2 - kPackedKBlockPairs;
    for (int64_t j = 0; j < st.num_next; ++j) {
      st.next[j] = a.w->Row(a.row_idx[j]) + (kPackedKBlockPairs << st.next_shift);
    }
  }
  if (f == WeightFormat::kBf16) {
    for (int j = 0; j < nr; ++j) st.rows[j] = a.w->Row(a.row_idx[r0 + j]);
    return st;
  }
  // The strip's block decoded to bf16 in L1; its raw rows were fetched during the previous
  // strip's first token tile (NextRows). MXFP4's and NVFP4's scales for the next strip are
  // prefetched while decoding.
  const bool column_scales = f == WeightFormat::kMxfp4 || f == WeightFormat::kNvfp4;
  const StripNext next_scales{
      a.row_idx + r0 + kPackedNr,
      static_cast<int>(std::clamp<int64_t>(a.num_rows - r0 - kPackedNr, 0, kPackedNr)),
      column_scales ? cols / a.w->group : 0, column_scales ? 2 * kp0 / a.w->group : 0};
  const int64_t k1 = std::min(cols, 2 * (kp0 + kPackedKBlockPairs));
  if (f == WeightFormat::kMxfp4) {
    DecodeMxfp4Strip(*a.w, a.row_idx + r0, nr, next_scales, 2 * kp0, k1, work);
  } else if (f == WeightFormat::kNvfp4) {
    DecodeNvfp4Strip(*a.w, a.row_idx + r0, nr, next_scales, 2 * kp0, k1, work);
  } else {
    DecodeRawStrip(*a.w, a.row_idx + r0, nr, 2 * kp0, k1, work);
  }
  for (int j = 0; j < nr; ++j) st.rows[j] = work + j * cols * 2;
  return st;
}

void PackedGemm(const PackedGemmArgs& a) {
  static constexpr PackedTable<false> kTable;
  static constexpr PackedTable<true> kScaledTable;
  const int64_t cols = a.w->cols;
  const int64_t num_strips = CeilDiv(a.num_rows, int64_t{kPackedNr});
  const bool scaled = ScaledPacked(a.w->format);
  const int64_t scale_group = PackedScaleGroup(*a.w);
  uint8_t* work = static_cast<uint8_t*>(a.work);  // kPackedNr bf16 rows: 16 * cols bytes
  static_assert(kPackedNr * 2 <= kPackedWorkBytesPerCol);
  for (int64_t kp0 = 0; 2 * kp0 < cols; kp0 += kPackedKBlockPairs) {
    const int64_t kc1 = std::min(cols, 2 * (kp0 + kPackedKBlockPairs));
    // Whole pairs, and with an odd K the last one's even column (`half`).
    const int64_t kp1 = kc1 / 2;
    const bool half = kc1 % 2 != 0;
    for (int64_t s = 0; s < num_strips; ++s) {
      const int64_t r0 = s * kPackedNr;
      const int nr = static_cast<int>(std::min<int64_t>(kPackedNr, a.num_rows - r0));
      const PackedStrip st = LoadPackedStrip(a, s, num_strips, nr, kp0, work);
      const ScaleRows<kPackedNr> strip_scales(*a.w, a.row_idx + r0, scaled ? nr : 0);
      for (int64_t g = 0; g < a.num_groups;) {
        const int64_t left = a.num_groups - g;
        const int mr = left == 4 ? 2 : static_cast<int>(std::min<int64_t>(kPackedMr, left));
        const auto i = static_cast<size_t>(mr - 1);
        const auto j = static_cast<size_t>(nr - 1);
        const NextRows next{st.next, g == 0 ? st.num_next : 0, st.next_shift, st.next_end};
        float* out = a.out + r0 * a.ldo + 16 * g;
        const uint32_t* x = a.x + g * a.group_stride;
        if (scaled) {
          kScaledTable.fns[i][j](st.rows, strip_scales, scale_group, next, x, a.group_stride, kp0,
                                 kp1, half, out, a.ldo, kp0 > 0);
        } else {
          kTable.fns[i][j](st.rows, next, x, a.group_stride, kp0, kp1, half, out, a.ldo, kp0 > 0);
        }
        g += mr;
      }
      if (a.num_rem > 0) {
        float* rem_out = a.out + r0 * a.ldo + 16 * a.num_groups;
        if (scaled) {
          PackedRemainder<ScaledStripDecoder>(
              a, nr, 2 * kp0, kc1,
              [&](int j0, int n) { return ScaledStripDecoder(*a.w, st.rows, strip_scales, j0, n); },
              rem_out);
        } else {
          PackedRemainder<Bf16Decoder>(
              a, nr, 2 * kp0, kc1, [&](int j0, int n) { return Bf16Decoder(st.rows + j0, n); },
              rem_out);
        }
      }
    }
  }
}

// 16 x 16 transpose of 32-bit elements: r[i] = row i in, r[k] = column k out.
inline void Transpose16x16(__m512i r[16]) {
  __m512i t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 16; i += 8) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0xdd);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
  }
}

// 32 columns of 16 token rows at a time: each row's 32 bf16 are 16 pairs, so the 16 x 16
// transpose of those pairs is exactly 16 packed [pair][token] vectors.
void PackGroup(const void* x, DType x_dtype, int64_t ldx, const int32_t* rows, int64_t num_tokens,
               int64_t cols, uint32_t* group) {
  for (int64_t k0 = 0; k0 < cols; k0 += 32) {
    const int64_t nk = std::min<int64_t>(32, cols - k0);
    const __mmask32 m = TailMask32(nk);
    __m512i r[16];
    for (int64_t t = 0; t < 16; ++t) {
      if (t >= num_tokens) {
        r[t] = _mm512_setzero_si512();
      } else if (x_dtype == DType::kF32) {
        const float* row = static_cast<const float*>(x) + rows[t] * ldx + k0;
        const __m512 lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m), row);
        const __m512 hi = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m >> 16), row + 16);
        const __m512bh b = _mm512_cvtne2ps_pbh(hi, lo);
        r[t] = reinterpret_cast<const __m512i&>(b);
      } else {
        r[t] = _mm512_maskz_loadu_epi16(m, static_cast<const bf16_t*>(x) + rows[t] * ldx + k0);
      }
    }
    Transpose16x16(r);
    const int64_t pairs = (nk + 1) / 2;
    for (int64_t i = 0; i < pairs; ++i) _mm512_storeu_si512(group + (k0 / 2 + i) * 16, r[i]);
  }
}

// 16 x 16 float blocks through Transpose16x16 (masked at the edges). Whole aligned 64-byte lines
// are written with non-temporal stores: y (the grouped down output, tens of MB at prefill sizes)
// is read back only by the unpermute pass, and ordinary stores of lines scattered over it each
// wait on a read for ownership (measured, Qwen3 shapes at 512 tokens in paired in-process runs:
// the step 3-4 % faster). The fence at the end orders them before the task's completion.
void StoreTransposed(const float* tile, int64_t ldt, int64_t num_rows, int64_t num_tokens,
                     const float* bias, float* y, int64_t ldy) {
  for (int64_t r0 = 0; r0 < num_rows; r0 += 16) {
    const int64_t nr = std::min<int64_t>(16, num_rows - r0);
    const __mmask16 rmask = static_cast<__mmask16>((1u << nr) - 1u);
    const __m512 b =
        bias != nullptr ? _mm512_maskz_loadu_ps(rmask, bias + r0) : _mm512_setzero_ps();
    for (int64_t t0 = 0; t0 < num_tokens; t0 += 16) {
      const int64_t nt = std::min<int64_t>(16, num_tokens - t0);
      const __mmask16 tmask = static_cast<__mmask16>((1u << nt) - 1u);
      __m512i v[16];
      for (int64_t i = 0; i < 16; ++i) {
        v[i] = i < nr
                   ? _mm512_castps_si512(_mm512_maskz_loadu_ps(tmask, tile + (r0 + i) * ldt + t0))
                   : _mm512_setzero_si512();
      }
      Transpose16x16(v);
      for (int64_t t = 0; t < nt; ++t) {
        float* dst = y + (t0 + t) * ldy + r0;
        const __m512 val = _mm512_add_ps(_mm512_castsi512_ps(v[t]), b);
        if (nr == 16 && (reinterpret_cast<uintptr_t>(dst) & 63) == 0) {
          _mm512_stream_ps(dst, val);
        } else {
          _mm512_mask_storeu_ps(dst, rmask, val);
        }
      }
    }
  }
  _mm_sfence();
}

// --- activations -------------------------------------------------------------------------------

// exp(x): range reduction x = n ln2 + r, |r| <= ln2/2, degree-6 Taylor polynomial (relative
// error < 2e-7 on the reduced range), 2^n applied with vscalefps (handles under/overflow).
inline __m512 Exp(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.5f)), _mm512_set1_ps(-88.5f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline __m512 Sigmoid(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, Exp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

// tanh(x) = 2 sigmoid(2x) - 1 (absolute error ~1e-7, ample for bf16 outputs).
inline __m512 Tanh(__m512 x) {
  const __m512 s = Sigmoid(_mm512_add_ps(x, x));
  return _mm512_sub_ps(_mm512_add_ps(s, s), _mm512_set1_ps(1.0f));
}

inline __m512 Act(const ActivationParams& a, __m512 g, __m512 u) {
  switch (a.kind) {
    case Activation::kSwiGlu: return _mm512_mul_ps(_mm512_mul_ps(g, Sigmoid(g)), u);
    case Activation::kSwiGluOai: {
      const __m512 lim = _mm512_set1_ps(a.swiglu_limit);
      g = _mm512_min_ps(g, lim);
      u = _mm512_max_ps(_mm512_min_ps(u, lim), _mm512_sub_ps(_mm512_setzero_ps(), lim));
      const __m512 glu =
          _mm512_mul_ps(g, Sigmoid(_mm512_mul_ps(_mm512_set1_ps(a.swiglu_alpha), g)));
      return _mm512_mul_ps(_mm512_add_ps(u, _mm512_set1_ps(1.0f)), glu);
    }
    case Activation::kSiTu: {
      const __m512 b = _mm512_set1_ps(a.situ_beta);
      const __m512 bl = _mm512_set1_ps(a.situ_linear_beta);
      const __m512 gp = _mm512_mul_ps(_mm512_mul_ps(b, Tanh(_mm512_div_ps(g, b))), Sigmoid(g));
      const __m512 up = _mm512_mul_ps(bl, Tanh(_mm512_div_ps(u, bl)));
      return _mm512_mul_ps(gp, up);
    }
    case Activation::kReluSquared: {
      const __m512 r = _mm512_max_ps(u, _mm512_setzero_ps());
      return _mm512_mul_ps(r, r);
    }
    case Activation::kGeluTanhGated: {
      const __m512 g3 = _mm512_mul_ps(_mm512_mul_ps(g, g), g);
      const __m512 inner = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f),
                                         _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), g3, g));
      const __m512 half_g = _mm512_mul_ps(_mm512_set1_ps(0.5f), g);
      return _mm512_mul_ps(_mm512_mul_ps(half_g, _mm512_add_ps(_mm512_set1_ps(1.0f), Tanh(inner))),
                           u);
    }
    case Activation::kSwiGluClamp: {
      const __m512 lim = _mm512_set1_ps(a.swiglu_limit);
      g = _mm512_min_ps(g, lim);
      u = _mm512_max_ps(_mm512_min_ps(u, lim), _mm512_sub_ps(_mm512_setzero_ps(), lim));
      return _mm512_mul_ps(_mm512_mul_ps(g, Sigmoid(g)), u);
    }
  }
  return _mm512_setzero_ps();
}

inline void StoreBf16(bf16_t* dst, __m512 v, __mmask16 m) {
  const __m256bh b = _mm512_cvtneps_pbh(v);
  _mm256_mask_storeu_epi16(dst, m, reinterpret_cast<const __m256i&>(b));
}

void Activate(const ActivationParams& a, const float* gate, const float* up, int64_t n, bf16_t* h) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m =
        n - i >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 g = gate == nullptr ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(m, up + i);
    StoreBf16(h + i, Act(a, g, u), m);
  }
}

void ToBf16(const float* src, int64_t n, bf16_t* dst) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m =
        n - i >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (n - i)) - 1u);
    StoreBf16(dst + i, _mm512_maskz_loadu_ps(m, src + i), m);
  }
}

// The 4-bit decode walk's inputs in block order (num_tokens x cols bf16, Nibble128Order); the
// formats SimdFallback() runs need its work space.
int64_t WorkFloats(int64_t num_tokens, int64_t cols) {
  // (with zero points each row is followed by its block sums: 1.25 x cols bf16 per row)
  const int64_t ordered =
      num_tokens <= kDecodeMaxTokens ? CeilDiv(num_tokens * (cols + cols / 4 + 128), 2) : 0;
  return std::max(ordered, SimdFallback().work_floats(num_tokens, cols));
}

// 64 columns at a time in four accumulators, each row's term added in order (fused
// multiply-add, so within a rounding of the portable loop, which GCC -O2 leaves scalar; measured:
// Qwen3 shapes at 512 tokens, the whole step 5 % faster in paired in-process runs).
void WeightedSum(const float* const* rows, const float* weights, int64_t num_rows, int64_t n,
                 float* out, bool accumulate) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512 acc[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      acc[u] = accumulate ? _mm512_loadu_ps(out + i + 16 * u) : _mm512_setzero_ps();
    }
    for (int64_t s = 0; s < num_rows; ++s) {
      const __m512 w = _mm512_set1_ps(weights[s]);
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        acc[u] = _mm512_fmadd_ps(w, _mm512_loadu_ps(rows[s] + i + 16 * u), acc[u]);
      }
    }
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) _mm512_storeu_ps(out + i + 16 * u, acc[u]);
  }
  for (; i < n; i += 16) {
    const __mmask16 m =
        n - i >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (n - i)) - 1u);
    __m512 acc = accumulate ? _mm512_maskz_loadu_ps(m, out + i) : _mm512_setzero_ps();
    for (int64_t s = 0; s < num_rows; ++s) {
      acc = _mm512_fmadd_ps(_mm512_set1_ps(weights[s]), _mm512_maskz_loadu_ps(m, rows[s] + i), acc);
    }
    _mm512_mask_storeu_ps(out + i, m, acc);
  }
}

}  // namespace

namespace {

// vdpbf16ps on registers (roofline_avx512.cc): 32 multiply-adds per instruction.
float PeakLoop(int64_t iterations, float seed, double* flops) {
  *flops += static_cast<double>(iterations) * kDotPeakOpsPerIteration * 64.0;
  return DotPeakLoopAvx512(iterations, seed);
}

}  // namespace

const CpuBackend& Avx512Backend() {
  static const CpuBackend backend{"avx512-bf16", DotRows,     Activate,  ToBf16,
                                  WorkFloats,    PackedGemm,  PackGroup, StoreTransposed,
                                  WeightedSum,   "vdpbf16ps", PeakLoop,  ReadStreamAvx512,
                                  kReadPatterns, nullptr,     nullptr};
  return backend;
}

}  // namespace moeshard::internal
