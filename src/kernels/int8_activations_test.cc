// Int8 activations (KernelContextOptions::int8_activations): every SIMD variant against the
// oracle (reference::Int8Inputs), at the kernel and at the grouped-GEMM level, the schemes it
// does not take left bit for bit as they were, and the portable kernels refused.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/kernels_test_util.h"
#include "moeshard/base/numeric.h"
#include "moeshard/kernels/expert_gemm.h"
#include "moeshard/kernels/moe_forward.h"
#include "moeshard/kernels/quantize.h"
#include "moeshard/kernels/reference.h"

namespace moeshard {
namespace {

using testing::Randn;

struct Scheme {
  WeightFormat format;
  int64_t group;
};
constexpr Scheme kInt8Schemes[] = {{WeightFormat::kMxfp4, 32},
                                   {WeightFormat::kInt4, 32},
                                   {WeightFormat::kInt4, 64},
                                   {WeightFormat::kInt4, 128},
                                   {WeightFormat::kNvfp4, 16}};

WeightScheme SchemeOf(WeightFormat format, int64_t group) {
  WeightScheme q = WeightScheme::Default(format);
  q.group = group;
  return q;
}

// One expert, ungated: w13 is [inter, hidden] of randn / 10.
OwnedExpertWeights OneExpert(const WeightScheme& q, int64_t hidden, int64_t inter, uint64_t seed) {
  const ExpertWeightsShape s{
      .scheme = q, .num_experts_local = 1, .hidden = hidden, .intermediate = inter, .gated = false};
  const std::vector<float> w13 = Randn(inter * hidden, seed, 0.1f);
  const std::vector<float> w2 = Randn(hidden * inter, seed + 1, 0.1f);
  return EncodeExpertWeights(s, w13.data(), w2.data(), nullptr, nullptr);
}

// randn / 2 inputs with, per token, an outlier in group 0, a group of zeros and a group of tiny
// values (where the columns reach them).
std::vector<bf16_t> Inputs(int64_t tokens, int64_t cols, uint64_t seed) {
  std::vector<float> f = Randn(tokens * cols, seed, 0.5f);
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = f.data() + t * cols;
    row[5] *= 100.0f;
    if (cols >= 64) std::fill(row + 32, row + 64, 0.0f);
    for (int64_t c = 64; c < std::min<int64_t>(cols, 96); ++c) row[c] *= 1e-30f;
  }
  std::vector<bf16_t> x(f.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = FloatToBf16(f[i]);
  return x;
}

// The SIMD variants this CPU runs (AVX-512 BF16 CPUs run int8 inputs on the avx512 kernels).
std::vector<CpuIsa> Int8Isas() {
  std::vector<CpuIsa> v;
  for (CpuIsa isa : SupportedCpuIsas()) {
    if (isa != CpuIsa::kPortable && isa != CpuIsa::kAvx512Bf16) v.push_back(isa);
  }
  return v;
}

// Each variant's dot_rows with int8 inputs against the oracle in double, at token counts of the
// integer decode walk (<= 16) and of the decoded strips, for K with and without a partial
// chunk. The tolerance is fp32 summation (1e-5 of the sum of magnitudes); the int8 rounding
// itself is checked to be far larger, so the test sees whether the inputs were quantized.
TEST(Int8Activations, DotRowsMatchTheOracleOnEverySimdVariant) {
  const std::vector<CpuIsa> isas = Int8Isas();
  ASSERT_FALSE(isas.empty()) << "no SIMD variant on this CPU";
  for (const Scheme& sc : kInt8Schemes) {
    for (int64_t cols : {sc.group * 3, int64_t{256}, int64_t{2048}}) {
      const WeightScheme q = SchemeOf(sc.format, sc.group);
      const OwnedExpertWeights ow = OneExpert(q, cols, 128, 70 + cols);
      const internal::MatrixRef m = internal::ExpertMatrix(ow.view, true, 0);
      std::vector<int32_t> rows(13);
      for (int i = 0; i < 13; ++i) rows[i] = 9 * i + 1;
      std::vector<std::vector<double>> w(rows.size(), std::vector<double>(cols));
      for (size_t j = 0; j < rows.size(); ++j) {
        for (int64_t c = 0; c < cols; ++c) {
          w[j][c] =
              reference::DequantizeWeight(ow.view, reference::Projection::kW13, 0, rows[j], c);
        }
      }
      for (int64_t tokens : {1, 2, 3, 5, 8, 16, 17, 40}) {
        const std::vector<bf16_t> x = Inputs(tokens, cols, 80 + tokens);
        for (CpuIsa isa : isas) {
          const std::vector<float> out =
              testing::RunDotRows(*internal::SimdBackendFor(isa), m, x, tokens, rows, true);
          double worst_int8 = 0.0;  // the largest int8 rounding effect, in tolerances
          for (int64_t t = 0; t < tokens; ++t) {
            std::vector<float> xf(cols);
            for (int64_t c = 0; c < cols; ++c) xf[c] = Bf16ToFloat(x[t * cols + c]);
            std::vector<double> xq(cols);
            reference::Int8Inputs(xf.data(), cols, sc.group, xq.data());
            for (size_t j = 0; j < rows.size(); ++j) {
              double want = 0.0, mag = 0.0, exact = 0.0;
              for (int64_t c = 0; c < cols; ++c) {
                want += xq[c] * w[j][c];
                mag += std::abs(xq[c] * w[j][c]);
                exact += xf[c] * w[j][c];
              }
              const double tol = 1e-5 * mag;
              EXPECT_NEAR(out[t * rows.size() + j], want, tol)
                  << fmt::format("{} {} g{} K{} tokens {} token {} row {}", CpuIsaName(isa),
                                 WeightFormatName(sc.format), sc.group, cols, tokens, t, rows[j]);
              worst_int8 = std::max(worst_int8, std::abs(exact - want) / tol);
            }
          }
          EXPECT_GT(worst_int8, 10.0) << "int8 rounding not visible: " << CpuIsaName(isa);
        }
      }
    }
  }
}

// An infinity in a token's inputs makes that token's outputs NaN (its group's scale is NaN, as
// the oracle's), and leaves the other tokens finite, at decode-walk and strip token counts.
TEST(Int8Activations, NonFiniteInputsPropagate) {
  const WeightScheme q = SchemeOf(WeightFormat::kMxfp4, 32);
  const OwnedExpertWeights ow = OneExpert(q, 256, 64, 90);
  const internal::MatrixRef m = internal::ExpertMatrix(ow.view, true, 0);
  std::vector<int32_t> rows(8);
  std::iota(rows.begin(), rows.end(), 0);
  for (int64_t tokens : {3, 20}) {
    std::vector<bf16_t> x = Inputs(tokens, 256, 91);
    x[1 * 256 + 40] = FloatToBf16(INFINITY);  // token 1, group 1
    for (CpuIsa isa : Int8Isas()) {
      const std::vector<float> out =
          testing::RunDotRows(*internal::SimdBackendFor(isa), m, x, tokens, rows, true);
      for (int64_t t = 0; t < tokens; ++t) {
        for (size_t j = 0; j < rows.size(); ++j) {
          const float v = out[t * rows.size() + j];
          EXPECT_EQ(std::isnan(v), t == 1) << CpuIsaName(isa) << " tokens " << tokens << " token "
                                           << t << " row " << j << ": " << v;
        }
      }
    }
  }
}

// MXFP4 scale codes 0 (2^-127) and 255 (NaN) with int8 inputs: the four-row decode takes the
// scales as raw bytes only where a step's four rows hold neither (else floats). Its transpose
// takes 16 groups, then 8, then single groups, so K is 16, 8, 3 and 27 groups, with row 0 at
// 2^-127 throughout (its inputs x 2^90 keep its dot products normal floats), row 1 NaN in the
// last group and row 2 in the first, each in a step of its own (rows r, r + 4, ...), and row 3's
// step with neither. NaN rows stay NaN, the others match the oracle.
TEST(Int8Activations, Mxfp4EveryScaleCode) {
  constexpr int64_t kRows = 16;
  for (int64_t groups : {16, 8, 3, 27}) {
    const int64_t cols = 32 * groups;
    std::vector<uint8_t> codes(kRows * cols / 2), scales(kRows * groups);
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 2654435761u >> 7);
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(110 + i % 23);
    std::fill(scales.begin(), scales.begin() + groups, uint8_t{0});
    scales[1 * groups + groups - 1] = 255;
    scales[2 * groups] = 255;
    const internal::MatrixRef m = testing::Mxfp4Matrix(codes, scales, kRows, cols);
    std::vector<int32_t> rows(kRows);
    std::iota(rows.begin(), rows.end(), 0);
    for (int64_t tokens : {1, 3, 8}) {
      std::vector<bf16_t> x = Inputs(tokens, cols, 95 + tokens);
      for (bf16_t& v : x) v = FloatToBf16(Bf16ToFloat(v) * 0x1p90f);
      for (CpuIsa isa : Int8Isas()) {
        const std::vector<float> out =
            testing::RunDotRows(*internal::SimdBackendFor(isa), m, x, tokens, rows, true);
        for (int64_t t = 0; t < tokens; ++t) {
          std::vector<float> xf(cols);
          for (int64_t c = 0; c < cols; ++c) xf[c] = Bf16ToFloat(x[t * cols + c]);
          std::vector<double> xq(cols);
          reference::Int8Inputs(xf.data(), cols, 32, xq.data());
          for (int64_t r = 0; r < kRows; ++r) {
            double want = 0.0, mag = 0.0;
            for (int64_t c = 0; c < cols; ++c) {
              const uint8_t byte = codes[r * cols / 2 + c / 2];
              const double w = static_cast<double>(Fp4E2M1ToFloat(c % 2 ? byte >> 4 : byte)) *
                               E8M0ToFloat(scales[r * groups + c / 32]);
              want += xq[c] * w;
              mag += std::abs(xq[c] * w);
            }
            const float got = out[t * kRows + r];
            const std::string what = fmt::format("{} K {} groups, tokens {} token {} row {}",
                                                 CpuIsaName(isa), groups, tokens, t, r);
            if (r == 1 || r == 2) {
              EXPECT_TRUE(std::isnan(got)) << what << ": " << got;
            } else {
              ASSERT_GT(std::abs(want), 0x1p-60) << what;  // row 0 too: a normal float
              EXPECT_NEAR(got, want, 1e-5 * mag) << what;
            }
          }
        }
      }
    }
  }
}

// Four gated experts of [2 x 128, 256] and [256, 128], randn / 10 from `seed`.
OwnedExpertWeights FourExperts(const WeightScheme& q, uint64_t seed) {
  constexpr int64_t kHidden = 256, kInter = 128;
  const ExpertWeightsShape s{.scheme = q,
                             .num_experts_local = 4,
                             .hidden = kHidden,
                             .intermediate = kInter,
                             .gated = true};
  const std::vector<float> w13 = Randn(4 * 2 * kInter * kHidden, seed, 0.1f);
  const std::vector<float> w2 = Randn(4 * kHidden * kInter, seed + 1, 0.1f);
  return EncodeExpertWeights(s, w13.data(), w2.data(), nullptr, nullptr);
}

struct GemmRun {
  std::vector<float> y, want, exact;
};

// A gated SwiGLU grouped GEMM (4 experts with 1, 3, 16 and 40 tokens) on `isa` with int8
// activations, and the reference with and without them.
GemmRun RunGemm(CpuIsa isa, const WeightScheme& q, bool int8) {
  constexpr int64_t kHidden = 256;
  const std::vector<int64_t> offsets = {0, 1, 4, 20, 60};
  const OwnedExpertWeights ow = FourExperts(q, 31);
  const std::vector<bf16_t> x = Inputs(offsets.back(), kHidden, 33);
  GemmRun r;
  r.y.assign(static_cast<size_t>(offsets.back() * kHidden), -7.0f);
  GroupedGemmParams p;
  p.weights = &ow.view;
  p.x_sorted = x.data();
  p.x_dtype = DType::kBF16;
  p.expert_offsets = offsets.data();
  p.y_sorted = r.y.data();
  Result<KernelContext> ctx =
      KernelContext::Create({.num_threads = 2, .isa = isa, .int8_activations = int8});
  EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
  const Status st = GroupedExpertGemm(*ctx, p);
  EXPECT_TRUE(st.ok()) << st.ToString();
  r.want.assign(r.y.size(), 0.0f);
  r.exact.assign(r.y.size(), 0.0f);
  p.y_sorted = r.want.data();
  EXPECT_TRUE(reference::GroupedExpertGemm(p, true).ok());
  p.y_sorted = r.exact.data();
  EXPECT_TRUE(reference::GroupedExpertGemm(p).ok());
  return r;
}

double MeanAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += std::abs(static_cast<double>(a[i]) - b[i]);
  return s / static_cast<double>(a.size());
}

