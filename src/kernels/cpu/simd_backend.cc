// The portable SIMD backend: the dot-product (decode) kernels for every weight format, the
// bf16 rounding and the unpermute sum, written once with Highway and compiled for each
// instruction set it targets (AVX2 + FMA + F16C, AVX-512 F/BW without BF16, NEON, SVE). The
// backend of an instruction set is picked per KernelContext (SimdBackendFor), after a runtime
// check that the CPU has it; `kAvx512Bf16` keeps its own intrinsics (native vdpbf16ps).
// `kAvx2Vnni` and `kAvx512Vnni` are the AVX2 and AVX-512 code with the 4-bit formats' integer
// products by VNNI (MulAddPairs, MulAddQuads): AVX-VNNI (Alder Lake and later without AVX-512)
// and AVX512_VNNI (Cascade Lake, Ice Lake; and the SIMD fallback of the AVX-512 BF16 CPUs).
//
// Numerics: tokens and weights are widened to fp32 and multiplied with fp32 FMAs (Highway's
// bf16 multiply-accumulate is emulated; see ../shared/reference/ecosystem.md), so every format
// gives exactly the dequantised weight times the bf16 input, summed in fp32. fp32 -> bf16 uses
// the round-to-nearest-even conversion of base/numeric.h semantics (Highway's demotion
// truncates).
//
// Layout of a dot task (DotRowsArgs): the tokens are widened once into the work buffer, in the
// order the format's decoder yields weights. 4-bit formats decode a vector of bytes into two
// vectors, the low nibbles (even columns) and the high nibbles (odd columns), so each chunk of
// 2 * N columns of a token is stored as its N even then its N odd columns; bf16 and fp8 keep the
// natural order. Each tile multiplies kMr tokens by kNr rows with kMr * kNr vector accumulators,
// decoding a row chunk once for all its tokens.
//
// Thread safety: pure functions over their arguments.

// clang-format off
// Targets below AVX2 add build time and no use: CPUs without AVX2 take the portable backend.
// SVE is not built: the tiles keep arrays of vectors, which SVE's sizeless vector types do not
// allow, so a build whose baseline has SVE (-march=...+sve) failed here; Arm CPUs take NEON.
// (Highway 1.0.3 has no runtime dispatch on Arm, so stock flags never compiled SVE anyway.)
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS \
  (HWY_SSSE3 | HWY_SSE4 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd_backend.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/cache_control.h"
// clang-format on

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "kernels/cpu/cpu_backend.h"
#include "moeshard/base/math.h"
#include "moeshard/base/numeric.h"

// Shared by every target's code and the work-space size below (this file is compiled once per
// target, so these are defined once).
#ifndef MOESHARD_SIMD_BACKEND_SHARED_
#define MOESHARD_SIMD_BACKEND_SHARED_
namespace moeshard::internal {
// Prefill strips (PrefillStrips): weight rows per strip and columns per K block.
inline constexpr int64_t kStripRows = 12;
inline constexpr int64_t kStripCols = 256;
// Floats between two tokens' widened inputs: K rounded up to a vector of 16, plus one 64-byte
// line, so that the rows of a strip tile's tokens fall in different L1 sets (K x 4 bytes is a
// multiple of 4 KiB for every benchmark shape, which put every token's row in one set).
inline int64_t WidenedStride(int64_t k) { return (k + 15) / 16 * 16 + 16; }
}  // namespace moeshard::internal
#endif

HWY_BEFORE_NAMESPACE();
namespace moeshard::internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
// Highway always compiles its baseline target too; there (HWY_SCALAR) the portable backend's
// kernels serve.
#if HWY_TARGET == HWY_SCALAR
void DotRowsT(const DotRowsArgs& a) { PortableBackend().dot_rows(a); }
bool QuantizedRowsLayoutT(const MatrixRef&, int64_t, bool, QuantizedRows*, int64_t*) {
  return false;
}
void QuantizeRowsT(const MatrixRef&, bool, const bf16_t*, int64_t, int64_t, const QuantizedRows&,
                   void*) {}
void ToBf16T(const float* src, int64_t n, bf16_t* dst) { PortableBackend().to_bf16(src, n, dst); }
void WeightedSumT(const float* const* rows, const float* weights, int64_t num_rows, int64_t n,
                  float* out, bool accumulate) {
  PortableBackend().weighted_sum(rows, weights, num_rows, n, out, accumulate);
}
float PeakLoopT(int64_t iterations, float seed, double* flops) {
  return PortableBackend().peak_loop(iterations, seed, flops);
}
uint64_t ReadStreamT(const uint8_t* p, int64_t bytes, int pattern) {
  return PortableBackend().read_stream(p, bytes, pattern);
}
#else
namespace {

// At most 16 fp32 lanes, so a 4-bit chunk (2 * N columns) never exceeds the 32-value MXFP4 group
// (SVE vectors can be wider).
using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;

// Keeps v in a register: without it GCC folds a vector that feeds several FMAs into each of them
// as a memory operand (measured on AVX-512: 12 loads instead of 4 per step, load-bound at 0.6 of
// the AVX2 variant's speed), or a load that feeds two instructions into both.
template <class V>
HWY_INLINE void InRegister(V& v) {
#if HWY_ARCH_X86
  __asm__("" : "+v"(v.raw));
#else
  (void)v;
#endif
}

// Hides p's value from the optimizer, so loads through it are not merged with loads through
// another copy of it: each row of a tile loads the tokens' inputs anew, as memory operands of its
// multiply-adds, instead of keeping them in registers (Tile with three tokens).
template <typename T>
HWY_INLINE const T* Opaque(const T* p) {
  __asm__("" : "+r"(p));
  return p;
}

// Software prefetch distance along each weight row (the AVX-512 BF16 kernels measured 1 KiB).
constexpr int64_t kPrefetchBytes = 1024;

// E2M1 codes times 2 (so they are integers) and int4 codes minus 8, as signed bytes, for the
// byte-shuffle lookup.
alignas(16) constexpr int8_t kE2M1x2[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                            0, -1, -2, -3, -4, -6, -8, -12};
alignas(16) constexpr int8_t kInt4[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
alignas(16) constexpr int8_t kCodes[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

// Per format: `kVecs` fp32 vectors per decoded chunk (chunk = kVecs * N columns), in natural column
// order (kEvenOdd false: fp8) or even columns then odd ones (kEvenOdd: bf16 pairs and 4-bit codes);
// RowOf(r) the row's data and scale pointers; DecodeRaw(row, c, out) the chunk starting at column c
// before its scale, ScaleAt(row, g) the scale of group g (1 for bf16; a chunk never straddles two
// groups), ScalesOf(row, g) that scale as vectors and Apply(sc, out) it to a raw chunk, Decode the
// three together; Scalar(r, c) for the columns past the last whole chunk; group() the columns per
// scale (0: no scales).
struct RowPtrs {
  const uint8_t* w = nullptr;
  const uint8_t* s = nullptr;
  const uint8_t* z = nullptr;  // int4-zp: the row's zero points
  float global = 1.0f;         // nvfp4: the row's global scale
};

// A group's scale as vectors: a raw chunk's lanes become raw x s, or with zero points (int4-zp)
// (raw - z) x s.
struct GroupScale {
  VF s;
  VF z;
};

// out[j] = dec.RowOf(rows[j]), field by field. A RowPtrs returned whole is built on the stack
// with 8-byte stores and copied with 16-byte loads, each of which waits for its stores to retire
// (a failed store forward): at one token, with the decode walk's steps of 4 rows, that was about
// an eighth of the AVX2 4-bit decode's time (measured with perf on Zen 5, --isa avx2).
template <typename Dec>
HWY_INLINE void SetRowPtrs(const Dec& dec, const int64_t* rows, int nr, RowPtrs* out) {
  for (int j = 0; j < nr; ++j) {
    const RowPtrs p = dec.RowOf(rows[j]);
    out[j].w = p.w;
    out[j].s = p.s;
    out[j].z = p.z;
    out[j].global = p.global;
  }
}

// Most tokens of the decode walks (DecodeWalk, QDecodeWalk); the decode buffers are sized for it.
constexpr int64_t kDecodeMaxTokens = 16;

// bf16: a chunk of 2N columns is N bf16 pairs, one 32-bit lane each: the even column is the lane
// shifted up by 16, the odd one the lane with its low half cleared (one load and two instructions
// per 2N weights; widening N columns in natural order took a load with a zero extension and a
// shift per N).
struct Bf16Dec {
  static constexpr int kVecs = 2;
  static constexpr bool kEvenOdd = true;
  // Tokens from which a task takes the decoded strips instead of the decode walk (measured on
  // AVX2: a bf16 chunk decodes in three instructions, so the walk holds up to 16 tokens (strips
  // from 9 measured the same); fp8 and the 4-bit formats' fp32 decode cost several per chunk, so
  // strips pay from about 5).
  static constexpr int64_t kStripFrom = kDecodeMaxTokens + 1;
  // Whether one token's tiles may apply the scale once per group (not for zero points).
  static constexpr bool kLateScale = false;
  static constexpr bool kInt8Inputs = false;
  // Whether the decode walk takes three tokens per tile (DecodeTokens).
  static constexpr bool kThreeTokens = true;
  const MatrixRef& m;
  int64_t group() const { return 0; }
  RowPtrs RowOf(int64_t r) const { return {m.Row(r), nullptr}; }
  void DecodeRaw(const RowPtrs& row, int64_t c, VF* out) const {
    const DF df;
    const hn::RebindToUnsigned<DF> du32;
    const hn::Repartition<uint16_t, DF> du16x2;
    auto pairs = hn::BitCast(du32, hn::LoadU(du16x2, reinterpret_cast<const uint16_t*>(row.w) + c));
    InRegister(pairs);  // one load, not one per half
    out[0] = hn::BitCast(df, hn::ShiftLeft<16>(pairs));
    out[1] = hn::BitCast(df, hn::And(pairs, hn::Set(du32, 0xFFFF0000u)));
  }
  static float ScaleAt(const RowPtrs& /*row*/, int64_t /*g*/) { return 1.0f; }
  static GroupScale ScalesOf(const RowPtrs& /*row*/, int64_t /*g*/) {
    return {hn::Set(DF(), 1.0f), hn::Zero(DF())};
  }
  static void Apply(const GroupScale& /*sc*/, VF* /*out*/) {}
  static const void* ScaleAddr(const RowPtrs& /*row*/, int64_t /*g*/) { return nullptr; }
  static const void* ZeroAddr(const RowPtrs& /*row*/, int64_t /*g*/) { return nullptr; }
  void Decode(const RowPtrs& row, int64_t c, int64_t /*g*/, VF* out) const {
    DecodeRaw(row, c, out);
  }
  float Scalar(int64_t r, int64_t c) const {
    return Bf16ToFloat(reinterpret_cast<const bf16_t*>(m.Row(r))[c]);
  }
};

// The fp16 bits of the e4m3fn codes at p (one per lane of di16) as the values times 2^-8,
// subnormals included: a code sign-extended to 16 bits and moved up 7 holds its exponent and
// mantissa in fp16's fields and the sign in bits 14 and 15; clearing bit 14 leaves the sign (a
// sign-extending load, a shift and an AND, where widening with zeros took one more to move the
// sign up).
template <class DI16>
HWY_INLINE hn::Vec<DI16> E4M3Fp16Bits(DI16 di16, const uint8_t* p) {
  const hn::Rebind<int8_t, DI16> di8;
  const auto wide = hn::PromoteTo(di16, hn::LoadU(di8, reinterpret_cast<const int8_t*>(p)));
  return hn::And(hn::ShiftLeft<7>(wide), hn::Set(di16, int16_t{~0x4000}));
}

// fp8 e4m3fn: the byte shifted into an fp16's exponent and mantissa fields is the value times
// 2^-8, subnormals included (the same trick as the AVX-512 backend); the block scale carries the
// 2^8. 2N bytes are widened to 16 bits together and converted as two halves.
struct Fp8Dec {
  static constexpr int kVecs = 2;
  static constexpr bool kEvenOdd = false;
  static constexpr int64_t kStripFrom = 5;
  static constexpr bool kLateScale = true;
  static constexpr bool kInt8Inputs = false;
  static constexpr bool kThreeTokens = false;
  const MatrixRef& m;
  int64_t scale_cols;
  explicit Fp8Dec(const MatrixRef& mr) : m(mr), scale_cols(CeilDiv(mr.cols, mr.group)) {}
  int64_t group() const { return m.group; }
  RowPtrs RowOf(int64_t r) const {
    return {m.Row(r), m.scales + (r / m.block_rows) * scale_cols * sizeof(float)};
  }
  void DecodeRaw(const RowPtrs& row, int64_t c, VF* out) const {
    const DF df;
    const hn::Repartition<int16_t, DF> di16;  // 2N lanes
    const hn::Half<decltype(di16)> dh;
    const hn::Rebind<hwy::float16_t, decltype(dh)> df16;
    const auto h = E4M3Fp16Bits(di16, row.w + c);
#if HWY_TARGET == HWY_AVX2
    // AVX2: the upper half converted from a stored copy (vcvtph2ps with a memory operand) instead
    // of extracted first: one shuffle fewer per 16 weights on a decode bound by its vector
    // instructions (Zen 5: 0.91-0.98 of the time at 1-32 tokens, 0.86-0.95 in L2). The lower half
    // converts from the register: loading it from the copy too took 1.09x the time in L2 at one
    // token (median of 14 alternations), and two 16-byte stores 1.3x. AVX-512: its 64-byte
    // store and load took 1.05-1.18x the time of the extract. Opaque: without it GCC turns the
    // store and load back into the extract.
    HWY_ALIGN int16_t buf[HWY_MAX_BYTES / sizeof(int16_t)];
    hn::Store(h, di16, buf);
    const int64_t n = static_cast<int64_t>(hn::Lanes(df));
    out[0] = hn::PromoteTo(df, hn::BitCast(df16, hn::LowerHalf(dh, h)));
    out[1] = hn::PromoteTo(df, hn::BitCast(df16, hn::Load(dh, Opaque(buf) + n)));
#else
    out[0] = hn::PromoteTo(df, hn::BitCast(df16, hn::LowerHalf(dh, h)));
    out[1] = hn::PromoteTo(df, hn::BitCast(df16, hn::UpperHalf(dh, h)));
#endif
  }
  static float ScaleAt(const RowPtrs& row, int64_t g) {
    return reinterpret_cast<const float*>(row.s)[g] * 256.0f;
  }
  static GroupScale ScalesOf(const RowPtrs& row, int64_t g) {
    return {hn::Set(DF(), ScaleAt(row, g)), hn::Zero(DF())};
  }
  static void Apply(const GroupScale& sc, VF* out) {
    out[0] = hn::Mul(out[0], sc.s);
    out[1] = hn::Mul(out[1], sc.s);
  }
  static const void* ScaleAddr(const RowPtrs& row, int64_t g) {
    return row.s + g * static_cast<int64_t>(sizeof(float));
  }
  static const void* ZeroAddr(const RowPtrs& /*row*/, int64_t /*g*/) { return nullptr; }
  void Decode(const RowPtrs& row, int64_t c, int64_t g, VF* out) const {
    DecodeRaw(row, c, out);
    Apply(ScalesOf(row, g), out);
  }
  float Scalar(int64_t r, int64_t c) const {
    return Fp8E4M3ToFloat(m.Row(r)[c]) * reinterpret_cast<const float*>(RowOf(r).s)[c / m.group];
  }
};

// The 4-bit formats: MXFP4 (E2M1, E8M0 per 32), int4 (code - 8, bf16 per group), int4-zp
// (code - zero, fp16 per group: AWQ, GPTQ) and NVFP4 (E2M1, E4M3 per 16, a global per row's
// tensor).
enum class Nib { kMx, kInt4, kInt4Zp, kNvfp4 };

// fp8 e4m3fn as fp32 (the fp16 trick of Fp8Dec, scaled back by 2^8), n lanes of df at p.
template <class DFT>
HWY_INLINE hn::Vec<DFT> E4M3ToF32(DFT df, const uint8_t* p) {
  const hn::Rebind<int16_t, DFT> di16;
  const hn::Rebind<hwy::float16_t, DFT> df16;
  const auto h = E4M3Fp16Bits(di16, p);
  return hn::Mul(hn::PromoteTo(df, hn::BitCast(df16, h)), hn::Set(df, 256.0f));
}

// 4-bit codes: N bytes hold 2N values; the low nibbles (even columns) and the high nibbles (odd
// columns) are looked up by byte shuffle into signed integers (int4-zp: the codes themselves, no
// lookup; the group's zero point subtracted in fp32), widened and converted to fp32, and
// multiplied by the group's scale.
template <Nib K>
struct NibbleDec {
  static constexpr int kVecs = 2;
  static constexpr bool kEvenOdd = true;
  static constexpr int64_t kStripFrom = 5;
  // One scale per group for one token's sums: not with zero points (per value), nor for NVFP4
  // (on 16-lane vectors a chunk of 32 spans two of its groups of 16: per-lane scales).
  static constexpr bool kLateScale = K == Nib::kMx || K == Nib::kInt4;
  // Whether the tokens may come as int8 per group (DotRowsArgs::int8_inputs): the 4-bit codes only.
  static constexpr bool kInt8Inputs = true;
  static constexpr bool kThreeTokens = false;
  static constexpr bool kE2M1 = K == Nib::kMx || K == Nib::kNvfp4;
  static constexpr int64_t kScaleBytes = K == Nib::kInt4 || K == Nib::kInt4Zp ? 2 : 1;
  const MatrixRef& m;
  // Columns per scale step of the fp32 tiles: the format's group, except NVFP4 on vectors of
  // more than 8 floats, where a chunk (32 columns) takes two groups' scales (Decode).
  static bool WideNvfp4() { return K == Nib::kNvfp4 && hn::Lanes(DF()) > 8; }
  int64_t group() const { return WideNvfp4() ? 2 * m.group : m.group; }
  static const int8_t* Table() { return kE2M1 ? kE2M1x2 : K == Nib::kInt4 ? kInt4 : kCodes; }
  RowPtrs RowOf(int64_t r) const {
    const int64_t groups = m.cols / m.group;
    RowPtrs p{m.Row(r), m.scales + r * groups * kScaleBytes};
    if constexpr (K == Nib::kInt4Zp) p.z = m.zeros + r * groups;
    if constexpr (K == Nib::kNvfp4) p.global = m.RowGlobal(r);
    return p;
  }
  static float ScaleAt(const RowPtrs& row, int64_t g) {
    if constexpr (K == Nib::kMx) {
      return E8M0ToFloat(row.s[g]) * 0.5f;  // the table holds E2M1 x 2
    } else if constexpr (K == Nib::kInt4) {
      return Bf16ToFloat(reinterpret_cast<const bf16_t*>(row.s)[g]);
    } else if constexpr (K == Nib::kInt4Zp) {
      return HalfToFloat(reinterpret_cast<const fp16_t*>(row.s)[g]);
    } else {
      return Fp8E4M3ToFloat(row.s[g]) * 0.5f * row.global;
    }
  }
  void DecodeRaw(const RowPtrs& row, int64_t c, VF* out) const {
    const DF df;
    const hn::Rebind<uint8_t, DF> du8;
    const hn::Rebind<int8_t, DF> di8;
    const hn::Rebind<int32_t, DF> di32;
    const auto bytes = hn::LoadU(du8, row.w + (c >> 1));  // c >= 0: no sign fix-up
    const auto lo = hn::BitCast(di8, hn::And(bytes, hn::Set(du8, 0x0F)));
    const auto hi = hn::BitCast(di8, hn::ShiftRight<4>(bytes));
    if constexpr (K == Nib::kInt4Zp) {  // the codes themselves: no lookup
      out[0] = hn::ConvertTo(df, hn::PromoteTo(di32, lo));
      out[1] = hn::ConvertTo(df, hn::PromoteTo(di32, hi));
      return;
    }
    const auto table = hn::Load(hn::Full128<int8_t>(), Table());
    out[0] = hn::ConvertTo(df, hn::PromoteTo(di32, hn::TableLookupBytes(table, lo)));
    out[1] = hn::ConvertTo(df, hn::PromoteTo(di32, hn::TableLookupBytes(table, hi)));
  }
  static GroupScale ScalesOf(const RowPtrs& row, int64_t g) {
    const DF df;
    if (WideNvfp4()) {  // lanes [0, N/2): group 2g, [N/2, N): group 2g + 1 (even or odd columns)
      const hn::Half<DF> dh;
      return {
          hn::Combine(df, hn::Set(dh, ScaleAt(row, 2 * g + 1)), hn::Set(dh, ScaleAt(row, 2 * g))),
          hn::Zero(df)};
    }
    const float zero = K == Nib::kInt4Zp ? static_cast<float>(row.z[g]) : 0.0f;
    return {hn::Set(df, ScaleAt(row, g)), hn::Set(df, zero)};
  }
  static const void* ScaleAddr(const RowPtrs& row, int64_t g) {
    return row.s + (WideNvfp4() ? 2 * g : g) * kScaleBytes;
  }
  static const void* ZeroAddr(const RowPtrs& row, int64_t g) {
    return K == Nib::kInt4Zp ? row.z + g : nullptr;
  }
  static void Apply(const GroupScale& sc, VF* out) {
    for (int v = 0; v < kVecs; ++v) {
      out[v] = K == Nib::kInt4Zp ? hn::Mul(hn::Sub(out[v], sc.z), sc.s) : hn::Mul(out[v], sc.s);
    }
  }
  void Decode(const RowPtrs& row, int64_t c, int64_t g, VF* out) const {
    DecodeRaw(row, c, out);
    Apply(ScalesOf(row, g), out);
  }
  float Scalar(int64_t r, int64_t c) const {
    const uint8_t b = m.Row(r)[c / 2];
    const int code = c % 2 == 0 ? (b & 0xF) : (b >> 4);
    const RowPtrs p = RowOf(r);
    const int zero = K == Nib::kInt4Zp ? p.z[c / m.group] : 0;
    return static_cast<float>(Table()[code] - zero) * ScaleAt(p, c / m.group);
  }
};

// Token t's columns in the decoder's chunk order, widened to fp32: x_f[t * WidenedStride(k) + ...]
// (for kEvenOdd decoders each chunk of 2N columns as its N even, then its N odd columns).
template <typename Dec>
void WidenTokens(const DotRowsArgs& a, int64_t whole, float* xf) {
  const DF df;
  const hn::RebindToUnsigned<DF> du32;
  const hn::Rebind<uint16_t, DF> du16;
  const hn::Repartition<uint16_t, DF> du16x2;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const int64_t k = a.w->cols;
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const uint16_t* x = reinterpret_cast<const uint16_t*>(a.x + t * a.ldx);
    float* dst = xf + t * WidenedStride(k);
    int64_t c = 0;
    if constexpr (Dec::kEvenOdd) {
      for (; c < whole; c += 2 * n) {  // a bf16 pair's high half is the odd column
        const auto pairs = hn::BitCast(du32, hn::LoadU(du16x2, x + c));
        hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(pairs)), df, dst + c);
        hn::StoreU(hn::BitCast(df, hn::And(pairs, hn::Set(du32, 0xFFFF0000u))), df, dst + c + n);
      }
    } else {
      for (; c + n <= k; c += n) {
        const auto v = hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, x + c)));
        hn::StoreU(hn::BitCast(df, v), df, dst + c);
      }
    }
    for (; c < k; ++c) dst[c] = Bf16ToFloat(a.x[t * a.ldx + c]);
  }
}

