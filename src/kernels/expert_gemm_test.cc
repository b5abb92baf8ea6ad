// Grouped expert GEMM: every backend against the reference, for every activation and weight
// format, odd sizes, experts without tokens, misaligned pointers, zero padding and bad input.
#include "moeshard/kernels/expert_gemm.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <span>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/kernels_test_util.h"
#include "moeshard/base/numeric.h"
#include "moeshard/kernels/kernel_backend.h"
#include "moeshard/kernels/quantize.h"
#include "moeshard/kernels/reference.h"

namespace moeshard {
namespace {

using testing::Close;
using testing::MakeContext;
using testing::Mxfp4Matrix;
using testing::Randn;
using testing::RunDotRows;
using testing::TestIsas;
using testing::Tolerance;

struct GemmCase {
  WeightFormat format = WeightFormat::kBf16;
  Activation act = Activation::kSwiGlu;
  int64_t num_experts = 8;
  int64_t hidden = 100;
  int64_t inter = 40;
  bool interleaved = false;
  bool bias = false;
  int64_t group = 32;   // int4 group
  int64_t block = 128;  // fp8 block (rows and columns)

  std::string Name() const {
    return fmt::format("{}/{} E{} H{} I{}{}{} g{} b{}", WeightFormatName(format),
                       ActivationName(act), num_experts, hidden, inter,
                       interleaved ? " interleaved" : "", bias ? " bias" : "", group, block);
  }
  int64_t Rows13() const { return IsGated(act) ? 2 * inter : inter; }
};

WeightScheme SchemeOf(const GemmCase& c) {
  WeightScheme q = WeightScheme::Default(c.format);
  if (c.format == WeightFormat::kInt4 || c.format == WeightFormat::kInt4Zp) q.group = c.group;
  if (c.format == WeightFormat::kFp8Block) q.group = q.block_rows = c.block;
  return q;
}

// Logical fp32 weights, optionally embedded into a larger zero-padded physical shape.
struct FloatWeights {
  std::vector<float> w13, w2, b13, b2;
};

FloatWeights RandomWeights(const GemmCase& c, uint64_t seed) {
  FloatWeights f;
  f.w13 = Randn(c.num_experts * c.Rows13() * c.hidden, seed, 0.1f);
  f.w2 = Randn(c.num_experts * c.hidden * c.inter, seed + 1, 0.1f);
  if (c.bias) {
    f.b13 = Randn(c.num_experts * c.Rows13(), seed + 2, 0.1f);
    f.b2 = Randn(c.num_experts * c.hidden, seed + 3, 0.1f);
  }
  return f;
}

// Zero-pads logical weights of case `c` to the physical sizes of case `p` (same layout rules).
FloatWeights Pad(const GemmCase& c, const GemmCase& p, const FloatWeights& f) {
  FloatWeights o;
  o.w13.assign(static_cast<size_t>(p.num_experts * p.Rows13() * p.hidden), 0.0f);
  o.w2.assign(static_cast<size_t>(p.num_experts * p.hidden * p.inter), 0.0f);
  auto row13 = [&](const GemmCase& g, int64_t logical_row) {   // physical row of a logical row
    if (!IsGated(g.act) || g.interleaved) return logical_row;  // interleaved pairs stay pairs
    return logical_row < c.inter ? logical_row : logical_row - c.inter + g.inter;
  };
  for (int64_t e = 0; e < c.num_experts; ++e) {
    for (int64_t r = 0; r < c.Rows13(); ++r) {
      for (int64_t col = 0; col < c.hidden; ++col) {
        o.w13[static_cast<size_t>((e * p.Rows13() + row13(p, r)) * p.hidden + col)] =
            f.w13[static_cast<size_t>((e * c.Rows13() + r) * c.hidden + col)];
      }
    }
    for (int64_t r = 0; r < c.hidden; ++r) {
      for (int64_t col = 0; col < c.inter; ++col) {
        o.w2[static_cast<size_t>((e * p.hidden + r) * p.inter + col)] =
            f.w2[static_cast<size_t>((e * c.hidden + r) * c.inter + col)];
      }
    }
  }
  if (!f.b13.empty()) {
    o.b13.assign(static_cast<size_t>(p.num_experts * p.Rows13()), 0.0f);
    o.b2.assign(static_cast<size_t>(p.num_experts * p.hidden), 0.0f);
    for (int64_t e = 0; e < c.num_experts; ++e) {
      for (int64_t r = 0; r < c.Rows13(); ++r) {
        o.b13[static_cast<size_t>(e * p.Rows13() + row13(p, r))] =
            f.b13[static_cast<size_t>(e * c.Rows13() + r)];
      }
      for (int64_t r = 0; r < c.hidden; ++r) {
        o.b2[static_cast<size_t>(e * p.hidden + r)] = f.b2[static_cast<size_t>(e * c.hidden + r)];
      }
    }
  }
  return o;
}

OwnedExpertWeights Encode(const GemmCase& c, const FloatWeights& f) {
  ExpertWeightsShape s{.scheme = SchemeOf(c),
                       .num_experts_local = c.num_experts,
                       .hidden = c.hidden,
                       .intermediate = c.inter,
                       .gated = IsGated(c.act),
                       .gate_up_interleaved = c.interleaved};
  return EncodeExpertWeights(s, f.w13.data(), f.w2.data(), f.b13.empty() ? nullptr : f.b13.data(),
                             f.b2.empty() ? nullptr : f.b2.data());
}

// Rows per expert for `tokens` tokens with top-k `k`, leaving experts 1 and 5 without tokens
// (when there are more than 6 experts).
std::vector<int64_t> Offsets(int64_t num_experts, int64_t tokens, int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> counts(static_cast<size_t>(num_experts), 0);
  for (int64_t i = 0; i < tokens * k; ++i) {
    int64_t e;
    do {
      e = static_cast<int64_t>(rng() % static_cast<uint64_t>(num_experts));
    } while (num_experts > 6 && (e == 1 || e == 5));
    ++counts[static_cast<size_t>(e)];
  }
  std::vector<int64_t> offsets = {0};
  for (int64_t c : counts) offsets.push_back(offsets.back() + c);
  return offsets;
}

struct RunOptions {
  DType x_dtype = DType::kF32;
  bool misalign = false;  // shift x, y and the weight data by one element off the vector width
  bool add_down_bias = true;
  int threads = 2;
  KernelContext* ctx = nullptr;  // reuse this context (its scratch) instead of a fresh one
  bool gather = false;           // pass the rows in reverse order with x_rows mapping them back
  bool row_groups = false;       // bf16 weights repacked into the row-group layout
};

// Runs the backend on x and returns y; `ref` (when non-null) receives the reference result.
std::vector<float> RunGemm(CpuIsa isa, const ExpertWeights& w, const ActivationParams& act,
                           const std::vector<int64_t>& offsets, const std::vector<float>& x,
                           const RunOptions& o, std::vector<float>* ref) {
  const int64_t rows = offsets.back();
  const size_t shift = o.misalign ? 1 : 0;
  std::vector<float> xf(x.size() + shift);
  std::copy(x.begin(), x.end(), xf.begin() + static_cast<std::ptrdiff_t>(shift));
  std::vector<bf16_t> xb(x.size() + shift);
  for (size_t i = 0; i < x.size(); ++i) xb[i + shift] = FloatToBf16(x[i]);
  std::vector<int32_t> x_rows;
  if (o.gather) {  // physical row rows-1-r holds grouped row r
    std::vector<float> xr(xf.size());
    std::vector<bf16_t> xbr(xb.size());
    for (int64_t r = 0; r < rows; ++r) {
      x_rows.push_back(static_cast<int32_t>(rows - 1 - r));
      for (int64_t c = 0; c < w.hidden; ++c) {
        const size_t from = shift + static_cast<size_t>(r * w.hidden + c);
        const size_t to = shift + static_cast<size_t>((rows - 1 - r) * w.hidden + c);
        xr[to] = xf[from];
        xbr[to] = xb[from];
      }
    }
    xf = std::move(xr);
    xb = std::move(xbr);
  }
  const void* xp = o.x_dtype == DType::kF32 ? static_cast<const void*>(xf.data() + shift)
                                            : static_cast<const void*>(xb.data() + shift);
  // y starts on a 64-byte line (unless misaligned), so the AVX-512 transposed store's
  // non-temporal whole-line path runs wherever a token row's 16 outputs fill a line.
  std::vector<float> y_buf(static_cast<size_t>(rows * w.hidden) + shift + 16, -7.0f);
  const size_t line_off =
      (64 - reinterpret_cast<uintptr_t>(y_buf.data()) % 64) % 64 / sizeof(float);
  const std::span<float> y(y_buf.data() + line_off, static_cast<size_t>(rows * w.hidden) + shift);
  GroupedGemmParams p;
  p.weights = &w;
  p.activation = act;
  p.x_sorted = xp;
  p.x_dtype = o.x_dtype;
  p.x_rows = o.gather ? x_rows.data() : nullptr;
  p.expert_offsets = offsets.data();
  p.y_sorted = y.data() + shift;
  p.add_down_bias = o.add_down_bias;
  KernelContext fresh = MakeContext(isa, o.threads);
  const Status s = GroupedExpertGemm(o.ctx != nullptr ? *o.ctx : fresh, p);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (ref != nullptr) {
    ref->assign(static_cast<size_t>(rows * w.hidden), 0.0f);
    p.y_sorted = ref->data();
    EXPECT_TRUE(reference::GroupedExpertGemm(p).ok());
  }
  return std::vector<float>(y.begin() + static_cast<std::ptrdiff_t>(shift), y.end());
}

// Copies the weight data into buffers shifted by `bytes` (misaligned for vector loads).
struct ShiftedWeights {
  std::vector<uint8_t> w13, w2;
  ExpertWeights view;
};
ShiftedWeights Shift(const OwnedExpertWeights& ow, size_t bytes) {
  ShiftedWeights s;
  s.w13.resize(ow.w13.size() + bytes);
  s.w2.resize(ow.w2.size() + bytes);
  std::memcpy(s.w13.data() + bytes, ow.w13.data(), ow.w13.size());
  std::memcpy(s.w2.data() + bytes, ow.w2.data(), ow.w2.size());
  s.view = ow.view;
  s.view.w13 = s.w13.data() + bytes;
  s.view.w2 = s.w2.data() + bytes;
  return s;
}

// Inputs randn * 0.5 and weights randn / 10 give gate/up values of order 1 and outputs of order
// 0.1-1: large enough that the absolute tolerance is meaningful, small enough that bf16
// rounding of the intermediate activation stays inside it.
constexpr float kInputScale = 0.5f;

Tolerance TolFor(WeightFormat f) {
  // bf16 weights: vLLM's atol 2e-2 on randn/10 data. Quantised weights are compared with the
  // reference dequantising the same codes, so only activation rounding to bf16 differs: the
  // mean relative error must stay small.
  return f == WeightFormat::kBf16 ? Tolerance{2e-2, 1e-2} : Tolerance{2e-2, 5e-3};
}

void CheckOffsets(const GemmCase& c, const std::vector<int64_t>& offsets, uint64_t seed,
                  const RunOptions& o, const std::string& label) {
  const FloatWeights f = RandomWeights(c, seed);
  OwnedExpertWeights ow = Encode(c, f);
  if (o.row_groups) {
    KernelContext ctx = MakeContext(CpuIsa::kAuto, 2);
    const Status s = RepackBf16RowGroups(ctx, &ow.view, ow.w13.data(), ow.w2.data());
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  ShiftedWeights sw;
  const ExpertWeights* w = &ow.view;
  if (o.misalign) {
    sw = Shift(ow, 2);
    w = &sw.view;
  }
  // Long reductions get smaller inputs so gate/up stay of order 1.
  const float scale = kInputScale * static_cast<float>(std::min(
                                        1.0, std::sqrt(256.0 / static_cast<double>(c.hidden))));
  const std::vector<float> x = Randn(offsets.back() * c.hidden, seed + 8, scale);
  ActivationParams act;
  act.kind = c.act;
  // Gate and up are of order 1: a small limit makes DeepSeek-V4's clamps bite.
  if (c.act == Activation::kSwiGluClamp) act.swiglu_limit = 0.6f;
  for (CpuIsa isa : TestIsas()) {
    std::vector<float> want;
    const std::vector<float> got = RunGemm(isa, *w, act, offsets, x, o, &want);
    // The comparison must be meaningful: outputs well away from 0 (the mean relative error
    // check then catches any systematic error).
    ASSERT_GT(testing::MeanAbs(want), 0.02) << c.Name();
    EXPECT_TRUE(Close(
        got, want, TolFor(c.format),
        fmt::format("{} {} {}{}{}{}{}", CpuIsaName(isa), c.Name(), label,
                    o.misalign ? " misaligned" : "", o.x_dtype == DType::kBF16 ? " x bf16" : "",
                    o.gather ? " gathered" : "", o.row_groups ? " row groups" : ""),
        seed));
  }
}

void CheckCase(const GemmCase& c, int64_t tokens, int64_t k, uint64_t seed, const RunOptions& o) {
  CheckOffsets(c, Offsets(c.num_experts, tokens, k, seed + 7), seed, o,
               fmt::format("T{} k{}", tokens, k));
}

constexpr Activation kAllActivations[] = {Activation::kSwiGlu,        Activation::kSwiGluOai,
                                          Activation::kSiTu,          Activation::kReluSquared,
                                          Activation::kGeluTanhGated, Activation::kSwiGluClamp};

TEST(GroupedGemm, Bf16EveryActivationAndTokenCount) {
  for (Activation act : kAllActivations) {
    for (int64_t tokens : {1, 3, 33, 511}) {
      GemmCase c{.format = WeightFormat::kBf16, .act = act};
      CheckCase(c, tokens, 2, 100 + tokens, {});
    }
  }
}

// Experts with 16 or more rows take the packed (prefill) path with tokens in groups of 16 (bf16,
// MXFP4, fp8-block and int4 weights, on backends that have it: AVX-512), the others the
// dot-product path. An
// expert's last n % 16 tokens, when at most kPackedMaxRem (8), are not padded into a group but
// multiplied unpacked on each L1-resident weight strip. Row counts on both sides of the
// thresholds and of group edges, odd H and I (each row ends in half a column pair), biases, fp32
// and bf16 inputs, misalignment.
// Group tilings of the AVX-512 packed kernel (3 groups a tile, never 3 + 1): 1, 2, 3, 2+2, 3+2,
// 3+2+2. Unpacked remainders: 17, 24 (8, the most), 33, 259 (two token blocks of 256, the second
// only the 3 unpacked tokens); padded: 25 (9), 31.
const std::vector<int64_t> kPackedCounts = {0, 1, 15, 16, 17, 24, 25, 31, 33, 64, 80, 112, 259};
constexpr const char* kCounts = "counts 0/1/15/16/17/24/25/31/33/64/80/112/259";

std::vector<int64_t> OffsetsOf(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets = {0};
  for (int64_t n : counts) offsets.push_back(offsets.back() + n);
  return offsets;
}

TEST(GroupedGemm, PackedPathGroupEdgesOddSizesAndBiases) {
  const std::vector<int64_t>& counts = kPackedCounts;
  const std::vector<int64_t> offsets = OffsetsOf(counts);
  for (Activation act : kAllActivations) {
    GemmCase c{.format = WeightFormat::kBf16,
               .act = act,
               .num_experts = static_cast<int64_t>(counts.size()),
               .hidden = 67,
               .inter = 37,
               .interleaved = act == Activation::kSwiGluOai,
               .bias = true};
    CheckOffsets(c, offsets, 500, {}, kCounts);
    CheckOffsets(c, offsets, 501, {.x_dtype = DType::kBF16, .misalign = true}, kCounts);
    CheckOffsets(c, offsets, 507, {.gather = true}, kCounts);
    CheckOffsets(c, offsets, 508, {.x_dtype = DType::kBF16, .gather = true}, kCounts);
  }
  // MXFP4 takes the packed path too (decoded a strip at a time, scale folded in exactly); the
  // reference dequantises the same codes, and 1100-column rows span several K blocks.
  for (Activation act : {Activation::kSwiGlu, Activation::kSwiGluOai}) {
    GemmCase c{.format = WeightFormat::kMxfp4,
               .act = act,
               .num_experts = static_cast<int64_t>(counts.size()),
               .hidden = 96,
               .inter = 64,
               .interleaved = act == Activation::kSwiGluOai,
               .bias = true};
    CheckOffsets(c, offsets, 509, {.gather = true}, kCounts);
  }
  GemmCase m{.format = WeightFormat::kMxfp4, .num_experts = 2, .hidden = 1120 * 2, .inter = 96};
  CheckOffsets(m, {0, 40, 73}, 510, {}, "counts 40/33, H 2240");
  // Scratch reused from another call must not leak into the padding of the next one: the first
  // call's inputs are infinite, so its activations are NaN wherever it wrote them.
  for (CpuIsa isa : TestIsas()) {
    KernelContext ctx = MakeContext(isa, 2);
    GemmCase big{.format = WeightFormat::kBf16,
                 .num_experts = static_cast<int64_t>(counts.size()),
                 .hidden = 67,
                 .inter = 38};
    const FloatWeights fb = RandomWeights(big, 503);
    const OwnedExpertWeights wb = Encode(big, fb);
    ActivationParams act;
    const std::vector<float> xb(static_cast<size_t>(offsets.back() * big.hidden),
                                std::numeric_limits<float>::infinity());
    RunGemm(isa, wb.view, act, offsets, xb, {.ctx = &ctx}, nullptr);
    GemmCase small = big;
    small.inter = 37;
    const FloatWeights fs = RandomWeights(small, 505);
    const OwnedExpertWeights ws = Encode(small, fs);
    const std::vector<float> xs = Randn(offsets.back() * small.hidden, 506, kInputScale);
    std::vector<float> want;
    const std::vector<float> got = RunGemm(isa, ws.view, act, offsets, xs, {.ctx = &ctx}, &want);
    EXPECT_TRUE(Close(got, want, TolFor(small.format),
                      fmt::format("{} reused scratch I38 then I37", CpuIsaName(isa)), 505));
  }
  // Several gate_up blocks per packed expert (96 intermediate indices each), the last one odd.
  for (int64_t inter : {200, 201}) {
    GemmCase g{.format = WeightFormat::kBf16, .num_experts = 2, .hidden = 64, .inter = inter};
    CheckOffsets(g, {0, 40, 75}, 512, {}, fmt::format("counts 40/35, I {}", inter));
  }
  // Reductions longer than one K block of the packed kernel (512 pairs), odd, with unpacked
  // remainders of 8 and 1 tokens.
  GemmCase c{.format = WeightFormat::kBf16, .num_experts = 2, .hidden = 1100 * 2 + 1, .inter = 96};
  CheckOffsets(c, {0, 40, 73}, 502, {}, "counts 40/33, H 2201");
}

// The scaled packed formats on the same token counts: strips decoded unscaled (fp8, int4,
// int4-zp) or with the block scales folded (NVFP4), each scale group's partial sums scaled.
TEST(GroupedGemm, PackedPathScaledFormats) {
  const std::vector<int64_t>& counts = kPackedCounts;
  const std::vector<int64_t> offsets = OffsetsOf(counts);
  // fp8 blocks and int4 take it with unscaled strips, each scale group's partial sums scaled:
  // partial 128-column blocks (H 200, I 136), an odd H whose last group ends in half a pair (201)
  // or holds only that half pair's column (257: the half pair after a group edge), int4 groups of
  // 32, 64 and 128, interleaved gate/up with biases, and rows spanning several K blocks.
  for (int64_t hidden : {200, 201, 257}) {
    GemmCase f{.format = WeightFormat::kFp8Block,
               .act = Activation::kSwiGlu,
               .num_experts = static_cast<int64_t>(counts.size()),
               .hidden = hidden,
               .inter = 136,
               .bias = true};
    CheckOffsets(f, offsets, 513, {.gather = true}, fmt::format("{}, H {}", kCounts, hidden));
  }
  // int4, and int4 with zero points (code - zero decoded exactly, fp16 scales per group): groups
  // of 32, 64 and 128, interleaved gate/up with biases, bf16 or gathered inputs.
  for (WeightFormat f : {WeightFormat::kInt4, WeightFormat::kInt4Zp}) {
    for (int64_t group : {32, 64, 128}) {
      GemmCase q{.format = f,
                 .act = Activation::kSwiGluOai,
                 .num_experts = static_cast<int64_t>(counts.size()),
                 .hidden = 256,
                 .inter = 128,
                 .interleaved = true,
                 .bias = true,
                 .group = group};
      const bool zp = f == WeightFormat::kInt4Zp;
      CheckOffsets(q, offsets, zp ? 517 : 514,
                   zp ? RunOptions{.gather = true} : RunOptions{.x_dtype = DType::kBF16},
                   fmt::format("{}, g{}", kCounts, group));
    }
  }
  // NVFP4 (E4M3 block scales folded into the strip, the global scale on the sums): an I of 144
  // ends its rows in one 16-column group (a half decode step).
  for (int64_t inter : {128, 144}) {
    GemmCase n{.format = WeightFormat::kNvfp4,
               .act = Activation::kSwiGlu,
               .num_experts = static_cast<int64_t>(counts.size()),
               .hidden = 208,
               .inter = inter,
               .bias = true};
    CheckOffsets(n, offsets, 518, {.x_dtype = DType::kBF16},
                 fmt::format("{}, I {}", kCounts, inter));
  }
  GemmCase fl{.format = WeightFormat::kFp8Block, .num_experts = 2, .hidden = 2200, .inter = 128};
  CheckOffsets(fl, {0, 40, 73}, 515, {}, "counts 40/33, H 2200");
  GemmCase ql{.format = WeightFormat::kInt4, .num_experts = 2, .hidden = 2240, .inter = 96};
  CheckOffsets(ql, {0, 40, 73}, 516, {}, "counts 40/33, H 2240");
  for (WeightFormat f : {WeightFormat::kInt4Zp, WeightFormat::kNvfp4}) {
    GemmCase l{.format = f, .num_experts = 2, .hidden = 2240, .inter = 96};
    CheckOffsets(l, {0, 40, 73}, 519, {}, "counts 40/33, H 2240");
  }
  // Groups that neither divide the packed kernels' K block (1024 columns) nor are a multiple of
  // it (96: a K block would start inside a group) stay off the packed path.
  for (WeightFormat f : {WeightFormat::kInt4, WeightFormat::kInt4Zp}) {
    GemmCase l{.format = f, .num_experts = 2, .hidden = 2112, .inter = 96, .group = 96};
    CheckOffsets(l, {0, 40, 73}, 520, {}, "counts 40/33, H 2112, g96");
  }
}

TEST(GroupedGemm, Bf16InputRowsAndTopKEqualsExperts) {
  GemmCase c{.format = WeightFormat::kBf16,
             .act = Activation::kSwiGlu,
             .num_experts = 4,
             .hidden = 65,
             .inter = 31};  // vector width (32 bf16) +- 1
  CheckCase(c, 33, 4, 5, {.x_dtype = DType::kBF16});
}

TEST(GroupedGemm, Fp8BlockScalesWithPartialBlocks) {
  for (Activation act : {Activation::kSwiGlu, Activation::kReluSquared}) {
    GemmCase c{.format = WeightFormat::kFp8Block,
               .act = act,
               .num_experts = 4,
               .hidden = 200,
               .inter = 136};
    for (int64_t tokens : {1, 33}) CheckCase(c, tokens, 2, 200 + tokens, {});
  }
}

TEST(GroupedGemm, Mxfp4) {
  for (Activation act : {Activation::kSiTu, Activation::kReluSquared}) {
    GemmCase c{
        .format = WeightFormat::kMxfp4, .act = act, .num_experts = 8, .hidden = 96, .inter = 64};
    for (int64_t tokens : {1, 3, 33}) CheckCase(c, tokens, 2, 300 + tokens, {});
  }
}

// 0, 1, ..., n - 1.
std::vector<int32_t> Iota(int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// n bf16 values randn * scale.
std::vector<bf16_t> RandnBf16(int64_t n, uint64_t seed, float scale) {
  const std::vector<float> f = Randn(n, seed, scale);
  std::vector<bf16_t> x(f.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = FloatToBf16(f[i]);
  return x;
}

// Row r of an MXFP4 matrix times row t of x in double: the sum and the sum of magnitudes.
std::pair<double, double> Mxfp4RowDot(const internal::MatrixRef& m, const std::vector<bf16_t>& x,
                                      int64_t r, int64_t t) {
  double sum = 0.0, mag = 0.0;
  for (int64_t c = 0; c < m.cols; ++c) {
    const uint8_t byte = m.data[r * m.cols / 2 + c / 2];
    const double term = static_cast<double>(Fp4E2M1ToFloat(c % 2 ? byte >> 4 : byte)) *
                        E8M0ToFloat(m.scales[r * (m.cols / 32) + c / 32]) *
                        Bf16ToFloat(x[static_cast<size_t>(t * m.cols + c)]);
    sum += term;
    mag += std::abs(term);
  }
  return {sum, mag};
}

// Every E8M0 code, through each variant's dot_rows on MXFP4 rows: code 0 is 2^-127 (an fp32
// subnormal; the AVX-512 decode walk builds its scales as e << 23 and must not make it 0) and 255
// is NaN. The inputs are large (about 2^90) so that a row scaled by 2^-127 everywhere still sums
// to a normal number; token counts cover the decode walk (128-column blocks) and the dot path.
TEST(GroupedGemm, Mxfp4DotRowsEveryScaleCode) {
  constexpr int64_t kRows = 6, kCols = 256, kGroups = kCols / 32;
  std::mt19937_64 rng(4242);
  std::vector<uint8_t> codes(static_cast<size_t>(kRows * kCols / 2));
  for (uint8_t& b : codes) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> scales(static_cast<size_t>(kRows * kGroups));
  for (uint8_t& e : scales) e = static_cast<uint8_t>(100 + rng() % 31);
  auto scale = [&](int64_t r, int64_t g) -> uint8_t& {
    return scales[static_cast<size_t>(r * kGroups + g)];
  };
  for (int64_t g = 0; g < kGroups; ++g) scale(0, g) = 0;  // row 0: 2^-127 everywhere
  scale(1, 3) = 255;                                      // row 1: one NaN group
  scale(2, 5) = 0;                                        // row 2: one tiny group
  scale(3, 0) = 1;                                        // the smallest plain code
  const internal::MatrixRef m = Mxfp4Matrix(codes, scales, kRows, kCols);
  const std::vector<int32_t> rows = Iota(kRows);
  for (int64_t tokens : {1, 3, 8, 20}) {
    const std::vector<bf16_t> x = RandnBf16(tokens * kCols, 4243 + tokens, 0x1p90f);
    for (CpuIsa isa : TestIsas()) {
      const KernelContext ctx = MakeContext(isa, 1);
      const internal::CpuBackend& b = internal::CpuBackendFor(ctx.isa());
      const std::vector<float> out = RunDotRows(b, m, x, tokens, rows);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t r = 0; r < kRows; ++r) {
          const auto [want, mag] = Mxfp4RowDot(m, x, r, t);
          const float got = out[static_cast<size_t>(t * kRows + r)];
          const std::string what =
              fmt::format("{} tokens {} token {} row {}", CpuIsaName(ctx.isa()), tokens, t, r);
          if (r == 1) {
            EXPECT_TRUE(std::isnan(got)) << what << ": " << got;
            continue;
          }
          ASSERT_GT(std::abs(want), 0x1p-60) << what;  // row 0 stays a normal float
          EXPECT_NEAR(got, want, 1e-4 * mag) << what;  // fp32 sums of 256 terms
        }
      }
    }
  }
}

// int4 and int4-zp on 16-bit inputs, through each compiled variant's dot_rows on one thread (the
// SIMD backends decode the codes unsigned and fold the offset's share, -8 or -the zero point x
// each lane's input sum, into the inputs' scaling: QLayout::offset in simd_backend.cc): groups of
// 32 (several per chunk, one row per lane or four rows per vector up to 3 tokens), 64 and 128 (a
// chunk or several per group), K with a last partial chunk, every token count of the integer
// walk, and per token an outlier, a group of zeros and a group of tiny inputs, against the oracle
// in double. The tolerance is the inputs' 16-bit rounding (half a step of 2^-14 of each group's
// largest magnitude, times the weight) plus fp32 summation; a lost or misplaced offset share is
// a multiple of a group's input sum times its scale, far outside it. It runs under qemu-aarch64
// (NEON), where the threaded grouped-GEMM tests cannot.
TEST(GroupedGemm, Int4DotRowsOnSixteenBitInputsEveryVariant) {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : SupportedCpuIsas()) {
    if (isa != CpuIsa::kPortable) isas.push_back(isa);
  }
  if (isas.empty()) GTEST_SKIP() << "this CPU runs only the portable kernels";
  for (const auto& [format, group] :
       {std::pair(WeightFormat::kInt4, int64_t{32}), std::pair(WeightFormat::kInt4, int64_t{64}),
        std::pair(WeightFormat::kInt4, int64_t{128}), std::pair(WeightFormat::kInt4Zp, int64_t{32}),
        std::pair(WeightFormat::kInt4Zp, int64_t{128})}) {
    WeightScheme q = WeightScheme::Default(format);
    q.group = group;
    for (int64_t cols : {3 * group, int64_t{2048}}) {
      const ExpertWeightsShape s{
          .scheme = q, .num_experts_local = 1, .hidden = cols, .intermediate = 128, .gated = false};
      const std::vector<float> w13 = Randn(128 * cols, 600 + group + cols, 0.1f);
      const std::vector<float> w2 = Randn(128 * cols, 601, 0.1f);
      const OwnedExpertWeights ow = EncodeExpertWeights(s, w13.data(), w2.data(), nullptr, nullptr);
      const internal::MatrixRef m = internal::ExpertMatrix(ow.view, true, 0);
      std::vector<int32_t> rows(13);
      for (int i = 0; i < 13; ++i) rows[i] = 3 * i + 1;
      for (int64_t tokens : {1, 2, 3, 4, 8, 11}) {
        std::vector<float> xf = Randn(tokens * cols, 700 + tokens, 0.5f);
        for (int64_t t = 0; t < tokens; ++t) {
          float* row = xf.data() + t * cols;
          row[5] *= 100.0f;
          std::fill(row + group, row + 2 * group, 0.0f);
          for (int64_t c = 2 * group; c < 3 * group; ++c) row[c] *= 1e-30f;
        }
        std::vector<bf16_t> x(xf.size());
        for (size_t i = 0; i < x.size(); ++i) {
          x[i] = FloatToBf16(xf[i]);
          xf[i] = Bf16ToFloat(x[i]);
        }
        for (CpuIsa isa : isas) {
          const std::vector<float> out =
              RunDotRows(internal::CpuBackendFor(isa), m, x, tokens, rows);
          for (int64_t t = 0; t < tokens; ++t) {
            const float* xt = xf.data() + t * cols;
            for (size_t j = 0; j < rows.size(); ++j) {
              double want = 0.0, mag = 0.0, rounding = 0.0;
              for (int64_t g0 = 0; g0 < cols; g0 += group) {
                double top = 0.0;
                for (int64_t c = g0; c < g0 + group; ++c)
                  top = std::max(top, std::abs(double{xt[c]}));
                for (int64_t c = g0; c < g0 + group; ++c) {
                  const double w = reference::DequantizeWeight(ow.view, reference::Projection::kW13,
                                                               0, rows[j], c);
                  want += xt[c] * w;
                  mag += std::abs(xt[c] * w);
                  rounding += std::ldexp(top, -14) * std::abs(w);
                }
              }
              EXPECT_NEAR(out[t * rows.size() + j], want, rounding + 1e-5 * mag)
                  << fmt::format("{} {} g{} K{} tokens {} token {} row {}", CpuIsaName(isa),
                                 WeightFormatName(format), group, cols, tokens, t, rows[j]);
            }
          }
        }
      }
    }
  }
}

// One packed_gemm call on rows 0..rows of m: x's first 16 tokens (bf16 rows of m.cols) packed
// as one group, the rest (up to kPackedMaxRem) as unpacked remainder tokens; out[r * tokens + t].
std::vector<float> PackedGemmOneGroup(const internal::CpuBackend& b, const internal::MatrixRef& m,
                                      const std::vector<bf16_t>& x, int64_t rows, int64_t tokens) {
  const int64_t cols = m.cols;
  const int64_t stride = internal::PackedPairs(cols) * internal::kPackedGroup;
  std::vector<uint32_t> packed(static_cast<size_t>(stride));
  const std::vector<int32_t> first = Iota(16);
  b.pack_group(x.data(), DType::kBF16, cols, first.data(), 16, cols, packed.data());
  std::vector<uint8_t> work(static_cast<size_t>(internal::kPackedWorkBytesPerCol * cols));
  std::vector<float> out(static_cast<size_t>(rows * tokens), -1.0f);
  const std::vector<int32_t> row_idx = Iota(rows);
  b.packed_gemm({.w = &m,
                 .row_idx = row_idx.data(),
                 .num_rows = rows,
                 .x = packed.data(),
                 .group_stride = stride,
                 .num_groups = 1,
                 .out = out.data(),
                 .ldo = tokens,
                 .work = work.data(),
                 .rem_x = x.data() + 16 * cols,
                 .rem_ldx = cols,
                 .num_rem = tokens - 16});
  return out;
}

// MXFP4 on the packed (prefill) path with E8M0 codes at both ends of the strip decode's exponent
// route (2..252) and past them (0, 1 and 255: the fp32 route), in two magnitudes of inputs so
// that no product leaves fp32's normal range. Codes 0 and 1 take half the groups of two rows
// whose other groups are near 2^0: the strip flushes their weights below 2^-126 where the dot path
// does not, a difference far inside the tolerance, but the exponent route on them would wrap
// (0.5 x 2^-127 becomes -inf). Left out: 253 and 254, where E2M1 values of 3 and more times the
// scale exceed the largest bf16 (the strip holds infinities, the dot path scales sums).
TEST(GroupedGemm, Mxfp4PackedStripScaleCodes) {
  constexpr int64_t kRows = 5, kCols = 256, kGroups = kCols / 32, kTokens = 21;
  std::mt19937_64 rng(5151);
  std::vector<uint8_t> codes(static_cast<size_t>(kRows * kCols / 2));
  for (uint8_t& b : codes) b = static_cast<uint8_t>(rng());
  for (const auto& [low, codes_of_rows] :
       {std::pair{true, std::array<int, kRows>{2, 0, 4, 1, 3}},
        std::pair{false, std::array<int, kRows>{252, 251, 250, 255, 252}}}) {
    std::vector<uint8_t> scales(static_cast<size_t>(kRows * kGroups));
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t g = 0; g < kGroups; ++g) {  // the row's code in odd groups, 127 +- 3 between
        scales[static_cast<size_t>(r * kGroups + g)] =
            static_cast<uint8_t>(g % 2 ? codes_of_rows[static_cast<size_t>(r)] : 124 + rng() % 7);
      }
    }
    const internal::MatrixRef m = Mxfp4Matrix(codes, scales, kRows, kCols);
    const std::vector<bf16_t> x = RandnBf16(kTokens * kCols, 5152, low ? 0x1p100f : 0x1p-100f);
    for (CpuIsa isa : TestIsas()) {
      const KernelContext ctx = MakeContext(isa, 1);
      const internal::CpuBackend& b = internal::CpuBackendFor(ctx.isa());
      if (b.packed_gemm == nullptr) continue;
      // One packed group of 16 tokens and 5 remainder tokens (unpacked).
      const std::vector<float> out = PackedGemmOneGroup(b, m, x, kRows, kTokens);
      for (int64_t r = 0; r < kRows; ++r) {
        for (int64_t t = 0; t < kTokens; ++t) {
          const auto [want, mag] = Mxfp4RowDot(m, x, r, t);
          const float got = out[static_cast<size_t>(r * kTokens + t)];
          const std::string what = fmt::format(
              "{} {} inputs row {} token {}", CpuIsaName(ctx.isa()), low ? "large" : "small", r, t);
          if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(got)) << what << ": " << got;
            continue;
          }
          ASSERT_GT(mag, 0x1p-100) << what;  // every row stays in fp32's normal range
          EXPECT_NEAR(got, want, 1e-4 * mag) << what;
        }
      }
    }
  }
}

