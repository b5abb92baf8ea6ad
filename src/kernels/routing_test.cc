// Routing: the optimised Route against the reference for every variant, with random and tied
// logits, k equal to the expert count, and invalid parameters.
#include "moeshard/kernels/routing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/kernels_test_util.h"
#include "moeshard/kernels/reference.h"

namespace moeshard {
namespace {

using testing::MakeContext;
using testing::Randn;

struct RoutingCase {
  const char* name;
  RoutingKind kind;
  int64_t num_experts, top_k, num_groups, topk_group;
  bool renormalize;
  float scale;
};

const RoutingCase kCases[] = {
    {"qwen3", RoutingKind::kSoftmaxTopK, 128, 8, 1, 1, true, 1.0f},
    {"mixtral", RoutingKind::kSoftmaxTopK, 8, 2, 1, 1, true, 1.0f},
    {"softmax_k_eq_e", RoutingKind::kSoftmaxTopK, 8, 8, 1, 1, false, 1.0f},
    {"deepseek_v3", RoutingKind::kSigmoidGroupedTopK, 256, 8, 8, 4, true, 2.5f},
    {"kimi", RoutingKind::kSigmoidGroupedTopK, 64, 8, 1, 1, true, 2.827f},
    {"grouped_k_eq_e", RoutingKind::kSigmoidGroupedTopK, 8, 8, 2, 2, true, 1.0f},
    {"gpt_oss", RoutingKind::kTopKThenSoftmax, 32, 4, 1, 1, true, 1.0f},
    {"topk_softmax_k_eq_e", RoutingKind::kTopKThenSoftmax, 6, 6, 1, 1, true, 1.0f},
    // DeepSeek-V2 (160 experts, 8 groups keep 3, top 6, scale 16) and V2-Lite-like shapes.
    {"deepseek_v2", RoutingKind::kSoftmaxGroupedTopK, 160, 6, 8, 3, false, 16.0f},
    {"softmax_grouped_renorm", RoutingKind::kSoftmaxGroupedTopK, 64, 6, 8, 1, true, 1.0f},
    {"softmax_grouped_all_kept", RoutingKind::kSoftmaxGroupedTopK, 16, 4, 4, 4, false, 1.0f},
    {"llama4", RoutingKind::kTopKThenSigmoid, 16, 1, 1, 1, false, 1.0f},
    {"topk_sigmoid_k4", RoutingKind::kTopKThenSigmoid, 128, 4, 1, 1, false, 1.0f},
    // DeepSeek-V4-Flash (256 experts, top 6, scale 1.5) and -Pro (384, top 6, 2.5).
    {"deepseek_v4_flash", RoutingKind::kSqrtSoftplusTopK, 256, 6, 1, 1, true, 1.5f},
    {"deepseek_v4_pro", RoutingKind::kSqrtSoftplusTopK, 384, 6, 1, 1, true, 2.5f},
    {"sqrtsoftplus_k_eq_e", RoutingKind::kSqrtSoftplusTopK, 8, 8, 1, 1, false, 1.0f},
};

void CheckAgainstReference(const RoutingCase& c, int64_t num_tokens, bool ties, uint64_t seed) {
  std::vector<float> logits = Randn(num_tokens * c.num_experts, seed);
  if (ties) {
    for (float& v : logits) v = std::floor(v);  // few distinct values: many exact ties
  }
  std::vector<float> bias = Randn(c.num_experts, seed + 1, 0.1f);
  if (ties) std::fill(bias.begin(), bias.end(), 0.0f);
  RoutingParams p{.kind = c.kind,
                  .num_experts = c.num_experts,
                  .top_k = c.top_k,
                  .renormalize = c.renormalize,
                  .num_groups = c.num_groups,
                  .topk_group = c.topk_group,
                  .e_score_correction_bias = bias.data(),
                  .routed_scaling_factor = c.scale};
  const size_t n = static_cast<size_t>(num_tokens * c.top_k);
  std::vector<int32_t> ids(n), ref_ids(n);
  std::vector<float> w(n), ref_w(n);
  KernelContext ctx = MakeContext(CpuIsa::kAuto, 2);
  ASSERT_TRUE(Route(ctx, p, {logits.data(), num_tokens, ids.data(), w.data()}).ok());
  ASSERT_TRUE(reference::Route(p, {logits.data(), num_tokens, ref_ids.data(), ref_w.data()}).ok());
  int shown = 0;
  for (size_t i = 0; i < n && shown < 5; ++i) {
    if (ids[i] != ref_ids[i] || std::abs(w[i] - ref_w[i]) > 1e-5f * std::max(1.0f, c.scale)) {
      ADD_FAILURE() << c.name << " seed " << seed << " tokens " << num_tokens << " ties " << ties
                    << ": [token " << i / c.top_k << ", slot " << i % c.top_k << "] id " << ids[i]
                    << " w " << w[i] << ", reference id " << ref_ids[i] << " w " << ref_w[i];
      ++shown;
    }
  }
  // Each token's ids are distinct experts.
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::vector<bool> seen(static_cast<size_t>(c.num_experts), false);
    for (int64_t s = 0; s < c.top_k; ++s) {
      const int32_t id = ids[static_cast<size_t>(t * c.top_k + s)];
      ASSERT_TRUE(id >= 0 && id < c.num_experts);
      ASSERT_FALSE(seen[static_cast<size_t>(id)]) << c.name << " token " << t;
      seen[static_cast<size_t>(id)] = true;
    }
  }
}

TEST(Routing, MatchesReferenceRandom) {
  for (const RoutingCase& c : kCases) {
    for (int64_t tokens : {1, 3, 33, 511}) CheckAgainstReference(c, tokens, false, 1000 + tokens);
  }
}

TEST(Routing, MatchesReferenceWithTies) {
  for (const RoutingCase& c : kCases) CheckAgainstReference(c, 33, true, 77);
}

TEST(Routing, AllEqualLogitsPickLowestIndices) {
  for (const RoutingCase& c : kCases) {
    std::vector<float> logits(static_cast<size_t>(c.num_experts), 0.5f);
    std::vector<float> bias(static_cast<size_t>(c.num_experts), 0.0f);
    RoutingParams p{.kind = c.kind,
                    .num_experts = c.num_experts,
                    .top_k = c.top_k,
                    .renormalize = c.renormalize,
                    .num_groups = c.num_groups,
                    .topk_group = c.topk_group,
                    .e_score_correction_bias = bias.data()};
    std::vector<int32_t> ids(static_cast<size_t>(c.top_k));
    std::vector<float> w(ids.size());
    KernelContext ctx = MakeContext(CpuIsa::kAuto, 1);
    ASSERT_TRUE(Route(ctx, p, {logits.data(), 1, ids.data(), w.data()}).ok());
    for (int64_t s = 0; s < c.top_k; ++s) EXPECT_EQ(ids[static_cast<size_t>(s)], s) << c.name;
  }
}

// DeepSeek-V2's group_limited_greedy scores a group by its best expert (not the sum of two, as
// noaux_tc does), and Llama-4's weights are the sigmoid of the chosen logits: hand-checked.
TEST(Routing, SoftmaxGroupsAreScoredByTheirBestExpert) {
  KernelContext ctx = MakeContext(CpuIsa::kAuto, 1);
  // Groups of two: {3, 3} sums to more than {3.5, -9}, but its best expert is lower.
  const std::vector<float> logits = {3.0f, 3.0f, 3.5f, -9.0f, 0.0f, 0.0f, 1.0f, -1.0f};
  RoutingParams p{.kind = RoutingKind::kSoftmaxGroupedTopK,
                  .num_experts = 8,
                  .top_k = 2,
                  .renormalize = false,
                  .num_groups = 4,
                  .topk_group = 1,
                  .routed_scaling_factor = 2.0f};
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  ASSERT_TRUE(Route(ctx, p, {logits.data(), 1, ids.data(), w.data()}).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 3}));
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l));
  EXPECT_NEAR(w[0], 2.0 * std::exp(3.5) / sum, 1e-6);
  EXPECT_NEAR(w[1], 2.0 * std::exp(-9.0) / sum, 1e-9);
  p.renormalize = true;
  ASSERT_TRUE(Route(ctx, p, {logits.data(), 1, ids.data(), w.data()}).ok());
  EXPECT_NEAR(w[0] + w[1], 2.0, 1e-6);
  // Every group kept: the plain top-2.
  p.topk_group = 4;
  ASSERT_TRUE(Route(ctx, p, {logits.data(), 1, ids.data(), w.data()}).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 0}));
}

