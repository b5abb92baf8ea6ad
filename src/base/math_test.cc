#include "moeshard/base/math.h"

#include <gtest/gtest.h>

#include <limits>

#include "moeshard/base/units.h"

namespace moeshard {
namespace {

TEST(MathTest, RoundingAndDivisors) {
  EXPECT_EQ(RoundUp(96, 128), 128);
  EXPECT_EQ(RoundUp(128, 128), 128);
  EXPECT_EQ(RoundUp(0, 64), 0);
  EXPECT_EQ(CeilDiv(7, 2), 4);
  EXPECT_EQ(Lcm(128, 32), 128);
  EXPECT_EQ(Lcm(96, 128), 384);
  EXPECT_EQ(Divisors(96), (std::vector<int64_t>{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96}));
  EXPECT_EQ(Divisors(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(Divisors(49), (std::vector<int64_t>{1, 7, 49}));
}

TEST(MathTest, CheckedArithmetic) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(CheckedMul(1 << 20, 1 << 20), int64_t{1} << 40);
  EXPECT_FALSE(CheckedMul(max / 2 + 1, 2).has_value());
  EXPECT_FALSE(CheckedMul(-1, 2).has_value());
  EXPECT_FALSE(CheckedAdd(max, 1).has_value());
  EXPECT_EQ(CheckedAdd(3, 4), 7);
}

TEST(UnitsTest, Formats) {
  EXPECT_EQ(FormatBytes(96), "96 B");
  EXPECT_EQ(FormatBytes(3 * kGiB / 2), "1.50 GiB");
  EXPECT_EQ(FormatBytes(512 * kMiB), "512.0 MiB");
  EXPECT_EQ(FormatCount(1234567), "1,234,567");
  EXPECT_EQ(FormatCount(-1000), "-1,000");
  EXPECT_EQ(FormatCount(12), "12");
  EXPECT_EQ(FormatFraction(0.9), "0.90");
  EXPECT_EQ(FormatFraction(0.92), "0.92");
  EXPECT_EQ(FormatFraction(0.835), "0.835");
  EXPECT_EQ(FormatFraction(0.906), "0.906");
}

}  // namespace
}  // namespace moeshard