// The packed path reads ahead into the next K block's rows (a load per new 4 KiB page, where
// prefetches did nothing): a matrix whose last row ends against an unmapped page, with a last K
// block shorter than the others (2304 columns: 1024 + 1024 + 256), must not be read past its end,
// and gives the same bits as a copy of it elsewhere.
TEST(GroupedGemm, PackedReadAheadStaysInsideTheMatrix) {
  constexpr int64_t kRows = 8, kCols = 2304, kTokens = 16;
  const int64_t bytes = kRows * kCols / 2;
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped = (static_cast<size_t>(bytes) + page - 1) / page * page;
  void* region =
      mmap(nullptr, mapped + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  auto* base = static_cast<uint8_t*>(region);
  ASSERT_EQ(mprotect(base + mapped, page, PROT_NONE), 0);  // the guard page
  std::mt19937_64 rng(5153);
  std::vector<uint8_t> codes(static_cast<size_t>(bytes));
  for (uint8_t& b : codes) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> scales(static_cast<size_t>(kRows * kCols / 32));
  for (uint8_t& e : scales) e = static_cast<uint8_t>(124 + rng() % 7);
  uint8_t* at_end = base + mapped - bytes;  // the last row ends at the guard page
  std::memcpy(at_end, codes.data(), codes.size());
  internal::MatrixRef guarded = Mxfp4Matrix(codes, scales, kRows, kCols);
  guarded.data = at_end;
  const internal::MatrixRef copy = Mxfp4Matrix(codes, scales, kRows, kCols);
  const std::vector<bf16_t> x = RandnBf16(kTokens * kCols, 5154, 1.0f);
  for (CpuIsa isa : TestIsas()) {
    const internal::CpuBackend& b = internal::CpuBackendFor(MakeContext(isa, 1).isa());
    if (b.packed_gemm == nullptr) continue;
    EXPECT_EQ(PackedGemmOneGroup(b, guarded, x, kRows, kTokens),
              PackedGemmOneGroup(b, copy, x, kRows, kTokens))
        << CpuIsaName(isa);
  }
  munmap(region, mapped + page);
}

// fp8 codes [rows, cols] with fp32 scales per block of block_rows x block columns.
internal::MatrixRef Fp8Matrix(const std::vector<uint8_t>& codes, const std::vector<float>& scales,
                              int64_t rows, int64_t cols, int64_t block, int64_t block_rows) {
  internal::MatrixRef m;
  m.format = WeightFormat::kFp8Block;
  m.data = codes.data();
  m.scales = reinterpret_cast<const uint8_t*>(scales.data());
  m.rows = rows;
  m.cols = cols;
  m.group = block;
  m.block_rows = block_rows;
  m.row_bytes = cols;
  return m;
}

// Every fp8 E4M3 code but the two NaNs (0x7f, 0xff), through each variant's dot_rows: tokens that
// are one-hot on a column read one weight times its block's scale, exactly. The subnormal codes
// (exponent 0) take their own route in the AVX-512 decode.
TEST(GroupedGemm, Fp8DotRowsEveryCode) {
  constexpr int64_t kRows = 4, kCols = 256, kBlock = 128;
  std::vector<uint8_t> codes(static_cast<size_t>(kRows * kCols));
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) {
      const auto code = static_cast<uint8_t>((c + 64 * r) % 256);
      codes[static_cast<size_t>(r * kCols + c)] = (code & 0x7f) == 0x7f ? 0 : code;
    }
  }
  const std::vector<float> scales = {1.0f, 0.375f};  // the two column blocks
  const internal::MatrixRef m = Fp8Matrix(codes, scales, kRows, kCols, kBlock, kBlock);
  const std::vector<int32_t> rows = Iota(kRows);
  for (int64_t tokens : {1, 5, 8, 11, 16, 24}) {
    for (CpuIsa isa : TestIsas()) {
      const KernelContext ctx = MakeContext(isa, 1);
      const internal::CpuBackend& b = internal::CpuBackendFor(ctx.isa());
      for (int64_t c0 = 0; c0 < kCols; c0 += tokens) {
        std::vector<bf16_t> x(static_cast<size_t>(tokens * kCols), FloatToBf16(0.0f));
        for (int64_t t = 0; t < tokens; ++t) {
          x[static_cast<size_t>(t * kCols + (c0 + t) % kCols)] = FloatToBf16(1.0f);
        }
        const std::vector<float> out = RunDotRows(b, m, x, tokens, rows);
        for (int64_t t = 0; t < tokens; ++t) {
          const int64_t c = (c0 + t) % kCols;
          for (int64_t r = 0; r < kRows; ++r) {
            const uint8_t code = codes[static_cast<size_t>(r * kCols + c)];
            const float want = Fp8E4M3ToFloat(code) * scales[static_cast<size_t>(c / kBlock)];
            EXPECT_EQ(out[static_cast<size_t>(t * kRows + r)], want)
                << fmt::format("{} tokens {} code 0x{:02x} row {} column {}", CpuIsaName(ctx.isa()),
                               tokens, code, r, c);
          }
        }
      }
    }
  }
}

