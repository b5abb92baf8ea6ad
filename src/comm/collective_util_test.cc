#include "comm/collective_util.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "moeshard/base/numeric.h"

namespace moeshard::comm_internal {
namespace {

// Values spanning many binades, so that sums round and the summation order matters.
float Value(int rank, size_t i) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(rank) * 40503u;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  const float mantissa = static_cast<float>(h & 0xffff) / 65536.0f - 0.5f;
  return std::ldexp(mantissa, static_cast<int>((h >> 16) % 24) - 12);
}

TEST(ChunkBeginTest, CoversRangeInBalancedContiguousChunks) {
  for (size_t count : {0, 1, 5, 7, 8, 1000, 1001}) {
    for (int n : {1, 2, 3, 4, 8}) {
      EXPECT_EQ(ChunkBegin(count, n, 0), 0u);
      EXPECT_EQ(ChunkBegin(count, n, n), count) << count << " over " << n;
      for (int r = 0; r < n; ++r) {
        const size_t len = ChunkBegin(count, n, r + 1) - ChunkBegin(count, n, r);
        EXPECT_TRUE(len == count / n || len == count / n + 1) << count << " " << n << " " << r;
      }
    }
  }
}

TEST(ReduceSumInRankOrderTest, Fp32IsSequentialSumInRankOrder) {
  for (int n : {1, 2, 3, 5, 8}) {
    const size_t len = 3000;  // crosses tile boundaries
    std::vector<std::vector<float>> in(static_cast<size_t>(n), std::vector<float>(len));
    std::vector<const void*> srcs;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < len; ++i) in[static_cast<size_t>(r)][i] = Value(r, i);
      srcs.push_back(in[static_cast<size_t>(r)].data());
    }
    std::vector<float> out(len);
    ReduceSumInRankOrder(ReduceDtype::kFloat32, srcs.data(), n, len, out.data());
    for (size_t i = 0; i < len; ++i) {
      float ref = in[0][i];
      for (int r = 1; r < n; ++r) ref += in[static_cast<size_t>(r)][i];
      ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(ref))
          << "n=" << n << " i=" << i;
    }
  }
}

TEST(ReduceSumInRankOrderTest, Bf16AccumulatesInFp32AndRoundsOnce) {
  const int n = 6;
  const size_t len = 2500;
  std::vector<std::vector<bf16_t>> in(n, std::vector<bf16_t>(len));
  std::vector<const void*> srcs;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < len; ++i) in[r][i] = FloatToBf16(Value(r, i));
    srcs.push_back(in[r].data());
  }
  std::vector<bf16_t> out(len);
  ReduceSumInRankOrder(ReduceDtype::kBfloat16, srcs.data(), n, len, out.data());
  size_t differs_from_per_step_rounding = 0;
  for (size_t i = 0; i < len; ++i) {
    float ref = Bf16ToFloat(in[0][i]);
    float per_step = ref;
    for (int r = 1; r < n; ++r) {
      ref += Bf16ToFloat(in[r][i]);
      per_step = RoundToBf16(per_step + Bf16ToFloat(in[r][i]));
    }
    ASSERT_EQ(out[i].bits, FloatToBf16(ref).bits) << "i=" << i;
    if (out[i].bits != FloatToBf16(per_step).bits) ++differs_from_per_step_rounding;
  }
  // The inputs are chosen so that rounding at every step would give other bits: the check
  // above distinguishes the two.
  EXPECT_GT(differs_from_per_step_rounding, len / 10);
}