// The columns a task's tiles share: `whole` columns in chunks of `chunk` (the rest, up to K, go
// through Dec::Scalar), and the tokens widened to fp32 at xf (ldxf apart).
struct DotSpan {
  int64_t chunk;
  int64_t whole;
  const float* xf;
  int64_t ldxf;
};

// Tile's late scaling: group g's sums of each token and row, scaled, into their totals. A function,
// not a lambda capturing the sums by reference: with the lambda GCC kept the sums in memory, a
// store and a reload around every multiply-add (fp8 at one token on AVX2, Zen 5: 25.9 against
// 24.5 TSC cycles per 128 weights in L2, end to end 0.88-0.93 of the time; docs/PERFORMANCE.md).
template <typename Dec, int kAcc, int MR, int NR>
HWY_INLINE void FlushLate(const RowPtrs* row_ptr, int64_t g, VF (&acc)[kAcc][MR][NR],
                          float (&total)[MR][NR][HWY_MAX_BYTES / sizeof(float)]) {
  const DF df;
#pragma GCC unroll 16
  for (int j = 0; j < NR; ++j) {
    const VF scale = hn::Set(df, Dec::ScaleAt(row_ptr[j], g));
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      VF sum = acc[0][i][j];
      if constexpr (kAcc == 2) sum = hn::Add(sum, acc[1][i][j]);
      hn::Store(hn::MulAdd(sum, scale, hn::Load(df, total[i][j])), df, total[i][j]);
#pragma GCC unroll 2
      for (int u = 0; u < kAcc; ++u) acc[u][i][j] = hn::Zero(df);
    }
  }
}

// Columns [k0, k1) (chunk multiples, k1 <= whole) of tokens [t0, t0 + MR) times weight rows
// rows[0, NR): out[i * ldo + j] (+)= the partial dot products. One token gets two independent
// multiply-add chains per row (the chunk's two vectors). Tiles of one or two tokens apply the
// scales once per group to the group's sums instead of to every decoded vector (with two tokens
// the per-chunk scaling was 5 of fp8's 13 instructions per row and chunk on AVX2; three tokens
// hold no registers for it).
template <typename Dec, int MR, int NR>
void Tile(const Dec& dec, const DotRowsArgs& a, const DotSpan& sp, const int64_t* rows, int64_t t0,
          int64_t k0, int64_t k1, float* out, int64_t ldo, bool accumulate) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const int64_t k = a.w->cols;
  const int64_t chunk = sp.chunk;
  static_assert(Dec::kVecs == 2, "one token's two chains are the chunk's two vectors");
  constexpr int kAcc = MR == 1 ? 2 : 1;
  constexpr bool kLate = MR <= 2 && Dec::kLateScale;
  // Every fixed-count loop below is unrolled (GCC's -O2 would leave them rolled and keep the
  // accumulators in memory, one store-forward latency per multiply-add).
  VF acc[kAcc][MR][NR];
  // kLate: the scaled group sums, in memory: they change once per group, and the registers are
  // left to the sums (AVX2 has 16).
  HWY_ALIGN float total[kLate ? MR : 1][kLate ? NR : 1][HWY_MAX_BYTES / sizeof(float)];
#pragma GCC unroll 16
  for (int u = 0; u < kAcc; ++u) {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) acc[u][i][j] = hn::Zero(df);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < (kLate ? MR : 1); ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < (kLate ? NR : 1); ++j) hn::Store(hn::Zero(df), df, total[i][j]);
  }
  RowPtrs row_ptr[NR];
  SetRowPtrs(dec, rows, NR, row_ptr);
  // The scale group of the current chunk, advanced as the chunks cross group boundaries.
  const int64_t group = dec.group() > 0 ? dec.group() : k + chunk;
  int64_t g = k0 / group, group_end = (g + 1) * group;
  // Bytes of a row per chunk, and the chunks between prefetches (one per 64-byte line).
  const int64_t chunk_bytes = a.w->row_bytes * chunk / std::max<int64_t>(1, k);
  const int64_t per_line = std::max<int64_t>(1, 64 / std::max<int64_t>(1, chunk_bytes));
  int64_t since = 0;
  // Chunk c's prefetch address in each row, stepped with c (no divide per line).
  int64_t off = k0 * a.w->row_bytes / std::max<int64_t>(1, k) + kPrefetchBytes;
  // The inputs: sp's fields in locals (Highway's stores may alias them, and GCC reloaded them per
  // chunk). Three tokens take them from memory in each row's multiply-adds: with 12 accumulators
  // and a row's two decoded vectors, AVX2's 16 registers hold no inputs.
  constexpr bool kXInRegisters = MR < 3;
  const int64_t ldxf = sp.ldxf;
  const float* x0 = sp.xf + t0 * ldxf;
  for (int64_t c = k0; c < k1; c += chunk, off += chunk_bytes) {
    if (c == group_end) {
      if constexpr (kLate) FlushLate<Dec>(row_ptr, g, acc, total);
      ++g;
      group_end += group;
    }
    if (since-- == 0) {
      // The weight streams are read once: prefetch kPrefetchBytes ahead of each row (past a
      // row's end this runs on into the next row, the stream's next step in the decode walk).
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) hwy::Prefetch(row_ptr[j].w + off);
      since = per_line - 1;
    }
    // Up to two tokens: their inputs once per chunk (in registers, see InRegister); then each
    // row's decode and its multiply-adds (three tokens: the inputs as their memory operands).
    VF xv[kXInRegisters ? MR : 1][Dec::kVecs];
    if constexpr (kXInRegisters) {
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
        for (int v = 0; v < Dec::kVecs; ++v) {
          // Pinned as a local, then copied: InRegister on the array element itself made GCC
          // store every input to the array on the stack each chunk, never to read it back (AVX2
          // end to end without those stores: bf16 0.93-0.98 of the time, fp8 0.96-0.98).
          VF loaded = hn::LoadU(df, x0 + i * ldxf + c + v * n);
          InRegister(loaded);
          xv[i][v] = loaded;
        }
      }
    }
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      VF w[Dec::kVecs];
      if constexpr (kLate) {
        dec.DecodeRaw(row_ptr[j], c, w);
      } else {
        dec.Decode(row_ptr[j], c, g, w);
      }
      const float* xr = kXInRegisters ? x0 : Opaque(x0);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
        for (int v = 0; v < Dec::kVecs; ++v) {
          // One token: one chain per vector of the chunk.
          const int u = kAcc == 1 ? 0 : v;
          const VF x = kXInRegisters ? xv[i][v] : hn::LoadU(df, xr + i * ldxf + c + v * n);
          acc[u][i][j] = hn::MulAdd(w[v], x, acc[u][i][j]);
        }
      }
    }
  }
  if constexpr (kLate) FlushLate<Dec>(row_ptr, g, acc, total);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      VF v;
      if constexpr (kLate) {
        v = hn::Load(df, total[i][j]);
      } else {
        v = acc[0][i][j];
        if constexpr (kAcc == 2) v = hn::Add(v, acc[1][i][j]);
      }
      const float s = hn::GetLane(hn::SumOfLanes(df, v));
      float& o = out[i * ldo + j];
      o = accumulate ? o + s : s;
    }
  }
}

// Adds the columns past the last whole chunk: out[i * ldo + j] += their dot products.
template <typename Dec>
void TailColumns(const Dec& dec, const DotRowsArgs& a, const DotSpan& sp, const int64_t* rows,
                 int nr, int64_t t0, int mr, float* out, int64_t ldo) {
  for (int i = 0; i < mr; ++i) {
    const float* x = sp.xf + (t0 + i) * sp.ldxf;
    for (int j = 0; j < nr; ++j) {
      float s = 0.0f;
      for (int64_t c = sp.whole; c < a.w->cols; ++c) s += dec.Scalar(rows[j], c) * x[c];
      out[i * ldo + j] += s;
    }
  }
}

// Up to kDecodeMaxTokens tokens: the decode walk. The rows are cut into kStreams runs of
// consecutive list entries (consecutive weight rows: the driver lists row blocks in order) and
// each tile takes one row of every run, so the reads are kStreams long sequential streams whose
// prefetches run on into each stream's next row (as in the AVX-512 BF16 kernels, where 4
// streams measured best). K blocks keep all the tokens' fp32 inputs within kDecodeXBytes of L1
// while the weight streams pass; they walk each row in order, so they do not break the streams.
constexpr int kStreams = 4;
constexpr int64_t kDecodeXBytes = 16 * 1024;

// Chunks of two decoded vectors per row (every decoder: bf16 pairs, fp8, 4-bit) take two tokens,
// their four inputs in registers beside 8 accumulators, or with Dec::kThreeTokens three, 12
// accumulators and the inputs from memory (fewer passes over each row; a remainder of one token
// is avoided, its tile pays a whole decode for 2 multiply-adds per vector).
template <typename Dec, int NR>
void DecodeTokens(const Dec& dec, const DotRowsArgs& a, const DotSpan& sp, const int64_t* rows,
                  int64_t k0, int64_t k1, float* tile, bool accumulate) {
  int64_t t = 0;
  if constexpr (Dec::kThreeTokens) {
    for (; t + 3 <= a.num_tokens && a.num_tokens - t != 4; t += 3) {
      Tile<Dec, 3, NR>(dec, a, sp, rows, t, k0, k1, tile + t * kStreams, kStreams, accumulate);
    }
  }
  for (; t + 2 <= a.num_tokens; t += 2) {
    Tile<Dec, 2, NR>(dec, a, sp, rows, t, k0, k1, tile + t * kStreams, kStreams, accumulate);
  }
  if (t < a.num_tokens) {
    Tile<Dec, 1, NR>(dec, a, sp, rows, t, k0, k1, tile + t * kStreams, kStreams, accumulate);
  }
}

template <typename Dec, int NR>
void DecodeStep(const Dec& dec, const DotRowsArgs& a, const DotSpan& sp, const int64_t* rows,
                int64_t kc, float* tile) {
  for (int64_t k0 = 0; k0 < sp.whole || k0 == 0; k0 += kc) {
    const int64_t k1 = std::min(sp.whole, k0 + kc);
    DecodeTokens<Dec, NR>(dec, a, sp, rows, k0, k1, tile, k0 > 0);
    if (k1 >= sp.whole) break;
  }
  if (sp.whole < a.w->cols) {
    for (int64_t t = 0; t < a.num_tokens; ++t) {
      TailColumns(dec, a, sp, rows, NR, t, 1, tile + t * kStreams, kStreams);
    }
  }
}

template <typename Dec>
void DecodeWalk(const Dec& dec, const DotRowsArgs& a, const DotSpan& sp) {
  const int64_t per = CeilDiv(a.num_rows, int64_t{kStreams});
  // K block: a multiple of the chunk and of the scale group.
  const int64_t unit = std::max(sp.chunk, dec.group());
  const int64_t kc = std::max(unit, kDecodeXBytes / (4 * a.num_tokens) / unit * unit);
  float tile[kDecodeMaxTokens * kStreams];
  for (int64_t s = 0; s < per; ++s) {
    int64_t col[kStreams], rows[kStreams];
    int nr = 0;
    for (int q = 0; q < kStreams && q * per + s < a.num_rows; ++q) col[nr++] = q * per + s;
    for (int j = 0; j < nr; ++j) rows[j] = a.row_idx[col[j]];
    switch (nr) {
      case 4: DecodeStep<Dec, 4>(dec, a, sp, rows, kc, tile); break;
      case 3: DecodeStep<Dec, 3>(dec, a, sp, rows, kc, tile); break;
      case 2: DecodeStep<Dec, 2>(dec, a, sp, rows, kc, tile); break;
      default: DecodeStep<Dec, 1>(dec, a, sp, rows, kc, tile); break;
    }
    for (int64_t t = 0; t < a.num_tokens; ++t) {
      for (int j = 0; j < nr; ++j) a.out[t * a.ldo + col[j]] = tile[t * kStreams + j];
    }
  }
}

// --- prefill: decoded strips ----------------------------------------------------------------
//
// More than kDecodeMaxTokens tokens: a strip of kStripRows weight rows is decoded once per K
// block of kStripCols columns into fp32 (in the decoder's chunk order, like the widened inputs;
// 12 KiB, L1-resident beside the tiles' inputs), and every token tile passes over it with loads and
// FMAs only: the decode (exact for bf16, MXFP4 and int4, whose scales fold into fp32 exactly; fp8
// rounds code x scale once, as the decode walk does) is paid once per weight instead of once per
// token tile. Each tile adds its vector sums into per-(token, row) vector partials, reduced once at
// the end. Tokens x rows of a strip tile: 4 x 3, twelve accumulators, three weight vectors and one
// input vector fill AVX2's 16 registers; 12 FMAs per 7 loads. AVX-512's 32 registers take 8 x 3 (24
// accumulators; 24 FMAs per 11 loads).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr int kMrWide = 8;
#else
constexpr int kMrWide = 4;
#endif
constexpr int kNrWide = 3;

// pacc[(i * kStripRows + j) * N ...] += the tile's sums over `cols` columns (chunk multiples) of
// strip rows w + j * kStripCols and inputs x + i * ldx (= on the first K block: `first`).
template <int MR, int NR>
void StripTile(const float* w, const float* x, int64_t ldx, int64_t cols, float* pacc, bool first) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  VF acc[MR][NR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) acc[i][j] = hn::Zero(df);
  }
  for (int64_t c = 0; c < cols; c += n) {
    VF wv[NR];
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) wv[j] = hn::LoadU(df, w + j * kStripCols + c);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      VF xv = hn::LoadU(df, x + i * ldx + c);
      InRegister(xv);
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) acc[i][j] = hn::MulAdd(wv[j], xv, acc[i][j]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      float* p = pacc + (i * kStripRows + j) * n;
      hn::StoreU(first ? acc[i][j] : hn::Add(hn::LoadU(df, p), acc[i][j]), df, p);
    }
  }
}

template <int MR>
void StripTiles(int nr, const float* w, const float* x, int64_t ldx, int64_t cols, float* pacc,
                bool first) {
  const int64_t n = static_cast<int64_t>(hn::Lanes(DF()));
  int j = 0;
  for (; j + kNrWide <= nr; j += kNrWide) {
    StripTile<MR, kNrWide>(w + j * kStripCols, x, ldx, cols, pacc + j * n, first);
  }
  if (nr - j == 2) StripTile<MR, 2>(w + j * kStripCols, x, ldx, cols, pacc + j * n, first);
  if (nr - j == 1) StripTile<MR, 1>(w + j * kStripCols, x, ldx, cols, pacc + j * n, first);
}