// Rows [0, num_rows) of m through each variant's dot_rows with random bf16 inputs (seed + the
// token count), at token counts on the decode walk (1-16) and on the strips (17 and more),
// against sums in double of weight(r, c) x input, within 1e-5 of the products' magnitudes.
template <typename WeightFn>
void CheckDotRowsAgainstDouble(const internal::MatrixRef& m, int64_t num_rows, uint64_t seed,
                               const WeightFn& weight) {
  const int64_t cols = m.cols;
  const std::vector<int32_t> rows = Iota(num_rows);
  for (int64_t tokens : {1, 2, 3, 5, 16, 17, 24}) {
    const std::vector<bf16_t> x = RandnBf16(tokens * cols, seed + tokens, 1.0f);
    for (CpuIsa isa : TestIsas()) {
      const KernelContext ctx = MakeContext(isa, 1);
      const std::vector<float> out =
          RunDotRows(internal::CpuBackendFor(ctx.isa()), m, x, tokens, rows);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t r = 0; r < num_rows; ++r) {
          double want = 0.0, mag = 0.0;
          for (int64_t c = 0; c < cols; ++c) {
            const double term = weight(r, c) * Bf16ToFloat(x[static_cast<size_t>(t * cols + c)]);
            want += term;
            mag += std::abs(term);
          }
          EXPECT_NEAR(out[static_cast<size_t>(t * num_rows + r)], want, 1e-5 * mag)
              << fmt::format("{} tokens {} token {} row {}", CpuIsaName(ctx.isa()), tokens, t, r);
        }
      }
    }
  }
}