// The whole expert (inputs and activations quantized) on every SIMD variant and on AVX-512 BF16
// CPUs' default: near the int8 oracle, several times nearer than to the bf16 reference.
TEST(Int8Activations, GroupedGemmMatchesTheOracle) {
  std::vector<CpuIsa> isas = Int8Isas();
  if (CpuSupportsIsa(CpuIsa::kAvx512Bf16)) isas.push_back(CpuIsa::kAvx512Bf16);
  for (const Scheme& sc : kInt8Schemes) {
    const WeightScheme q = SchemeOf(sc.format, sc.group);
    for (CpuIsa isa : isas) {
      const GemmRun r = RunGemm(isa, q, true);
      const std::string what =
          fmt::format("{} {} g{}", CpuIsaName(isa), WeightFormatName(sc.format), sc.group);
      const double scale = testing::MeanAbs(r.want);
      ASSERT_GT(scale, 0.02) << what;
      const double to_oracle = MeanAbsDiff(r.y, r.want) / scale;
      const double to_exact = MeanAbsDiff(r.y, r.exact) / scale;
      // The activations' bf16 rounding is the same on both sides, save where the two round a
      // value on either side of a bf16 (or int8) step.
      EXPECT_LT(to_oracle, 2e-4) << what;
      EXPECT_GT(to_exact, 5 * to_oracle) << what;
    }
  }
}

