// The oracle checked on hand-computed cases, so that it is not only validated by itself.
// Expected values below were worked out by hand from the formulas in the headers (with a
// calculator for exp/tanh), not produced by this code.
#include "moeshard/kernels/reference.h"

#include <gtest/gtest.h>

#include <vector>

#include "moeshard/base/numeric.h"
#include "moeshard/kernels/quantize.h"

namespace moeshard {
namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed RouteOne(const RoutingParams& p, const std::vector<float>& logits) {
  Routed r;
  r.ids.resize(static_cast<size_t>(p.top_k));
  r.weights.resize(static_cast<size_t>(p.top_k));
  const Status s = reference::Route(p, RoutingArgs{.router_logits = logits.data(),
                                                   .num_tokens = 1,
                                                   .topk_ids = r.ids.data(),
                                                   .topk_weights = r.weights.data()});
  EXPECT_TRUE(s.ok()) << s.ToString();
  return r;
}

TEST(ReferenceRouting, SoftmaxTopKRenormalised) {
  RoutingParams p{.kind = RoutingKind::kSoftmaxTopK, .num_experts = 4, .top_k = 2};
  const Routed r = RouteOne(p, {0.0f, 1.0f, 3.0f, 2.0f});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3}));
  EXPECT_NEAR(r.weights[0], 0.7310586f, 1e-6);  // e^3 / (e^3 + e^2)
  EXPECT_NEAR(r.weights[1], 0.2689414f, 1e-6);
}

TEST(ReferenceRouting, SoftmaxTopKNotRenormalisedAndScaled) {
  RoutingParams p{.kind = RoutingKind::kSoftmaxTopK,
                  .num_experts = 4,
                  .top_k = 2,
                  .renormalize = false,
                  .routed_scaling_factor = 2.0f};
  const Routed r = RouteOne(p, {0.0f, 1.0f, 3.0f, 2.0f});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3}));
  EXPECT_NEAR(r.weights[0], 2 * 0.6439143f, 1e-6);  // e^3 / (1 + e + e^2 + e^3)
  EXPECT_NEAR(r.weights[1], 2 * 0.2368828f, 1e-6);
}

TEST(ReferenceRouting, TiesPickLowerIndex) {
  RoutingParams p{.kind = RoutingKind::kSoftmaxTopK, .num_experts = 5, .top_k = 3};
  const Routed r = RouteOne(p, {1.0f, 2.0f, 1.0f, 2.0f, 1.0f});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3, 0}));
}

TEST(ReferenceRouting, SigmoidGroupedUsesBiasForSelectionOnly) {
  // sigmoid: e0 .5, e1 .5, e2 .9526, e3 .0067, e4 .7311, e5 .7311, e6 .0180, e7 .8808; bias +0.3
  // on e0. Groups of 2 scored by the sum of both: g0 1.3, g1 .9593, g2 1.4621, g3 .8988 -> keep
  // g2, g0. Best biased in {0,1,4,5}: e0 (.8), then e4 (.7311, tie with e5 -> lower index).
  // Weights from unbiased scores .5 and .7311, renormalised, times 2.5.
  std::vector<float> bias = {0.3f, 0, 0, 0, 0, 0, 0, 0};
  RoutingParams p{.kind = RoutingKind::kSigmoidGroupedTopK,
                  .num_experts = 8,
                  .top_k = 2,
                  .num_groups = 4,
                  .topk_group = 2,
                  .e_score_correction_bias = bias.data(),
                  .routed_scaling_factor = 2.5f};
  const Routed r = RouteOne(p, {0.0f, 0.0f, 3.0f, -5.0f, 1.0f, 1.0f, -4.0f, 2.0f});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 4}));
  EXPECT_NEAR(r.weights[0], 1.0153863f, 1e-5);
  EXPECT_NEAR(r.weights[1], 1.4846137f, 1e-5);
}

TEST(ReferenceRouting, TopKThenSoftmax) {
  RoutingParams p{.kind = RoutingKind::kTopKThenSoftmax, .num_experts = 3, .top_k = 2};
  const Routed r = RouteOne(p, {1.0f, 3.0f, 2.0f});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(r.weights[0], 0.7310586f, 1e-6);
  EXPECT_NEAR(r.weights[1], 0.2689414f, 1e-6);
}