// bf16 rows through each variant's dot_rows, against sums in double: 13 rows (a strip of 12 and
// one more), 556 columns (two 256-column K blocks and a rest that is not a whole chunk on any
// vector width), and token counts on the decode walk (1-16) and on the strips (17 and more). The
// SIMD decode takes a chunk as bf16 pairs, even columns then odd ones, with the inputs widened
// in the same order; a wrong pairing or a dropped rest shows here.
TEST(GroupedGemm, Bf16DotRowsWalkStripsAndRest) {
  constexpr int64_t kRows = 13, kCols = 556;
  const std::vector<bf16_t> w = RandnBf16(kRows * kCols, 7301, 1.0f);
  internal::MatrixRef m;
  m.format = WeightFormat::kBf16;
  m.data = reinterpret_cast<const uint8_t*>(w.data());
  m.rows = kRows;
  m.cols = kCols;
  m.row_bytes = kCols * static_cast<int64_t>(sizeof(bf16_t));
  CheckDotRowsAgainstDouble(m, kRows, 7302, [&](int64_t r, int64_t c) {
    return static_cast<double>(Bf16ToFloat(w[static_cast<size_t>(r * kCols + c)]));
  });
}

// fp8 rows through each variant's dot_rows, against sums in double: 13 rows over two block rows
// of 8, 200 columns (two column blocks of 128, the second partial, and a rest past the last whole
// chunk on every vector width), every code but NaN, tokens on the decode walk and the strips. A
// wrong half of a chunk, block scale or rest shows here.
TEST(GroupedGemm, Fp8DotRowsWalkStripsAndRest) {
  constexpr int64_t kRows = 13, kCols = 200, kBlock = 128, kBlockRows = 8;
  std::vector<uint8_t> codes(static_cast<size_t>(kRows * kCols));
  std::mt19937 rng(7401);
  for (uint8_t& code : codes) {
    do {
      code = static_cast<uint8_t>(rng() & 0xFF);
    } while ((code & 0x7F) == 0x7F);
  }
  const std::vector<float> scales = {0.5f, 0.046875f, 3.0f, 0.25f};  // [block row][block column]
  const internal::MatrixRef m = Fp8Matrix(codes, scales, kRows, kCols, kBlock, kBlockRows);
  CheckDotRowsAgainstDouble(m, kRows, 7402, [&](int64_t r, int64_t c) {
    const float scale = scales[static_cast<size_t>(r / kBlockRows * 2 + c / kBlock)];
    return static_cast<double>(Fp8E4M3ToFloat(codes[static_cast<size_t>(r * kCols + c)])) * scale;
  });
}