// The routed experts of a layer (top-2 of 4 experts, weighted), as `moeshard run` calls them:
// the kernels with int8 activations against reference::MoeExpertsForward with them.
TEST(Int8Activations, MoeExpertsForwardMatchesTheOracle) {
  constexpr int64_t kTokens = 24, kHidden = 256, kTopK = 2;
  const OwnedExpertWeights ow = FourExperts(SchemeOf(WeightFormat::kMxfp4, 32), 41);
  const std::vector<bf16_t> x = Inputs(kTokens, kHidden, 43);
  std::vector<int32_t> ids(kTokens * kTopK);
  std::vector<float> weights(ids.size());
  for (int64_t t = 0; t < kTokens; ++t) {
    ids[t * kTopK] = static_cast<int32_t>(t % 4);
    ids[t * kTopK + 1] = static_cast<int32_t>((t / 4 + 1 + t % 4) % 4);
    weights[t * kTopK] = 0.75f;
    weights[t * kTopK + 1] = 0.25f;
  }
  MoeExpertsParams p;
  p.topk_ids = ids.data();
  p.topk_weights = weights.data();
  p.num_tokens = kTokens;
  p.top_k = kTopK;
  p.num_experts_global = 4;
  p.x = x.data();
  p.x_dtype = DType::kBF16;
  p.weights = &ow.view;
  std::vector<float> want(kTokens * kHidden), exact(want.size());
  p.out = want.data();
  ASSERT_TRUE(reference::MoeExpertsForward(p, true).ok());
  p.out = exact.data();
  ASSERT_TRUE(reference::MoeExpertsForward(p).ok());
  for (CpuIsa isa : SupportedCpuIsas()) {
    if (isa == CpuIsa::kPortable) continue;
    Result<KernelContext> ctx = KernelContext::Create({.isa = isa, .int8_activations = true});
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    std::vector<float> got(want.size(), -7.0f);
    p.out = got.data();
    ASSERT_TRUE(MoeExpertsForward(*ctx, p).ok());
    const double scale = testing::MeanAbs(want);
    EXPECT_LT(MeanAbsDiff(got, want) / scale, 2e-4) << CpuIsaName(isa);
    EXPECT_GT(MeanAbsDiff(got, exact), 5 * MeanAbsDiff(got, want)) << CpuIsaName(isa);
  }
}

