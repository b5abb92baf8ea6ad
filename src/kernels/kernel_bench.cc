#include "moeshard/kernels/kernel_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <set>

#include "moeshard/kernels/kernel_context.h"
#include "moeshard/kernels/moe_forward.h"
#include "moeshard/kernels/quantize.h"
#include "moeshard/kernels/roofline.h"
#include "moeshard/kernels/routing.h"

namespace moeshard {

std::vector<KernelBenchShape> DefaultKernelBenchShapes() {
  return {
      {"qwen3-30b-a3b", 2048, 768, 128, 8},
      {"kimi-k2-32e", 7168, 2048, 32, 8},
      {"kimi-k3-latent-64e", 3584, 3072, 64, 16},
  };
}

Result<Roofline> MeasureRoofline(KernelContext& ctx, const ReadBuffer& read, int repetitions) {
  Roofline r;
  MOESHARD_ASSIGN_OR_RETURN(r.read_bytes_per_s, MeasureReadBandwidth(ctx, read, repetitions));
  MOESHARD_ASSIGN_OR_RETURN(r.peak_flops_per_s, MeasureComputePeak(ctx, repetitions));
  return r;
}

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

std::string KernelBenchFormatName(const KernelBenchResult& r) {
  return r.row_groups ? "bf16-rg" : std::string(WeightFormatName(r.format));
}

Roofline BestOf(const Roofline& a, const Roofline& b) {
  return {std::max(a.read_bytes_per_s, b.read_bytes_per_s),
          std::max(a.peak_flops_per_s, b.peak_flops_per_s)};
}

void ApplyRoofline(const Roofline& run_best, std::vector<KernelBenchResult>* results) {
  for (KernelBenchResult& r : *results) {
    const Roofline& local =
        r.roofline.read_bytes_per_s > 0 && r.roofline.peak_flops_per_s > 0 ? r.roofline : run_best;
    r.memory_seconds = r.weight_bytes / local.read_bytes_per_s;
    r.compute_seconds = r.flops / local.peak_flops_per_s;
    r.bound = r.memory_seconds >= r.compute_seconds ? "memory" : "compute";
    r.fraction = std::max(r.memory_seconds, r.compute_seconds) / r.seconds;
    r.fraction_of_run_best =
        std::max(r.weight_bytes / run_best.read_bytes_per_s, r.flops / run_best.peak_flops_per_s) /
        r.seconds;
  }
}

namespace {

// Shape check only: a probe with every pointer set, none read.
Status ValidateBenchShape(const WeightScheme& scheme, const KernelBenchShape& shape,
                          const ActivationParams& act) {
  ExpertWeights probe{.scheme = scheme,
                      .num_experts_local = shape.num_experts,
                      .hidden = shape.hidden,
                      .intermediate = shape.intermediate};
  probe.w13 = probe.w2 = probe.w13_scales = probe.w2_scales = &probe;
  const float dummy[2] = {1.0f, 1.0f};
  const uint8_t dummy_zeros[1] = {0};
  probe.w13_zeros = probe.w2_zeros = dummy_zeros;
  probe.w13_global = probe.w2_global = dummy;
  return ValidateExpertWeights(probe, act);
}

// What one (shape, format, layout, tokens) case measured.
struct CaseTimes {
  std::vector<double> times, routing_times, versus_times, ratios;  // one per repetition
  double touched_sum = 0.0;  // distinct experts routed to, summed over repetitions
  Roofline roofline;         // best of the rooflines measured just before and after
};

// Routes fresh logits and runs the experts forward on `ctx` (and, A/B, on o.versus): one
// warm-up (first-touch of scratch buffers), then timed repetitions for at least
// o.min_repetitions and o.min_seconds.
Result<CaseTimes> TimeCase(KernelContext& ctx, const KernelBenchOptions& o, const ReadBuffer& read,
                           const KernelBenchShape& shape, const ExpertWeights& weights,
                           const ActivationParams& act, int64_t tokens) {
  const int64_t h = shape.hidden;
  std::vector<float> x(static_cast<size_t>(tokens * h));
  std::mt19937_64 rng(o.seed + static_cast<uint64_t>(tokens));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : x) v = nd(rng);
  std::vector<float> out(x.size());
  std::vector<float> logits(static_cast<size_t>(tokens * shape.num_experts));
  std::vector<int32_t> ids(static_cast<size_t>(tokens * shape.top_k));
  std::vector<float> rw(ids.size());
  RoutingParams rp{
      .kind = RoutingKind::kSoftmaxTopK, .num_experts = shape.num_experts, .top_k = shape.top_k};
  CaseTimes t;
  MOESHARD_ASSIGN_OR_RETURN(const Roofline around_before, MeasureRoofline(ctx, read, 2));
  const double start = Now();
  for (int rep = -1; rep < o.min_repetitions || Now() - start < o.min_seconds; ++rep) {
    for (float& v : logits) v = nd(rng);
    const double t0 = Now();
    MOESHARD_RETURN_IF_ERROR(Route(ctx, rp, {logits.data(), tokens, ids.data(), rw.data()}));
    const double t1 = Now();
    MoeExpertsParams p;
    p.topk_ids = ids.data();
    p.topk_weights = rw.data();
    p.num_tokens = tokens;
    p.top_k = shape.top_k;
    p.num_experts_global = shape.num_experts;
    p.x = x.data();
    p.x_dtype = DType::kF32;
    p.weights = &weights;
    p.activation = act;
    p.out = out.data();
    // A/B: the other context runs first on odd repetitions, so neither always finds the caches
    // the other left.
    auto timed = [&](KernelContext& c) -> Result<double> {
      const double a = Now();
      MOESHARD_RETURN_IF_ERROR(MoeExpertsForward(c, p));
      return Now() - a;
    };
    double tv = 0.0;
    if (o.versus != nullptr && rep % 2 != 0) {
      MOESHARD_ASSIGN_OR_RETURN(tv, timed(*o.versus));
    }
    MOESHARD_ASSIGN_OR_RETURN(const double ta, timed(ctx));
    if (o.versus != nullptr && rep % 2 == 0) {
      MOESHARD_ASSIGN_OR_RETURN(tv, timed(*o.versus));
    }
    if (rep < 0) continue;
    t.routing_times.push_back(t1 - t0);
    t.times.push_back(ta);
    if (o.versus != nullptr) {
      t.versus_times.push_back(tv);
      t.ratios.push_back(tv / ta);
    }
    t.touched_sum += static_cast<double>(std::set<int32_t>(ids.begin(), ids.end()).size());
    if (rep > 1000) break;
  }
  MOESHARD_ASSIGN_OR_RETURN(const Roofline around_after, MeasureRoofline(ctx, read, 2));
  t.roofline = BestOf(around_before, around_after);
  return t;
}

// One result row from a case's timings (before the roofline fractions are applied).
KernelBenchResult SummarizeCase(const KernelBenchOptions& o, const KernelBenchShape& shape,
                                WeightFormat format, bool row_groups, int64_t tokens,
                                double expert_bytes, const CaseTimes& t) {
  KernelBenchResult r;
  r.shape = shape.name;
  r.format = format;
  r.row_groups = row_groups;
  r.num_tokens = tokens;
  r.roofline = t.roofline;
  r.repetitions = static_cast<int>(t.times.size());
  r.experts_touched = t.touched_sum / r.repetitions;
  r.weight_bytes = r.experts_touched * expert_bytes;
  r.flops = 2.0 * static_cast<double>(tokens * shape.top_k) * 3.0 *
            static_cast<double>(shape.hidden * shape.intermediate);
  r.seconds = Median(t.times);
  r.routing_seconds = Median(t.routing_times);
  if (o.versus != nullptr) {
    r.versus_seconds = Median(t.versus_times);
    r.versus_ratio = Median(t.ratios);
  }
  return r;
}

}  // namespace