// The benchmark's fp8 weights are codes of block-quantized Gaussian weights: no NaN code, the
// block maximum near 448, and subnormal codes (exponent 0, which the AVX-512 decode takes a slower
// route for) as rare as in a checkpoint, not every eighth code as uniform bytes would make them.
TEST(GroupedGemm, RandomFp8WeightsAreCheckpointLike) {
  KernelContext ctx = MakeContext(CpuIsa::kPortable, 2);
  const ExpertWeightsShape shape{.scheme = WeightScheme::Default(WeightFormat::kFp8Block),
                                 .num_experts_local = 2,
                                 .hidden = 512,
                                 .intermediate = 256};
  const OwnedExpertWeights w = MakeRandomExpertWeights(ctx, shape, 7);
  const auto* codes = w.w13.as<uint8_t>();
  const int64_t n = shape.num_experts_local * 2 * shape.intermediate * shape.hidden;
  int64_t subnormal = 0, nan = 0;
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    subnormal += (codes[i] & 0x78) == 0 ? 1 : 0;
    nan += (codes[i] & 0x7f) == 0x7f ? 1 : 0;
    if ((codes[i] & 0x7f) != 0x7f) amax = std::max(amax, std::abs(Fp8E4M3ToFloat(codes[i])));
  }
  EXPECT_EQ(nan, 0);
  EXPECT_LT(subnormal, n / 1000) << subnormal << " of " << n;
  EXPECT_GE(amax, 320.0f);
}

TEST(GroupedGemm, Int4GroupSizes) {
  for (int64_t group : {32, 64}) {
    GemmCase c{.format = WeightFormat::kInt4,
               .act = Activation::kSwiGlu,
               .num_experts = 8,
               .hidden = 128,
               .inter = 64,
               .group = group};
    for (int64_t tokens : {3, 33}) CheckCase(c, tokens, 2, 400 + tokens + group, {});
  }
  GemmCase relu{.format = WeightFormat::kInt4,
                .act = Activation::kReluSquared,
                .num_experts = 4,
                .hidden = 64,
                .inter = 96};
  CheckCase(relu, 33, 2, 450, {});
}

// Decode of 4-bit weights (up to 16 tokens per expert) multiplies on 16-bit integers in the SIMD
// backends, with each token's inputs quantized per scale group (simd_backend.cc). Every token
// count of that path, int4 groups of 32/64/128 (one scale per chunk or several chunks per scale)
// and MXFP4 (several scales per chunk on AVX2), K a multiple of the group but not of the 64-column
// chunk (96, 160: a last half chunk), and inputs that stress the per-group quantization: a group
// with a 100x outlier, a group of zeros, a group of tiny values.
TEST(GroupedGemm, DecodeEveryTokenCountGroupAndInputRange) {
  const std::vector<int64_t> counts = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16};
  std::vector<int64_t> offsets = {0};
  for (int64_t n : counts) offsets.push_back(offsets.back() + n);
  struct Case {
    WeightFormat format;
    int64_t group;
    int64_t hidden;
    int64_t inter;
  };
  // bf16 and fp8 too: their decode walk and decoded strips meet at 16 and 4 tokens.
  const Case cases[] = {{WeightFormat::kMxfp4, 32, 96, 160},
                        {WeightFormat::kMxfp4, 32, 256, 64},
                        {WeightFormat::kInt4, 32, 96, 160},
                        {WeightFormat::kInt4, 64, 192, 128},
                        {WeightFormat::kInt4, 128, 256, 128},
                        {WeightFormat::kBf16, 0, 200, 72},
                        {WeightFormat::kFp8Block, 0, 256, 128},
                        // AWQ/GPTQ groups, NVFP4's 16 (scales per 32-bit lane on AVX2).
                        {WeightFormat::kInt4Zp, 32, 96, 160},
                        {WeightFormat::kInt4Zp, 64, 192, 128},
                        {WeightFormat::kInt4Zp, 128, 256, 128},
                        {WeightFormat::kInt4Zp, 32, 256, 384},  // 128-column blocks of 4 groups
                        {WeightFormat::kNvfp4, 16, 96, 160},
                        {WeightFormat::kNvfp4, 16, 256, 64},
                        {WeightFormat::kNvfp4, 16, 256, 384}};
  for (const Case& k : cases) {
    GemmCase c{.format = k.format,
               .act = Activation::kSwiGlu,
               .num_experts = static_cast<int64_t>(counts.size()),
               .hidden = k.hidden,
               .inter = k.inter,
               .group = k.group > 0 ? k.group : 32};
    const OwnedExpertWeights ow = Encode(c, RandomWeights(c, 900 + k.group));
    // Inputs a tenth of the usual size, so with the outliers the outputs stay of order 1.
    std::vector<float> x = Randn(offsets.back() * c.hidden, 901, kInputScale / 10);
    for (int64_t r = 0; r < offsets.back(); ++r) {
      float* row = x.data() + r * c.hidden;
      row[5] *= 100.0f;                                    // an outlier in group 0
      std::fill(row + 32, row + 64, 0.0f);                 // a group of zeros
      for (int64_t i = 64; i < 96; ++i) row[i] *= 1e-30f;  // a group of tiny values
    }
    ActivationParams act;
    for (CpuIsa isa : TestIsas()) {
      std::vector<float> want;
      const std::vector<float> got = RunGemm(isa, ow.view, act, offsets, x, {}, &want);
      ASSERT_GT(testing::MeanAbs(want), 0.02) << c.Name();
      // The outliers make some outputs 20x the typical one; the bf16 rounding of activations
      // (every path's) then exceeds the usual absolute tolerance there, so it scales with the
      // largest output.
      float max_want = 0.0f;
      for (float v : want) max_want = std::max(max_want, std::abs(v));
      EXPECT_TRUE(Close(got, want, Tolerance{1e-2 * max_want, 5e-3},
                        fmt::format("{} {} counts 1..16", CpuIsaName(isa), c.Name()), 902));
    }
  }
}

// A non-finite input makes its token's outputs non-finite on every path, where the reference's
// are (the integer decode marks a group with an infinite input NaN instead of quantizing it), and
// leaves the other tokens finite.
TEST(GroupedGemm, NonFiniteInputsPropagateInEveryFormat) {
  for (WeightFormat f : kAllWeightFormats) {
    GemmCase c{
        .format = f, .act = Activation::kSwiGlu, .num_experts = 2, .hidden = 128, .inter = 64};
    const OwnedExpertWeights ow = Encode(c, RandomWeights(c, 910));
    const std::vector<int64_t> offsets = {0, 2, 3};
    std::vector<float> x = Randn(3 * c.hidden, 911, kInputScale);
    x[1 * c.hidden + 40] = std::numeric_limits<float>::infinity();  // token 1 of expert 0
    ActivationParams act;
    act.kind = c.act;
    for (CpuIsa isa : TestIsas()) {
      std::vector<float> want;
      const std::vector<float> y = RunGemm(isa, ow.view, act, offsets, x, {}, &want);
      int token_nonfinite = 0, mismatched = 0;
      for (int64_t r = 0; r < 3; ++r) {
        for (int64_t o = 0; o < c.hidden; ++o) {
          const size_t i = static_cast<size_t>(r * c.hidden + o);
          if (std::isfinite(y[i]) != std::isfinite(want[i])) ++mismatched;
          if (r == 1 && !std::isfinite(want[i])) ++token_nonfinite;
          if (r != 1) {
            EXPECT_TRUE(std::isfinite(y[i])) << CpuIsaName(isa) << " " << c.Name();
          }
        }
      }
      EXPECT_EQ(token_nonfinite, c.hidden) << CpuIsaName(isa) << " " << c.Name();
      EXPECT_EQ(mismatched, 0) << CpuIsaName(isa) << " " << c.Name();
    }
  }
}

TEST(GroupedGemm, GptOssInterleavedWithBiasesEveryFormat) {
  for (WeightFormat f : kAllWeightFormats) {
    GemmCase c{.format = f,
               .act = Activation::kSwiGluOai,
               .num_experts = 8,
               .hidden = 64,
               .inter = 96,
               .interleaved = true,
               .bias = true};
    CheckCase(c, 33, 4, 500, {});
    CheckCase(c, 3, 4, 501, {.add_down_bias = false});
  }
}

// Reductions longer than the AVX-512 K block (2048) are split and accumulated.
TEST(GroupedGemm, LongReductionsAcrossKBlocks) {
  for (WeightFormat f : kAllWeightFormats) {
    GemmCase c{.format = f,
               .act = Activation::kSwiGlu,
               .num_experts = 2,
               .hidden = f == WeightFormat::kBf16 || f == WeightFormat::kFp8Block ? 4200 : 4160,
               .inter = 64};
    CheckCase(c, 5, 2, 700, {});
  }
  GemmCase down{.format = WeightFormat::kBf16,
                .act = Activation::kReluSquared,
                .num_experts = 2,
                .hidden = 40,
                .inter = 2080};
  CheckCase(down, 5, 2, 701, {});
}

TEST(GroupedGemm, MisalignedPointers) {
  for (WeightFormat f : {WeightFormat::kBf16, WeightFormat::kMxfp4, WeightFormat::kFp8Block}) {
    GemmCase c{
        .format = f, .act = Activation::kSwiGlu, .num_experts = 4, .hidden = 96, .inter = 64};
    CheckCase(c, 33, 2, 600, {.misalign = true});
    CheckCase(c, 33, 2, 601, {.x_dtype = DType::kBF16, .misalign = true});
  }
}