// Rows row_ptr[0, nr) over columns [k0, k1) (whole chunks and, where groups are smaller than
// the block, whole groups) decoded into strip rows strip + j * kStripCols, in the decoder's chunk
// order. The scale is made once per group and the chunks of a group run in a loop of their own,
// with the chunk size and the bounds in locals: with Highway's stores (which may alias anything)
// GCC reloaded them from memory on every chunk, and checking for the next group on every chunk
// made the bf16 loop ten instructions per eight values.
template <typename Dec>
HWY_INLINE void DecodeStripBlock(const Dec& dec, const RowPtrs* row_ptr, int nr, int64_t k0,
                                 int64_t k1, int64_t group, int64_t chunk, float* strip) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const int64_t g0 = k0 / group;
  const int64_t first_end = std::min(k1, (g0 + 1) * group);
  for (int j = 0; j < nr; ++j) {
    const RowPtrs row = row_ptr[j];
    float* dst = strip + j * kStripCols;
    int64_t g = g0;
    for (int64_t c0 = k0, c1 = first_end; c0 < k1; c0 = c1, c1 = std::min(k1, c1 + group), ++g) {
      const GroupScale sc = dec.ScalesOf(row, g);
#pragma GCC unroll 4
      for (int64_t c = c0; c < c1; c += chunk) {
        VF w[Dec::kVecs];
        dec.DecodeRaw(row, c, w);
        dec.Apply(sc, w);
#pragma GCC unroll 2
        for (int v = 0; v < Dec::kVecs; ++v) hn::StoreU(w[v], df, dst + (c - k0) + v * n);
      }
    }
  }
}

// The weight lines a strip's next decode reads: `rows` row starts, `count` 64-byte lines over
// them (row i's line l is line l * rows + i).
struct StripLines {
  int rows = 0;
  int64_t count = 0;
  // The rows' pointers, the block's byte offset in each row, and its first and last scale groups
  // (ScaleAddr, ZeroAddr).
  RowPtrs ptrs[kStripRows];
  int64_t from = 0;
  int64_t g0 = 0, g1 = 0;
};

// The lines ScalesOf reads for groups g0 and g1 of a row (the first and last of a K block).
template <typename Dec>
HWY_INLINE void PrefetchScales(const RowPtrs& row, int64_t g0, int64_t g1) {
  for (const void* p : {Dec::ScaleAddr(row, g0), Dec::ScaleAddr(row, g1), Dec::ZeroAddr(row, g0),
                        Dec::ZeroAddr(row, g1)}) {
    if (p != nullptr) hwy::Prefetch(p);
  }
}

// *s = the StripLines of the K block from column k1 of the strip's rows (row_ptr, nr of them), or
// with k1 < 0 of the first block of the next strip's rows (after r0's). Filled in place, once per
// K block: a StripLines made anew was cleared with a `rep stos` each time.
template <typename Dec>
void NextStripLines(const Dec& dec, const DotRowsArgs& a, const RowPtrs* row_ptr, int nr,
                    int64_t r0, int64_t k1, int64_t kb, int64_t group, StripLines& s) {
  s.rows = 0;
  const int64_t k = a.w->cols;
  s.from = k1 >= 0 ? k1 * a.w->row_bytes / k : 0;
  for (int j = 0; j < nr; ++j) {
    if (k1 >= 0) {
      s.ptrs[s.rows++] = row_ptr[j];
    } else if (r0 + kStripRows + j < a.num_rows) {
      s.ptrs[s.rows++] = dec.RowOf(a.row_idx[r0 + kStripRows + j]);
    }
  }
  s.count = s.rows * ((kb * a.w->row_bytes / k + 63) / 64);
  const int64_t first = std::max<int64_t>(k1, 0);
  s.g0 = first / group;
  s.g1 = (std::min(k, first + kb) - 1) / group;
}

template <typename Dec>
void PrefillStrips(const Dec& dec, const DotRowsArgs& a, const DotSpan& sp) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const int64_t k = a.w->cols;
  const int64_t tokens = a.num_tokens;
  // The strip and the partial sums after the widened inputs, vector-aligned.
  float* strip = a.work + tokens * sp.ldxf;
  float* pacc = strip + kStripRows * kStripCols;
  const int64_t group = dec.group() > 0 ? dec.group() : k + sp.chunk;
  // K blocks of whole chunks and (for the scales) whole groups where the groups are smaller.
  const int64_t unit = std::max(sp.chunk, std::min(group, kStripCols));
  const int64_t kb = std::max(unit, kStripCols / unit * unit);
  StripLines next;
  for (int64_t r0 = 0; r0 < a.num_rows; r0 += kStripRows) {
    const int nr = static_cast<int>(std::min(kStripRows, a.num_rows - r0));
    // The first K block's tiles store their sums (no K block: no tiles, the tail sums alone).
    if (sp.whole == 0) std::fill(pacc, pacc + tokens * kStripRows * n, 0.0f);
    RowPtrs row_ptr[kStripRows];
    int64_t rows[kStripRows];
    for (int j = 0; j < nr; ++j) rows[j] = a.row_idx[r0 + j];
    SetRowPtrs(dec, rows, nr, row_ptr);
    for (int64_t k0 = 0; k0 < sp.whole; k0 += kb) {
      const int64_t k1 = std::min(sp.whole, k0 + kb);
      DecodeStripBlock(dec, row_ptr, nr, k0, k1, group, sp.chunk, strip);
      // The lines the next decode will read (each row's next block, or after the last block the
      // next strip's rows' first), prefetched in shares before the token tiles of the second
      // half. Issued all during the decode, they queued with the decode's own loads behind the
      // core's outstanding misses (spread out: 0.93-0.99 of the time; over all the tiles instead
      // of the second half measured the same; docs/PERFORMANCE.md).
      NextStripLines(dec, a, row_ptr, nr, r0, k1 >= sp.whole ? -1 : k1, kb, group, next);
      int64_t issued = 0, line = 0;
      int row = 0;
      const auto tiles = [&](int mr, int64_t t, auto run) {
        const int64_t half = std::max<int64_t>(0, 2 * (t + mr) - tokens);
        const int64_t upto = next.count * half / tokens;
        // The next block's scales (a line or two per row) with the first share: the decode
        // waited on them (int4 at Kimi-K3's 16 tokens per expert: the scale's load took 17 % of
        // the strip decode's samples).
        if (issued == 0 && upto > 0) {
          for (int j = 0; j < next.rows; ++j) PrefetchScales<Dec>(next.ptrs[j], next.g0, next.g1);
        }
        for (; issued < upto; ++issued) {
          hwy::Prefetch(next.ptrs[row].w + next.from + line * 64);
          if (++row == next.rows) {
            row = 0;
            ++line;
          }
        }
        run(nr, strip, sp.xf + k0 + t * sp.ldxf, sp.ldxf, k1 - k0, pacc + t * kStripRows * n,
            k0 == 0);
      };
      int64_t t = 0;
      for (; t + kMrWide <= tokens; t += kMrWide) tiles(kMrWide, t, StripTiles<kMrWide>);
      if constexpr (kMrWide > 4) {
        for (; t + 4 <= tokens; t += 4) tiles(4, t, StripTiles<4>);
      }
      for (; t + 2 <= tokens; t += 2) tiles(2, t, StripTiles<2>);
      for (; t < tokens; ++t) tiles(1, t, StripTiles<1>);
    }
    for (int64_t t = 0; t < tokens; ++t) {
      for (int j = 0; j < nr; ++j) {
        a.out[t * a.ldo + r0 + j] =
            hn::GetLane(hn::SumOfLanes(df, hn::LoadU(df, pacc + (t * kStripRows + j) * n)));
      }
    }
    if (sp.whole < k)
      TailColumns(dec, a, sp, rows, nr, 0, static_cast<int>(tokens), a.out + r0, a.ldo);
  }
}

// --- 4-bit decode on 16-bit integers --------------------------------------------------------
//
// Widening every 4-bit code to fp32 costs more instructions than its half byte takes to arrive
// from memory, so decode (up to kDecodeMaxTokens tokens) multiplies in integers instead. A chunk
// is one vector of a row's bytes (N8 bytes, 2 x N8 codes): its low and its high nibbles are
// looked up by byte shuffle (E2M1 x 2 or int4, as signed bytes) and spread into four int16
// vectors (each code times 256, SpreadBytes). Each token's bf16 inputs are quantized to int16
// per scale group with a power-of-two scale (|q| < 2^14) and stored in the chunk's lane order,
// and 16-bit multiply-adds with 32-bit sums (vpmaddwd on x86) take the chunk in four
// instructions per token. The integer sums are converted once per group, or, where a chunk spans
// several groups (AVX2 with groups of 32, NVFP4's 16), once per chunk with each lane's scales.
// (The spread replaced byte interleaves with zeros, which put NVFP4's two groups of a 128-bit
// block in different vectors and so needed two sets of sums: NVFP4 decode 0.65-0.74 of the
// time after, the other formats 0.98-1.04, on Zen 4 with AVX2 and AVX-512 forced.)
//
// Numerics: a bf16 input has 8 significant bits and its int16 form 15, so the quantization is
// exact for every input within 2^6 of its group's largest magnitude and rounds the others to
// multiples of 2^-14 of it (error at most 2^-15 of the group's largest input); the integer sums
// are exact; so against the fp32 dot products the only differences are those roundings and the
// order of the fp32 additions.
// A chunk is one vector of bytes: 32 on AVX2 (and at most 32 on NEON and SVE, whose wider
// vectors are not measured), 64 on AVX-512, where each 128-bit block still holds whole groups
// of 32 codes (the byte-shuffle lookups and interleaves work per block).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
inline constexpr size_t kQMaxBytes = 64;
#else
inline constexpr size_t kQMaxBytes = 32;
#endif
using D8 = hn::CappedTag<uint8_t, kQMaxBytes>;
using D16 = hn::Repartition<int16_t, D8>;
using V16 = hn::Vec<D16>;
using D32 = hn::Repartition<int32_t, D8>;
using V32 = hn::Vec<D32>;
using DQF = hn::Rebind<float, D32>;

// Most columns per scale group whose integer sums cannot overflow: |code x 2 x 256| <= 3072,
// |q| < 2^14, and a 32-bit lane sums at most 8 products per chunk and group / 32 chunks (NEON):
// 32 x 3072 x 2^14 < 2^31.
constexpr int64_t kQMaxGroup = 128;
// The most 32-bit lanes (and int16 lanes) of these vectors.
constexpr int kQMaxLanes32 = 16;

int64_t QChunk() { return 2 * static_cast<int64_t>(hn::Lanes(D8())); }

// A vector of bytes as two int16 vectors holding each byte times 256 (in the high byte of its
// 16-bit lane): the even bytes shifted up, the odd bytes with the low byte cleared. Element-wise,
// so every vector's 32-bit lanes hold the same columns of each 128-bit block (QLayout).
HWY_INLINE void SpreadBytes(hn::Vec<D8> b, V16* out) {
  const D16 d16;
  const hn::Repartition<uint16_t, D8> du16;
  const auto u = hn::BitCast(du16, b);
  out[0] = hn::BitCast(d16, hn::ShiftLeft<8>(u));
  out[1] = hn::BitCast(d16, hn::And(u, hn::Set(du16, uint16_t{0xFF00})));
}

// The column (within the chunk) of each int16 lane of the four decoded vectors, found by running
// the decode's spread on the columns themselves: order[v * N16 + lane].
const int16_t* QChunkOrder() {
  static const auto order = [] {
    const D8 d8;
    const D16 d16;
    const hn::Repartition<uint16_t, D8> du16;
    std::array<int16_t, 2 * kQMaxBytes> o{};
    HWY_ALIGN uint8_t even[kQMaxBytes], odd[kQMaxBytes];
    for (size_t i = 0; i < kQMaxBytes; ++i) {
      even[i] = static_cast<uint8_t>(2 * i);
      odd[i] = static_cast<uint8_t>(2 * i + 1);
    }
    const size_t n16 = hn::Lanes(d16);
    HWY_ALIGN uint16_t lanes[32];
    int v = 0;
    for (const uint8_t* cols : {even, odd}) {  // low nibbles: even columns; high: odd
      V16 w[2];
      SpreadBytes(hn::Load(d8, cols), w);
      for (int half = 0; half < 2; ++half, ++v) {
        hn::Store(hn::ShiftRight<8>(hn::BitCast(du16, w[half])), du16, lanes);
        for (size_t l = 0; l < n16; ++l) o[v * n16 + l] = static_cast<int16_t>(lanes[l]);
      }
    }
    return o;
  }();
  return order.data();
}

// How a decode's groups map to chunks. Where a chunk spans several groups, each 32-bit lane of a
// decoded vector holds columns of one group, the same group in all four vectors (SpreadBytes
// puts columns 8L + a and 8L + a + 4, a < 4, in lane L), so the four share their integer sums:
// groups of 32 on AVX2, NVFP4's 16 everywhere.
struct QLayout {
  int64_t cols = 0;    // K
  int64_t group = 0;   // columns per scale group
  int64_t chunk = 0;   // columns per chunk (QChunk())
  bool lanes = false;  // several groups per chunk: scales per 32-bit lane (else a group >= a chunk)
  // Four rows' sums per vector: 8-bit inputs (Q8RowsTile), or 16-bit inputs with groups of 32
  // within a chunk (Q16RowsTile).
  bool rows4 = false;
  // The integer products by VNNI (the avx2-vnni and avx512-vnni backends; kVnniTarget): vpdpwssd
  // and vpdpbusd add into the 32-bit sums, the same sums as vpmaddwd / vpmaddubsw and their adds.
  bool vnni = false;
  // kOffsetCodes on 16-bit inputs: the codes decoded unsigned (QDecodeChunk), the offset's
  // share (int4: -8 x the inputs' sum per flush unit and lane; int4-zp: -the sum, times each
  // row's zero point in the flush) folded into the inputs' scaling (QInputs::negc), as with
  // 8-bit inputs.
  bool offset = false;
  int32_t lane_group[kQMaxLanes32] = {};  // the group (within the chunk) of each 32-bit lane
};

// Fills the lane layout of a chunk spanning several groups; false when a 32-bit lane's columns
// fall in different groups (groups narrower than 8 columns).
bool MakeQLaneGroups(QLayout* ql) {
  const int64_t n16 = static_cast<int64_t>(hn::Lanes(D16()));
  const int16_t* order = QChunkOrder();
  for (int64_t k = 0; k < n16 / 2; ++k) {
    ql->lane_group[k] = static_cast<int32_t>(order[2 * k] / ql->group);
  }
  for (int64_t v = 0; v < 4; ++v) {
    for (int64_t l = 0; l < n16; ++l) {
      if (order[v * n16 + l] / ql->group != ql->lane_group[l / 2]) return false;
    }
  }
  return true;
}

// MakeQLaneGroups, made once per group size and thread: the layout depends on the group alone,
// and its divisions, made on every dot_rows call, were 1.4 % of the one-token 4-bit decode's
// samples (perf, Zen 5, AVX2 forced).
bool QLaneGroups(QLayout* ql) {
  thread_local QLayout made;  // group 0: nothing made yet
  thread_local bool made_ok = false;
  if (made.group != ql->group) {
    made = QLayout{};
    made.group = ql->group;
    made_ok = MakeQLaneGroups(&made);
  }
  std::copy(std::begin(made.lane_group), std::end(made.lane_group), ql->lane_group);
  return made_ok;
}

// Whether the 16-bit decode of K takes its codes unsigned, with the offset's share in the
// inputs' scaling (QLayout::offset): int4, whose codes are the value + 8, and int4-zp, whose
// codes are the value + the group's zero point.
template <Nib K>
constexpr bool kOffsetCodes = K == Nib::kInt4 || K == Nib::kInt4Zp;

// The multiple of a lane's input sum in its offset share (QInputs::negc): int4's 8; int4-zp's
// zero points differ per row and group, so its share is the sum alone, times each row's zero
// point in the flush (QTile).
template <Nib K>
constexpr int kOffsetMultiple = K == Nib::kInt4 ? 8 : 1;

// The four int16 vectors of the chunk at byte p: the table's values x 256, or (kOffsetCodes: int4,
// int4-zp) the unsigned codes, QLayout::offset.
template <Nib K>
HWY_INLINE void QDecodeChunk(const uint8_t* p, V16* w) {
  const D8 d8;
  const hn::Repartition<uint16_t, D8> du16;
  if constexpr (kOffsetCodes<K>) {
    // The four nibbles of each 16-bit lane, in SpreadBytes' order (the low nibbles of the even
    // and the odd bytes, then the high ones): 6 instructions, where the lookup and the spread
    // took 9.
    const D16 d16;
    const auto u = hn::BitCast(du16, hn::LoadU(d8, p));
    const auto nibble = hn::Set(du16, uint16_t{0x000F});
    w[0] = hn::BitCast(d16, hn::And(u, nibble));
    w[1] = hn::BitCast(d16, hn::And(hn::ShiftRight<8>(u), nibble));
    w[2] = hn::BitCast(d16, hn::And(hn::ShiftRight<4>(u), nibble));
    w[3] = hn::BitCast(d16, hn::ShiftRight<12>(u));
    return;
  }
  const auto mask = hn::Set(d8, 0x0F);
  const auto bytes = hn::LoadU(d8, p);
  const auto table = hn::LoadDup128(d8, reinterpret_cast<const uint8_t*>(NibbleDec<K>::Table()));
  const auto lo = hn::TableLookupBytes(table, hn::And(bytes, mask));
  const auto hi = hn::TableLookupBytes(
      table, hn::And(hn::BitCast(d8, hn::ShiftRight<4>(hn::BitCast(du16, bytes))), mask));
  SpreadBytes(lo, w);
  SpreadBytes(hi, w + 2);
}

// The inputs of the tokens quantized: q[t * ldq + c] in the chunks' lane order, and their
// scales (q * scale is the input; the factor 1/256 of the decoded codes, but int4's and int4-zp's,
// and the 1/2 of E2M1 x 2 are folded in): per group sx[t * ldu + g], or, with QLayout::lanes, per
// chunk, class and 32-bit lane sx[t * ldu + chunk * N32 + lane]. With QLayout::offset (int4,
// int4-zp), per flush unit and lane as Q8Inputs, with the offset's share negc (else null).
struct QInputs {
  const int16_t* q;
  int64_t ldq;
  const float* sx;
  const float* negc;
  int64_t ldu;
};

// 2^e as a float for e in [-126, 127].
inline float Pow2(int e) { return std::bit_cast<float>(static_cast<uint32_t>(e + 127) << 23); }

// A group's quantization shift (q = x * 2^shift): these two mark a group of zeros and a group
// holding an infinity or a NaN (its sums are NaN).
constexpr int32_t kZeroShift = std::numeric_limits<int32_t>::min();
constexpr int32_t kNaNShift = std::numeric_limits<int32_t>::max();

// bf16 lanes widened to their fp32 bits (exact: a bf16 is the top half of its fp32).
template <class DI32>
HWY_INLINE hn::Vec<DI32> Bf16Bits(DI32 di32, const bf16_t* p) {
  const hn::Rebind<uint16_t, DI32> du16;
  const hn::Rebind<uint32_t, DI32> du32;
  const auto wide = hn::PromoteTo(du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p)));
  return hn::BitCast(di32, hn::ShiftLeft<16>(wide));
}