TEST(ReduceSumInRankOrderTest, Bf16SpecialValuesMatchFloatToBf16) {
  const float inf = std::numeric_limits<float>::infinity();
  const float max_bf16 = Bf16ToFloat(bf16_t{0x7f7f});
  // Pairs (a, b) whose fp32 sum hits NaN, infinities, overflow to infinity, exact ties
  // (1 + 2^-8 is halfway between two bf16 values) and signed zeros.
  const std::vector<std::pair<float, float>> pairs = {
      {inf, -inf},           {inf, 1.0f},         {-inf, -1.0f},  {max_bf16, max_bf16},
      {1.0f, 0.00390625f},   {1.0f, 0.01171875f}, {-0.0f, -0.0f}, {0.0f, -0.0f},
      {std::nanf(""), 1.0f}, {1e-40f, 1e-40f}};
  std::vector<bf16_t> a, b;
  for (const auto& [x, y] : pairs) {
    a.push_back(FloatToBf16(x));
    b.push_back(FloatToBf16(y));
  }
  const void* srcs[] = {a.data(), b.data()};
  std::vector<bf16_t> out(a.size());
  ReduceSumInRankOrder(ReduceDtype::kBfloat16, srcs, 2, a.size(), out.data());
  for (size_t i = 0; i < a.size(); ++i) {
    const bf16_t ref = FloatToBf16(Bf16ToFloat(a[i]) + Bf16ToFloat(b[i]));
    EXPECT_EQ(out[i].bits, ref.bits) << "pair " << i;
  }
}

TEST(ReduceSumInRankOrderTest, InPlaceIntoFirstInput) {
  std::vector<float> a = {1.0f, 2.0f, 3.0f};
  std::vector<float> b = {0.5f, 0.25f, 0.125f};
  const void* srcs[] = {a.data(), b.data()};
  ReduceSumInRankOrder(ReduceDtype::kFloat32, srcs, 2, a.size(), a.data());
  EXPECT_EQ(a, (std::vector<float>{1.5f, 2.25f, 3.125f}));
}

TEST(CheckBlocksTest, ResolvesPackedDisplacements) {
  std::vector<size_t> counts = {3, 0, 2, 5};
  std::vector<size_t> displs;
  size_t extent = 0;
  ASSERT_TRUE(CheckBlocks("recv_counts", counts, {}, 4, true, &displs, &extent).ok());
  EXPECT_EQ(displs, (std::vector<size_t>{0, 3, 3, 5}));
  EXPECT_EQ(extent, 10u);
}

TEST(CheckBlocksTest, RejectsWrongSizesAndOverlaps) {
  std::vector<size_t> counts = {3, 2};
  std::vector<size_t> displs;
  size_t extent = 0;
  Status s = CheckBlocks("recv_counts", counts, {}, 3, true, &displs, &extent);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expected 3 entries"), std::string::npos) << s.message();

  std::vector<size_t> overlapping = {0, 2};  // [0, 3) and [2, 4)
  s = CheckBlocks("recv_counts", counts, overlapping, 2, true, &displs, &extent);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overlap"), std::string::npos) << s.message();
  // Send blocks may overlap (the same rows sent to several ranks).
  EXPECT_TRUE(CheckBlocks("send_counts", counts, overlapping, 2, false, &displs, &extent).ok());
  EXPECT_EQ(extent, 4u);

  std::vector<size_t> gaps = {10, 0};  // reversed order with a gap: fine
  EXPECT_TRUE(CheckBlocks("recv_counts", counts, gaps, 2, true, &displs, &extent).ok());
  EXPECT_EQ(extent, 13u);
}

TEST(CheckSameCallTest, NamesBothCallsOnMismatch) {
  CallHeader a;
  a.op = CollectiveOp::kAllReduceSum;
  a.seq = 4;
  a.count = 100;
  CallHeader b = a;
  EXPECT_TRUE(CheckSameCall(a, 0, b, 2).ok());
  b.count = 99;
  Status s = CheckSameCall(a, 0, b, 2);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rank 0 called AllReduceSum(count=100, fp32)"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("rank 2 called AllReduceSum(count=99, fp32)"), std::string::npos)
      << s.message();
  b = a;
  b.op = CollectiveOp::kBarrier;
  EXPECT_FALSE(CheckSameCall(a, 0, b, 1).ok());
}

TEST(OverlapsTest, HalfOpenRanges) {
  char buf[16] = {};
  EXPECT_TRUE(Overlaps(buf, 8, buf + 7, 8));
  EXPECT_FALSE(Overlaps(buf, 8, buf + 8, 8));
  EXPECT_FALSE(Overlaps(buf, 0, buf, 8));
}

}  // namespace
}  // namespace moeshard::comm_internal
