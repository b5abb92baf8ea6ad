#include "moeshard/base/numeric.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace moeshard {
namespace {

// Decodes a minifloat with `exp_bits` exponent bits and `man_bits` mantissa bits.
float DecodeMinifloat(uint32_t bits, int exp_bits, int man_bits, int bias) {
  const uint32_t sign = (bits >> (exp_bits + man_bits)) & 1u;
  const uint32_t exp = (bits >> man_bits) & ((1u << exp_bits) - 1u);
  const uint32_t man = bits & ((1u << man_bits) - 1u);
  float value;
  if (exp == 0) {
    value = std::ldexp(static_cast<float>(man), 1 - bias - man_bits);
  } else {
    value = std::ldexp(1.0f + static_cast<float>(man) / static_cast<float>(1u << man_bits),
                       static_cast<int>(exp) - bias);
  }
  return sign ? -value : value;
}

// Encodes |f| (finite, >= 0) to the nearest representable minifloat magnitude code, ties to
// even, saturating at `max_code`. Works by scanning the codes: 8-bit formats have <= 128.
uint32_t EncodeMagnitude(float mag, int exp_bits, int man_bits, int bias, uint32_t max_code) {
  uint32_t best = 0;
  float best_err = std::numeric_limits<float>::infinity();
  for (uint32_t code = 0; code <= max_code; ++code) {
    const float v = DecodeMinifloat(code, exp_bits, man_bits, bias);
    const float err = std::abs(v - mag);
    if (err < best_err || (err == best_err && (code & 1u) == 0)) {
      best = code;
      best_err = err;
    }
  }
  return best;
}

}  // namespace

float HalfToFloat(fp16_t v) {
  const uint32_t sign = static_cast<uint32_t>(v.bits & 0x8000u) << 16;
  const uint32_t exp = (v.bits >> 10) & 0x1fu;
  const uint32_t man = v.bits & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf, NaN
  if (exp == 0) {  // zero or subnormal: man x 2^-24, exact in fp32
    const float mag = std::ldexp(static_cast<float>(man), -24);
    return sign != 0 ? -mag : mag;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

fp16_t FloatToHalf(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return fp16_t{static_cast<uint16_t>(sign | 0x7e00u)};   // quiet NaN
  if (abs >= 0x47800000u) return fp16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // >= 2^16: inf
  if (abs < 0x38800000u) {  // below 2^-14: subnormal (or zero), in units of 2^-24, RNE
    const float units = std::bit_cast<float>(abs) * 16777216.0f;  // exact (power of two)
    return fp16_t{static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(units)))};
  }
  // Normal: drop 13 mantissa bits, round to nearest even (a carry into the exponent is right).
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return fp16_t{static_cast<uint16_t>(sign | ((rounded >> 13) - (112u << 10)))};
}

float Fp8E4M3ToFloat(uint8_t v) {
  if ((v & 0x7f) == 0x7f) return std::nanf("");
  return DecodeMinifloat(v, 4, 3, 7);
}

uint8_t FloatToFp8E4M3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float mag = std::min(std::abs(f), 448.0f);
  return sign | static_cast<uint8_t>(EncodeMagnitude(mag, 4, 3, 7, 0x7e));
}

float Fp8E5M2ToFloat(uint8_t v) {
  const uint32_t exp = (v >> 2) & 0x1f;
  if (exp == 0x1f) {
    if (v & 0x3) return std::nanf("");
    return (v & 0x80) ? -std::numeric_limits<float>::infinity()
                      : std::numeric_limits<float>::infinity();
  }
  return DecodeMinifloat(v, 5, 2, 15);
}

uint8_t FloatToFp8E5M2(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float mag = std::abs(f);
  // Values beyond max + half an ulp (57344 + 4096) round to infinity.
  if (mag >= 61440.0f) return sign | 0x7c;
  return sign | static_cast<uint8_t>(EncodeMagnitude(mag, 5, 2, 15, 0x7b));
}

uint8_t FloatToE8M0Ceil(float f) {
  f = std::abs(f);
  if (!(f > 0.0f) || std::isinf(f)) return f > 0.0f ? 254 : 0;
  int exp = 0;
  const float m = std::frexp(f, &exp);  // f = m * 2^exp, m in [0.5, 1)
  int e = (m == 0.5f) ? exp - 1 : exp;  // smallest e with 2^e >= f
  e += 127;
  return static_cast<uint8_t>(std::clamp(e, 0, 254));
}

uint8_t FloatToFp4E2M1(float f) {
  const uint8_t sign = std::signbit(f) ? 0x8 : 0;
  const float mag = std::isnan(f) ? 0.0f : std::min(std::abs(f), 6.0f);
  uint8_t best = 0;
  float best_err = std::numeric_limits<float>::infinity();
  for (uint8_t code = 0; code < 8; ++code) {
    const float err = std::abs(kFp4E2M1Values[code] - mag);
    if (err < best_err || (err == best_err && (code & 1u) == 0)) {
      best = code;
      best_err = err;
    }
  }
  return sign | best;
}

}  // namespace moeshard