// The largest of the bf16 magnitudes (sign cleared, as int16) of p[*c, n) in vectors of tag d,
// and m: *c advances past the whole vectors.
template <class D16>
HWY_INLINE int16_t MaxMagnitudeIn(D16 d16, const int16_t* p, int64_t n, int64_t* c, int16_t m) {
  const int64_t nl = static_cast<int64_t>(hn::Lanes(d16));
  if (*c + nl > n) return m;
  const auto magnitude = hn::Set(d16, int16_t{0x7fff});
  auto v = hn::Set(d16, m);
  for (; *c + nl <= n; *c += nl) v = hn::Max(v, hn::And(hn::LoadU(d16, p + *c), magnitude));
  return hn::GetLane(hn::MaxOfLanes(d16, v));
}

// The largest magnitude of x[0, n) as fp32 bits (sign cleared), where every infinity and NaN
// sorts above the finite values: the maximum of the bf16 bits in 16-bit lanes (a group of 32 is
// one or two vectors), shifted into place.
HWY_INLINE int32_t MaxMagnitudeBits(const bf16_t* p, int64_t n) {
  const int16_t* bits = reinterpret_cast<const int16_t*>(p);
  int64_t c = 0;
  int16_t m = MaxMagnitudeIn(hn::CappedTag<int16_t, 32>(), bits, n, &c, 0);
  m = MaxMagnitudeIn(hn::CappedTag<int16_t, 8>(), bits, n, &c, m);
  for (; c < n; ++c) m = std::max(m, static_cast<int16_t>(bits[c] & 0x7fff));
  return int32_t{m} << 16;
}

// shifts[g] for each of one token's groups: the largest magnitude m < 2^e gives 14 - e, so
// |q| < 2^14.
void GroupShifts(const bf16_t* x, int64_t groups, int64_t group, int32_t* shifts) {
  for (int64_t g = 0; g < groups; ++g) {
    const int32_t bits = MaxMagnitudeBits(x + g * group, group);
    if (bits >= 0x7f800000) {
      shifts[g] = kNaNShift;
    } else if (bits == 0) {
      shifts[g] = kZeroShift;
    } else {
      int e;
      std::frexp(std::bit_cast<float>(bits), &e);  // m < 2^e, e in [-148, 128]
      shifts[g] = 14 - e;
    }
  }
}

// q[c] = x[c] * 2^shift of its group, rounded to nearest even, for one token's `groups` groups
// in column order (zeros for the groups of zeros, infinities and NaNs).
void QuantizeGroups(const bf16_t* x, int64_t groups, int64_t group, const int32_t* shifts,
                    int16_t* q) {
  const hn::CappedTag<int32_t, 16> di32;
  const hn::Rebind<float, decltype(di32)> df;
  const hn::Rebind<int16_t, decltype(di32)> di16;
  const int64_t n = static_cast<int64_t>(hn::Lanes(di32));
  for (int64_t g = 0; g < groups; ++g) {
    const int32_t shift = shifts[g];
    const bf16_t* p = x + g * group;
    int16_t* d = q + g * group;
    if (shift == kZeroShift || shift == kNaNShift) {
      std::fill(d, d + group, int16_t{0});
      continue;
    }
    // 2^shift in two exact factors (shift can exceed a float's exponent range); the products
    // stay exact and |v| < 2^14, so rounding to the nearest integer is the only rounding.
    const float f1 = Pow2(shift / 2), f2 = Pow2(shift - shift / 2);
    int64_t c = 0;
    for (; c + n <= group; c += n) {
      const auto v = hn::Mul(hn::Mul(hn::BitCast(df, Bf16Bits(di32, p + c)), hn::Set(df, f1)),
                             hn::Set(df, f2));
      hn::StoreU(hn::DemoteTo(di16, hn::NearestInt(v)), di16, d + c);
    }
    for (; c < group; ++c) {  // round to nearest even: |v| < 2^14, adding 1.5 x 2^23 rounds it
      const float v = Bf16ToFloat(p[c]) * f1 * f2;
      d[c] = static_cast<int16_t>((v + 12582912.0f) - 12582912.0f);
    }
  }
}

// One token's row sizes in the layout of ql for 8-bit (k8) or 16-bit inputs: values (ldq) and
// scales (ldu: per flush unit and lane, with negc, for 8-bit inputs and QLayout::offset; else
// per group, or per chunk and lane with QLayout::lanes), and the scratch bytes of QuantizeRows8 /
// QuantizeRows16.
void QRowSizes(const QLayout& ql, bool k8, QuantizedRows* r, int64_t* scratch_bytes) {
  const int64_t chunks = CeilDiv(ql.cols, ql.chunk);
  const int64_t n32 = static_cast<int64_t>(hn::Lanes(D32()));
  r->ldq = chunks * ql.chunk;
  r->q_bytes = k8 ? 1 : 2;
  r->with_negc = k8 || ql.offset;
  const int64_t groups = r->ldq / ql.group;
  if (r->with_negc) {
    r->ldu = (ql.lanes ? chunks : ql.cols / ql.group) * n32;
  } else {
    r->ldu = ql.lanes ? chunks * n32 : ql.cols / ql.group;
  }
  if (k8) {
    *scratch_bytes = 4 * groups + 4 * r->ldu + r->ldq;  // per group, lane sums, one token
  } else {  // per-group scales and shifts, one token, (QLayout::offset) lane sums
    *scratch_bytes = 8 * groups + 2 * r->ldq + (ql.offset ? 4 * r->ldu : 0);
  }
}

// One token's input scales and offset shares per flush unit u and 32-bit lane l (units of n32
// lanes): tsx = the scale of the lane's group (d: per group, or per unit without QLayout::lanes)
// x code_scale, and tnegc = -offset x the lane's input sum (lane_sum, per unit and lane) x tsx.
// With QLayout::rows4 a lane stands for its 128-bit block: its share sums the block's four lanes
// (summed in lane_sum in place).
void LaneScales(const QLayout& ql, int64_t units, const float* d, int32_t* lane_sum,
                float code_scale, int offset, float* tsx, float* tnegc) {
  const int64_t n32 = static_cast<int64_t>(hn::Lanes(D32()));
  const int64_t n = units * n32;
  const int64_t per_scale = ql.lanes ? ql.group / 8 : n32;  // the lanes of one group
  for (int64_t l = 0, g = 0; l < n; l += per_scale, ++g) {
    std::fill(tsx + l, tsx + l + per_scale, d[g] * code_scale);  // g: group, or unit (not lanes)
  }
  if (ql.rows4) {
    for (int64_t l = 0; l < n; l += 4) {
      std::fill(lane_sum + l, lane_sum + l + 4, std::accumulate(lane_sum + l, lane_sum + l + 4, 0));
    }
  }
  for (int64_t l = 0; l < n; ++l) tnegc[l] = -static_cast<float>(offset * lane_sum[l]) * tsx[l];
}

// One token's int16 inputs (natural: in column order, ldq of them) in the chunks' lane order
// (QChunkOrder) at dst: a chunk's four vectors hold in lane i its columns 4i, 4i + 2, 4i + 1 and
// 4i + 3 (SpreadBytes' order of the low and the high nibbles). Two rounds of even / odd lanes,
// where a lookup per value took 39 % of the quantizer's samples (perf, AVX2, one token).
void ChunkOrder16(const int16_t* natural, int64_t ldq, int16_t* dst) {
  const D16 d16;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d16));
  for (int64_t c0 = 0; c0 < ldq; c0 += 4 * n) {
    const int16_t* x = natural + c0;
    const auto a = hn::LoadU(d16, x), b = hn::LoadU(d16, x + n);
    const auto c = hn::LoadU(d16, x + 2 * n), d = hn::LoadU(d16, x + 3 * n);
    const auto even_ab = hn::ConcatEven(d16, b, a), odd_ab = hn::ConcatOdd(d16, b, a);
    const auto even_cd = hn::ConcatEven(d16, d, c), odd_cd = hn::ConcatOdd(d16, d, c);
    int16_t* out = dst + c0;
    hn::StoreU(hn::ConcatEven(d16, even_cd, even_ab), d16, out);        // 4i
    hn::StoreU(hn::ConcatOdd(d16, even_cd, even_ab), d16, out + n);     // 4i + 2
    hn::StoreU(hn::ConcatEven(d16, odd_cd, odd_ab), d16, out + 2 * n);  // 4i + 1
    hn::StoreU(hn::ConcatOdd(d16, odd_cd, odd_ab), d16, out + 3 * n);   // 4i + 3
  }
}

// num_tokens rows of x (ldx apart) quantized to int16 into the rows of out, in the layout of ql
// (sizes from QRowSizes); scratch: QRowSizes' bytes, 4-byte aligned.
void QuantizeRows16(const bf16_t* x_rows, int64_t ldx, int64_t num_tokens, const QLayout& ql,
                    float code_scale, int offset, const QuantizedRows& out, void* scratch) {
  const int64_t k = ql.cols;
  const int64_t group = ql.group;
  const int64_t groups = k / group;
  const int64_t chunk = ql.chunk;
  const int64_t n32 = static_cast<int64_t>(hn::Lanes(D32()));
  // A last partial chunk (QLayout::lanes: K a multiple of the group, not of the chunk) is
  // padded with zero inputs of zero scale.
  const int64_t ldq = out.ldq, ldsx = out.ldu;
  const int64_t chunks = ldq / chunk;
  // Per-group scales of one token (QLayout::lanes, QLayout::offset).
  float* sg = static_cast<float*>(scratch);
  int32_t* shifts = reinterpret_cast<int32_t*>(sg + ldq / group);       // per group
  int16_t* natural = reinterpret_cast<int16_t*>(shifts + ldq / group);  // one token, in order
  int32_t* lane_sum = reinterpret_cast<int32_t*>(natural + ldq);        // QLayout::offset
  for (int64_t t = 0; t < num_tokens; ++t) {
    const bf16_t* x = x_rows + t * ldx;
    GroupShifts(x, groups, group, shifts);
    for (int64_t g = groups; g < ldq / group; ++g) shifts[g] = kZeroShift;
    QuantizeGroups(x, groups, group, shifts, natural);
    std::fill(natural + k, natural + ldq, int16_t{0});
    ChunkOrder16(natural, ldq, static_cast<int16_t*>(out.q) + t * ldq);
    float* sx = out.sx + t * ldsx;
    float* scales = ql.lanes || ql.offset ? sg : sx;
    for (int64_t g = 0; g < ldq / group; ++g) {
      const int32_t shift = shifts[g];
      if (shift == kZeroShift) {
        scales[g] = 0.0f;
      } else if (shift == kNaNShift) {
        scales[g] = std::numeric_limits<float>::quiet_NaN();
      } else {
        scales[g] = Pow2(-(shift / 2)) * Pow2(-(shift - shift / 2)) * code_scale;
      }
    }
    if (ql.offset) {
      // The input sum of each flush unit's 32-bit lanes: lane l of a chunk holds its int16 lanes
      // 2l and 2l + 1 of the four vectors, columns 8l .. 8l + 7 (QChunkOrder).
      std::fill(lane_sum, lane_sum + ldsx, 0);
      for (int64_t c0 = 0; c0 < ldq; c0 += chunk) {
        int32_t* unit = lane_sum + (ql.lanes ? c0 / chunk : c0 / group) * n32;
        for (int64_t l = 0; l < n32; ++l) {
          const int16_t* cols = natural + c0 + 8 * l;
          unit[l] += cols[0] + cols[1] + cols[2] + cols[3] + cols[4] + cols[5] + cols[6] + cols[7];
        }
      }
      LaneScales(ql, ldsx / n32, sg, lane_sum, 1.0f, offset, sx, out.negc + t * ldsx);
    } else if (ql.lanes) {
      const int64_t per_chunk = chunk / group;
      for (int64_t c = 0; c < chunks; ++c) {
        for (int64_t l = 0; l < n32; ++l) sx[c * n32 + l] = sg[c * per_chunk + ql.lane_group[l]];
      }
    }
  }
}

// --- 4-bit decode on 8-bit inputs (KernelContextOptions::int8_activations) -----------------
//
// Opt-in: each token's inputs are quantized per scale group to int8 with the scale d = max|x| /
// 127 (Int8Group below: the oracle is reference::Int8Inputs), and the weights are decoded to
// unsigned bytes, code + an offset (E2M1 x 2 + 12, or the int4 code itself, 8 above its value),
// so one byte multiply-add with 16-bit pair sums (vpmaddubsw on x86) takes a vector of byte
// pairs, twice the products per instruction of the 16-bit path. The offset's share, offset x the
// sum of a lane's quantized inputs, is folded into the per-lane scaling (`negc`), so it costs no
// instruction in the tile. A 32-bit lane of a chunk's sums holds its columns 8L .. 8L + 7 (bytes
// 4L .. 4L + 3 of the low and of the high nibbles), all in one group for groups of 8 or more.
//
// Numerics: the integer sums are exact (|code + offset| <= 24, |q| <= 127: a 16-bit pair sum of
// the two nibble halves is at most 4 x 24 x 127 = 12192); the inputs' rounding to int8 is the
// whole difference to the bf16 product (at most d / 2 per input), besides the fp32 additions.

