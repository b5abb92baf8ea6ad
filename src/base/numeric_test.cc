#include "moeshard/base/numeric.h"

#include <gtest/gtest.h>

#include <cmath>

namespace moeshard {
namespace {

TEST(NumericTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-2.5f)), -2.5f);
}

TEST(NumericTest, Fp8E4M3) {
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x38), 1.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0xff)));
  EXPECT_EQ(FloatToFp8E4M3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(FloatToFp8E4M3(-1000.0f), 0xfe);
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const float v = Fp8E4M3ToFloat(static_cast<uint8_t>(c));
    if (v == 0.0f) continue;
    EXPECT_EQ(FloatToFp8E4M3(v), c) << c;
  }
}

TEST(NumericTest, Fp8E5M2) {
  EXPECT_EQ(Fp8E5M2ToFloat(0x3c), 1.0f);
  EXPECT_EQ(Fp8E5M2ToFloat(0x7b), 57344.0f);
  EXPECT_TRUE(std::isinf(Fp8E5M2ToFloat(0x7c)));
  for (int c = 0; c < 0x7c; ++c) {
    const float v = Fp8E5M2ToFloat(static_cast<uint8_t>(c));
    if (v == 0.0f) continue;
    EXPECT_EQ(FloatToFp8E5M2(v), c) << c;
  }
}

TEST(NumericTest, E8M0AndFp4) {
  EXPECT_EQ(E8M0ToFloat(127), 1.0f);
  EXPECT_EQ(E8M0ToFloat(130), 8.0f);
  EXPECT_TRUE(std::isnan(E8M0ToFloat(0xff)));
  EXPECT_EQ(FloatToE8M0Ceil(1.0f), 127);
  EXPECT_EQ(FloatToE8M0Ceil(1.5f), 128);
  EXPECT_EQ(FloatToE8M0Ceil(0.25f), 125);
  EXPECT_EQ(Fp4E2M1ToFloat(0x7), 6.0f);
  EXPECT_EQ(Fp4E2M1ToFloat(0xa), -1.0f);
  EXPECT_EQ(FloatToFp4E2M1(5.0f), 0x6);   // tie between 4 (code 6) and 6 (code 7): even
  EXPECT_EQ(FloatToFp4E2M1(-2.4f), 0xc);  // -2
  EXPECT_EQ(FloatToFp4E2M1(100.0f), 0x7);
  for (uint8_t c = 0; c < 16; ++c) {
    if (c == 8) continue;  // -0 encodes as +0 magnitude with sign
    EXPECT_EQ(FloatToFp4E2M1(Fp4E2M1ToFloat(c)), c);
  }
}

}  // namespace
}  // namespace moeshard

namespace moeshard {
namespace {

// Every fp16 value converts to fp32 and back unchanged; values between two neighbours round to
// the nearer (ties to the even code); past the largest finite value (65504) they round to
// infinity from 65520 on, as IEEE round-to-nearest does.
TEST(NumericTest, Fp16RoundTripsAndRoundsToNearestEven) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const fp16_t h{static_cast<uint16_t>(b)};
    const float f = HalfToFloat(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << b;
      continue;
    }
    ASSERT_EQ(FloatToHalf(f).bits, h.bits) << b;
    // The midpoint to the next code of the same sign rounds to the even one of the two.
    if ((b & 0x7fffu) < 0x7bffu) {
      const float next = HalfToFloat(fp16_t{static_cast<uint16_t>(b + 1)});
      const float mid = static_cast<float>((static_cast<double>(f) + next) / 2);
      const uint16_t even = (b & 1u) == 0 ? static_cast<uint16_t>(b) : static_cast<uint16_t>(b + 1);
      EXPECT_EQ(FloatToHalf(mid).bits, even) << b;
    }
  }
  EXPECT_EQ(HalfToFloat(fp16_t{0x3c00}), 1.0f);
  EXPECT_EQ(HalfToFloat(fp16_t{0x0001}), std::ldexp(1.0f, -24));
  EXPECT_EQ(FloatToHalf(65519.0f).bits, 0x7bffu);
  EXPECT_EQ(FloatToHalf(65520.0f).bits, 0x7c00u);
  EXPECT_EQ(FloatToHalf(-1e30f).bits, 0xfc00u);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -26)).bits, 0x0000u);  // a quarter of the smallest
}

}  // namespace
}  // namespace moeshard
