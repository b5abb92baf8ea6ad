#include "moeshard/weights/dummy_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "moeshard/base/numeric.h"

namespace moeshard {
namespace {

std::vector<std::byte> Fill(uint64_t key, DType dtype, DummyKind kind, int64_t first, int64_t n) {
  std::vector<std::byte> out(static_cast<size_t>(n * DTypeBits(dtype) / 8));
  FillDummy(key, dtype, kind, first, out);
  return out;
}

TEST(DummyWeightsTest, KindsFromNamesAndDtypes) {
  EXPECT_EQ(DummyKindOf("model.layers.3.mlp.experts.1.up_proj.weight", DType::kBF16),
            DummyKind::kWeight);
  EXPECT_EQ(DummyKindOf("model.layers.3.mlp.experts.1.up_proj.weight", DType::kF8E4M3),
            DummyKind::kFp8);
  EXPECT_EQ(DummyKindOf("x.weight_scale_inv", DType::kF32), DummyKind::kScale);
  EXPECT_EQ(DummyKindOf("x.weight_scale", DType::kU8), DummyKind::kE8M0);
  EXPECT_EQ(DummyKindOf("x.weight_scale", DType::kBF16), DummyKind::kScale);
  EXPECT_EQ(DummyKindOf("x.gate_up_proj_scales", DType::kU8), DummyKind::kE8M0);
  EXPECT_EQ(DummyKindOf("x.gate_up_proj_blocks", DType::kU8), DummyKind::kNibbles);
  EXPECT_EQ(DummyKindOf("x.weight_packed", DType::kU8), DummyKind::kNibbles);
  EXPECT_EQ(DummyKindOf("model.layers.0.input_layernorm.weight", DType::kBF16), DummyKind::kNorm);
  EXPECT_EQ(DummyKindOf("model.norm.weight", DType::kBF16), DummyKind::kNorm);
  EXPECT_EQ(DummyKindOf("model.layers.1.mlp.gate.e_score_correction_bias", DType::kF32),
            DummyKind::kBias);
}

// Any sub-range equals the same range of a whole fill: the value depends on the index only.
TEST(DummyWeightsTest, CounterBasedAnyOffset) {
  const uint64_t key = DummyTensorKey(7, "t");
  const auto whole = Fill(key, DType::kBF16, DummyKind::kWeight, 0, 4096);
  for (int64_t first : {0, 1, 17, 1000, 4095}) {
    const auto part = Fill(key, DType::kBF16, DummyKind::kWeight, first, 4096 - first);
    ASSERT_EQ(0, std::memcmp(part.data(), whole.data() + first * 2, part.size())) << first;
  }
  // Across the 2^32 element boundary, runs split there give the same bytes as one run.
  const int64_t b = (int64_t{1} << 32) - 3;
  const auto across = Fill(key, DType::kU8, DummyKind::kNibbles, b, 6);
  const auto lo = Fill(key, DType::kU8, DummyKind::kNibbles, b, 3);
  const auto hi = Fill(key, DType::kU8, DummyKind::kNibbles, b + 3, 3);
  EXPECT_EQ(0, std::memcmp(across.data(), lo.data(), 3));
  EXPECT_EQ(0, std::memcmp(across.data() + 3, hi.data(), 3));
}

TEST(DummyWeightsTest, SeedAndNameChangeValues) {
  const auto a = Fill(DummyTensorKey(1, "a"), DType::kBF16, DummyKind::kWeight, 0, 64);
  const auto b = Fill(DummyTensorKey(2, "a"), DType::kBF16, DummyKind::kWeight, 0, 64);
  const auto c = Fill(DummyTensorKey(1, "b"), DType::kBF16, DummyKind::kWeight, 0, 64);
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
}

TEST(DummyWeightsTest, ValuesInRangeAndSpread) {
  const uint64_t key = DummyTensorKey(3, "w");
  const int64_t n = 100000;
  const auto w = Fill(key, DType::kBF16, DummyKind::kWeight, 0, n);
  double sum = 0, sum2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, w.data() + 2 * i, 2);
    const float v = Bf16ToFloat(bf16_t{bits});
    ASSERT_LE(std::fabs(v), 0.0501f);
    sum += v;
    sum2 += v * v;
  }
  EXPECT_NEAR(sum / n, 0.0, 1e-3);
  EXPECT_NEAR(std::sqrt(sum2 / n), 0.05 / std::sqrt(3.0), 2e-3);  // uniform's RMS

  const auto norm = Fill(key, DType::kF32, DummyKind::kNorm, 0, 1000);
  for (int64_t i = 0; i < 1000; ++i) {
    float v;
    std::memcpy(&v, norm.data() + 4 * i, 4);
    ASSERT_GE(v, 0.95f);
    ASSERT_LT(v, 1.05f);
  }
}

TEST(DummyWeightsTest, QuantizedEncodingsAreValid) {
  const uint64_t key = DummyTensorKey(5, "q");
  const int64_t n = 65536;
  const auto fp8 = Fill(key, DType::kF8E4M3, DummyKind::kFp8, 0, n);
  std::set<uint8_t> codes;
  for (std::byte b : fp8) {
    const uint8_t c = static_cast<uint8_t>(b);
    const float v = Fp8E4M3ToFloat(c);
    ASSERT_TRUE(std::isfinite(v)) << int{c};
    ASSERT_LE(std::fabs(v), 8.0f);
    codes.insert(c);
  }
  EXPECT_GT(codes.size(), 150u);  // both signs, every magnitude code

  const auto e8 = Fill(key, DType::kU8, DummyKind::kE8M0, 0, n);
  std::set<uint8_t> scales;
  for (std::byte b : e8) scales.insert(static_cast<uint8_t>(b));
  EXPECT_EQ(scales, (std::set<uint8_t>{120, 121, 122}));  // 2^-7 .. 2^-5

  const auto nib = Fill(key, DType::kU8, DummyKind::kNibbles, 0, n);
  std::set<uint8_t> lo, hi;
  for (std::byte b : nib) {
    lo.insert(static_cast<uint8_t>(b) & 0xf);
    hi.insert(static_cast<uint8_t>(b) >> 4);
  }
  EXPECT_EQ(lo.size(), 16u);
  EXPECT_EQ(hi.size(), 16u);

  const auto sc = Fill(key, DType::kF32, DummyKind::kScale, 0, 1000);
  for (int64_t i = 0; i < 1000; ++i) {
    float v;
    std::memcpy(&v, sc.data() + 4 * i, 4);
    ASSERT_GE(v, 0.005f);
    ASSERT_LT(v, 0.015f);
  }
}

}  // namespace
}  // namespace moeshard