// One group of inputs as int8: q[c] = round(x[c] / d), |q| <= 127, rounded to nearest even;
// returns d (0 for a group of zeros, NaN for one holding an infinity or a NaN, whose q are 0)
// and, where `sum` is non-null, the sum of the q in *sum.
// The group's largest magnitude a is scaled into [0.5, 1) by a power of two (exact) before the
// reciprocal 127 / a, so tiny groups do not overflow it; reference::Int8Inputs does the same
// fp32 operations.
float Int8Group(const bf16_t* x, int64_t n, int8_t* q, int32_t* sum = nullptr) {
  const int32_t bits = MaxMagnitudeBits(x, n);
  if (bits == 0 || bits >= 0x7f800000) {
    std::fill(q, q + n, int8_t{0});
    if (sum != nullptr) *sum = 0;
    return bits == 0 ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  int e;  // a in [2^(e-1), 2^e), e in [-148, 128]
  if (bits >= 0x00800000) {
    e = (bits >> 23) - 126;  // normal: from the exponent field
  } else {
    std::frexp(std::bit_cast<float>(bits), &e);
  }
  const float f1 = Pow2((-e) / 2), f2 = Pow2(-e - (-e) / 2);
  const float m = std::bit_cast<float>(bits) * f1 * f2;  // in [0.5, 1)
  const float inv = 127.0f / m;
  const hn::CappedTag<int32_t, 16> di32;
  const hn::Rebind<float, decltype(di32)> df;
  const hn::Rebind<int8_t, decltype(di32)> di8;
  const int64_t nl = static_cast<int64_t>(hn::Lanes(di32));
  auto total = hn::Zero(di32);
  int64_t c = 0;
  for (; c + nl <= n; c += nl) {
    const auto v = hn::Mul(
        hn::Mul(hn::Mul(hn::BitCast(df, Bf16Bits(di32, x + c)), hn::Set(df, f1)), hn::Set(df, f2)),
        hn::Set(df, inv));
    const auto qi = hn::NearestInt(v);
    total = hn::Add(total, qi);
    hn::StoreU(hn::DemoteTo(di8, qi), di8, q + c);
  }
  int32_t s = c > 0 ? hn::GetLane(hn::SumOfLanes(di32, total)) : 0;
  // The rest one at a time, rounded by nearbyint as reference::Int8Inputs (adding and
  // subtracting 1.5 x 2^23 would be contracted into a fused multiply-add with the product).
  for (; c < n; ++c) {
    const float v = Bf16ToFloat(x[c]) * f1 * f2 * inv;
    q[c] = static_cast<int8_t>(std::nearbyint(v));
    s += q[c];
  }
  if (sum != nullptr) *sum = s;
  return m / 127.0f * Pow2(e / 2) * Pow2(e - e / 2);
}

// The tokens' int8 inputs for the 8-bit decode: q[t * ldq + ...] per chunk its even columns then
// its odd ones (the low and the high nibbles' order), and per token, flush unit (a chunk with
// QLayout::lanes, else a group) and 32-bit lane: sx, the input scale times the codes' scale, and
// negc = -offset x the lane's input sum x sx. With QLayout::rows4 a lane stands for its 128-bit
// block (Q8RowsTile: lane 4b + r holds row r's sum over block b's 32 columns), so its negc sums
// the block's four lanes.
struct Q8Inputs {
  const int8_t* q;
  int64_t ldq;
  const float* sx;
  const float* negc;
  int64_t ldu;
};

// One token's int8 inputs (natural, in column order) into q's chunk order at dst: per chunk its
// even columns, then its odd ones. With lane_sum non-null, adds each 32-bit lane's input sum
// (columns 8l .. 8l + 7 of a chunk) into lane_sum[u * n32 + l] of its flush unit u.
void ChunkOrder8(const QLayout& ql, const int8_t* natural, int64_t ldq, int8_t* dst,
                 int32_t* lane_sum) {
  const int64_t chunk = ql.chunk;
  const int64_t half = chunk / 2;
  const int64_t n32 = static_cast<int64_t>(hn::Lanes(D32()));
  const D8 d8;
  const hn::Repartition<uint64_t, D8> du64;
  const auto bias = hn::Set(d8, uint8_t{0x80});  // q + 128: the sums of 8 as unsigned bytes
  for (int64_t c0 = 0; c0 < ldq; c0 += chunk) {
    const auto v0 = hn::LoadU(d8, reinterpret_cast<const uint8_t*>(natural + c0));
    const auto v1 = hn::LoadU(d8, reinterpret_cast<const uint8_t*>(natural + c0 + half));
    hn::StoreU(hn::ConcatEven(d8, v1, v0), d8, reinterpret_cast<uint8_t*>(dst + c0));
    hn::StoreU(hn::ConcatOdd(d8, v1, v0), d8, reinterpret_cast<uint8_t*>(dst + c0 + half));
    if (lane_sum == nullptr) continue;
    HWY_ALIGN uint64_t sums[2 * kQMaxBytes / 8];  // lane l: columns 8l .. 8l + 7
    hn::Store(hn::SumsOf8(hn::Xor(v0, bias)), du64, sums);
    hn::Store(hn::SumsOf8(hn::Xor(v1, bias)), du64, sums + half / 8);
    const int64_t u = ql.lanes ? c0 / chunk : c0 / ql.group;
    for (int64_t l = 0; l < n32; ++l) {
      lane_sum[u * n32 + l] += static_cast<int32_t>(sums[l]) - 8 * 128;
    }
  }
}

// num_tokens rows of x (ldx apart) quantized to int8 into the rows of out, in the layout of ql
// (sizes from QRowSizes); scratch: QRowSizes' bytes, 4-byte aligned.
void QuantizeRows8(const bf16_t* x_rows, int64_t ldx, int64_t num_tokens, const QLayout& ql,
                   float code_scale, int offset, const QuantizedRows& out, void* scratch) {
  const int64_t k = ql.cols;
  const int64_t group = ql.group;
  const int64_t n32 = static_cast<int64_t>(hn::Lanes(D32()));
  const int64_t ldq = out.ldq, ldu = out.ldu;
  const int64_t units = ldu / n32;
  // Groups of 32 with four rows per vector: a lane's 128-bit block is one group, so every lane
  // of group g (4g .. 4g + 3) takes the group's scale and input sum, which Int8Group adds up.
  const bool per_group = ql.rows4 && ql.lanes;
  float* d = static_cast<float*>(scratch);                          // per group, one token
  int32_t* lane_sum = reinterpret_cast<int32_t*>(d + ldq / group);  // per unit and lane
  int8_t* natural = reinterpret_cast<int8_t*>(lane_sum + ldu);      // one token, in order
  for (int64_t t = 0; t < num_tokens; ++t) {
    const bf16_t* x = x_rows + t * ldx;
    std::fill(lane_sum, lane_sum + ldu, 0);  // per_group: the sum of group g at lane_sum[g]
    for (int64_t g = 0; g < k / group; ++g) {
      d[g] =
          Int8Group(x + g * group, group, natural + g * group, per_group ? lane_sum + g : nullptr);
    }
    for (int64_t g = k / group; g < ldq / group; ++g) d[g] = 0.0f;
    std::fill(natural + k, natural + ldq, int8_t{0});
    ChunkOrder8(ql, natural, ldq, static_cast<int8_t*>(out.q) + t * ldq,
                per_group ? nullptr : lane_sum);
    float* tsx = out.sx + t * ldu;
    float* tnegc = out.negc + t * ldu;
    if (per_group) {
      for (int64_t g = 0; g < ldq / group; ++g) {
        const float s = d[g] * code_scale;
        const float c = -static_cast<float>(offset * lane_sum[g]) * s;
        std::fill(tsx + 4 * g, tsx + 4 * g + 4, s);
        std::fill(tnegc + 4 * g, tnegc + 4 * g + 4, c);
      }
      continue;
    }
    LaneScales(ql, units, d, lane_sum, code_scale, offset, tsx, tnegc);
  }
}

// num_tokens tokens' rows in the layout of ql (k8: int8, else int16) laid out in the work space
// `work` (DotRowsArgs::work): the values, then sx (and with k8 negc); *scratch gets the
// quantizer's scratch after them.
QuantizedRows WorkRows(int64_t num_tokens, const QLayout& ql, bool k8, void* work, void** scratch) {
  QuantizedRows r;
  int64_t scratch_bytes = 0;
  QRowSizes(ql, k8, &r, &scratch_bytes);
  r.q = work;
  r.sx = reinterpret_cast<float*>(static_cast<uint8_t*>(work) +
                                  RoundUp(num_tokens * r.ldq * r.q_bytes, int64_t{64}));
  float* end = r.sx + num_tokens * r.ldu;
  if (r.with_negc) {
    r.negc = end;
    end += num_tokens * r.ldu;
  }
  *scratch = end;
  return r;
}

// Most scale groups of one K block of a decode step (the weight-scale buffers).
constexpr int64_t kQMaxBlockGroups = 256;

// Whether any of the n E8M0 scales at s is 0 (2^-127, a subnormal float) or 255 (NaN), the codes
// that are not their bits shifted into a float's exponent.
inline bool HasSpecialE8M0(const uint8_t* s, int64_t n) {
  const D8 d8;
  const int64_t nl = static_cast<int64_t>(hn::Lanes(d8));
  auto any = hn::Zero(d8);
  int64_t g = 0;
  for (; g + nl <= n; g += nl) {
    const auto v = hn::LoadU(d8, s + g);
    any = hn::Or(
        any, hn::VecFromMask(d8, hn::Or(hn::Eq(v, hn::Zero(d8)), hn::Eq(v, hn::Set(d8, 0xFF)))));
  }
  bool special = !hn::AllFalse(d8, hn::Ne(any, hn::Zero(d8)));
  for (; g < n; ++g) special |= s[g] == 0 || s[g] == 0xFF;
  return special;
}

// The raw weight scale of the formats Q8RowsTile takes (MXFP4's E8M0 bytes, int4's bf16), and
// the shift that makes it a float's bits (E8M0 into the exponent, bf16 on top), exact but for
// E8M0's two special codes (HasSpecialE8M0).
template <Nib K>
using RawScale = std::conditional_t<K == Nib::kMx, uint8_t, uint16_t>;
template <Nib K>
constexpr int kRawScaleShift = K == Nib::kMx ? 23 : 16;

// n raw scales at s (RawScale<K>) as floats into out; `special`: some may be E8M0's codes 0 or
// 255, which take a select per lane.
template <Nib K>
void RawScalesToFloats(const RawScale<K>* s, int64_t n, bool special, float* out) {
  const hn::ScalableTag<uint32_t> du32;
  const hn::Rebind<float, decltype(du32)> df;
  const hn::Rebind<RawScale<K>, decltype(du32)> dt;
  const int64_t nl = static_cast<int64_t>(hn::Lanes(du32));
  int64_t g = 0;
  if constexpr (K == Nib::kMx) {
    for (; special && g + nl <= n; g += nl) {
      const auto e = hn::PromoteTo(du32, hn::LoadU(dt, s + g));
      const auto odd = hn::Or(hn::Eq(e, hn::Zero(du32)), hn::Eq(e, hn::Set(du32, 255)));
      const auto bits =
          hn::Or(hn::ShiftLeft<23>(e), hn::IfThenElseZero(odd, hn::Set(du32, 1u << 22)));
      hn::StoreU(hn::BitCast(df, bits), df, out + g);
    }
  }
  for (; g + nl <= n; g += nl) {
    const auto bits = hn::ShiftLeft<kRawScaleShift<K> >(hn::PromoteTo(du32, hn::LoadU(dt, s + g)));
    hn::StoreU(hn::BitCast(df, bits), df, out + g);
  }
  for (; g < n; ++g) {
    out[g] = K == Nib::kMx ? E8M0ToFloat(static_cast<uint8_t>(s[g]))
                           : std::bit_cast<float>(uint32_t{s[g]} << kRawScaleShift<K>);
  }
}

// The weight scales of groups [g0, g0 + n) of a row as floats (E8M0 exactly: 0 is 2^-127, 255
// NaN; int4: bf16; int4-zp: fp16; nvfp4: E4M3 times the row's global scale).
template <Nib K>
void RowScales(const RowPtrs& row, int64_t g0, int64_t n, float* out) {
  const hn::ScalableTag<uint32_t> du32;
  const hn::Rebind<float, decltype(du32)> df;
  const int64_t nl = static_cast<int64_t>(hn::Lanes(du32));
  int64_t g = 0;
  if constexpr (K == Nib::kMx) {
    RawScalesToFloats<K>(row.s + g0, n, HasSpecialE8M0(row.s + g0, n), out);
  } else if constexpr (K == Nib::kInt4) {
    RawScalesToFloats<K>(reinterpret_cast<const uint16_t*>(row.s) + g0, n, false, out);
  } else if constexpr (K == Nib::kInt4Zp) {
    const hn::Rebind<hwy::float16_t, decltype(df)> df16;
    const hn::CappedTag<float, 1> d1;  // the rest one by one, converted as the vectors are (F16C)
    const hn::Rebind<hwy::float16_t, decltype(d1)> d1h;
    const hwy::float16_t* s = reinterpret_cast<const hwy::float16_t*>(row.s) + g0;
    for (; g + nl <= n; g += nl) hn::StoreU(hn::PromoteTo(df, hn::LoadU(df16, s + g)), df, out + g);
    for (; g < n; ++g) out[g] = hn::GetLane(hn::PromoteTo(d1, hn::LoadU(d1h, s + g)));
  } else {
    const auto global = hn::Set(df, row.global);
    for (; g + nl <= n; g += nl) {
      hn::StoreU(hn::Mul(E4M3ToF32(df, row.s + g0 + g), global), df, out + g);
    }
    for (; g < n; ++g) out[g] = Fp8E4M3ToFloat(row.s[g0 + g]) * row.global;
  }
}

// n zero points (bytes) at z as floats into out.
inline void ZeroPointsToFloats(const uint8_t* z, int64_t n, float* out) {
  const DQF df;
  const hn::Rebind<uint8_t, DQF> du8;
  const hn::Rebind<int32_t, DQF> di32;
  const int64_t nl = static_cast<int64_t>(hn::Lanes(df));
  int64_t g = 0;
  for (; g + nl <= n; g += nl) {
    hn::StoreU(hn::ConvertTo(df, hn::PromoteTo(di32, hn::LoadU(du8, z + g))), df, out + g);
  }
  for (; g < n; ++g) out[g] = static_cast<float>(z[g]);
}

// E2M1 codes times 2 plus 12, unsigned (the 8-bit decode's offset lookup).
alignas(16) constexpr uint8_t kE2M1x2Plus12[16] = {12, 13, 14, 15, 16, 18, 20, 24,
                                                   12, 11, 10, 9,  8,  6,  4,  0};

// The 8-bit decode's offset: code + offset is what the lookup gives (int4: the code itself).
template <Nib K>
constexpr int Q8Offset() {
  return K == Nib::kInt4 ? 8 : 12;
}

using DI8 = hn::Repartition<int8_t, D8>;

// u[2i] * x[2i] + u[2i + 1] * x[2i + 1] in 16-bit lane i (u unsigned, x signed bytes; the sums
// here never saturate): vpmaddubsw on x86, even and odd bytes widened elsewhere.
HWY_INLINE V16 MulBytePairs(hn::Vec<D8> u, hn::Vec<DI8> x) {
#if HWY_TARGET == HWY_AVX2
  return V16{_mm256_maddubs_epi16(u.raw, x.raw)};
#elif HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  return V16{_mm512_maddubs_epi16(u.raw, x.raw)};
#else
  const D16 d16;
  const hn::Repartition<uint16_t, D8> du16;
  const auto uw = hn::BitCast(du16, u);
  const auto xw = hn::BitCast(d16, x);
  const auto u_even = hn::BitCast(d16, hn::And(uw, hn::Set(du16, uint16_t{0xFF})));
  const auto u_odd = hn::BitCast(d16, hn::ShiftRight<8>(uw));
  const auto x_even = hn::ShiftRight<8>(hn::ShiftLeft<8>(xw));
  return hn::Add(hn::Mul(u_even, x_even), hn::Mul(u_odd, hn::ShiftRight<8>(xw)));
#endif
}

// One row's chunk (its decoded low and high nibbles) times one token's inputs of the chunk (x[0]
// the even columns, x[1] the odd ones): 16-bit sums of four products per lane.
HWY_INLINE V16 ChunkPairSums(hn::Vec<D8> lo, hn::Vec<D8> hi, const hn::Vec<DI8> (&x)[2]) {
  return hn::Add(MulBytePairs(lo, x[0]), MulBytePairs(hi, x[1]));
}

// Whether this target takes QLayout::vnni: AVX2 and AVX-512, whose backends avx2-vnni and
// avx512-vnni run only where CPUID lists AVX-VNNI or AVX512_VNNI. The instructions are written in
// asm (on AVX2 in their VEX form, "{vex}"): their intrinsics need a target attribute Highway's
// code of these targets does not carry, and asm is not checked against the function's target.
// VnniRaw: the vector type, unaligned, for a memory operand.
#undef MOESHARD_VNNI_ASM
#if HWY_TARGET == HWY_AVX2
constexpr bool kVnniTarget = true;
#define MOESHARD_VNNI_ASM(insn) "%{vex%} " insn " %2, %1, %0"
using VnniRaw = __m256i_u;
#elif HWY_TARGET == HWY_AVX3
constexpr bool kVnniTarget = true;
#define MOESHARD_VNNI_ASM(insn) insn " %2, %1, %0"
using VnniRaw = __m512i_u;
#else
constexpr bool kVnniTarget = false;
#endif

// s0 + w[2l] x[2l] + w[2l + 1] x[2l + 1] per 32-bit lane l (s1 as ReorderWidenMulAccumulate's;
// x read at xp): vpmaddwd and an add, or one vpdpwssd (kVnni). Both sum modulo 2^32, so they
// give the same bits.
template <bool kVnni>
HWY_INLINE V32 MulAddPairs(V16 w, const int16_t* xp, V32 s0, V32& s1) {
#ifdef MOESHARD_VNNI_ASM
  if constexpr (kVnni) {
    asm(MOESHARD_VNNI_ASM("vpdpwssd")
        : "+v"(s0.raw)
        : "v"(w.raw), "vm"(*reinterpret_cast<const VnniRaw*>(xp)));
    return s0;
  }
#else
  static_assert(!kVnni, "no VNNI products on this target");
#endif
  return hn::ReorderWidenMulAccumulate(D32(), w, hn::LoadU(D16(), xp), s0, s1);
}

// s0 + the four byte products lo[4l + b] x[0][4l + b] + hi[4l + b] x[1][4l + b] (b = 0 .. 3) per
// 32-bit lane l: ChunkPairSums widened by a vpmaddwd by ones and added, or two vpdpbusd (kVnni;
// the same sums, since ChunkPairSums' 16-bit sums never saturate).
template <bool kVnni>
HWY_INLINE V32 MulAddQuads(hn::Vec<D8> lo, hn::Vec<D8> hi, const hn::Vec<DI8> (&x)[2], V32 s0,
                           V32& s1) {
#ifdef MOESHARD_VNNI_ASM
  if constexpr (kVnni) {
    asm(MOESHARD_VNNI_ASM("vpdpbusd") : "+v"(s0.raw) : "v"(lo.raw), "v"(x[0].raw));
    asm(MOESHARD_VNNI_ASM("vpdpbusd") : "+v"(s0.raw) : "v"(hi.raw), "v"(x[1].raw));
    return s0;
  }
#else
  static_assert(!kVnni, "no VNNI products on this target");
#endif
  return hn::ReorderWidenMulAccumulate(D32(), ChunkPairSums(lo, hi, x), hn::Set(D16(), 1), s0, s1);
}

// fn(std::true_type()) where the layout asks for VNNI products (QLayout::vnni) and this target
// has them, else fn(std::false_type()).
template <typename Fn>
HWY_INLINE void WithVnni(const QLayout& ql, const Fn& fn) {
  if constexpr (kVnniTarget) {
    if (ql.vnni) return fn(std::true_type());
  }
  fn(std::false_type());
}

// The chunk at byte p as unsigned bytes code + offset: its low nibbles (even columns) and its
// high nibbles (odd columns).
template <Nib K>
HWY_INLINE void Q8DecodeChunk(const uint8_t* p, hn::Vec<D8>* lo, hn::Vec<D8>* hi) {
  const D8 d8;
  const hn::Repartition<uint16_t, D8> du16;
  const auto mask = hn::Set(d8, 0x0F);
  const auto bytes = hn::LoadU(d8, p);
  *lo = hn::And(bytes, mask);
  *hi = hn::And(hn::BitCast(d8, hn::ShiftRight<4>(hn::BitCast(du16, bytes))), mask);
  if constexpr (K != Nib::kInt4) {
    const auto table = hn::LoadDup128(d8, kE2M1x2Plus12);
    *lo = hn::TableLookupBytes(table, *lo);
    *hi = hn::TableLookupBytes(table, *hi);
  }
}

// The last, partial chunk (from column c of `cols`) of each of nr rows, zero-padded into pad.
inline void PadLastChunk(const RowPtrs* row_ptr, int nr, int64_t c, int64_t cols,
                         uint8_t (*pad)[kQMaxBytes]) {
  for (int j = 0; j < nr; ++j) {
    std::memset(pad[j], 0, kQMaxBytes);
    std::memcpy(pad[j], row_ptr[j].w + c / 2, static_cast<size_t>((cols - c) / 2));
  }
}

// out[i * ldo + j] (+)= the sum of total[i][j]'s lanes.
template <int MR, int NR>
HWY_INLINE void StoreTotals(const hn::Vec<DQF> (&total)[MR][NR], float* out, int64_t ldo,
                            bool accumulate) {
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      const float s = hn::GetLane(hn::SumOfLanes(DQF(), total[i][j]));
      float& o = out[i * ldo + j];
      o = accumulate ? o + s : s;
    }
  }
}