TEST(GroupedGemm, DownBiasSkippedOnRequest) {
  GemmCase c{.format = WeightFormat::kBf16,
             .act = Activation::kSwiGlu,
             .num_experts = 2,
             .hidden = 40,
             .inter = 24,
             .bias = true};
  const FloatWeights f = RandomWeights(c, 3);
  const OwnedExpertWeights ow = Encode(c, f);
  const std::vector<int64_t> offsets = {0, 3, 5};
  const std::vector<float> x = Randn(5 * c.hidden, 4, kInputScale);
  ActivationParams act;
  for (CpuIsa isa : TestIsas()) {
    const std::vector<float> with = RunGemm(isa, ow.view, act, offsets, x, {}, nullptr);
    const std::vector<float> without =
        RunGemm(isa, ow.view, act, offsets, x, {.add_down_bias = false}, nullptr);
    for (int64_t r = 0; r < 5; ++r) {
      const int64_t e = r < 3 ? 0 : 1;
      for (int64_t o = 0; o < c.hidden; ++o) {
        ASSERT_NEAR(with[static_cast<size_t>(r * c.hidden + o)] -
                        without[static_cast<size_t>(r * c.hidden + o)],
                    f.b2[static_cast<size_t>(e * c.hidden + o)], 1e-5);
      }
    }
  }
}

// Zero padding of I and H (as the plan's backend padding produces) must not change the logical
// outputs, and padded output columns must be exactly 0.
TEST(GroupedGemm, PaddedEqualsUnpadded) {
  struct PadCase {
    GemmCase logical;
    int64_t hidden_padded = 0, inter_padded = 0;
  };
  const PadCase cases[] = {
      {{.format = WeightFormat::kBf16, .act = Activation::kSwiGlu, .hidden = 100, .inter = 40},
       128,
       64},
      {{.format = WeightFormat::kBf16,
        .act = Activation::kSwiGluOai,
        .hidden = 100,
        .inter = 40,
        .interleaved = true,
        .bias = true},
       112,
       48},
      {{.format = WeightFormat::kMxfp4, .act = Activation::kSiTu, .hidden = 96, .inter = 64},
       128,
       96},
      // fp8 block scales cover 128x128 blocks of the physical matrix: gate and up rows must
      // not share a block (I a multiple of 128, as block-fp8 backends require), or padding
      // would change the quantisation itself.
      {{.format = WeightFormat::kFp8Block,
        .act = Activation::kSwiGlu,
        .num_experts = 4,
        .hidden = 200,
        .inter = 128},
       256,
       256},
      {{.format = WeightFormat::kInt4, .act = Activation::kReluSquared, .hidden = 64, .inter = 96},
       96,
       128},
  };
  for (const PadCase& pc : cases) {
    const GemmCase& c = pc.logical;
    GemmCase p = c;
    p.hidden = pc.hidden_padded;
    p.inter = pc.inter_padded;
    const FloatWeights f = RandomWeights(c, 42);
    const OwnedExpertWeights w_logical = Encode(c, f);
    const OwnedExpertWeights w_padded = Encode(p, Pad(c, p, f));
    const std::vector<int64_t> offsets = Offsets(c.num_experts, 33, 2, 43);
    const int64_t rows = offsets.back();
    const std::vector<float> x = Randn(rows * c.hidden, 44, kInputScale);
    std::vector<float> x_padded(static_cast<size_t>(rows * p.hidden), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(x.begin() + r * c.hidden, c.hidden, x_padded.begin() + r * p.hidden);
    }
    ActivationParams act;
    act.kind = c.act;
    for (CpuIsa isa : TestIsas()) {
      const std::vector<float> y = RunGemm(isa, w_logical.view, act, offsets, x, {}, nullptr);
      const std::vector<float> yp =
          RunGemm(isa, w_padded.view, act, offsets, x_padded, {}, nullptr);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t o = 0; o < p.hidden; ++o) {
          const float got = yp[static_cast<size_t>(r * p.hidden + o)];
          if (o < c.hidden) {
            ASSERT_NEAR(got, y[static_cast<size_t>(r * c.hidden + o)], 1e-4)
                << CpuIsaName(isa) << " " << c.Name() << " row " << r << " col " << o;
          } else {
            ASSERT_EQ(got, 0.0f) << CpuIsaName(isa) << " " << c.Name() << " padded col " << o;
          }
        }
      }
    }
  }
}

// The result must not depend on the thread count (each output has a fixed summation order).
TEST(GroupedGemm, DeterministicAcrossThreadCounts) {
  GemmCase c{.format = WeightFormat::kBf16,
             .act = Activation::kSwiGlu,
             .num_experts = 8,
             .hidden = 256,
             .inter = 160};
  const OwnedExpertWeights ow = Encode(c, RandomWeights(c, 8));
  ActivationParams act;
  for (int64_t tokens : {1, 33}) {
    const std::vector<int64_t> offsets = Offsets(c.num_experts, tokens, 8 - 2, 9);
    const std::vector<float> x = Randn(offsets.back() * c.hidden, 10, kInputScale);
    for (CpuIsa isa : TestIsas()) {
      const std::vector<float> a = RunGemm(isa, ow.view, act, offsets, x, {.threads = 1}, nullptr);
      const std::vector<float> b = RunGemm(isa, ow.view, act, offsets, x, {.threads = 2}, nullptr);
      ASSERT_EQ(a, b) << CpuIsaName(isa) << " tokens " << tokens;
    }
  }
}

// A token's result depends on which other tokens share its expert call only through the path
// the count selects (4-bit formats: 16-bit inputs up to 4 tokens, fp32 strips from 5): each
// expert's first rows computed alone and among 24 rows agree within 1e-3 of the largest
// output. Measured here (AMD EPYC, AVX-512 BF16; the SIMD "avx512" and "avx2" variants, MXFP4):
// up to 4.1e-4 for MXFP4 and 4.7e-4 for int4 -- more than the 16-bit rounding of the inputs
// alone, since the activation's bf16 rounding can flip on either side. A layout that
// splits an expert's tokens differently (EP dispatch) therefore differs from one rank by that
// much (tests/runtime/runtime_cases.cc, tolerance_scale); the bound keeps it from growing.
TEST(GroupedGemm, TokensIndependentOfTheirBatch) {
  for (WeightFormat f :
       {WeightFormat::kMxfp4, WeightFormat::kBf16, WeightFormat::kFp8Block, WeightFormat::kInt4}) {
    GemmCase c{
        .format = f, .act = Activation::kSwiGlu, .num_experts = 2, .hidden = 256, .inter = 1024};
    const OwnedExpertWeights ow = Encode(c, RandomWeights(c, 21));
    ActivationParams act;
    const int64_t most = 24;
    const std::vector<float> x = Randn(most * c.hidden, 31, kInputScale);
    for (CpuIsa isa : TestIsas()) {
      const std::vector<float> all = RunGemm(isa, ow.view, act, {0, most, most}, x, {}, nullptr);
      double scale = 0;
      for (float v : all) scale = std::max(scale, static_cast<double>(std::abs(v)));
      for (int64_t n = 1; n < most; ++n) {
        const std::vector<float> xs(x.begin(), x.begin() + n * c.hidden);
        const std::vector<float> part = RunGemm(isa, ow.view, act, {0, n, n}, xs, {}, nullptr);
        for (int64_t i = 0; i < n * c.hidden; ++i) {
          ASSERT_NEAR(part[static_cast<size_t>(i)], all[static_cast<size_t>(i)], 1e-3 * scale)
              << WeightFormatName(f) << " " << CpuIsaName(isa) << " " << n << " of " << most
              << " tokens, row " << i / c.hidden << " col " << i % c.hidden;
        }
      }
    }
  }
}