// Schemes Int8ActivationScheme does not take compute exactly as without int8 activations.
TEST(Int8Activations, OtherSchemesUnchanged) {
  const WeightScheme others[] = {WeightScheme::Default(WeightFormat::kBf16),
                                 WeightScheme::Default(WeightFormat::kFp8Block),
                                 WeightScheme::Default(WeightFormat::kInt4Zp)};
  for (const WeightScheme& q : others) {
    EXPECT_FALSE(Int8ActivationScheme(q)) << WeightFormatName(q.format) << " g" << q.group;
    for (CpuIsa isa : SupportedCpuIsas()) {
      if (isa == CpuIsa::kPortable) continue;
      EXPECT_EQ(RunGemm(isa, q, true).y, RunGemm(isa, q, false).y)
          << CpuIsaName(isa) << " " << WeightFormatName(q.format);
    }
  }
}

// KernelContext::int8_isa names the variant whose kernels take the int8 inputs: the context's
// own, except avx512-bf16, whose int8 experts give the same bits as on the variant it names.
TEST(Int8Activations, ContextNamesTheVariantThatRunsThem) {
  for (CpuIsa isa : SupportedCpuIsas()) {
    if (isa == CpuIsa::kPortable) continue;
    Result<KernelContext> ctx = KernelContext::Create({.isa = isa, .int8_activations = true});
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    if (isa != CpuIsa::kAvx512Bf16) {
      EXPECT_EQ(ctx->int8_isa(), isa) << CpuIsaName(isa);
      continue;
    }
    const CpuIsa runs = ctx->int8_isa();
    EXPECT_TRUE(runs == CpuIsa::kAvx512Vnni || runs == CpuIsa::kAvx512) << CpuIsaName(runs);
    const WeightScheme q = SchemeOf(WeightFormat::kMxfp4, 32);
    EXPECT_EQ(RunGemm(isa, q, true).y, RunGemm(runs, q, true).y) << CpuIsaName(runs);
    EXPECT_NE(RunGemm(isa, q, true).y, RunGemm(isa, q, false).y);
  }
}

