// Permutation, gather and unpermute: against the reference permutation and direct sums,
// including expert maps (EP ranks), experts without tokens and invalid ids.
#include "moeshard/kernels/permute.h"

#include <gtest/gtest.h>

#include <random>

#include "kernels/kernels_test_util.h"
#include "moeshard/base/numeric.h"
#include "moeshard/kernels/reference.h"

namespace moeshard {
namespace {

using testing::MakeContext;
using testing::Randn;

// Random distinct ids per token drawn from `allowed` experts.
std::vector<int32_t> RandomIds(int64_t tokens, int64_t k, const std::vector<int32_t>& allowed,
                               uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> pool = allowed;
    std::shuffle(pool.begin(), pool.end(), rng);
    ids.insert(ids.end(), pool.begin(), pool.begin() + k);
  }
  return ids;
}

TEST(Permute, MatchesReferenceWithAndWithoutExpertMap) {
  const int64_t num_experts = 16, k = 4;
  std::vector<int32_t> allowed;
  for (int32_t e = 0; e < num_experts; ++e) {
    if (e % 5 != 3) allowed.push_back(e);  // experts 3, 8, 13 never receive tokens
  }
  // EP rank holding the odd experts, in reverse order (local ids need not follow global ones).
  std::vector<int32_t> map(num_experts, -1);
  for (int32_t e = 1, l = 7; e < num_experts; e += 2, --l) map[static_cast<size_t>(e)] = l;
  for (int64_t tokens : {0, 1, 3, 33, 511}) {
    const std::vector<int32_t> ids = RandomIds(tokens, k, allowed, 5 + tokens);
    const std::vector<float> w = Randn(tokens * k, 9);
    for (const int32_t* m :
         {static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(map.data())}) {
      PermuteParams p{.topk_ids = ids.data(),
                      .topk_weights = w.data(),
                      .num_tokens = tokens,
                      .top_k = k,
                      .num_experts_global = num_experts,
                      .expert_global_to_local = m,
                      .num_experts_local = 8};
      TokenPermutation got, want;
      ASSERT_TRUE(PermuteTokens(p, &got).ok());
      ASSERT_TRUE(reference::PermuteTokens(p, &want).ok());
      EXPECT_EQ(got.expert_offsets, want.expert_offsets) << tokens;
      EXPECT_EQ(got.sorted_token_idx, want.sorted_token_idx) << tokens;
      EXPECT_EQ(got.sorted_weights, want.sorted_weights) << tokens;
      EXPECT_EQ(got.slot_row, want.slot_row) << tokens;
      if (m == nullptr) {
        EXPECT_EQ(got.num_rows(), tokens * k);
        EXPECT_EQ(got.expert_offsets[4] - got.expert_offsets[3], 0);  // expert 3: no tokens
      }
    }
  }
}

TEST(Permute, RejectsOutOfRangeIds) {
  const std::vector<int32_t> ids = {0, 4};
  const std::vector<float> w = {0.5f, 0.5f};
  TokenPermutation perm;
  PermuteParams p{.topk_ids = ids.data(),
                  .topk_weights = w.data(),
                  .num_tokens = 1,
                  .top_k = 2,
                  .num_experts_global = 4};
  EXPECT_EQ(PermuteTokens(p, &perm).code(), StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad_map = {0, 1, 2, 5};
  const std::vector<int32_t> ok_ids = {0, 3};
  p.topk_ids = ok_ids.data();
  p.expert_global_to_local = bad_map.data();
  p.num_experts_local = 4;
  EXPECT_EQ(PermuteTokens(p, &perm).code(), StatusCode::kInvalidArgument);
}

TEST(Permute, GatherAndUnpermuteRoundTrip) {
  struct Case {
    int64_t k, num_experts, hidden;
  };
  // hidden 37: vector tails only; 133: two full 64-column blocks of the AVX-512 sum, then a
  // tail. k 20 over 24 experts: up to 18 local slots per token, more than one summing batch.
  for (const Case& c : {Case{3, 8, 37}, Case{3, 8, 133}, Case{20, 24, 133}}) {
    SCOPED_TRACE(::testing::Message() << "k " << c.k << " hidden " << c.hidden);
    const int64_t tokens = 33, k = c.k, num_experts = c.num_experts, hidden = c.hidden;
    std::vector<int32_t> all(num_experts);
    for (int32_t e = 0; e < num_experts; ++e) all[static_cast<size_t>(e)] = e;
    const std::vector<int32_t> ids = RandomIds(tokens, k, all, 11);
    const std::vector<float> w = Randn(tokens * k, 12);
    // This rank holds experts 2 and 5 (k 3), or all but every fourth (k 20).
    std::vector<int32_t> map(num_experts, -1);
    int32_t num_local = 0;
    for (int64_t e = 0; e < num_experts; ++e) {
      if (k < 16 ? (e == 2 || e == 5) : e % 4 != 0) map[static_cast<size_t>(e)] = num_local++;
    }
    TokenPermutation perm;
    ASSERT_TRUE(
        PermuteTokens({ids.data(), w.data(), tokens, k, num_experts, map.data(), num_local}, &perm)
            .ok());
    const std::vector<float> x = Randn(tokens * hidden, 13);
    for (CpuIsa isa : testing::TestIsas()) {
      KernelContext ctx = MakeContext(isa, 2);
      // Gather fp32 -> fp32 is an exact copy of the token rows.
      std::vector<float> xs(static_cast<size_t>(perm.num_rows() * hidden));
      ASSERT_TRUE(
          GatherTokens(ctx, perm, {x.data(), DType::kF32, hidden, xs.data(), DType::kF32}).ok());
      for (int64_t r = 0; r < perm.num_rows(); ++r) {
        const int64_t t = perm.sorted_token_idx[static_cast<size_t>(r)];
        for (int64_t c = 0; c < hidden; ++c) {
          ASSERT_EQ(xs[static_cast<size_t>(r * hidden + c)],
                    x[static_cast<size_t>(t * hidden + c)]);
        }
      }
      // fp32 -> bf16 rounds to nearest even.
      std::vector<bf16_t> xb(xs.size());
      ASSERT_TRUE(
          GatherTokens(ctx, perm, {x.data(), DType::kF32, hidden, xb.data(), DType::kBF16}).ok());
      for (size_t i = 0; i < xb.size(); ++i) ASSERT_EQ(xb[i].bits, FloatToBf16(xs[i]).bits);
      // Unpermute of the gathered rows: out[t] = (sum of local weights of t) * x[t].
      std::vector<float> out(static_cast<size_t>(tokens * hidden), 123.0f);
      ASSERT_TRUE(UnpermuteTokens(ctx, perm, {xs.data(), hidden, out.data(), false}).ok());
      for (int64_t t = 0; t < tokens; ++t) {
        double wsum = 0.0;
        for (int64_t s = 0; s < k; ++s) {
          if (map[static_cast<size_t>(ids[static_cast<size_t>(t * k + s)])] >= 0) {
            wsum += w[static_cast<size_t>(t * k + s)];
          }
        }
        for (int64_t c = 0; c < hidden; ++c) {
          ASSERT_NEAR(out[static_cast<size_t>(t * hidden + c)],
                      wsum * x[static_cast<size_t>(t * hidden + c)], 1e-5)
              << "token " << t;
        }
      }
      // accumulate adds on top.
      std::vector<float> acc(out.size(), 1.0f);
      ASSERT_TRUE(UnpermuteTokens(ctx, perm, {xs.data(), hidden, acc.data(), true}).ok());
      for (size_t i = 0; i < acc.size(); ++i) ASSERT_NEAR(acc[i], out[i] + 1.0f, 1e-5);
    }
  }
}

}  // namespace
}  // namespace moeshard