TEST(ReferenceActivation, KnownValues) {
  ActivationParams a;
  a.kind = Activation::kSwiGlu;
  EXPECT_NEAR(ApplyActivation(a, 1.0f, 2.0f), 1.4621172f, 1e-5);
  a.kind = Activation::kSwiGluOai;
  EXPECT_NEAR(ApplyActivation(a, 10.0f, -9.0f), -41.999719f, 1e-4);  // clamped to 7 / -7
  EXPECT_NEAR(ApplyActivation(a, -1.0f, 0.5f), -0.23130635f, 1e-6);
  a.kind = Activation::kSiTu;
  EXPECT_NEAR(ApplyActivation(a, 2.0f, 30.0f), 33.932364f, 1e-4);
  EXPECT_NEAR(ApplyActivation(a, -3.0f, -1.0f), 0.12042575f, 1e-6);
  a.kind = Activation::kReluSquared;
  EXPECT_EQ(ApplyActivation(a, 0.0f, -1.0f), 0.0f);
  EXPECT_EQ(ApplyActivation(a, 0.0f, 3.0f), 9.0f);
  a.kind = Activation::kGeluTanhGated;
  EXPECT_NEAR(ApplyActivation(a, 1.0f, 2.0f), 1.6823840f, 1e-5);
  EXPECT_NEAR(ApplyActivation(a, -0.5f, 3.0f), -0.46285797f, 1e-6);
  // DeepSeek-V4: gate clamped from above only, up both ways, no alpha, no +1.
  a.kind = Activation::kSwiGluClamp;
  a.swiglu_limit = 10.0f;
  EXPECT_NEAR(ApplyActivation(a, 1.0f, 2.0f), 1.4621172f, 1e-5);      // as SwiGLU
  EXPECT_NEAR(ApplyActivation(a, 12.0f, -11.0f), -99.995460f, 1e-3);  // 10 sigmoid(10) * -10
  EXPECT_NEAR(ApplyActivation(a, -12.0f, 3.0f), -2.2119e-4f, 1e-7);   // gate not clamped below
  EXPECT_NEAR(ApplyActivation(a, 3.0f, 25.0f), 28.577223f, 1e-4);     // 3 sigmoid(3) * 10
}

