// Whole single-rank MoE forward (route -> permute -> grouped GEMM -> unpermute) against the
// reference that loops token by token, for model-like configurations; expert-parallel partial
// sums add up to the full layer.
#include "moeshard/kernels/moe_forward.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>

#include "kernels/kernels_test_util.h"
#include "moeshard/kernels/quantize.h"
#include "moeshard/kernels/reference.h"

namespace moeshard {
namespace {

using testing::Close;
using testing::MakeContext;
using testing::Randn;
using testing::TestIsas;

struct LayerCase {
  const char* name;
  RoutingKind routing;
  int64_t num_experts, top_k, num_groups, topk_group;
  float scaling;
  WeightFormat format;
  Activation act;
  int64_t hidden, inter;
  bool interleaved, bias;
};

const LayerCase kLayers[] = {
    {"qwen3-like", RoutingKind::kSoftmaxTopK, 16, 4, 1, 1, 1.0f, WeightFormat::kBf16,
     Activation::kSwiGlu, 100, 40, false, false},
    {"deepseek-like", RoutingKind::kSigmoidGroupedTopK, 16, 4, 4, 2, 2.5f, WeightFormat::kFp8Block,
     Activation::kSwiGlu, 136, 72, false, false},
    {"gpt-oss-like", RoutingKind::kTopKThenSoftmax, 8, 4, 1, 1, 1.0f, WeightFormat::kMxfp4,
     Activation::kSwiGluOai, 96, 64, true, true},
    {"kimi-k3-like", RoutingKind::kSigmoidGroupedTopK, 16, 4, 1, 1, 1.0f, WeightFormat::kMxfp4,
     Activation::kSiTu, 64, 96, false, false},
    {"kimi-k2-like", RoutingKind::kSigmoidGroupedTopK, 8, 8, 1, 1, 2.827f, WeightFormat::kInt4,
     Activation::kSwiGlu, 64, 32, false, false},
};

struct Layer {
  OwnedExpertWeights weights;
  std::vector<float> bias;  // e_score_correction_bias
  RoutingParams routing;
  ActivationParams act;
};

Layer MakeLayer(const LayerCase& c, uint64_t seed) {
  Layer l;
  const int64_t r13 = IsGated(c.act) ? 2 * c.inter : c.inter;
  const std::vector<float> w13 = Randn(c.num_experts * r13 * c.hidden, seed, 0.1f);
  const std::vector<float> w2 = Randn(c.num_experts * c.hidden * c.inter, seed + 1, 0.1f);
  const std::vector<float> b13 = Randn(c.num_experts * r13, seed + 2, 0.1f);
  const std::vector<float> b2 = Randn(c.num_experts * c.hidden, seed + 3, 0.1f);
  ExpertWeightsShape s{.scheme = WeightScheme::Default(c.format),
                       .num_experts_local = c.num_experts,
                       .hidden = c.hidden,
                       .intermediate = c.inter,
                       .gated = IsGated(c.act),
                       .gate_up_interleaved = c.interleaved};
  l.weights = EncodeExpertWeights(s, w13.data(), w2.data(), c.bias ? b13.data() : nullptr,
                                  c.bias ? b2.data() : nullptr);
  l.bias = Randn(c.num_experts, seed + 4, 0.05f);
  l.routing = RoutingParams{.kind = c.routing,
                            .num_experts = c.num_experts,
                            .top_k = c.top_k,
                            .num_groups = c.num_groups,
                            .topk_group = c.topk_group,
                            .e_score_correction_bias = l.bias.data(),
                            .routed_scaling_factor = c.scaling};
  l.act.kind = c.act;
  return l;
}

TEST(MoeForward, MatchesReferenceForModelLikeLayers) {
  for (const LayerCase& c : kLayers) {
    const Layer layer = MakeLayer(c, 31);
    for (int64_t tokens : {1, 3, 33, 511}) {
      if (tokens == 511 && c.format != WeightFormat::kBf16) continue;  // keep the suite fast
      const std::vector<float> x = Randn(tokens * c.hidden, 32 + tokens);
      const std::vector<float> logits = Randn(tokens * c.num_experts, 33 + tokens);
      MoeForwardParams p;
      p.routing = layer.routing;
      p.router_logits = logits.data();
      p.num_tokens = tokens;
      p.x = x.data();
      p.x_dtype = DType::kF32;
      p.weights = &layer.weights.view;
      p.activation = layer.act;
      std::vector<float> want(static_cast<size_t>(tokens * c.hidden));
      p.out = want.data();
      ASSERT_TRUE(reference::MoeForward(p).ok());
      for (CpuIsa isa : TestIsas()) {
        KernelContext ctx = MakeContext(isa, 2);
        std::vector<float> got(want.size(), 5.0f);
        p.out = got.data();
        const Status s = MoeForward(ctx, p);
        ASSERT_TRUE(s.ok()) << s.ToString();
        // Second call on the same context (steady state: scratch reused) gives the same result.
        std::vector<float> again(want.size(), 9.0f);
        p.out = again.data();
        ASSERT_TRUE(MoeForward(ctx, p).ok());
        EXPECT_EQ(got, again);
        const testing::Tolerance tol = c.format == WeightFormat::kBf16
                                           ? testing::Tolerance{2e-2, 1e-2}
                                           : testing::Tolerance{3e-2, 1e-2};
        EXPECT_TRUE(
            Close(got, want, tol, fmt::format("{} {} T{}", CpuIsaName(isa), c.name, tokens), 31));
      }
    }
  }
}

// Two EP ranks (even / odd experts, local ids in order) each compute a partial output; their
// sum is the full layer, and each partial matches the reference with the same expert map.
TEST(MoeForward, ExpertParallelPartialsSumToFullLayer) {
  const LayerCase& c = kLayers[0];
  const Layer layer = MakeLayer(c, 51);
  const int64_t tokens = 33;
  const std::vector<float> x = Randn(tokens * c.hidden, 52);
  const std::vector<float> logits = Randn(tokens * c.num_experts, 53);
  const int64_t half = c.num_experts / 2;
  const int64_t h = c.hidden;
  for (CpuIsa isa : TestIsas()) {
    KernelContext ctx = MakeContext(isa, 2);
    MoeForwardParams p;
    p.routing = layer.routing;
    p.router_logits = logits.data();
    p.num_tokens = tokens;
    p.x = x.data();
    p.weights = &layer.weights.view;
    p.activation = layer.act;
    std::vector<float> full(static_cast<size_t>(tokens * h));
    p.out = full.data();
    ASSERT_TRUE(MoeForward(ctx, p).ok());
    std::vector<float> sum(full.size(), 0.0f);
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<int32_t> map(static_cast<size_t>(c.num_experts), -1);
      for (int32_t e = rank; e < c.num_experts; e += 2) map[static_cast<size_t>(e)] = e / 2;
      // The rank's local weights: experts rank, rank+2, ... copied out of the full set.
      const int64_t r13 = 2 * c.inter;
      const int64_t b13 = r13 * h * 2, b2 = h * c.inter * 2;  // bf16 bytes per expert
      OwnedExpertWeights local;
      local.w13 = AlignedBuffer(static_cast<size_t>(half * b13));
      local.w2 = AlignedBuffer(static_cast<size_t>(half * b2));
      for (int32_t e = rank, l = 0; e < c.num_experts; e += 2, ++l) {
        std::memcpy(local.w13.data() + l * b13, layer.weights.w13.data() + e * b13,
                    static_cast<size_t>(b13));
        std::memcpy(local.w2.data() + l * b2, layer.weights.w2.data() + e * b2,
                    static_cast<size_t>(b2));
      }
      local.view = layer.weights.view;
      local.view.num_experts_local = half;
      local.view.w13 = local.w13.data();
      local.view.w2 = local.w2.data();
      p.weights = &local.view;
      p.expert_global_to_local = map.data();
      std::vector<float> part(full.size()), want(full.size());
      p.out = part.data();
      ASSERT_TRUE(MoeForward(ctx, p).ok());
      p.out = want.data();
      ASSERT_TRUE(reference::MoeForward(p).ok());
      EXPECT_TRUE(Close(part, want, {2e-2, 1e-2}, fmt::format("rank {}", rank), 51));
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    }
    EXPECT_TRUE(Close(sum, full, {1e-4, 1e-4}, "EP sum vs single rank", 51));
  }
}

TEST(MoeForward, RejectsMismatchedExpertCount) {
  const Layer layer = MakeLayer(kLayers[0], 1);
  KernelContext ctx = MakeContext(CpuIsa::kAuto, 1);
  std::vector<float> x(100), logits(32), out(100);
  MoeForwardParams p;
  p.routing = layer.routing;
  p.routing.num_experts = 32;  // router over 32 experts, weights for 16, no expert map
  p.router_logits = logits.data();
  p.num_tokens = 1;
  p.x = x.data();
  p.weights = &layer.weights.view;
  p.activation = layer.act;
  p.out = out.data();
  EXPECT_EQ(MoeForward(ctx, p).code(), StatusCode::kInvalidArgument);
}

TEST(KernelContext, ForcedIsaIsHonouredOrRejected) {
  KernelContextOptions o;
  o.isa = CpuIsa::kPortable;
  o.num_threads = 1;
  auto portable = KernelContext::Create(o);
  ASSERT_TRUE(portable.ok());
  EXPECT_EQ(portable->isa(), CpuIsa::kPortable);
  o.isa = CpuIsa::kAvx512Bf16;
  auto avx = KernelContext::Create(o);
  EXPECT_EQ(avx.ok(), CpuSupportsAvx512Bf16());
  o.isa = CpuIsa::kAuto;
  auto autoctx = KernelContext::Create(o);
  ASSERT_TRUE(autoctx.ok());
  // The best the CPU runs: native bf16 dots, then the SIMD variants widest first, then plain C++
  // (an Ice Lake, AVX-512 without BF16, gets avx512-vnni; a Skylake-SP avx512; an Alder Lake
  // avx2-vnni; a Zen 3 avx2).
  CpuIsa best = CpuIsa::kPortable;
  for (CpuIsa isa : {CpuIsa::kAvx512Bf16, CpuIsa::kAvx512Vnni, CpuIsa::kAvx512, CpuIsa::kAvx2Vnni,
                     CpuIsa::kAvx2, CpuIsa::kNeon, CpuIsa::kSve}) {
    if (CpuSupportsIsa(isa)) {
      best = isa;
      break;
    }
  }
  EXPECT_EQ(autoctx->isa(), best) << CpuIsaName(autoctx->isa()) << " against " << CpuIsaName(best);
}

}  // namespace
}  // namespace moeshard