// Chunks [c0, c0 + nc) (their column index / chunk) of tokens [t0, t0 + MR) times
// rows[0, NR): out[i * ldo + j] (+)= the partial dot products. sw[j] holds row j's weight scales
// from group c0 * chunk / group on (with kLanes at least N32 - 1 floats past the last), zw[j]
// its zero points as floats (int4-zp, the same groups and padding). On 16-bit inputs (QInputs)
// or 8-bit ones (Q8Inputs: no zero points).
template <Nib K, bool kLanes, bool kVnni, int MR, int NR, typename In>
void QTile(const QLayout& ql, const In& xq, const RowPtrs* row_ptr, const float* const* sw,
           const float* const* zw, int64_t t0, int64_t c0, int64_t nc, float* out, int64_t ldo,
           bool accumulate) {
  constexpr bool k8 = std::is_same_v<In, Q8Inputs>;
  const D8 d8;
  const D16 d16;
  const D32 d32;
  const DQF dqf;
  const int64_t n16 = static_cast<int64_t>(hn::Lanes(d16));
  const int64_t n32 = static_cast<int64_t>(hn::Lanes(d32));
  const int64_t chunk = ql.chunk;
  // Chunks per flush: one (kLanes), or a group's.
  const int64_t per_flush = kLanes ? 1 : ql.group / chunk;
  const int64_t groups_per_chunk = kLanes ? chunk / ql.group : 0;
  using Idx = decltype(hn::IndicesFromVec(dqf, hn::Zero(hn::RebindToSigned<DQF>())));
  Idx lane_table{};
  if constexpr (kLanes) {
    lane_table = hn::IndicesFromVec(dqf, hn::LoadU(hn::RebindToSigned<DQF>(), ql.lane_group));
  }
  hn::Vec<DQF> total[MR][NR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) total[i][j] = hn::Zero(dqf);
  }
  const int64_t per_line = std::max<int64_t>(1, 128 / chunk);  // chunks per 64-byte line
  int64_t since = 0;
  for (int64_t f = 0; f < nc; f += per_flush) {
    V32 s0[MR][NR], s1[MR][NR];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) s0[i][j] = s1[i][j] = hn::Zero(d32);
    }
    for (int64_t ci = f; ci < f + per_flush; ++ci) {
      const int64_t c = (c0 + ci) * chunk;
      if (since-- == 0) {
#pragma GCC unroll 16
        for (int j = 0; j < NR; ++j) hwy::Prefetch(row_ptr[j].w + c / 2 + kPrefetchBytes);
        since = per_line - 1;
      }
      // A last partial chunk is decoded from a zero-padded copy (its padded columns meet zero
      // inputs).
      const bool partial = c + chunk > ql.cols;
      HWY_ALIGN uint8_t pad[NR][kQMaxBytes];
      if (HWY_UNLIKELY(partial)) PadLastChunk(row_ptr, NR, c, ql.cols, pad);
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) {
        const uint8_t* wp = HWY_UNLIKELY(partial) ? pad[j] : row_ptr[j].w + c / 2;
        if constexpr (k8) {
          hn::Vec<D8> lo, hi;
          Q8DecodeChunk<K>(wp, &lo, &hi);
#pragma GCC unroll 16
          for (int i = 0; i < MR; ++i) {
            const int8_t* x = xq.q + (t0 + i) * xq.ldq + c;
            const hn::Vec<DI8> xv[2] = {hn::LoadU(DI8(), x), hn::LoadU(DI8(), x + hn::Lanes(d8))};
            s0[i][j] = MulAddQuads<kVnni>(lo, hi, xv, s0[i][j], s1[i][j]);
          }
        } else {
          V16 w[4];
          QDecodeChunk<K>(wp, w);
#pragma GCC unroll 16
          for (int i = 0; i < MR; ++i) {
            const int16_t* x = xq.q + (t0 + i) * xq.ldq + c;
#pragma GCC unroll 4
            for (int v = 0; v < 4; ++v) {
              s0[i][j] = MulAddPairs<kVnni>(w[v], x + v * n16, s0[i][j], s1[i][j]);
            }
          }
        }
      }
    }
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      hn::Vec<DQF> wscale, zero;  // zero: int4-zp's zero points, per lane
      float wscalar = 0.0f;
      if constexpr (kLanes) {
        wscale = hn::TableLookupLanes(hn::LoadU(dqf, sw[j] + f * groups_per_chunk), lane_table);
        if constexpr (K == Nib::kInt4Zp) {
          zero = hn::TableLookupLanes(hn::LoadU(dqf, zw[j] + f * groups_per_chunk), lane_table);
        }
      } else {
        wscalar = sw[j][f / per_flush];
        if constexpr (K == Nib::kInt4Zp) zero = hn::Set(dqf, zw[j][f / per_flush]);
      }
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const auto sum = hn::ConvertTo(dqf, hn::RearrangeToOddPlusEven(s0[i][j], s1[i][j]));
        // Per flush unit and lane: the input scale, the offset's share (QLayout::offset; int4-zp:
        // times the row's zero point).
        if constexpr (k8 || kOffsetCodes<K>) {
          const int64_t at = (t0 + i) * xq.ldu + (c0 + f) / per_flush * n32;
          auto negc = hn::LoadU(dqf, xq.negc + at);
          if constexpr (K == Nib::kInt4Zp) negc = hn::Mul(negc, zero);
          const auto scaled = hn::MulAdd(sum, hn::LoadU(dqf, xq.sx + at), negc);
          if constexpr (kLanes) {
            total[i][j] = hn::MulAdd(scaled, wscale, total[i][j]);
          } else {
            total[i][j] = hn::MulAdd(scaled, hn::Set(dqf, wscalar), total[i][j]);
          }
        } else if constexpr (kLanes) {
          const float* sx = xq.sx + (t0 + i) * xq.ldu + (c0 + f) * n32;
          total[i][j] = hn::MulAdd(hn::Mul(sum, hn::LoadU(dqf, sx)), wscale, total[i][j]);
        } else {
          const float sx = xq.sx[(t0 + i) * xq.ldu + (c0 + f) / per_flush];
          total[i][j] = hn::MulAdd(sum, hn::Set(dqf, sx * wscalar), total[i][j]);
        }
      }
    }
  }
  StoreTotals(total, out, ldo, accumulate);
}

// fn(c0, nc, g0, ng) for each K block of a decode step: chunks [c0, c0 + nc) of at most cc,
// and their whole scale groups [g0, g0 + ng).
template <typename Fn>
HWY_INLINE void ForEachKBlock(const DotRowsArgs& a, const QLayout& ql, int64_t cc, const Fn& fn) {
  const int64_t chunks = CeilDiv(a.w->cols, ql.chunk);
  const int64_t groups = a.w->cols / ql.group;
  for (int64_t c0 = 0; c0 < chunks; c0 += cc) {
    const int64_t nc = std::min(cc, chunks - c0);
    const int64_t g0 = c0 * ql.chunk / ql.group;
    fn(c0, nc, g0, std::min(nc * ql.chunk / ql.group, groups - g0));
  }
}

template <Nib K, bool kLanes, int NR, typename In>
void QDecodeStep(const NibbleDec<K>& dec, const DotRowsArgs& a, const QLayout& ql, const In& xq,
                 const int64_t* rows, int64_t cc, float* tile) {
  RowPtrs row_ptr[NR];
  SetRowPtrs(dec, rows, NR, row_ptr);
  HWY_ALIGN float sw[NR][kQMaxBlockGroups + kQMaxLanes32];
  HWY_ALIGN float zw[K == Nib::kInt4Zp ? NR : 1][kQMaxBlockGroups + kQMaxLanes32];
  const float* swp[NR];
  const float* zwp[NR];
  for (int j = 0; j < NR; ++j) {
    swp[j] = sw[j];
    zwp[j] = zw[K == Nib::kInt4Zp ? j : 0];
  }
  ForEachKBlock(a, ql, cc, [&](int64_t c0, int64_t nc, int64_t g0, int64_t ng) {
    for (int j = 0; j < NR; ++j) {
      RowScales<K>(row_ptr[j], g0, ng, sw[j]);
      std::fill(sw[j] + ng, sw[j] + ng + kQMaxLanes32, 0.0f);
      if constexpr (K == Nib::kInt4Zp) {
        ZeroPointsToFloats(row_ptr[j].z + g0, ng, zw[j]);
        std::fill(zw[j] + ng, zw[j] + ng + kQMaxLanes32, 0.0f);
      }
    }
    WithVnni(ql, [&](auto vnni) {
      constexpr bool kVnni = decltype(vnni)::value;
      int64_t t = 0;
      // Two tokens share each decoded chunk (eight integer sums beside the decoded codes).
      for (; t + 2 <= a.num_tokens; t += 2) {
        QTile<K, kLanes, kVnni, 2, NR>(ql, xq, row_ptr, swp, zwp, t, c0, nc, tile + t * kStreams,
                                       kStreams, c0 > 0);
      }
      for (; t < a.num_tokens; ++t) {
        QTile<K, kLanes, kVnni, 1, NR>(ql, xq, row_ptr, swp, zwp, t, c0, nc, tile + t * kStreams,
                                       kStreams, c0 > 0);
      }
    });
  });
}

// --- 8-bit decode, four rows per vector ------------------------------------------------------
//
// Where each 32 columns of a chunk lie in one scale group (groups of 32 within a chunk, or groups
// of whole chunks), the four row streams' integer sums are added into one vector before they are
// converted and scaled: lane 4b + r of a 128-bit block b holds row r's sum over the block's 32
// columns. One transpose-add per block (blockwise interleaves, the same on every target) takes 9
// instructions where the four rows' own conversions, scalings and scale lookups took about 30.
// The weight scales come transposed to match (TransposedScales), the input scales and the offset's
// share per block (QLayout::rows4 in QuantizeRows8).

// SumRowsPerBlock's last step, from rows (0, 1) and (2, 3) paired: ab = [a0 + a2, b0 + b2,
// a1 + a3, b1 + b3] per block, cd likewise.
HWY_INLINE V32 SumRowPairsPerBlock(V32 ab, V32 cd) {
  const hn::Repartition<int64_t, D32> d64;
  const auto ab64 = hn::BitCast(d64, ab), cd64 = hn::BitCast(d64, cd);
  return hn::Add(hn::BitCast(D32(), hn::InterleaveLower(d64, ab64, cd64)),
                 hn::BitCast(D32(), hn::InterleaveUpper(d64, ab64, cd64)));
}

// [a0 + a2, b0 + b2, a1 + a3, b1 + b3] per block: SumRowsPerBlock's first step, for two rows.
HWY_INLINE V32 PairRowsPerBlock(V32 a, V32 b) {
  const D32 d32;
  return hn::Add(hn::InterleaveLower(d32, a, b), hn::InterleaveUpper(d32, a, b));
}

// Lane 4b + r: the sum of vector r's four lanes of block b (r = 0 .. 3 for a, b, c, d).
HWY_INLINE V32 SumRowsPerBlock(V32 a, V32 b, V32 c, V32 d) {
  return SumRowPairsPerBlock(PairRowsPerBlock(a, b), PairRowsPerBlock(c, d));
}

// Two rows' 16-bit pair sums of one chunk (QLayout::lanes: a flush per chunk) widened together:
// per block, their lanes interleaved in pairs and added ([u0 + u4, u1 + u5, v0 + v4, v1 + v5,
// ...]: at most 2 x 12192 in magnitude, no overflow), then one pairwise widening gives
// [u0 + u2, v0 + v2, u1 + u3, v1 + v3] in 32-bit lanes (SumRowsPerBlock's first step, with one
// widening per two rows instead of one per row and one interleave fewer).
HWY_INLINE V32 WidenRowPairs(V16 u, V16 v) {
  const D16 d16;
  const D32 d32;
  const auto u32 = hn::BitCast(d32, u), v32 = hn::BitCast(d32, v);
  const auto uv = hn::Add(hn::BitCast(d16, hn::InterleaveLower(d32, u32, v32)),
                          hn::BitCast(d16, hn::InterleaveUpper(d32, u32, v32)));
  V32 odd = hn::Zero(d32);
  const V32 even =
      hn::ReorderWidenMulAccumulate(d32, uv, hn::Set(d16, int16_t{1}), hn::Zero(d32), odd);
  return hn::RearrangeToOddPlusEven(even, odd);
}

// Whether this target's vectors are whole 128-bit blocks of 32-bit sums (SumRowsPerBlock).
bool RowsPerBlock() { return hn::Lanes(D32()) % 4 == 0; }

// The formats Q8RowsTile takes: those whose groups can be 32 or more (NVFP4's are 16).
template <Nib K>
constexpr bool Rows4Format() {
  return K == Nib::kMx || K == Nib::kInt4;
}

// raw[4g + r] = s[r][g] for g < ng: four rows' scales (bytes or 16-bit) transposed, 16 bytes of
// each row per step, then 8 (two interleaves: of single scales, then of pairs). Returns, for
// bytes, whether any is 0 or 0xFF (E8M0's special codes, HasSpecialE8M0), looked for in the
// loaded rows (a vector load of the transposed bytes just stored would span two stores, which
// store-to-load forwarding cannot serve).
template <typename T>
bool TransposeRawScales(const T* const* s, int64_t ng, T* raw) {
  int64_t g = 0;
  bool special = false;
  if constexpr (HWY_TARGET != HWY_SCALAR) {
    const auto step = [&](auto d) {
      const hn::Repartition<hwy::MakeWide<T>, decltype(d)> d2;
      const int64_t n = static_cast<int64_t>(hn::Lanes(d));
      auto lo = hn::Set(d, T{1}), hi = hn::Zero(d);  // min(1, codes), max(0, codes)
      for (; g + n <= ng; g += n) {
        const auto r0 = hn::LoadU(d, s[0] + g), r1 = hn::LoadU(d, s[1] + g);
        const auto r2 = hn::LoadU(d, s[2] + g), r3 = hn::LoadU(d, s[3] + g);
        if constexpr (sizeof(T) == 1) {
          lo = hn::Min(lo, hn::Min(hn::Min(r0, r1), hn::Min(r2, r3)));
          hi = hn::Max(hi, hn::Max(hn::Max(r0, r1), hn::Max(r2, r3)));
        }
        const auto a = hn::BitCast(d2, hn::InterleaveLower(d, r0, r1));  // (r0, r1) pairs
        const auto b = hn::BitCast(d2, hn::InterleaveUpper(d, r0, r1));
        const auto c = hn::BitCast(d2, hn::InterleaveLower(d, r2, r3));  // (r2, r3) pairs
        const auto e = hn::BitCast(d2, hn::InterleaveUpper(d, r2, r3));
        T* out = raw + 4 * g;
        hn::StoreU(hn::BitCast(d, hn::InterleaveLower(d2, a, c)), d, out);
        hn::StoreU(hn::BitCast(d, hn::InterleaveUpper(d2, a, c)), d, out + n);
        hn::StoreU(hn::BitCast(d, hn::InterleaveLower(d2, b, e)), d, out + 2 * n);
        hn::StoreU(hn::BitCast(d, hn::InterleaveUpper(d2, b, e)), d, out + 3 * n);
      }
      if constexpr (sizeof(T) == 1) {
        special |=
            !hn::AllFalse(d, hn::Or(hn::Eq(lo, hn::Zero(d)), hn::Eq(hi, hn::Set(d, T{0xFF}))));
      }
    };
    step(hn::Full128<T>());
    step(hn::Full64<T>());
  }
  for (; g < ng; ++g) {
    for (int r = 0; r < 4; ++r) {
      raw[4 * g + r] = s[r][g];
      if constexpr (sizeof(T) == 1) special |= s[r][g] == 0 || s[r][g] == 0xFF;
    }
  }
  return special;
}

// TransposedScales' output: floats, or raw scales of either kind (each read as it was written).
union Rows4Scales {
  float f[4 * kQMaxBlockGroups + kQMaxLanes32];
  uint8_t u8[4 * kQMaxBlockGroups + kQMaxLanes32];
  uint16_t u16[4 * kQMaxBlockGroups + kQMaxLanes32];
};

template <Nib K>
RawScale<K>* RawScales(Rows4Scales& ws) {
  if constexpr (K == Nib::kMx) {
    return ws.u8;
  } else {
    return ws.u16;
  }
}

// The four rows' weight scales of groups [g0, g0 + ng), transposed (lane 4g + r: row r's scale of
// group g0 + g), then kQMaxLanes32 zeros, into ws: as raw scales (RawScale<K>) when `raw_ok` and
// they are all a float's high bits, which returns true; else as floats.
template <Nib K>
bool TransposedScales(const RowPtrs* row, int64_t g0, int64_t ng, bool raw_ok, Rows4Scales& ws) {
  static_assert(Rows4Format<K>());
  using T = RawScale<K>;
  const T* s[4];
  for (int j = 0; j < 4; ++j) s[j] = reinterpret_cast<const T*>(row[j].s) + g0;
  const int64_t n = 4 * ng;
  HWY_ALIGN T local[4 * kQMaxBlockGroups];
  T* raw = raw_ok ? RawScales<K>(ws) : local;
  const bool special = TransposeRawScales(s, ng, raw);
  if (raw_ok) {
    if (!special) {
      std::fill(raw + n, raw + n + kQMaxLanes32, T{0});
      return true;
    }
    TransposeRawScales(s, ng, local);  // rare: ws's bytes are about to hold floats
  }
  RawScalesToFloats<K>(local, n, special, ws.f);
  std::fill(ws.f + n, ws.f + n + kQMaxLanes32, 0.0f);
  return false;
}

// The weight scales of Q8RowsTile's flush at chunk f (per_flush chunks a flush), from
// TransposedScales' ws: with kRaw raw scales made floats here (QLayout::lanes only), else floats.
template <Nib K, bool kLanes, bool kRaw>
HWY_INLINE hn::Vec<DQF> FlushScales(const void* ws, int64_t f, int64_t per_flush) {
  const DQF dqf;
  const int64_t n32 = static_cast<int64_t>(hn::Lanes(dqf));
  if constexpr (kRaw) {
    static_assert(kLanes);
    const hn::RebindToUnsigned<DQF> du32;
    const hn::Rebind<RawScale<K>, decltype(du32)> dt;
    const RawScale<K>* raw = static_cast<const RawScale<K>*>(ws) + f * n32;
    return hn::BitCast(dqf,
                       hn::ShiftLeft<kRawScaleShift<K> >(hn::PromoteTo(du32, hn::LoadU(dt, raw))));
  } else {
    const float* wf = static_cast<const float*>(ws);
    return kLanes ? hn::LoadU(dqf, wf + f * n32) : hn::LoadDup128(dqf, wf + 4 * (f / per_flush));
  }
}

// out[i * kStreams + r] (+)= the sum of row r's lanes of total[i] (lanes r, r + 4, ...: four rows'
// sums per vector, QLayout::rows4).
template <int MR>
HWY_INLINE void StoreRows4Totals(const hn::Vec<DQF> (&total)[MR], float* out, bool accumulate) {
  const DQF dqf;
  const int64_t n32 = static_cast<int64_t>(hn::Lanes(dqf));
  HWY_ALIGN float lanes[kQMaxLanes32];
  for (int i = 0; i < MR; ++i) {
    hn::Store(total[i], dqf, lanes);
    for (int r = 0; r < 4; ++r) {
      float s = 0.0f;
      for (int64_t l = r; l < n32; l += 4) s += lanes[l];
      float& o = out[i * kStreams + r];
      o = accumulate ? o + s : s;
    }
  }
}

// The four rows' bytes of chunks [c0, c0 + nc), in order (Q8RowsTile, Q16RowsTile): each row read
// kPrefetchBytes ahead once per 64-byte line, a last partial chunk from a zero-padded copy (its
// padded columns meet zero inputs). The row pointers are copied in (row_ptr may alias pad).
struct FourRowChunks {
  const uint8_t* w[4] = {};
  int64_t step;      // bytes per chunk
  int64_t per_line;  // chunks per 64-byte line
  int64_t partial;   // the partial chunk's index (nc where none)
  int64_t since = 0;
  FourRowChunks(const QLayout& ql, const RowPtrs* row_ptr, int64_t c0, int64_t nc)
      : step(ql.chunk / 2),
        per_line(std::max<int64_t>(1, 128 / ql.chunk)),
        partial(c0 * ql.chunk + nc * ql.chunk > ql.cols ? nc - 1 : nc) {
    for (int j = 0; j < 4; ++j) w[j] = row_ptr[j].w + c0 * step;
  }
  // p[j] = row j's bytes of chunk f (the next one; from c0), padded into pad where partial.
  HWY_INLINE void Next(const QLayout& ql, const RowPtrs* row_ptr, int64_t c0, int64_t f,
                       uint8_t (*pad)[kQMaxBytes], const uint8_t* (&p)[4]) {
    if (since-- == 0) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) hwy::Prefetch(w[j] + kPrefetchBytes);
      since = per_line - 1;
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) p[j] = w[j];
    if (HWY_UNLIKELY(f == partial)) {
      PadLastChunk(row_ptr, 4, (c0 + f) * ql.chunk, ql.cols, pad);
      for (int j = 0; j < 4; ++j) p[j] = pad[j];
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) w[j] += step;
  }
};

