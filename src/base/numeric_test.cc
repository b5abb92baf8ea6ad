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
