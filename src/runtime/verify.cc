#include "moeshard/runtime/verify.h"

#include <fmt/format.h>

#include <cmath>

#include "base/check.h"

namespace moeshard {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

void ErrorStats::Merge(const ErrorStats& o) {
  if (o.count == 0) return;
  if (count == 0 || o.max_abs_err > max_abs_err) {
    max_abs_err = o.max_abs_err;
    worst_index = o.worst_index;
  }
  count += o.count;
  sum_abs_err += o.sum_abs_err;
  max_abs_ref = std::max(max_abs_ref, o.max_abs_ref);
  num_nonfinite += o.num_nonfinite;
}

std::string ErrorStats::Summary(const Tolerance& tol) const {
  return fmt::format("max {:.3e} mean {:.3e} (max |ref| {:.3g}, limit {:.3e}{}): {}", max_abs_err,
                     mean_abs_err(), max_abs_ref, limit(tol),
                     num_nonfinite > 0 ? fmt::format(", {} non-finite", num_nonfinite) : "",
                     Passes(tol) ? "ok" : "FAILED");
}

ErrorStats CompareOutputs(std::span<const float> out, std::span<const float> ref) {
  MOESHARD_CHECK(out.size() == ref.size(), "CompareOutputs: {} vs {} elements", out.size(),
                 ref.size());
  ErrorStats s;
  s.count = static_cast<int64_t>(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) {
      ++s.num_nonfinite;
      continue;
    }
    const double err = std::fabs(static_cast<double>(out[i]) - static_cast<double>(ref[i]));
    s.sum_abs_err += err;
    if (err > s.max_abs_err || s.worst_index < 0) {
      s.worst_index = static_cast<int64_t>(i);
      s.max_abs_err = err;
    }
    s.max_abs_ref = std::max(s.max_abs_ref, std::fabs(static_cast<double>(ref[i])));
  }
  return s;
}

void DummyHiddenStates(uint64_t seed, int64_t unit, int64_t num_tokens, int64_t hidden,
                       float* out) {
  const uint64_t key =
      SplitMix64(seed ^ SplitMix64(0x68696464656eull + static_cast<uint64_t>(unit)));
  for (int64_t t = 0; t < num_tokens; ++t) {
    const uint64_t row = SplitMix64(key + static_cast<uint64_t>(t));
    for (int64_t h = 0; h < hidden; ++h) {
      const uint64_t bits = SplitMix64(row ^ static_cast<uint64_t>(h)) >> 40;  // 24 bits
      out[t * hidden + h] = static_cast<float>(bits) * (2.0f / 16777216.0f) - 1.0f;
    }
  }
}

void DummyTokenIds(uint64_t seed, int64_t unit, int64_t num_tokens, int64_t vocab, int32_t* out) {
  const uint64_t key =
      SplitMix64(seed ^ SplitMix64(0x746f6b656e73ull + static_cast<uint64_t>(unit)));
  for (int64_t t = 0; t < num_tokens; ++t) {
    out[t] = static_cast<int32_t>(SplitMix64(key + static_cast<uint64_t>(t)) %
                                  static_cast<uint64_t>(vocab));
  }
}

PlanOptions SingleRankPlanOptions(const PlanOptions& options) {
  PlanOptions o = options;
  o.topology = Topology{};
  return o;
}

}  // namespace moeshard