TEST(ReferenceDequantize, EachFormatDecodesKnownCodes) {
  ExpertWeights w;
  w.num_experts_local = 1;
  w.hidden = 32;
  w.intermediate = 32;
  // fp8: code 0x38 = 1.0, 0xC4 = -3.0 (1.5 * 2^1); scale 0.5.
  std::vector<uint8_t> fp8(64 * 32, 0);
  fp8[0] = 0x38;
  fp8[1] = 0xC4;
  std::vector<float> fp8_scale = {0.5f};
  w.scheme = WeightScheme::Default(WeightFormat::kFp8Block);
  w.w13 = fp8.data();
  w.w13_scales = fp8_scale.data();
  EXPECT_EQ(reference::DequantizeWeight(w, reference::Projection::kW13, 0, 0, 0), 0.5f);
  EXPECT_EQ(reference::DequantizeWeight(w, reference::Projection::kW13, 0, 0, 1), -1.5f);
  // MXFP4: byte 0x72 = low code 2 (1.0), high code 7 (6.0); E8M0 126 = 0.5.
  std::vector<uint8_t> fp4(64 * 16, 0);
  fp4[0] = 0x72;
  std::vector<uint8_t> e8m0(64, 126);
  w.scheme = WeightScheme::Default(WeightFormat::kMxfp4);
  w.w13 = fp4.data();
  w.w13_scales = e8m0.data();
  EXPECT_EQ(reference::DequantizeWeight(w, reference::Projection::kW13, 0, 0, 0), 0.5f);
  EXPECT_EQ(reference::DequantizeWeight(w, reference::Projection::kW13, 0, 0, 1), 3.0f);
  // int4: byte 0x0F = low 15 - 8 = 7, high 0 - 8 = -8; bf16 scale 0.25.
  std::vector<uint8_t> i4(64 * 16, 0x88);
  i4[0] = 0x0F;
  std::vector<bf16_t> i4_scale(64, FloatToBf16(0.25f));
  w.scheme = WeightScheme::Default(WeightFormat::kInt4);
  w.w13 = i4.data();
  w.w13_scales = i4_scale.data();
  EXPECT_EQ(reference::DequantizeWeight(w, reference::Projection::kW13, 0, 0, 0), 1.75f);
  EXPECT_EQ(reference::DequantizeWeight(w, reference::Projection::kW13, 0, 0, 1), -2.0f);
  EXPECT_EQ(reference::DequantizeWeight(w, reference::Projection::kW13, 0, 0, 2), 0.0f);
  // int4-zp (AWQ/GPTQ): byte 0xA3 = low code 3, high code 10; zero 5; fp16 scale 0.5 (0x3800).
  // Row 1 (gate half, group 0) has zero 0 and scale 2.0 (0x4000).
  w.scheme = WeightScheme{WeightFormat::kInt4Zp, 32, 1};
  std::vector<uint8_t> zp(64 * 16, 0);
  zp[0] = 0xA3;
  zp[16] = 0x01;  // row 1, columns 0 and 1: codes 1 and 0
  std::vector<fp16_t> zp_scale(64, fp16_t{0x3800});
  zp_scale[1] = fp16_t{0x4000};
  std::vector<uint8_t> zeros(64, 5);
  zeros[1] = 0;
  w.w13 = zp.data();
  w.w13_scales = zp_scale.data();
  w.w13_zeros = zeros.data();
  EXPECT_EQ(reference::DequantizeWeight(w, reference::Projection::kW13, 0, 0, 0), -1.0f);
  EXPECT_EQ(reference::DequantizeWeight(w, reference::Projection::kW13, 0, 0, 1), 2.5f);
  EXPECT_EQ(reference::DequantizeWeight(w, reference::Projection::kW13, 0, 1, 0), 2.0f);
  EXPECT_EQ(reference::DequantizeWeight(w, reference::Projection::kW13, 0, 1, 1), 0.0f);
  // NVFP4: byte 0x7A = low code 10 (-1.0), high 7 (6.0); E4M3 0x40 = 2.0 for columns 0-15,
  // 0x30 = 0.5 for 16-31; globals 0.25 (gate rows) and 4.0 (up rows, from I = 32 on).
  w.scheme = WeightScheme::Default(WeightFormat::kNvfp4);
  std::vector<uint8_t> nv(64 * 16, 0);
  nv[0] = 0x7A;
  nv[8] = 0x11;        // columns 16, 17: codes 1, 1 (0.5)
  nv[32 * 16] = 0x02;  // row 32 (up), column 0: code 2 (1.0)
  std::vector<uint8_t> nv_scale(64 * 2, 0x40);
  for (int r = 0; r < 64; ++r) nv_scale[2 * static_cast<size_t>(r) + 1] = 0x30;
  std::vector<float> globals = {0.25f, 4.0f};
  w.w13 = nv.data();
  w.w13_scales = nv_scale.data();
  w.w13_global = globals.data();
  EXPECT_EQ(reference::DequantizeWeight(w, reference::Projection::kW13, 0, 0, 0), -0.5f);
  EXPECT_EQ(reference::DequantizeWeight(w, reference::Projection::kW13, 0, 0, 1), 3.0f);
  EXPECT_EQ(reference::DequantizeWeight(w, reference::Projection::kW13, 0, 0, 16), 0.0625f);
  EXPECT_EQ(reference::DequantizeWeight(w, reference::Projection::kW13, 0, 32, 0), 8.0f);
}

// The encoders of the AWQ/GPTQ and NVFP4 formats round-trip within their steps: int4-zp to half a
// step of its group ((max - min) / 15), NVFP4 to half an E2M1 step of the block's scale (at most
// 1 x scale x global near 6) plus the E4M3 rounding of the scale.
TEST(ReferenceDequantize, Int4ZpAndNvfp4EncodersRoundTrip) {
  std::vector<float> w(4 * 64);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(0.37f * static_cast<float>(i)) * 0.2f;
  w[7] = 1.5f;  // an outlier in one group
  {
    const WeightScheme q{WeightFormat::kInt4Zp, 32, 1};
    std::vector<uint8_t> data(static_cast<size_t>(q.WeightBytes(4, 64)));
    std::vector<uint8_t> scales(static_cast<size_t>(q.ScaleBytes(4, 64)));
    std::vector<uint8_t> zeros(static_cast<size_t>(q.ZeroBytes(4, 64)));
    EXPECT_EQ(zeros.size(), 8u);
    QuantizeMatrix(q, w.data(), 4, 64, data.data(), scales.data(), zeros.data());
    std::vector<float> row(64);
    for (int64_t r = 0; r < 4; ++r) {
      reference::DequantizeMatrixRow(q, data.data(), scales.data(), 4, 64, r, row.data(),
                                     zeros.data());
      for (int64_t c = 0; c < 64; ++c) {
        float lo = 0.0f, hi = 0.0f;
        for (int64_t i = c / 32 * 32; i < c / 32 * 32 + 32; ++i) {
          lo = std::min(lo, w[static_cast<size_t>(r * 64 + i)]);
          hi = std::max(hi, w[static_cast<size_t>(r * 64 + i)]);
        }
        EXPECT_NEAR(row[static_cast<size_t>(c)], w[static_cast<size_t>(r * 64 + c)],
                    0.51f * (hi - lo) / 15.0f + 1e-6f)
            << r << " " << c;
      }
    }
  }
  {
    const WeightScheme q = WeightScheme::Default(WeightFormat::kNvfp4);
    std::vector<uint8_t> data(static_cast<size_t>(q.WeightBytes(4, 64)));
    std::vector<uint8_t> scales(static_cast<size_t>(q.ScaleBytes(4, 64)));
    float global = 0.0f;
    QuantizeMatrix(q, w.data(), 4, 64, data.data(), scales.data(), nullptr, &global);
    EXPECT_FLOAT_EQ(global, 1.5f / (6.0f * 448.0f));
    std::vector<float> row(64);
    for (int64_t r = 0; r < 4; ++r) {
      reference::DequantizeMatrixRow(q, data.data(), scales.data(), 4, 64, r, row.data(), nullptr,
                                     global);
      for (int64_t c = 0; c < 64; ++c) {
        float amax = 0.0f;
        for (int64_t i = c / 16 * 16; i < c / 16 * 16 + 16; ++i) {
          amax = std::max(amax, std::abs(w[static_cast<size_t>(r * 64 + i)]));
        }
        // E2M1 steps are at most 2 (between 4 and 6) in units of amax / 6, the E4M3 scale rounds
        // by 1/16: half a step plus the scale's error at the largest value.
        EXPECT_NEAR(row[static_cast<size_t>(c)], w[static_cast<size_t>(r * 64 + c)],
                    amax / 6.0f * (1.0f + 6.0f / 16.0f) + 1e-6f)
            << r << " " << c;
      }
    }
  }
}