TEST(GroupedGemm, PortableAndAvx512Agree) {
  if (!CpuSupportsAvx512Bf16()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  for (WeightFormat f : kAllWeightFormats) {
    GemmCase c{.format = f,
               .act = Activation::kGeluTanhGated,
               .num_experts = 4,
               .hidden = 128,
               .inter = 96};
    const OwnedExpertWeights ow = Encode(c, RandomWeights(c, 20));
    const std::vector<int64_t> offsets = Offsets(c.num_experts, 33, 2, 21);
    const std::vector<float> x = Randn(offsets.back() * c.hidden, 22, kInputScale);
    ActivationParams act;
    act.kind = c.act;
    const std::vector<float> a = RunGemm(CpuIsa::kPortable, ow.view, act, offsets, x, {}, nullptr);
    const std::vector<float> b =
        RunGemm(CpuIsa::kAvx512Bf16, ow.view, act, offsets, x, {}, nullptr);
    // Same bf16-rounded inputs and exact weights: only summation order and the vector
    // exp/tanh differ, which can flip a bf16 rounding of the intermediate activation.
    EXPECT_TRUE(Close(b, a, {5e-3, 2e-3}, c.Name(), 20));
  }
}

// avx2-vnni and avx512-vnni sum the 4-bit formats' integer products with vpdpwssd / vpdpbusd
// where avx2 and avx512 take vpmaddwd / vpmaddubsw and adds: the same integer sums in the same
// order, so the same bits, on 16-bit and 8-bit inputs, at every token count of the integer
// decode walk and beyond it, for groups within a chunk, of a chunk and across chunks, and K with
// a partial chunk.
TEST(GroupedGemm, VnniVariantsGiveTheBitsOfTheirBase) {
  const struct {
    WeightFormat format;
    int64_t group;
  } schemes[] = {{WeightFormat::kMxfp4, 32}, {WeightFormat::kInt4, 32},
                 {WeightFormat::kInt4, 64},  {WeightFormat::kInt4, 128},
                 {WeightFormat::kNvfp4, 16}, {WeightFormat::kInt4Zp, 128}};
  int64_t compared = 0;
  for (const auto& [vnni_isa, base_isa] : {std::pair(CpuIsa::kAvx2Vnni, CpuIsa::kAvx2),
                                           std::pair(CpuIsa::kAvx512Vnni, CpuIsa::kAvx512)}) {
    if (!CpuSupportsIsa(vnni_isa)) continue;  // no AVX-VNNI / AVX512_VNNI on this CPU
    const internal::CpuBackend& base = *internal::SimdBackendFor(base_isa);
    const internal::CpuBackend& vnni = *internal::SimdBackendFor(vnni_isa);
    for (const auto& sc : schemes) {
      for (int64_t hidden : {sc.group * 3, int64_t{256}, int64_t{1280}}) {
        const GemmCase c{.format = sc.format,
                         .act = Activation::kSwiGlu,
                         .num_experts = 1,
                         .hidden = hidden,
                         .inter = 128,
                         .group = sc.group};
        const OwnedExpertWeights ow = Encode(c, RandomWeights(c, 30 + hidden));
        const internal::MatrixRef m = internal::ExpertMatrix(ow.view, true, 0);
        const std::vector<int32_t> rows = Iota(13);
        for (int64_t tokens : {1, 2, 3, 4, 5, 8, 11, 16, 17}) {
          const std::vector<bf16_t> x = RandnBf16(tokens * hidden, 40 + tokens, 0.5f);
          for (bool int8 : {false, true}) {
            if (int8 && sc.format == WeightFormat::kInt4Zp) continue;  // no int8 inputs
            const std::vector<float> a = RunDotRows(base, m, x, tokens, rows, int8);
            const std::vector<float> b = RunDotRows(vnni, m, x, tokens, rows, int8);
            ASSERT_EQ(a.size(), b.size());
            for (size_t i = 0; i < a.size(); ++i) {
              ASSERT_EQ(std::bit_cast<uint32_t>(b[i]), std::bit_cast<uint32_t>(a[i]))
                  << fmt::format("{} {} g{} K{} tokens {}{}: output {} is {} there, {} on {}",
                                 CpuIsaName(vnni_isa), WeightFormatName(sc.format), sc.group,
                                 hidden, tokens, int8 ? " int8" : "", i, b[i], a[i],
                                 CpuIsaName(base_isa));
            }
            compared += static_cast<int64_t>(a.size());
          }
        }
      }
    }
  }
  if (compared == 0) GTEST_SKIP() << "neither AVX-VNNI nor AVX512_VNNI on this CPU";
}

// bf16 weights in the row-group layout (RepackBf16RowGroups): one token per expert up to many
// token tiles, every non-interleaved activation, biases, bf16 and gathered inputs,
// misalignment, and a gate_up reduction over two K blocks of 1024 pairs (H 2080: 1040 pairs).
TEST(GroupedGemm, Bf16RowGroupLayout) {
  for (Activation act : {Activation::kSwiGlu, Activation::kSiTu, Activation::kReluSquared,
                         Activation::kGeluTanhGated}) {
    for (const auto& [hidden, inter] : {std::pair<int64_t, int64_t>{64, 48}, {320, 96}}) {
      for (int64_t tokens : {1, 3, 7, 33, 200}) {
        GemmCase c{.format = WeightFormat::kBf16,
                   .act = act,
                   .hidden = hidden,
                   .inter = inter,
                   .bias = tokens == 33};
        CheckCase(c, tokens, 2, 300 + tokens, {.row_groups = true});
      }
    }
  }
  GemmCase c{.format = WeightFormat::kBf16, .hidden = 64, .inter = 32, .bias = true};
  CheckCase(c, 45, 3, 7, {.x_dtype = DType::kBF16, .misalign = true, .row_groups = true});
  CheckCase(c, 45, 3, 8, {.gather = true, .row_groups = true});
  // One expert with many tokens: 150 tokens in 25 tiles of 6.
  GemmCase one{.format = WeightFormat::kBf16, .num_experts = 1, .hidden = 320, .inter = 32};
  CheckCase(one, 150, 1, 9, {.row_groups = true});
  // Several token tiles over two K blocks: the second block accumulates onto the first.
  GemmCase wide{.format = WeightFormat::kBf16, .num_experts = 2, .hidden = 2080, .inter = 32};
  CheckCase(wide, 20, 1, 10, {.row_groups = true});
  CheckCase(wide, 2, 1, 11, {.row_groups = true});
}

// The layout is the same bytes reordered: the reference reads it through Bf16RowGroupsIndex and
// gives bit for bit what it gives on the row-major weights.
TEST(GroupedGemm, RowGroupRepackKeepsEveryWeight) {
  GemmCase c{.format = WeightFormat::kBf16, .num_experts = 3, .hidden = 48, .inter = 32};
  const FloatWeights f = RandomWeights(c, 4);
  const OwnedExpertWeights rm = Encode(c, f);
  OwnedExpertWeights rg = Encode(c, f);
  KernelContext ctx = MakeContext(CpuIsa::kAuto, 2);
  ASSERT_TRUE(RepackBf16RowGroups(ctx, &rg.view, rg.w13.data(), rg.w2.data()).ok());
  EXPECT_TRUE(rg.view.bf16_row_groups);
  for (int64_t e = 0; e < c.num_experts; ++e) {
    for (int64_t r = 0; r < c.Rows13(); ++r) {
      for (int64_t col = 0; col < c.hidden; ++col) {
        ASSERT_EQ(reference::DequantizeWeight(rg.view, reference::Projection::kW13, e, r, col),
                  reference::DequantizeWeight(rm.view, reference::Projection::kW13, e, r, col))
            << e << " " << r << " " << col;
      }
    }
    for (int64_t r = 0; r < c.hidden; ++r) {
      for (int64_t col = 0; col < c.inter; ++col) {
        ASSERT_EQ(reference::DequantizeWeight(rg.view, reference::Projection::kW2, e, r, col),
                  reference::DequantizeWeight(rm.view, reference::Projection::kW2, e, r, col));
      }
    }
  }
  // A few elements by hand: row 17 (group 1, lane 1), columns 4 and 5 (pair 2).
  const bf16_t* w13 = static_cast<const bf16_t*>(rg.view.w13);
  const bf16_t* orig = static_cast<const bf16_t*>(rm.view.w13);
  EXPECT_EQ(w13[((1 * (48 / 2) + 2) * 16 + 1) * 2].bits, orig[17 * 48 + 4].bits);
  EXPECT_EQ(w13[((1 * (48 / 2) + 2) * 16 + 1) * 2 + 1].bits, orig[17 * 48 + 5].bits);
}

TEST(GroupedGemm, RowGroupLayoutRejectsWhatItCannotHold) {
  KernelContext ctx = MakeContext(CpuIsa::kAuto, 1);
  auto repack = [&](const GemmCase& c) {
    OwnedExpertWeights ow = Encode(c, RandomWeights(c, 1));
    return RepackBf16RowGroups(ctx, &ow.view, ow.w13.data(), ow.w2.data());
  };
  Status s = repack({.format = WeightFormat::kBf16, .hidden = 40, .inter = 32});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("H 40"), std::string::npos) << s.message();
  s = repack({.format = WeightFormat::kFp8Block, .hidden = 64, .inter = 32});
  EXPECT_NE(s.message().find("expected bf16 weights for the row-group layout, got fp8"),
            std::string::npos)
      << s.message();
  s = repack({.format = WeightFormat::kBf16,
              .act = Activation::kSwiGluOai,
              .hidden = 64,
              .inter = 32,
              .interleaved = true});
  EXPECT_NE(s.message().find("interleaved"), std::string::npos) << s.message();
  GemmCase c{.format = WeightFormat::kBf16, .hidden = 64, .inter = 32};
  OwnedExpertWeights ow = Encode(c, RandomWeights(c, 1));
  ASSERT_TRUE(RepackBf16RowGroups(ctx, &ow.view, ow.w13.data(), ow.w2.data()).ok());
  s = RepackBf16RowGroups(ctx, &ow.view, ow.w13.data(), ow.w2.data());
  EXPECT_NE(s.message().find("already"), std::string::npos) << s.message();
  // A view flagged by hand with a shape the layout cannot hold fails validation.
  ExpertWeights bad = ow.view;
  bad.intermediate = 40;
  s = ValidateExpertWeights(bad, {});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("I 40"), std::string::npos) << s.message();
}

TEST(GroupedGemm, RejectsBadShapes) {
  KernelContext ctx = MakeContext(CpuIsa::kAuto, 1);
  GemmCase c{.format = WeightFormat::kMxfp4,
             .act = Activation::kSwiGlu,
             .num_experts = 2,
             .hidden = 64,
             .inter = 32};
  OwnedExpertWeights ow = Encode(c, RandomWeights(c, 1));
  std::vector<float> x(64 * 2), y(64 * 2);
  std::vector<int64_t> offsets = {0, 1, 2};
  GroupedGemmParams p;
  p.weights = &ow.view;
  p.x_sorted = x.data();
  p.x_dtype = DType::kF32;
  p.expert_offsets = offsets.data();
  p.y_sorted = y.data();
  EXPECT_TRUE(GroupedExpertGemm(ctx, p).ok());
  ExpertWeights bad = ow.view;
  bad.hidden = 48;  // not a multiple of the MXFP4 group
  p.weights = &bad;
  Status s = GroupedExpertGemm(ctx, p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("multiple of 32"), std::string::npos) << s.message();
  bad = ow.view;
  bad.gated = false;  // ReLU²-style weights with a gated activation
  EXPECT_EQ(GroupedExpertGemm(ctx, p).code(), StatusCode::kInvalidArgument);
  p.weights = &ow.view;
  offsets = {0, 2, 1};
  EXPECT_EQ(GroupedExpertGemm(ctx, p).code(), StatusCode::kInvalidArgument);
  offsets = {0, 1, 2};
  p.x_dtype = DType::kF16;
  EXPECT_EQ(GroupedExpertGemm(ctx, p).code(), StatusCode::kInvalidArgument);
}

// Act-order GPTQ experts: int4-zp codes whose groups' columns are spread over the input as
// act-order spreads them (g_idx names each column's group), made from a group-contiguous
// encoding by moving stored column c to position at[c].
struct ActOrderExperts {
  OwnedExpertWeights ow;
  std::vector<int32_t> g13, g2;  // [E, 2, H] (gate, up; [E, 1, H] not gated), [E, I]
};

// A shuffled g_idx over `cols` columns with `group` columns per group; at[c] = the stored
// position of the c-th column in group order.
std::vector<int32_t> ShuffledGroups(int64_t cols, int64_t group, uint64_t seed,
                                    std::vector<int32_t>* at) {
  at->resize(static_cast<size_t>(cols));
  std::iota(at->begin(), at->end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(at->begin(), at->end(), rng);
  std::vector<int32_t> gidx(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c)
    gidx[static_cast<size_t>((*at)[static_cast<size_t>(c)])] = static_cast<int32_t>(c / group);
  // Sorting by group is stable: group g's columns in increasing stored position.
  for (int64_t g = 0; g < cols / group; ++g) {
    std::sort(at->begin() + g * group, at->begin() + (g + 1) * group);
  }
  return gidx;
}

void ScatterNibbleColumns(uint8_t* data, int64_t rows, int64_t cols,
                          const std::vector<int32_t>& at) {
  std::vector<uint8_t> row(static_cast<size_t>(cols / 2));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* d = data + r * cols / 2;
    std::copy(d, d + cols / 2, row.begin());
    std::fill(d, d + cols / 2, uint8_t{0});
    for (int64_t c = 0; c < cols; ++c) {
      const int nib = (row[static_cast<size_t>(c / 2)] >> (c % 2 * 4)) & 0xF;
      const int32_t to = at[static_cast<size_t>(c)];
      d[to / 2] = static_cast<uint8_t>(d[to / 2] | (nib << (to % 2 * 4)));
    }
  }
}