TEST(Routing, TopKThenSigmoidWeighsByTheChosenLogits) {
  KernelContext ctx = MakeContext(CpuIsa::kAuto, 1);
  const std::vector<float> logits = {0.0f, 2.0f, -1.0f, 1.0f};
  RoutingParams p{.kind = RoutingKind::kTopKThenSigmoid, .num_experts = 4, .top_k = 1};
  std::vector<int32_t> ids(1);
  std::vector<float> w(1);
  ASSERT_TRUE(Route(ctx, p, {logits.data(), 1, ids.data(), w.data()}).ok());
  EXPECT_EQ(ids[0], 1);
  EXPECT_NEAR(w[0], 1.0 / (1.0 + std::exp(-2.0)), 1e-6);
}

double SqrtSoftplus(double x) { return std::sqrt(x > 20.0 ? x : std::log1p(std::exp(x))); }

// DeepSeek-V4: experts chosen by sqrt(softplus(logit)) + bias, weighted by the unbiased score,
// renormalised and scaled (vLLM _topk_softplus_sqrt_torch), hand-checked.
TEST(Routing, SqrtSoftplusSelectsBiasedAndWeighsUnbiased) {
  KernelContext ctx = MakeContext(CpuIsa::kAuto, 1);
  const std::vector<float> logits = {0.0f, 2.0f, -1.0f, 1.0f};
  // The bias lifts expert 2 (s = 0.5597) above experts 1 (1.4584) and 3 (1.1460).
  const std::vector<float> bias = {0.0f, 0.0f, 1.0f, 0.0f};
  RoutingParams p{.kind = RoutingKind::kSqrtSoftplusTopK,
                  .num_experts = 4,
                  .top_k = 2,
                  .renormalize = true,
                  .e_score_correction_bias = bias.data(),
                  .routed_scaling_factor = 1.5f};
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  for (int backend = 0; backend < 2; ++backend) {
    const RoutingArgs a{logits.data(), 1, ids.data(), w.data()};
    ASSERT_TRUE((backend == 0 ? Route(ctx, p, a) : reference::Route(p, a)).ok());
    EXPECT_EQ(ids, (std::vector<int32_t>{2, 1})) << backend;
    const double s2 = SqrtSoftplus(-1.0), s1 = SqrtSoftplus(2.0);
    EXPECT_NEAR(s2, 0.5596982, 1e-6);  // sqrt(ln(1 + e^-1))
    EXPECT_NEAR(w[0], 1.5 * s2 / (s1 + s2), 1e-6) << backend;
    EXPECT_NEAR(w[1], 1.5 * s1 / (s1 + s2), 1e-6) << backend;
  }
  // No bias (it is optional), no renormalisation: the plain top-2 of s with weights s * 1.5;
  // softplus is the identity above 20, as torch's.
  const std::vector<float> big = {30.0f, 2.0f, -1.0f, 1.0f};
  p.e_score_correction_bias = nullptr;
  p.renormalize = false;
  ASSERT_TRUE(Route(ctx, p, {big.data(), 1, ids.data(), w.data()}).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(w[0], 1.5 * std::sqrt(30.0), 1e-5);
  EXPECT_NEAR(w[1], 1.5 * SqrtSoftplus(2.0), 1e-6);
}

// DeepSeek-V4's hash layers: the table names each token's experts (in its order, the bias
// ignored), the weights are their renormalised sqrt(softplus) scores.
TEST(Routing, HashTableNamesTheExpertsOfEachToken) {
  KernelContext ctx = MakeContext(CpuIsa::kAuto, 2);
  const std::vector<int32_t> table = {3, 0, /*token 1*/ 1, 2, /*token 2*/ 2, 3};
  const std::vector<int32_t> tokens = {2, 0, 1};
  const std::vector<float> logits = {0.0f, 2.0f,  -1.0f, 1.0f,   // token id 2 -> experts 2, 3
                                     0.0f, 2.0f,  -1.0f, 1.0f,   // token id 0 -> experts 3, 0
                                     5.0f, -3.0f, 0.5f,  9.0f};  // token id 1 -> experts 1, 2
  const std::vector<float> bias = {100.0f, 0.0f, 0.0f, 0.0f};    // must not matter
  RoutingParams p{.kind = RoutingKind::kSqrtSoftplusHash,
                  .num_experts = 4,
                  .top_k = 2,
                  .renormalize = true,
                  .e_score_correction_bias = bias.data(),
                  .routed_scaling_factor = 2.0f,
                  .hash_table = table.data(),
                  .hash_vocab = 3};
  std::vector<int32_t> ids(6);
  std::vector<float> w(6);
  for (int backend = 0; backend < 2; ++backend) {
    const RoutingArgs a{logits.data(), 3, ids.data(), w.data(), tokens.data()};
    ASSERT_TRUE((backend == 0 ? Route(ctx, p, a) : reference::Route(p, a)).ok());
    EXPECT_EQ(ids, (std::vector<int32_t>{2, 3, 3, 0, 1, 2})) << backend;
    const double a2 = SqrtSoftplus(-1.0), a3 = SqrtSoftplus(1.0), a0 = SqrtSoftplus(0.0);
    EXPECT_NEAR(w[0], 2.0 * a2 / (a2 + a3), 1e-6);
    EXPECT_NEAR(w[1], 2.0 * a3 / (a2 + a3), 1e-6);
    EXPECT_NEAR(w[2], 2.0 * a3 / (a3 + a0), 1e-6);
    EXPECT_NEAR(w[3], 2.0 * a0 / (a3 + a0), 1e-6);
    const double b1 = SqrtSoftplus(-3.0), b2 = SqrtSoftplus(0.5);
    EXPECT_NEAR(w[4], 2.0 * b1 / (b1 + b2), 1e-6);
    EXPECT_NEAR(w[5], 2.0 * b2 / (b1 + b2), 1e-6);
  }
  // Random logits and tokens: the optimised router equals the reference.
  const int64_t T = 65, E = 32, k = 4, V = 50;
  std::vector<int32_t> big_table(V * k), big_tokens(T), ids2(T * k), ref_ids(T * k);
  std::mt19937 rng(5);
  for (int64_t v = 0; v < V; ++v) {
    for (int64_t j = 0; j < k; ++j)
      big_table[v * k + j] = static_cast<int32_t>((v * 7 + j * 8) % E);
  }
  for (int32_t& t : big_tokens) t = static_cast<int32_t>(rng() % V);
  const std::vector<float> big_logits = Randn(T * E, 9);
  std::vector<float> w2(T * k), ref_w(T * k);
  p = {.kind = RoutingKind::kSqrtSoftplusHash,
       .num_experts = E,
       .top_k = k,
       .renormalize = true,
       .routed_scaling_factor = 1.5f,
       .hash_table = big_table.data(),
       .hash_vocab = V};
  ASSERT_TRUE(
      Route(ctx, p, {big_logits.data(), T, ids2.data(), w2.data(), big_tokens.data()}).ok());
  ASSERT_TRUE(
      reference::Route(p, {big_logits.data(), T, ref_ids.data(), ref_w.data(), big_tokens.data()})
          .ok());
  EXPECT_EQ(ids2, ref_ids);
  for (int64_t i = 0; i < T * k; ++i) ASSERT_NEAR(w2[i], ref_w[i], 1e-5) << i;
}

TEST(Routing, HashRoutingRejectsMissingOrOutOfRangeIds) {
  KernelContext ctx = MakeContext(CpuIsa::kAuto, 1);
  std::vector<float> logits(8);
  std::vector<int32_t> ids(2), table = {0, 1, 2, 8};  // token 1's second expert is out of range
  std::vector<float> w(2);
  RoutingParams p{.kind = RoutingKind::kSqrtSoftplusHash, .num_experts = 8, .top_k = 2};
  std::vector<int32_t> tok = {0};
  EXPECT_EQ(Route(ctx, p, {logits.data(), 1, ids.data(), w.data(), tok.data()}).code(),
            StatusCode::kInvalidArgument);  // no table
  p.hash_table = table.data();
  p.hash_vocab = 2;
  EXPECT_EQ(Route(ctx, p, {logits.data(), 1, ids.data(), w.data()}).code(),
            StatusCode::kInvalidArgument);  // no token ids
  EXPECT_TRUE(Route(ctx, p, {logits.data(), 1, ids.data(), w.data(), tok.data()}).ok());
  tok = {2};  // beyond the vocabulary
  const Status beyond = Route(ctx, p, {logits.data(), 1, ids.data(), w.data(), tok.data()});
  EXPECT_EQ(beyond.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(beyond.ToString().find("token_ids[0]"), std::string::npos) << beyond.ToString();
  tok = {1};
  const Status bad = Route(ctx, p, {logits.data(), 1, ids.data(), w.data(), tok.data()});
  EXPECT_NE(bad.ToString().find("hash_table[1, 1]"), std::string::npos) << bad.ToString();
}

TEST(Routing, RejectsInvalidParams) {
  KernelContext ctx = MakeContext(CpuIsa::kAuto, 1);
  std::vector<float> logits(8);
  std::vector<int32_t> ids(16);
  std::vector<float> w(16);
  RoutingArgs a{logits.data(), 1, ids.data(), w.data()};
  RoutingParams p{.kind = RoutingKind::kSoftmaxTopK, .num_experts = 8, .top_k = 9};
  EXPECT_EQ(Route(ctx, p, a).code(), StatusCode::kInvalidArgument);
  p = {.kind = RoutingKind::kSigmoidGroupedTopK, .num_experts = 8, .top_k = 2};
  EXPECT_EQ(Route(ctx, p, a).code(), StatusCode::kInvalidArgument);  // no bias
  std::vector<float> bias(8);
  p = {.kind = RoutingKind::kSigmoidGroupedTopK,
       .num_experts = 8,
       .top_k = 2,
       .num_groups = 3,
       .topk_group = 1,
       .e_score_correction_bias = bias.data()};
  EXPECT_EQ(Route(ctx, p, a).code(), StatusCode::kInvalidArgument);  // 8 % 3 != 0
  p.num_groups = 4;
  p.topk_group = 1;
  p.top_k = 3;  // one group of 2 experts cannot supply 3
  EXPECT_EQ(Route(ctx, p, a).code(), StatusCode::kInvalidArgument);
  // Softmax groups need no bias, but the same group arithmetic.
  p = {.kind = RoutingKind::kSoftmaxGroupedTopK, .num_experts = 8, .top_k = 2, .num_groups = 4};
  EXPECT_TRUE(Route(ctx, p, a).ok());
  p.num_groups = 3;
  EXPECT_EQ(Route(ctx, p, a).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moeshard