TEST(ReferenceGemm, TinySwiGluWithBiases) {
  // H = 2, I = 1. gate row [1, 2], up row [0.5, -1], down [[2], [-1]]; x = [1, 1].
  // gate = 3 + bias 0 = 3, up = -0.5 + bias 0 = -0.5 -> a = 3 sigmoid(3) (-0.5) = -1.4288612;
  // y = [2a, -a] + down bias [1, 0] (bias only on request).
  const std::vector<float> w13 = {1.0f, 2.0f, 0.5f, -1.0f};
  const std::vector<float> w2 = {2.0f, -1.0f};
  const std::vector<float> b13 = {0.0f, 0.0f};
  const std::vector<float> b2 = {1.0f, 0.0f};
  ExpertWeightsShape shape{.scheme = {}, .num_experts_local = 1, .hidden = 2, .intermediate = 1};
  OwnedExpertWeights ow = EncodeExpertWeights(shape, w13.data(), w2.data(), b13.data(), b2.data());
  const std::vector<float> x = {1.0f, 1.0f};
  const std::vector<int64_t> offsets = {0, 1};
  std::vector<float> y(2);
  GroupedGemmParams p;
  p.weights = &ow.view;
  p.x_sorted = x.data();
  p.x_dtype = DType::kF32;
  p.expert_offsets = offsets.data();
  p.y_sorted = y.data();
  p.add_down_bias = false;
  ASSERT_TRUE(reference::GroupedExpertGemm(p).ok());
  EXPECT_NEAR(y[0], -2.8577224f, 1e-5);
  EXPECT_NEAR(y[1], 1.4288612f, 1e-5);
  p.add_down_bias = true;
  ASSERT_TRUE(reference::GroupedExpertGemm(p).ok());
  EXPECT_NEAR(y[0], -1.8577224f, 1e-5);
}

TEST(ReferencePermute, HandExample) {
  // Tokens: t0 -> experts (1, 0), t1 -> (1, 2). Sorted: e0: (t0,s1); e1: (t0,s0), (t1,s0);
  // e2: (t1,s1).
  const std::vector<int32_t> ids = {1, 0, 1, 2};
  const std::vector<float> w = {0.6f, 0.4f, 0.7f, 0.3f};
  TokenPermutation perm;
  ASSERT_TRUE(reference::PermuteTokens(PermuteParams{.topk_ids = ids.data(),
                                                     .topk_weights = w.data(),
                                                     .num_tokens = 2,
                                                     .top_k = 2,
                                                     .num_experts_global = 3},
                                       &perm)
                  .ok());
  EXPECT_EQ(perm.expert_offsets, (std::vector<int64_t>{0, 1, 3, 4}));
  EXPECT_EQ(perm.sorted_token_idx, (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_EQ(perm.sorted_weights, (std::vector<float>{0.4f, 0.6f, 0.7f, 0.3f}));
  EXPECT_EQ(perm.slot_row, (std::vector<int32_t>{1, 0, 2, 3}));
}

}  // namespace
}  // namespace moeshard
