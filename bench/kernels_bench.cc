// Google Benchmark cases for the CPU MoE kernels (the full ratio report is
// `moeshard bench kernels`). Counters: `bytes` = distinct expert weight bytes touched per
// iteration, `flops` = expert FLOPs per iteration, reported as rates.
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "base/check.h"
#include "moeshard/kernels/kernel_bench.h"
#include "moeshard/kernels/kernel_context.h"
#include "moeshard/kernels/moe_forward.h"
#include "moeshard/kernels/quantize.h"
#include "moeshard/kernels/routing.h"

namespace moeshard {
namespace {

KernelContext& Context() {
  static KernelContext ctx = KernelContext::Create({}).value();
  return ctx;
}

// One resident weight set at a time (Kimi-K2 bf16 alone is 2.8 GB); `row_groups`: bf16 in the
// row-group layout.
const OwnedExpertWeights& Weights(const KernelBenchShape& s, WeightFormat f, bool row_groups) {
  static std::unique_ptr<OwnedExpertWeights> cached;
  static std::string key;
  const std::string k = s.name + std::string(WeightFormatName(f)) + (row_groups ? "-rg" : "");
  if (!cached || key != k) {
    cached.reset();
    cached = std::make_unique<OwnedExpertWeights>(
        MakeRandomExpertWeights(Context(),
                                {.scheme = WeightScheme::Default(f),
                                 .num_experts_local = s.num_experts,
                                 .hidden = s.hidden,
                                 .intermediate = s.intermediate},
                                1));
    if (row_groups) {
      MOESHARD_CHECK(
          RepackBf16RowGroups(Context(), &cached->view, cached->w13.data(), cached->w2.data()).ok(),
          "repack failed");
    }
    key = k;
  }
  return *cached;
}

void BM_MoeExperts(benchmark::State& state, int shape_idx, WeightFormat format,
                   bool row_groups = false) {
  const KernelBenchShape s = DefaultKernelBenchShapes()[static_cast<size_t>(shape_idx)];
  const int64_t tokens = state.range(0);
  const OwnedExpertWeights& w = Weights(s, format, row_groups);
  KernelContext& ctx = Context();
  std::mt19937_64 rng(tokens);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(tokens * s.hidden)), out(x.size());
  for (float& v : x) v = nd(rng);
  std::vector<float> logits(static_cast<size_t>(tokens * s.num_experts));
  std::vector<int32_t> ids(static_cast<size_t>(tokens * s.top_k));
  std::vector<float> rw(ids.size());
  RoutingParams rp{
      .kind = RoutingKind::kSoftmaxTopK, .num_experts = s.num_experts, .top_k = s.top_k};
  const double expert_bytes =
      static_cast<double>(ExpertMatrixBytes(w.view.scheme, 2 * s.intermediate, s.hidden) +
                          ExpertMatrixBytes(w.view.scheme, s.hidden, s.intermediate));
  double bytes = 0.0;
  for (auto _ : state) {
    state.PauseTiming();  // new routing each iteration: other experts, cold caches
    for (float& v : logits) v = nd(rng);
    if (!Route(ctx, rp, {logits.data(), tokens, ids.data(), rw.data()}).ok()) {
      state.SkipWithError("route failed");
      break;
    }
    bytes += expert_bytes * static_cast<double>(std::set<int32_t>(ids.begin(), ids.end()).size());
    state.ResumeTiming();
    MoeExpertsParams p;
    p.topk_ids = ids.data();
    p.topk_weights = rw.data();
    p.num_tokens = tokens;
    p.top_k = s.top_k;
    p.num_experts_global = s.num_experts;
    p.x = x.data();
    p.weights = &w.view;
    p.out = out.data();
    if (!MoeExpertsForward(ctx, p).ok()) {
      state.SkipWithError("forward failed");
      break;
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["bytes"] = benchmark::Counter(bytes, benchmark::Counter::kIsRate);
  state.counters["flops"] = benchmark::Counter(2.0 * static_cast<double>(tokens * s.top_k) * 3.0 *
                                                   static_cast<double>(s.hidden * s.intermediate) *
                                                   static_cast<double>(state.iterations()),
                                               benchmark::Counter::kIsRate);
}

void BM_Route(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  std::vector<float> logits(static_cast<size_t>(tokens * 256));
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd;
  for (float& v : logits) v = nd(rng);
  std::vector<float> bias(256, 0.01f);
  std::vector<int32_t> ids(static_cast<size_t>(tokens * 8));
  std::vector<float> w(ids.size());
  RoutingParams rp{.kind = RoutingKind::kSigmoidGroupedTopK,
                   .num_experts = 256,
                   .top_k = 8,
                   .num_groups = 8,
                   .topk_group = 4,
                   .e_score_correction_bias = bias.data(),
                   .routed_scaling_factor = 2.5f};
  for (auto _ : state) {
    benchmark::DoNotOptimize(Route(Context(), rp, {logits.data(), tokens, ids.data(), w.data()}));
  }
  state.SetItemsProcessed(state.iterations() * tokens);
}

void TokenArgs(benchmark::internal::Benchmark* b) {
  for (int64_t t : {1, 8, 32, 128, 512, 2048}) b->Arg(t);
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK_CAPTURE(BM_MoeExperts, qwen3_30b_a3b_bf16, 0, WeightFormat::kBf16)->Apply(TokenArgs);
BENCHMARK_CAPTURE(BM_MoeExperts, qwen3_30b_a3b_bf16_rg, 0, WeightFormat::kBf16, true)
    ->Apply(TokenArgs);
BENCHMARK_CAPTURE(BM_MoeExperts, qwen3_30b_a3b_mxfp4, 0, WeightFormat::kMxfp4)->Apply(TokenArgs);
BENCHMARK_CAPTURE(BM_MoeExperts, kimi_k2_32e_bf16, 1, WeightFormat::kBf16)
    ->Arg(1)
    ->Arg(8)
    ->Arg(512)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_MoeExperts, kimi_k2_32e_bf16_rg, 1, WeightFormat::kBf16, true)
    ->Arg(1)
    ->Arg(8)
    ->Arg(512)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_MoeExperts, kimi_k3_latent_64e_mxfp4, 2, WeightFormat::kMxfp4)
    ->Arg(1)
    ->Arg(8)
    ->Arg(512)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Route)->Arg(1)->Arg(512)->Arg(4096);

}  // namespace
}  // namespace moeshard

BENCHMARK_MAIN();
