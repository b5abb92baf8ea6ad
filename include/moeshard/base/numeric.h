// Number formats: bf16, fp16, fp8 (e4m3fn, e5m2), E8M0 scales and FP4 E2M1, with exact
// conversions.
//
// fp32 -> bf16 and fp32 -> fp8 round to nearest, ties to even (NaN stays NaN; fp8 e4m3fn
// saturates to +-448 because it has no infinity). These are the scalar definitions every
// kernel backend must agree with. Thread safety: pure functions.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace moeshard {

// bf16 as its raw bits; arithmetic happens in fp32.
struct bf16_t {
  uint16_t bits = 0;
};

inline float Bf16ToFloat(bf16_t v) {
  return std::bit_cast<float>(static_cast<uint32_t>(v.bits) << 16);
}

inline bf16_t FloatToBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a quiet NaN
    return bf16_t{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  }
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>((u + rounding_bias) >> 16)};
}

// Rounds an fp32 through bf16 and back (what storing to a bf16 buffer does).
inline float RoundToBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

// IEEE fp16 as its raw bits (AWQ and GPTQ scales).
struct fp16_t {
  uint16_t bits = 0;
};
float HalfToFloat(fp16_t v);  // exact (subnormals, infinities, NaN)
fp16_t FloatToHalf(float f);  // RNE; overflow to infinity; NaN stays NaN

// fp8 e4m3fn: bias 7, max 448, 0x7f/0xff NaN, no infinity.
float Fp8E4M3ToFloat(uint8_t v);
uint8_t FloatToFp8E4M3(float f);  // RNE, saturating to +-448
// fp8 e5m2: bias 15, IEEE-like with infinities.
float Fp8E5M2ToFloat(uint8_t v);
uint8_t FloatToFp8E5M2(float f);  // RNE

// E8M0 scale: 2^(e - 127); 0xFF is NaN.
inline float E8M0ToFloat(uint8_t e) {
  if (e == 0xff) return std::nanf("");
  if (e == 0) return std::ldexp(1.0f, -127);
  return std::bit_cast<float>(static_cast<uint32_t>(e) << 23);
}
// Smallest E8M0 exponent e with 2^(e-127) >= |f| (for choosing an MXFP4 block scale such that
// amax / scale <= 6 use FloatToE8M0Ceil(amax / 6)). Clamped to [0, 254].
uint8_t FloatToE8M0Ceil(float f);

// FP4 E2M1 values indexed by the 4-bit code.
inline constexpr std::array<float, 16> kFp4E2M1Values = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,
                                                         4.0f,  6.0f,  -0.0f, -0.5f, -1.0f, -1.5f,
                                                         -2.0f, -3.0f, -4.0f, -6.0f};

inline float Fp4E2M1ToFloat(uint8_t code) { return kFp4E2M1Values[code & 0xf]; }
// Nearest E2M1 code (ties to the even mantissa), saturating at +-6.
uint8_t FloatToFp4E2M1(float f);

}  // namespace moeshard
