#include "moeshard/base/dtype.h"

#include <gtest/gtest.h>

namespace moeshard {
namespace {

TEST(DTypeTest, NamesRoundTrip) {
  for (DType d : kAllDTypes) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.has_value()) << DTypeName(d);
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_FALSE(ParseDType("bf16").has_value());  // names are case-sensitive, as in safetensors
  EXPECT_FALSE(ParseDType("F8").has_value());
}

TEST(DTypeTest, Bytes) {
  EXPECT_EQ(DTypeBytes(DType::kBF16, 3), 6);
  EXPECT_EQ(DTypeBytes(DType::kF4, 64), 32);
  EXPECT_FALSE(DTypeBytes(DType::kF4, 3).has_value());  // 12 bits is not whole bytes
  EXPECT_EQ(DTypeBytes(DType::kF6E2M3, 4), 3);
  EXPECT_FALSE(DTypeBytes(DType::kF64, int64_t{1} << 61).has_value());  // overflow
  EXPECT_EQ(DTypeBits(DType::kF8E8M0), 8);
}

}  // namespace
}  // namespace moeshard