// QTile on 8-bit inputs for four rows (QLayout::rows4): chunks [c0, c0 + nc) of tokens
// [t0, t0 + MR); out[i * kStreams + r] (+)= the partial dot products; ws the four rows' weight
// scales from group c0 * chunk / group on, transposed (TransposedScales).
template <Nib K, bool kLanes, bool kVnni, int MR, bool kRaw>
void Q8RowsTile(const QLayout& ql, const Q8Inputs& xq, const RowPtrs* row_ptr, const void* ws,
                int64_t t0, int64_t c0, int64_t nc, float* out, bool accumulate) {
  const D8 d8;
  const DI8 di8;
  const D32 d32;
  const DQF dqf;
  const int64_t n32 = static_cast<int64_t>(hn::Lanes(d32));
  const int64_t chunk = ql.chunk;
  const int64_t per_flush = kLanes ? 1 : ql.group / chunk;  // chunks per flush
  // Rows widened in pairs (WidenRowPairs) where a flush takes one chunk, unless VNNI products
  // widen every row as they sum.
  constexpr bool kPairs = kLanes && !kVnni;
  const int64_t ldq = xq.ldq, ldu = xq.ldu;
  const int8_t* q = xq.q + t0 * ldq;  // token t0's inputs
  const float* sx = xq.sx + t0 * ldu;
  const float* negc = xq.negc + t0 * ldu;
  hn::Vec<DQF> total[MR];
  for (int i = 0; i < MR; ++i) total[i] = hn::Zero(dqf);
  FourRowChunks rows4(ql, row_ptr, c0, nc);
  const int8_t* xc = q + c0 * chunk;  // the tokens' inputs of the next chunk
  for (int64_t f = 0; f < nc; f += per_flush) {
    V32 s0[MR][4], s1[MR][4];
    V32 pairs[MR][2];  // QLayout::lanes: rows (0, 1) and (2, 3) of the flush's one chunk
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) s0[i][j] = s1[i][j] = hn::Zero(d32);
    }
    for (int64_t ci = f; ci < f + per_flush; ++ci, xc += chunk) {
      const uint8_t* p[4];
      HWY_ALIGN uint8_t pad[4][kQMaxBytes];
      rows4.Next(ql, row_ptr, c0, ci, pad, p);
      hn::Vec<DI8> x[MR][2];
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        x[i][0] = hn::LoadU(di8, xc + i * ldq);
        x[i][1] = hn::LoadU(di8, xc + i * ldq + hn::Lanes(d8));
      }
      if constexpr (kPairs) {
#pragma GCC unroll 2
        for (int jp = 0; jp < 2; ++jp) {
          hn::Vec<D8> lo0, hi0, lo1, hi1;
          Q8DecodeChunk<K>(p[2 * jp], &lo0, &hi0);
          Q8DecodeChunk<K>(p[2 * jp + 1], &lo1, &hi1);
#pragma GCC unroll 16
          for (int i = 0; i < MR; ++i) {
            pairs[i][jp] =
                WidenRowPairs(ChunkPairSums(lo0, hi0, x[i]), ChunkPairSums(lo1, hi1, x[i]));
          }
        }
        continue;
      }
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        hn::Vec<D8> lo, hi;
        Q8DecodeChunk<K>(p[j], &lo, &hi);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i)
          s0[i][j] = MulAddQuads<kVnni>(lo, hi, x[i], s0[i][j], s1[i][j]);
      }
    }
    const int64_t unit = (c0 + f) / per_flush;
    const auto wscale = FlushScales<K, kLanes, kRaw>(ws, f, per_flush);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      V32 block;
      if constexpr (kPairs) {
        block = SumRowPairsPerBlock(pairs[i][0], pairs[i][1]);
      } else {
        V32 rows[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) rows[j] = hn::RearrangeToOddPlusEven(s0[i][j], s1[i][j]);
        block = SumRowsPerBlock(rows[0], rows[1], rows[2], rows[3]);
      }
      const auto sum = hn::ConvertTo(dqf, block);
      const int64_t at = i * ldu + unit * n32;
      const auto scaled = hn::MulAdd(sum, hn::LoadU(dqf, sx + at), hn::LoadU(dqf, negc + at));
      total[i] = hn::MulAdd(scaled, wscale, total[i]);
    }
  }
  StoreRows4Totals(total, out, accumulate);
}

// One row's products with MR tokens' 16-bit inputs over the chunk at byte p (inputs at xc, a
// token every ldq), summed per 32-bit lane into s[i].
template <Nib K, bool kVnni, int MR>
HWY_INLINE void ChunkRowSums(const uint8_t* p, const int16_t* xc, int64_t ldq, V32 (&s)[MR]) {
  const D16 d16;
  const int64_t n16 = static_cast<int64_t>(hn::Lanes(d16));
  V16 wv[4];
  QDecodeChunk<K>(p, wv);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    const int16_t* x = MR == 1 ? xc : Opaque(xc + i * ldq);  // two tokens: from memory
    V32 s0 = hn::Zero(D32()), s1 = hn::Zero(D32());  // s1: NEON's odd products (x86: unused)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) s0 = MulAddPairs<kVnni>(wv[v], x + v * n16, s0, s1);
    s[i] = hn::RearrangeToOddPlusEven(s0, s1);
  }
}

// QTile on 16-bit inputs for four rows (QLayout::rows4: groups of 32, several in a chunk, so a
// flush per chunk): chunks [c0, c0 + nc) of tokens [t0, t0 + MR); out[i * kStreams + r] (+)= the
// partial dot products; ws as for Q8RowsTile. A 32-bit lane of a block sums at most 32 products
// (4 lanes of 8), within kQMaxGroup's bound. Per token and chunk the flush is one transpose-add,
// one conversion and two multiplies, where QTile's four rows took four of each, four scale
// lookups and (AVX2) their sums spilled. Rows 0 and 1 are paired as soon as both are summed, so
// at most three sums per token are live (with all four kept, AVX2 spilled them every chunk).
template <Nib K, bool kVnni, int MR, bool kRaw>
void Q16RowsTile(const QLayout& ql, const QInputs& xq, const RowPtrs* row_ptr, const void* ws,
                 int64_t t0, int64_t c0, int64_t nc, float* out, bool accumulate) {
  const D32 d32;
  const DQF dqf;
  const int64_t n32 = static_cast<int64_t>(hn::Lanes(d32));
  const int64_t chunk = ql.chunk;
  const int64_t ldq = xq.ldq, ldsx = xq.ldu;
  const int64_t x0 = t0 * ldsx + c0 * n32;  // token t0's scales of chunk c0 in sx (and negc)
  hn::Vec<DQF> total[MR];
  for (int i = 0; i < MR; ++i) total[i] = hn::Zero(dqf);
  FourRowChunks rows4(ql, row_ptr, c0, nc);
  const int16_t* xc = xq.q + t0 * ldq + c0 * chunk;
  for (int64_t f = 0; f < nc; ++f, xc += chunk) {
    const uint8_t* p[4];
    HWY_ALIGN uint8_t pad[4][kQMaxBytes];
    rows4.Next(ql, row_ptr, c0, f, pad, p);
    V32 a[MR], b[MR], ab[MR];
    ChunkRowSums<K, kVnni, MR>(p[0], xc, ldq, a);
    ChunkRowSums<K, kVnni, MR>(p[1], xc, ldq, b);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) ab[i] = PairRowsPerBlock(a[i], b[i]);
    ChunkRowSums<K, kVnni, MR>(p[2], xc, ldq, a);
    ChunkRowSums<K, kVnni, MR>(p[3], xc, ldq, b);
    const auto wscale = FlushScales<K, true, kRaw>(ws, f, 1);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const auto sum = hn::ConvertTo(dqf, SumRowPairsPerBlock(ab[i], PairRowsPerBlock(a[i], b[i])));
      const int64_t at = x0 + f * n32 + i * ldsx;
      const auto x_scale = hn::LoadU(dqf, xq.sx + at);
      hn::Vec<DQF> scaled;
      if constexpr (kOffsetCodes<K>) {  // QLayout::offset: the offset's share
        scaled = hn::MulAdd(sum, x_scale, hn::LoadU(dqf, xq.negc + at));
      } else {
        scaled = hn::Mul(sum, x_scale);
      }
      total[i] = hn::MulAdd(scaled, wscale, total[i]);
    }
  }
  StoreRows4Totals(total, out, accumulate);
}

// Q8RowsTile or Q16RowsTile over every token, two at a time.
template <Nib K, bool kLanes, bool kRaw, typename In>
void RowsTiles(const DotRowsArgs& a, const QLayout& ql, const In& xq, const RowPtrs* row_ptr,
               const void* ws, int64_t c0, int64_t nc, float* tile) {
  WithVnni(ql, [&](auto vnni) {
    constexpr bool kVnni = decltype(vnni)::value;
    const auto tiles = [&](auto mr, int64_t t) {
      constexpr int kMR = decltype(mr)::value;
      float* out = tile + t * kStreams;
      if constexpr (std::is_same_v<In, Q8Inputs>) {
        Q8RowsTile<K, kLanes, kVnni, kMR, kRaw>(ql, xq, row_ptr, ws, t, c0, nc, out, c0 > 0);
      } else {
        Q16RowsTile<K, kVnni, kMR, kRaw>(ql, xq, row_ptr, ws, t, c0, nc, out, c0 > 0);
      }
    };
    int64_t t = 0;
    for (; t + 2 <= a.num_tokens; t += 2) tiles(std::integral_constant<int, 2>(), t);
    for (; t < a.num_tokens; ++t) tiles(std::integral_constant<int, 1>(), t);
  });
}

// QDecodeStep for Q8RowsTile and Q16RowsTile: four rows (a step of fewer repeats its first row).
template <Nib K, bool kLanes, typename In>
void RowsStep(const NibbleDec<K>& dec, const DotRowsArgs& a, const QLayout& ql, const In& xq,
              const int64_t* rows, int64_t cc, float* tile) {
  RowPtrs row_ptr[4];
  SetRowPtrs(dec, rows, 4, row_ptr);
  // Written by TransposedScales before each K block's tiles read it; zeroing its 4 KiB per step
  // would cost more than the step's scales.
  HWY_ALIGN Rows4Scales ws;  // NOLINT(cppcoreguidelines-pro-type-member-init)
  ForEachKBlock(a, ql, cc, [&](int64_t c0, int64_t nc, int64_t g0, int64_t ng) {
    // Raw scales, made floats in each tile, where a flush's lanes take them in order
    // (QLayout::lanes) and at most two tiles use them; else floats made once.
    if (TransposedScales<K>(row_ptr, g0, ng, kLanes && a.num_tokens <= 4, ws)) {
      RowsTiles<K, kLanes, kLanes>(a, ql, xq, row_ptr, RawScales<K>(ws), c0, nc, tile);
    } else {
      RowsTiles<K, kLanes, false>(a, ql, xq, row_ptr, ws.f, c0, nc, tile);
    }
  });
}

// The scale of the decoded codes folded into the inputs' scales: 1/2 for E2M1 x 2, and with
// 16-bit inputs 1/256 for the codes' placement in the int16's high byte (not int4's and int4-zp's,
// decoded in the low byte: QLayout::offset).
template <Nib K, bool k8>
constexpr float QCodeScale() {
  return (NibbleDec<K>::kE2M1 ? 0.5f : 1.0f) * (k8 || kOffsetCodes<K> ? 1.0f : 1.0f / 256.0f);
}

// num_tokens rows of x quantized for the decode walk of format K (k8: int8, else int16) into
// out, in the layout of ql.
template <Nib K, bool k8>
void QuantizeRowsIn(const bf16_t* x, int64_t ldx, int64_t num_tokens, const QLayout& ql,
                    const QuantizedRows& out, void* scratch) {
  if constexpr (k8) {
    QuantizeRows8(x, ldx, num_tokens, ql, QCodeScale<K, true>(), Q8Offset<K>(), out, scratch);
  } else {
    QuantizeRows16(x, ldx, num_tokens, ql, QCodeScale<K, false>(), kOffsetMultiple<K>, out,
                   scratch);
  }
}

// The inputs of the decode walk: int8 (k8) or int16; DotRowsArgs::quantized where a caller
// quantized them ahead (QuantizedRowsLayout: in this layout), else quantized into a.work.
template <Nib K, bool k8>
auto QuantizeFor(const DotRowsArgs& a, const QLayout& ql) {
  QuantizedRows r;
  if (a.quantized != nullptr) {
    r = *a.quantized;
  } else {
    void* scratch = nullptr;
    r = WorkRows(a.num_tokens, ql, k8, a.work, &scratch);
    QuantizeRowsIn<K, k8>(a.x, a.ldx, a.num_tokens, ql, r, scratch);
  }
  if constexpr (k8) {
    return Q8Inputs{static_cast<const int8_t*>(r.q), r.ldq, r.sx, r.negc, r.ldu};
  } else {
    return QInputs{static_cast<const int16_t*>(r.q), r.ldq, r.sx, r.negc, r.ldu};
  }
}

template <Nib K, bool kLanes, bool k8>
void QDecodeRows(const NibbleDec<K>& dec, const DotRowsArgs& a, const QLayout& ql) {
  const auto xq = QuantizeFor<K, k8>(a, ql);
  const int64_t per = CeilDiv(a.num_rows, int64_t{kStreams});
  // K block in chunks: the tokens' quantized inputs within kDecodeXBytes of L1, and whole groups
  // within the weight-scale buffers.
  const int64_t group_chunks = std::max<int64_t>(1, ql.group / ql.chunk);
  const int64_t max_chunks = kQMaxBlockGroups * ql.group / ql.chunk;
  int64_t cc = kDecodeXBytes / ((k8 ? 1 : 2) * a.num_tokens * ql.chunk);
  cc = std::max(group_chunks, std::min(cc, max_chunks) / group_chunks * group_chunks);
  float tile[kDecodeMaxTokens * kStreams];
  for (int64_t s = 0; s < per; ++s) {
    int64_t col[kStreams], rows[kStreams];
    int nr = 0;
    for (int q = 0; q < kStreams && q * per + s < a.num_rows; ++q) col[nr++] = q * per + s;
    for (int j = 0; j < nr; ++j) rows[j] = a.row_idx[col[j]];
    bool rows4 = false;
    if constexpr (Rows4Format<K>() && (k8 || kLanes)) {
      if (ql.rows4) {
        for (int j = nr; j < kStreams; ++j) rows[j] = rows[0];
        RowsStep<K, kLanes>(dec, a, ql, xq, rows, cc, tile);
        rows4 = true;
      }
    }
    if (!rows4) {
      switch (nr) {
        case 4: QDecodeStep<K, kLanes, 4>(dec, a, ql, xq, rows, cc, tile); break;
        case 3: QDecodeStep<K, kLanes, 3>(dec, a, ql, xq, rows, cc, tile); break;
        case 2: QDecodeStep<K, kLanes, 2>(dec, a, ql, xq, rows, cc, tile); break;
        default: QDecodeStep<K, kLanes, 1>(dec, a, ql, xq, rows, cc, tile); break;
      }
    }
    for (int64_t t = 0; t < a.num_tokens; ++t) {
      for (int j = 0; j < nr; ++j) a.out[t * a.ldo + col[j]] = tile[t * kStreams + j];
    }
  }
}

// The integer decode walk's layout for num_tokens tokens of matrix m on int16 or (k8) int8
// inputs, where the walk applies: up to kDecodeMaxTokens tokens (int8; int16: 11), groups of whole
// chunks or chunks of whole groups (each 32-bit lane within one group), and groups whose sums
// cannot overflow. Returns false otherwise.
template <Nib K, bool k8>
bool QLayoutFor(const MatrixRef& m, int64_t num_tokens, QLayout* out) {
  QLayout& ql = *out;
  ql = QLayout{};
  ql.cols = m.cols;
  ql.group = m.group;
  ql.chunk = QChunk();
  ql.offset = !k8 && kOffsetCodes<K>;
  // 16-bit inputs: the fp32 strips from 12 tokens (Qwen3 at 12 and 16 tokens per expert, AVX2:
  // 0.88-0.97 of the time of this walk; the Kimi shapes 0.99-1.00; at 8, 1.15x the time).
  const int64_t most = k8 ? kDecodeMaxTokens : 11;
  if (num_tokens > most || ql.group > kQMaxGroup || m.cols % ql.group != 0) {
    return false;
  }
  if (ql.group % ql.chunk == 0) {
    ql.rows4 = k8 && Rows4Format<K>() && RowsPerBlock();
    return true;
  }
  if (ql.chunk % ql.group != 0) return false;
  if constexpr (k8) {  // lane L: columns 8L .. 8L + 7 of the chunk
    if (ql.group % 8 != 0) return false;
    ql.rows4 = Rows4Format<K>() && ql.group == 32 && RowsPerBlock();
    for (size_t l = 0; l < hn::Lanes(D32()); ++l) {
      ql.lane_group[l] = static_cast<int32_t>(8 * static_cast<int64_t>(l) / ql.group);
    }
  } else if (!QLaneGroups(&ql)) {
    return false;
  } else {
    // A block lane of four rows sums 32 products (Q16RowsTile). Up to 3 tokens: AVX2 A/B (Zen 4)
    // 0.87-0.94 of QTile's time for MXFP4 at 1 and 2 tokens per expert, int4 0.97-1.02; at 4
    // to 8 tokens per expert 0.99-1.02.
    ql.rows4 = Rows4Format<K>() && ql.group == 32 && RowsPerBlock() && num_tokens <= 3;
  }
  ql.lanes = true;
  return true;
}

// The integer decode walk (4 sequential row streams, as DecodeWalk) where it applies
// (QLayoutFor), its products by VNNI where `vnni` (QLayout::vnni); returns false otherwise.
template <Nib K, bool k8>
bool QDecodeWalk(const NibbleDec<K>& dec, const DotRowsArgs& a, bool vnni) {
  QLayout ql;
  if (!QLayoutFor<K, k8>(dec.m, a.num_tokens, &ql)) return false;
  ql.vnni = vnni;
  if (ql.lanes) {
    QDecodeRows<K, true, k8>(dec, a, ql);
  } else {
    QDecodeRows<K, false, k8>(dec, a, ql);
  }
  return true;
}

// WidenTokens for int8 inputs (DotRowsArgs::int8_inputs; 4-bit chunk order): each group of
// `group` (<= kQMaxGroup) columns quantized as the 8-bit decode quantizes it, then widened as
// q x d, so the strips compute the same products as the 8-bit decode up to fp32 rounding. The
// row is widened in column order, then each whole chunk (2N columns, N the float lanes) is put in
// place into its N even, then N odd columns. Per element, the scatter by chunk position (two
// divisions each) took 19 % of the kernels' time at 32 tokens per expert (Kimi-K2 MXFP4 at 128
// tokens, avx2-vnni, Zen 5) and made the int8 strips 1.2-1.3x as slow as the 16-bit inputs'.
void WidenInt8Tokens(const DotRowsArgs& a, int64_t group, int64_t chunk, int64_t whole, float* xf) {
  const DF df;
  const hn::Rebind<int32_t, DF> di32;
  const hn::Rebind<int8_t, DF> di8;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  HWY_DASSERT(chunk == 2 * n || whole == 0);
  (void)chunk;
  const int64_t k = a.w->cols;
  HWY_ALIGN int8_t q[kQMaxGroup];
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    float* dst = xf + t * WidenedStride(k);
    for (int64_t g0 = 0; g0 < k; g0 += group) {
      const float d = Int8Group(a.x + t * a.ldx + g0, group, q);
      int64_t c = 0;
      for (; c + n <= group; c += n) {
        const auto v = hn::ConvertTo(df, hn::PromoteTo(di32, hn::LoadU(di8, q + c)));
        hn::StoreU(hn::Mul(v, hn::Set(df, d)), df, dst + g0 + c);
      }
      for (; c < group; ++c) dst[g0 + c] = static_cast<float>(q[c]) * d;
    }
    for (int64_t c = 0; c < whole; c += 2 * n) {
      const auto lo = hn::LoadU(df, dst + c), hi = hn::LoadU(df, dst + c + n);
      hn::StoreU(hn::ConcatEven(df, hi, lo), df, dst + c);
      hn::StoreU(hn::ConcatOdd(df, hi, lo), df, dst + c + n);
    }
  }
}