ActOrderExperts MakeActOrder(const GemmCase& c, uint64_t seed) {
  ActOrderExperts a{.ow = Encode(c, RandomWeights(c, seed)), .g13 = {}, .g2 = {}};
  ExpertWeights& w = a.ow.view;
  for (int64_t e = 0; e < c.num_experts; ++e) {
    std::vector<int32_t> at13, at2;
    const std::vector<int32_t> g13 = ShuffledGroups(c.hidden, c.group, seed + 2 * e, &at13);
    const std::vector<int32_t> g2 = ShuffledGroups(c.inter, c.group, seed + 2 * e + 1, &at2);
    for (int part = 0; part < (IsGated(c.act) ? 2 : 1); ++part) {
      a.g13.insert(a.g13.end(), g13.begin(), g13.end());
    }
    a.g2.insert(a.g2.end(), g2.begin(), g2.end());
    ScatterNibbleColumns(a.ow.w13.as<uint8_t>() + e * c.Rows13() * c.hidden / 2, c.Rows13(),
                         c.hidden, at13);
    ScatterNibbleColumns(a.ow.w2.as<uint8_t>() + e * c.hidden * c.inter / 2, c.hidden, c.inter,
                         at2);
  }
  w.scheme.act_order = true;
  w.w13_group_index = a.g13.data();
  w.w2_group_index = a.g2.data();
  return a;
}

Result<bool> Sort(KernelContext& ctx, ActOrderExperts& a, std::vector<int32_t>* perm) {
  ActOrderBuffers b{.w13 = a.ow.w13.data(),
                    .w13_scales = a.ow.w13_scales.data(),
                    .w13_zeros = a.ow.w13_zeros.data(),
                    .w2 = a.ow.w2.data()};
  return SortActOrderExperts(ctx, &a.ow.view, b, perm);
}

// Sorted by group, the native kernels of every instruction set match the reference on the
// weights as they were (each column's scale through g_idx), from one token per expert (the decode
// walk) to 40 (the packed path), with fp32 inputs gathered through x_rows and with bf16 inputs.
TEST(ActOrderSortTest, SortedExpertsMatchTheActOrderReference) {
  // Gated (gate and up apart or interleaved) and not gated (ReLU^2: w13 is I rows).
  for (const auto& [kind, interleaved] :
       {std::pair{Activation::kSwiGlu, false}, std::pair{Activation::kSwiGlu, true},
        std::pair{Activation::kReluSquared, false}}) {
    const GemmCase c{.format = WeightFormat::kInt4Zp,
                     .act = kind,
                     .num_experts = 4,
                     .hidden = 256,
                     .inter = 128,
                     .interleaved = interleaved,
                     .group = 64};
    ActOrderExperts as_loaded = MakeActOrder(c, 41);
    ActOrderExperts sorted = MakeActOrder(c, 41);
    KernelContext ctx = MakeContext(CpuIsa::kAuto, 2);
    std::vector<int32_t> perm;
    const Result<bool> ok = Sort(ctx, sorted, &perm);
    ASSERT_TRUE(ok.ok() && *ok) << c.Name();
    EXPECT_FALSE(sorted.ow.view.scheme.act_order);
    EXPECT_EQ(sorted.ow.view.w13_input_perm, perm.data());
    ASSERT_EQ(static_cast<int64_t>(perm.size()), c.num_experts * c.hidden);
    ActivationParams act;
    act.kind = c.act;
    for (const int64_t tokens : {1, 5, 40}) {
      const std::vector<int64_t> offsets = Offsets(c.num_experts, tokens, 2, 7 + tokens);
      const std::vector<float> x = Randn(offsets.back() * c.hidden, 9 + tokens, kInputScale);
      for (const RunOptions& o :
           {RunOptions{.gather = true}, RunOptions{.x_dtype = DType::kBF16}}) {
        std::vector<float> want;
        RunGemm(CpuIsa::kPortable, as_loaded.ow.view, act, offsets, x, o, &want);
        for (CpuIsa isa : TestIsas()) {
          const std::vector<float> got = RunGemm(isa, sorted.ow.view, act, offsets, x, o, nullptr);
          EXPECT_TRUE(Close(got, want, TolFor(c.format),
                            fmt::format("{} {} tokens {} {}", c.Name(), tokens, CpuIsaName(isa),
                                        o.gather ? "fp32 gathered" : "bf16"),
                            41));
        }
      }
    }
  }
}

// The sorted view belongs to the cpu backend: the reference, which reads act-order experts as
// loaded (g_idx per column), refuses it instead of reading its inputs in the wrong order, and an
// act-order view may not carry an input order.
TEST(ActOrderSortTest, SortedViewIsRefusedWhereItWouldBeReadWrongly) {
  const GemmCase c{
      .format = WeightFormat::kInt4Zp, .num_experts = 2, .hidden = 128, .inter = 64, .group = 32};
  ActOrderExperts a = MakeActOrder(c, 7);
  KernelContext ctx = MakeContext(CpuIsa::kAuto, 2);
  std::vector<int32_t> perm;
  const Result<bool> ok = Sort(ctx, a, &perm);
  ASSERT_TRUE(ok.ok() && *ok);
  ActivationParams act;
  act.kind = c.act;
  const std::vector<int64_t> offsets = {0, 1, 2};
  const std::vector<float> x(static_cast<size_t>(2 * c.hidden), 0.5f);
  std::vector<float> y(static_cast<size_t>(2 * c.hidden));
  GroupedGemmParams p;
  p.weights = &a.ow.view;
  p.activation = act;
  p.x_sorted = x.data();
  p.x_dtype = DType::kF32;
  p.expert_offsets = offsets.data();
  p.y_sorted = y.data();
  const Status ref = reference::GroupedExpertGemm(p);
  EXPECT_EQ(ref.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ref.message().find("'w13_input_perm'"), std::string::npos) << ref.message();
  ExpertWeights both = a.ow.view;
  both.scheme.act_order = true;
  both.w13_group_index = a.g13.data();
  both.w2_group_index = a.g2.data();
  const Status v = ValidateExpertWeights(both, act);
  EXPECT_EQ(v.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(v.message().find("'w13_input_perm'"), std::string::npos) << v.message();
}

// Where the sort cannot make whole groups it changes nothing and says so: a group with one
// column too many (and its neighbour one too few), gate and up with different g_idx, w2's scales
// covering more groups than its columns hold (a TP slice of I), biases.
TEST(ActOrderSortTest, RefusesWhatCannotBeSorted) {
  const GemmCase c{
      .format = WeightFormat::kInt4Zp, .num_experts = 2, .hidden = 128, .inter = 64, .group = 32};
  KernelContext ctx = MakeContext(CpuIsa::kAuto, 2);
  auto refuses = [&](const char* what, const std::function<void(ActOrderExperts&)>& spoil) {
    ActOrderExperts a = MakeActOrder(c, 5);
    spoil(a);
    const std::vector<uint8_t> w13(a.ow.w13.as<uint8_t>(),
                                   a.ow.w13.as<uint8_t>() + a.ow.w13.size());
    const std::vector<uint8_t> w2(a.ow.w2.as<uint8_t>(), a.ow.w2.as<uint8_t>() + a.ow.w2.size());
    const std::vector<uint8_t> scales = a.ow.w13_scales;
    const std::vector<uint8_t> zeros = a.ow.w13_zeros;
    std::vector<int32_t> perm;
    const Result<bool> ok = Sort(ctx, a, &perm);
    ASSERT_TRUE(ok.ok()) << what;
    EXPECT_FALSE(*ok) << what;
    EXPECT_TRUE(a.ow.view.scheme.act_order) << what;
    EXPECT_TRUE(std::equal(w13.begin(), w13.end(), a.ow.w13.as<uint8_t>())) << what;
    EXPECT_TRUE(std::equal(w2.begin(), w2.end(), a.ow.w2.as<uint8_t>())) << what;
    EXPECT_EQ(scales, a.ow.w13_scales) << what;
    EXPECT_EQ(zeros, a.ow.w13_zeros) << what;
  };
  refuses("uneven groups", [](ActOrderExperts& a) {
    const auto it = std::find(a.g2.begin() + 64, a.g2.end(), 1);  // expert 1's w2
    *it = 0;
  });
  refuses("gate and up differ", [&](ActOrderExperts& a) {
    std::swap(a.g13[c.hidden + 0], a.g13[c.hidden + 1]);  // expert 0's up
    if (a.g13[c.hidden] == a.g13[c.hidden + 1]) std::swap(a.g13[c.hidden], a.g13[c.hidden + 40]);
  });
  refuses("w2 split by TP", [](ActOrderExperts& a) { a.ow.view.w2_scale_cols = 4; });
  std::vector<float> bias(static_cast<size_t>(c.num_experts * c.Rows13()), 0.0f);
  refuses("biases", [&](ActOrderExperts& a) { a.ow.view.w13_bias = bias.data(); });
}

// The cpu backend knows the layers it rewrote by their address and shape: other experts later
// placed at the same address (a freed layer's memory reused) are read as loaded, not as the row
// groups the earlier layer was rewritten into.
TEST(CpuBackendPrepareTest, OtherExpertsAtARewrittenAddressAreReadAsLoaded) {
  Result<std::unique_ptr<KernelBackend>> be = CreateKernelBackend(
      {.name = "cpu", .num_threads = 2, .settings = {{"expert-layout", "row-groups"}}});
  ASSERT_TRUE(be.ok()) << be.status().message();
  const GemmCase first{.num_experts = 2, .hidden = 64, .inter = 32};
  OwnedExpertWeights a = Encode(first, RandomWeights(first, 61));
  PrepareExpertsArgs args;
  args.weights = a.view;
  args.w13 = a.w13.data();
  args.w2 = a.w2.data();
  const Result<bool> rewritten = (*be)->PrepareExperts(args);
  ASSERT_TRUE(rewritten.ok() && *rewritten) << "the bf16 layer was not put into row groups";
  // One expert of I 16, row-major, written over the first layer's memory.
  const GemmCase second{.num_experts = 1, .hidden = 64, .inter = 16};
  OwnedExpertWeights b = Encode(second, RandomWeights(second, 62));
  ASSERT_LE(b.w13.size(), a.w13.size());
  ASSERT_LE(b.w2.size(), a.w2.size());
  std::memcpy(a.w13.data(), b.w13.data(), b.w13.size());
  std::memcpy(a.w2.data(), b.w2.data(), b.w2.size());
  ExpertWeights reused = b.view;
  reused.w13 = a.w13.data();
  reused.w2 = a.w2.data();
  const std::vector<int64_t> offsets = {0, 3};
  const std::vector<float> x = Randn(3 * second.hidden, 63, kInputScale);
  auto run = [&](const ExpertWeights& w, bool reference) {
    std::vector<float> y(static_cast<size_t>(3 * second.hidden));
    GroupedGemmParams p;
    p.weights = &w;
    p.activation.kind = second.act;
    p.x_sorted = x.data();
    p.x_dtype = DType::kF32;
    p.expert_offsets = offsets.data();
    p.y_sorted = y.data();
    const Status s = reference ? reference::GroupedExpertGemm(p) : (*be)->ExpertGemm(p);
    EXPECT_TRUE(s.ok()) << s.message();
    return y;
  };
  EXPECT_TRUE(Close(run(reused, false), run(b.view, true), TolFor(WeightFormat::kBf16),
                    "reused address", 61));
}

}  // namespace
}  // namespace moeshard