Result<std::vector<KernelBenchResult>> RunKernelBench(
    KernelContext& ctx, const KernelBenchOptions& o, const ReadBuffer& read,
    const Roofline& roofline, const std::function<void(const KernelBenchResult&)>& on_result) {
  if (roofline.read_bytes_per_s <= 0 || roofline.peak_flops_per_s <= 0) {
    return InvalidArgumentError("bench kernels: 'roofline': expected positive measurements");
  }
  std::vector<KernelBenchResult> results;
  for (const KernelBenchShape& shape : o.shapes) {
    for (WeightFormat format : o.formats) {
      const WeightScheme scheme = WeightScheme::Default(format);
      ExpertWeightsShape ws{.scheme = scheme,
                            .num_experts_local = shape.num_experts,
                            .hidden = shape.hidden,
                            .intermediate = shape.intermediate};
      ActivationParams act;
      MOESHARD_RETURN_IF_ERROR(ValidateBenchShape(scheme, shape, act));
      // One set of weights per (shape, format), freed before the next; bf16 is measured in
      // each layout of o.bf16_row_groups, repacked in place when it turns to row groups.
      OwnedExpertWeights weights = MakeRandomExpertWeights(ctx, ws, o.seed);
      const double expert_bytes =
          static_cast<double>(ExpertMatrixBytes(scheme, 2 * shape.intermediate, shape.hidden) +
                              ExpertMatrixBytes(scheme, shape.hidden, shape.intermediate));
      const std::vector<bool> layouts =
          format == WeightFormat::kBf16 ? o.bf16_row_groups : std::vector<bool>{false};
      for (const bool row_groups : layouts) {
        if (row_groups != weights.view.bf16_row_groups) {
          if (!row_groups) {
            return InvalidArgumentError(
                "bench kernels: 'bf16_row_groups': expected row-major (false) before row groups "
                "(true), "
                "got row-major after row groups");
          }
          MOESHARD_RETURN_IF_ERROR(
              RepackBf16RowGroups(ctx, &weights.view, weights.w13.data(), weights.w2.data())
                  .WithContext(fmt::format("bench kernels: shape {}", shape.name)));
        }
        for (int64_t tokens : o.tokens) {
          MOESHARD_ASSIGN_OR_RETURN(const CaseTimes t,
                                    TimeCase(ctx, o, read, shape, weights.view, act, tokens));
          std::vector<KernelBenchResult> one = {
              SummarizeCase(o, shape, format, row_groups, tokens, expert_bytes, t)};
          ApplyRoofline(BestOf(roofline, one[0].roofline), &one);
          if (on_result) on_result(one[0]);
          results.push_back(one[0]);
        }
      }
    }
  }
  return results;
}

}  // namespace moeshard