template <typename Dec>
void DotRowsWith(const Dec& dec, const DotRowsArgs& a) {
  const DF df;
  int64_t chunk = static_cast<int64_t>(hn::Lanes(df)) * Dec::kVecs;
  // fp8 scales change every `group` columns: a chunk must not straddle two blocks.
  if constexpr (std::is_same_v<Dec, Fp8Dec>) {
    if (a.w->group % chunk != 0) chunk = 0;  // blocks narrower than a chunk: scalar only
  }
  const int64_t k = a.w->cols;
  const int64_t whole = chunk > 0 ? k / chunk * chunk : 0;
  if (chunk == 0) chunk = 1;
  float* xf = a.work;
  if constexpr (Dec::kInt8Inputs) {
    if (a.int8_inputs) {
      WidenInt8Tokens(a, dec.m.group, chunk, whole, xf);
    } else {
      WidenTokens<Dec>(a, whole, xf);
    }
  } else {
    WidenTokens<Dec>(a, whole, xf);
  }
  const DotSpan sp{chunk, whole, xf, WidenedStride(k)};
  if (a.num_tokens < Dec::kStripFrom) return DecodeWalk(dec, a, sp);
  PrefillStrips(dec, a, sp);
}

template <Nib K>
void NibbleDotRows(const NibbleDec<K>& dec, const DotRowsArgs& a, bool vnni) {
  if constexpr (K != Nib::kInt4Zp) {
    if (a.int8_inputs) {
      if (!QDecodeWalk<K, true>(dec, a, vnni)) DotRowsWith(dec, a);
      return;
    }
  }
  if (QDecodeWalk<K, false>(dec, a, vnni)) return;
  DotRowsWith(dec, a);
}

// QuantizedRowsLayout for the format K and input width (k8: int8, else int16).
template <Nib K, bool k8>
bool QuantizedRowsLayoutFor(const MatrixRef& m, int64_t num_tokens, QuantizedRows* layout,
                            int64_t* scratch_bytes) {
  QLayout ql;
  if (!QLayoutFor<K, k8>(m, num_tokens, &ql)) return false;
  QRowSizes(ql, k8, layout, scratch_bytes);
  return true;
}

template <Nib K, bool k8>
void QuantizeRowsFor(const MatrixRef& m, const bf16_t* x, int64_t ldx, int64_t num_tokens,
                     const QuantizedRows& out, void* scratch) {
  QLayout ql;
  const bool walk = QLayoutFor<K, k8>(m, num_tokens, &ql);
  HWY_DASSERT(walk);
  (void)walk;
  QuantizeRowsIn<K, k8>(x, ldx, num_tokens, ql, out, scratch);
}

template <Nib K>
bool QuantizedRowsLayoutK(const MatrixRef& m, int64_t num_tokens, bool int8, QuantizedRows* layout,
                          int64_t* scratch_bytes) {
  return int8 ? QuantizedRowsLayoutFor<K, true>(m, num_tokens, layout, scratch_bytes)
              : QuantizedRowsLayoutFor<K, false>(m, num_tokens, layout, scratch_bytes);
}

// CpuBackend::quantized_rows_layout: whether the integer decode walk of m on num_tokens tokens
// takes inputs quantized ahead (the 4-bit formats NibbleDotRows walks with int8 or int16
// inputs), and their layout.
bool QuantizedRowsLayout(const MatrixRef& m, int64_t num_tokens, bool int8, QuantizedRows* layout,
                         int64_t* scratch_bytes) {
  switch (m.format) {
    case WeightFormat::kMxfp4:
      return QuantizedRowsLayoutK<Nib::kMx>(m, num_tokens, int8, layout, scratch_bytes);
    case WeightFormat::kInt4:
      return QuantizedRowsLayoutK<Nib::kInt4>(m, num_tokens, int8, layout, scratch_bytes);
    case WeightFormat::kNvfp4:
      return QuantizedRowsLayoutK<Nib::kNvfp4>(m, num_tokens, int8, layout, scratch_bytes);
    case WeightFormat::kInt4Zp:  // no 8-bit decode: its int8 inputs are widened to floats
      return !int8 &&
             QuantizedRowsLayoutFor<Nib::kInt4Zp, false>(m, num_tokens, layout, scratch_bytes);
    default: return false;
  }
}

template <Nib K>
void QuantizeRowsK(const MatrixRef& m, bool int8, const bf16_t* x, int64_t ldx, int64_t num_tokens,
                   const QuantizedRows& out, void* scratch) {
  if (int8) {
    QuantizeRowsFor<K, true>(m, x, ldx, num_tokens, out, scratch);
  } else {
    QuantizeRowsFor<K, false>(m, x, ldx, num_tokens, out, scratch);
  }
}

// CpuBackend::quantize_rows (REQUIRES: QuantizedRowsLayout(m, num_tokens, int8) gave out's
// sizes).
void QuantizeRows(const MatrixRef& m, bool int8, const bf16_t* x, int64_t ldx, int64_t num_tokens,
                  const QuantizedRows& out, void* scratch) {
  switch (m.format) {
    case WeightFormat::kMxfp4:
      return QuantizeRowsK<Nib::kMx>(m, int8, x, ldx, num_tokens, out, scratch);
    case WeightFormat::kInt4:
      return QuantizeRowsK<Nib::kInt4>(m, int8, x, ldx, num_tokens, out, scratch);
    case WeightFormat::kNvfp4:
      return QuantizeRowsK<Nib::kNvfp4>(m, int8, x, ldx, num_tokens, out, scratch);
    case WeightFormat::kInt4Zp:
      return QuantizeRowsFor<Nib::kInt4Zp, false>(m, x, ldx, num_tokens, out, scratch);
    default: HWY_DASSERT(false);
  }
}

// `vnni`: the 4-bit formats' integer products by VNNI (QLayout::vnni; AVX2 and AVX-512 only).
void DotRows(const DotRowsArgs& a, bool vnni) {
  const MatrixRef& m = *a.w;
  // The bf16 row-group layout is the AVX-512 BF16 kernels' (moeshard run rewrites experts into
  // it only for them); here it is decoded by the portable kernels.
  if (m.row_groups) return PortableBackend().dot_rows(a);
  switch (m.format) {
    case WeightFormat::kBf16: return DotRowsWith(Bf16Dec{m}, a);
    case WeightFormat::kFp8Block: return DotRowsWith(Fp8Dec(m), a);
    case WeightFormat::kMxfp4: return NibbleDotRows(NibbleDec<Nib::kMx>{m}, a, vnni);
    case WeightFormat::kInt4: return NibbleDotRows(NibbleDec<Nib::kInt4>{m}, a, vnni);
    case WeightFormat::kInt4Zp: return NibbleDotRows(NibbleDec<Nib::kInt4Zp>{m}, a, vnni);
    case WeightFormat::kNvfp4: return NibbleDotRows(NibbleDec<Nib::kNvfp4>{m}, a, vnni);
  }
}

// Round to nearest even, NaN kept quiet (base/numeric.h FloatToBf16, vectorised).
void ToBf16(const float* src, int64_t n, bf16_t* dst) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(df, src + i);
    const auto bits = hn::BitCast(du, v);
    const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1));
    auto rounded = hn::ShiftRight<16>(hn::Add(bits, hn::Add(lsb, hn::Set(du, 0x7FFF))));
    const auto quiet = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du, 0x40));
    rounded = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet, rounded);
    const hn::RebindToSigned<decltype(df)> di;
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, rounded)), du16,
               reinterpret_cast<uint16_t*>(dst) + i);
  }
  for (; i < n; ++i) dst[i] = FloatToBf16(src[i]);
}

void WeightedSum(const float* const* rows, const float* weights, int64_t num_rows, int64_t n,
                 float* out, bool accumulate) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    auto acc = accumulate ? hn::LoadU(df, out + i) : hn::Zero(df);
    for (int64_t s = 0; s < num_rows; ++s) {
      acc = hn::MulAdd(hn::Set(df, weights[s]), hn::LoadU(df, rows[s] + i), acc);
    }
    hn::StoreU(acc, df, out + i);
  }
  for (; i < n; ++i) {
    float acc = accumulate ? out[i] : 0.0f;
    for (int64_t s = 0; s < num_rows; ++s) acc += weights[s] * rows[s][i];
    out[i] = acc;
  }
}

// Independent fp32 FMAs on full vectors: 12 chains hide a 4-cycle latency on 2-3 FMA pipes.
float PeakLoop(int64_t iterations, float seed, double* flops) {
  const hn::ScalableTag<float> df;
  constexpr int kChains = 12;
  hn::Vec<decltype(df)> acc[kChains];
#pragma GCC unroll 16
  for (int i = 0; i < kChains; ++i) acc[i] = hn::Set(df, seed + static_cast<float>(i));
  const auto x = hn::Set(df, 0.999f), y = hn::Set(df, 1e-3f);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = hn::MulAdd(acc[i], x, y);
  }
  *flops += 2.0 * kChains * static_cast<double>(hn::Lanes(df)) * static_cast<double>(iterations);
  auto s = acc[0];
  for (int i = 1; i < kChains; ++i) s = hn::Add(s, acc[i]);
  return hn::GetLane(hn::SumOfLanes(df, s));
}

// The read-bandwidth probe (CpuBackend::read_stream) in full vectors: XOR of 4 lines at a time,
// or of 4 streams prefetched kAhead bytes ahead.
template <int64_t kAhead>
uint64_t ReadStreamsPrefetched(const uint8_t* p, int64_t bytes) {
  const hn::CappedTag<uint64_t, 8> d;  // at most one line per load
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t part = bytes / 256 * 64;  // bytes per stream, a multiple of 64
  const uint8_t* s[4] = {p, p + part, p + 2 * part, p + 3 * part};
  auto a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < part; i += 64) {
    if constexpr (kAhead > 0) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) hwy::Prefetch(s[j] + i + kAhead);
    }
    // One 64-byte line of each stream (several vectors where they are narrower).
    for (int64_t b = 0; b < 64; b += 8 * N) {
      a0 = hn::Xor(a0, hn::Load(d, reinterpret_cast<const uint64_t*>(s[0] + i + b)));
      a1 = hn::Xor(a1, hn::Load(d, reinterpret_cast<const uint64_t*>(s[1] + i + b)));
      a2 = hn::Xor(a2, hn::Load(d, reinterpret_cast<const uint64_t*>(s[2] + i + b)));
      a3 = hn::Xor(a3, hn::Load(d, reinterpret_cast<const uint64_t*>(s[3] + i + b)));
    }
  }
  const auto x = hn::Xor(hn::Xor(a0, a1), hn::Xor(a2, a3));
  uint64_t r = 0;
  for (int64_t i = 0; i < N; ++i) r ^= hn::ExtractLane(x, static_cast<size_t>(i));
  return r;
}

uint64_t ReadStream(const uint8_t* p, int64_t bytes, int pattern) {
  if (pattern == 1) return ReadStreamsPrefetched<2048>(p, bytes);
  if (pattern == 2) return ReadStreamsPrefetched<1024>(p, bytes);
  const hn::ScalableTag<uint64_t> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 32 * N <= bytes; i += 32 * N) {
    a0 = hn::Xor(a0, hn::Load(d, reinterpret_cast<const uint64_t*>(p + i)));
    a1 = hn::Xor(a1, hn::Load(d, reinterpret_cast<const uint64_t*>(p + i + 8 * N)));
    a2 = hn::Xor(a2, hn::Load(d, reinterpret_cast<const uint64_t*>(p + i + 16 * N)));
    a3 = hn::Xor(a3, hn::Load(d, reinterpret_cast<const uint64_t*>(p + i + 24 * N)));
  }
  const auto x = hn::Xor(hn::Xor(a0, a1), hn::Xor(a2, a3));
  uint64_t r = 0;
  for (int64_t i = 0; i < N; ++i) r ^= hn::ExtractLane(x, static_cast<size_t>(i));
  return r;
}

}  // namespace

// The entry points of this target (referenced by name from the HWY_ONCE part below).
void DotRowsT(const DotRowsArgs& a) { DotRows(a, false); }
void DotRowsVnniT(const DotRowsArgs& a) { DotRows(a, true); }
bool QuantizedRowsLayoutT(const MatrixRef& m, int64_t num_tokens, bool int8, QuantizedRows* layout,
                          int64_t* scratch_bytes) {
  return QuantizedRowsLayout(m, num_tokens, int8, layout, scratch_bytes);
}
void QuantizeRowsT(const MatrixRef& m, bool int8, const bf16_t* x, int64_t ldx, int64_t num_tokens,
                   const QuantizedRows& out, void* scratch) {
  QuantizeRows(m, int8, x, ldx, num_tokens, out, scratch);
}
void ToBf16T(const float* src, int64_t n, bf16_t* dst) { ToBf16(src, n, dst); }
void WeightedSumT(const float* const* rows, const float* weights, int64_t num_rows, int64_t n,
                  float* out, bool accumulate) {
  WeightedSum(rows, weights, num_rows, n, out, accumulate);
}
float PeakLoopT(int64_t iterations, float seed, double* flops) {
  return PeakLoop(iterations, seed, flops);
}
uint64_t ReadStreamT(const uint8_t* p, int64_t bytes, int pattern) {
  return ReadStream(p, bytes, pattern);
}
#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace HWY_NAMESPACE
}  // namespace moeshard::internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace moeshard::internal {
namespace {

// Work floats: every token widened to fp32 (and a decoded row when the portable kernels decode
// the row-group layout).
int64_t WorkFloats(int64_t num_tokens, int64_t cols) {
  // The 4-bit decode's int16 inputs (rows padded to a chunk of up to 128 columns), their scales
  // (per group, or per chunk, class and lane: up to 2 x 16 per 128 columns per token), one
  // token's per-group scales and shifts
  // and one token's int16 inputs in column order.
  const int64_t quantized =
      num_tokens * ((cols + 128) / 2 + (cols + 128) / 4 + 1) + 2 * (cols + 128) + (cols + 128) / 2;
  const int64_t strips = num_tokens * WidenedStride(cols) + kStripRows * kStripCols +
                         num_tokens * kStripRows * 16 + 64;
  return std::max({strips, quantized, PortableBackend().work_floats(num_tokens, cols)});
}

#define MOESHARD_SIMD_BACKEND(NS, NAME, DOT_ROWS)                                              \
  CpuBackend {                                                                                 \
    NAME, NS::DOT_ROWS, PortableBackend().activate, NS::ToBf16T, WorkFloats, nullptr, nullptr, \
        nullptr, NS::WeightedSumT, "fp32 FMA (" NAME ")", NS::PeakLoopT, NS::ReadStreamT, 3,   \
        NS::QuantizedRowsLayoutT, NS::QuantizeRowsT                                            \
  }

}  // namespace

const CpuBackend* SimdBackendFor(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx2: {
#if HWY_TARGETS & HWY_AVX2
      static const CpuBackend b = MOESHARD_SIMD_BACKEND(N_AVX2, "avx2", DotRowsT);
      return &b;
#else
      return nullptr;
#endif
    }
    case CpuIsa::kAvx2Vnni: {
#if HWY_TARGETS & HWY_AVX2
      static const CpuBackend b = MOESHARD_SIMD_BACKEND(N_AVX2, "avx2-vnni", DotRowsVnniT);
      return &b;
#else
      return nullptr;
#endif
    }
    case CpuIsa::kAvx512Vnni: {
#if HWY_TARGETS & HWY_AVX3
      static const CpuBackend b = MOESHARD_SIMD_BACKEND(N_AVX3, "avx512-vnni", DotRowsVnniT);
      return &b;
#else
      return nullptr;
#endif
    }
    case CpuIsa::kAvx512: {
#if HWY_TARGETS & HWY_AVX3
      static const CpuBackend b = MOESHARD_SIMD_BACKEND(N_AVX3, "avx512", DotRowsT);
      return &b;
#else
      return nullptr;
#endif
    }
    case CpuIsa::kNeon: {
#if HWY_TARGETS & HWY_NEON
      static const CpuBackend b = MOESHARD_SIMD_BACKEND(N_NEON, "neon", DotRowsT);
      return &b;
#else
      return nullptr;
#endif
    }
    case CpuIsa::kSve: {
#if HWY_TARGETS & HWY_SVE
      static const CpuBackend b = MOESHARD_SIMD_BACKEND(N_SVE, "sve", DotRowsT);
      return &b;
#else
      return nullptr;
#endif
    }
    case CpuIsa::kAuto:
    case CpuIsa::kAvx512Bf16:
    case CpuIsa::kPortable: return nullptr;
  }
  return nullptr;
}

int64_t SimdTargetOf(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx2Vnni:
    case CpuIsa::kAvx2: return HWY_AVX2;
    case CpuIsa::kAvx512Vnni:
    case CpuIsa::kAvx512: return HWY_AVX3;
    case CpuIsa::kNeon: return HWY_NEON;
    case CpuIsa::kSve: return HWY_SVE;
    case CpuIsa::kAuto:
    case CpuIsa::kAvx512Bf16:
    case CpuIsa::kPortable: return 0;
  }
  return 0;
}

namespace {
// AVX-VNNI: CPUID leaf 7, sub-leaf 1, EAX bit 4 (Intel SDM vol. 2A, CPUID; the VEX-encoded
// vpdpwssd / vpdpbusd on 256-bit vectors, whose YMM state the AVX2 check already covers).
bool CpuHasAvxVnni() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 4)) != 0;
#else
  return false;
#endif
}

// AVX512_VNNI (the AVX-512 target's check covers the ZMM state).
bool CpuHasAvx512Vnni() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") != 0;
#else
  return false;
#endif
}
}  // namespace

const CpuBackend* Avx512SimdFallback() {
  // Chosen once: the native kernels ask on every dot_rows call they hand over.
  static const CpuBackend* const fallback = [] {
    for (CpuIsa isa : {CpuIsa::kAvx512Vnni, CpuIsa::kAvx512}) {
      if (CpuSupportsSimd(isa)) return SimdBackendFor(isa);
    }
    return static_cast<const CpuBackend*>(nullptr);
  }();
  return fallback;
}

bool CpuSupportsSimd(CpuIsa isa) {
  const int64_t target = SimdTargetOf(isa);
  if (isa == CpuIsa::kAvx2Vnni && !CpuHasAvxVnni()) return false;
  if (isa == CpuIsa::kAvx512Vnni && !CpuHasAvx512Vnni()) return false;
  return target != 0 && SimdBackendFor(isa) != nullptr && (hwy::SupportedTargets() & target) != 0;
}

}  // namespace moeshard::internal
#endif  // HWY_ONCE