TEST(Int8Activations, PortableKernelsRefuseThem) {
  Result<KernelContext> ctx =
      KernelContext::Create({.isa = CpuIsa::kPortable, .int8_activations = true});
  ASSERT_FALSE(ctx.ok());
  EXPECT_NE(ctx.status().message().find("int8_activations"), std::string::npos)
      << ctx.status().ToString();
}

// The oracle's rounding: d = max|x| / 127, ties to even, NaN and zero groups.
TEST(Int8Activations, OracleRoundsAsSpecified) {
  const float x[4] = {127.0f, 0.5f, 1.5f, -2.5f};  // d = 1
  double out[4];
  reference::Int8Inputs(x, 4, 4, out);
  EXPECT_EQ(out[0], 127.0);
  EXPECT_EQ(out[1], 0.0);
  EXPECT_EQ(out[2], 2.0);
  EXPECT_EQ(out[3], -2.0);
  const float y[4] = {0.0f, 0.0f, 1.0f, NAN};
  reference::Int8Inputs(y, 4, 2, out);
  EXPECT_EQ(out[0], 0.0);
  EXPECT_EQ(out[1], 0.0);
  EXPECT_TRUE(std::isnan(out[2]) && std::isnan(out[3]));
}

}  // namespace
}  // namespace moeshard
