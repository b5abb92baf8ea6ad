#include "moeshard/runtime/routing_simulation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "base/check.h"

namespace moeshard {
namespace {

// SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", 2014):
// a counter-based stream, so every token's draws follow from (seed, token) alone.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from the 53 high bits.
double Unit(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

class Stream {
 public:
  explicit Stream(uint64_t key) : state_(Mix(key)) {}
  double Next() { return Unit(state_ = Mix(state_)); }

 private:
  uint64_t state_;
};

}  // namespace

std::string RoutingSimulation::Describe() const {
  return zipf_s == 0 ? std::string("uniform_random") : fmt::format("zipf:{}", zipf_s);
}

Result<RoutingSimulation> ParseRoutingSimulation(std::string_view text) {
  RoutingSimulation sim;
  if (text == "uniform_random") {
    sim.zipf_s = 0;
    return sim;
  }
  const auto bad = [&] {
    return InvalidArgumentError(fmt::format(
        "run: '--routing-simulation {}': expected zipf, zipf:S (a Zipf exponent S >= 0, e.g. "
        "zipf:1.2) or uniform_random",
        text));
  };
  if (text == "zipf") return sim;
  if (text.substr(0, 5) != "zipf:" || text.size() == 5) return bad();
  const std::string number(text.substr(5));
  char* end = nullptr;
  const double s = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(s) || s < 0) return bad();
  sim.zipf_s = s;
  return sim;
}

SimulatedRouting SimulateRouting(const RoutingSimulation& sim, int64_t num_tokens,
                                 int64_t num_experts, int64_t top_k, uint64_t seed) {
  MOESHARD_CHECK(top_k > 0 && top_k <= num_experts && num_tokens >= 0,
                 "simulated routing: top_k {} of {} experts, {} tokens", top_k, num_experts,
                 num_tokens);
  const size_t E = static_cast<size_t>(num_experts), k = static_cast<size_t>(top_k);
  // The expert of each popularity rank: a seeded Fisher-Yates shuffle.
  std::vector<int32_t> expert_of_rank(E);
  std::iota(expert_of_rank.begin(), expert_of_rank.end(), 0);
  Stream shuffle(seed ^ 0x5a17f00dULL);
  for (size_t i = E - 1; i > 0; --i) {
    const size_t j = static_cast<size_t>(shuffle.Next() * static_cast<double>(i + 1));
    std::swap(expert_of_rank[i], expert_of_rank[std::min(j, i)]);
  }
  std::vector<double> prob(E);
  for (size_t r = 0; r < E; ++r) prob[r] = std::pow(static_cast<double>(r + 1), -sim.zipf_s);

  SimulatedRouting out;
  out.topk_ids.resize(static_cast<size_t>(num_tokens) * k);
  out.topk_weights.resize(out.topk_ids.size());
  std::vector<char> taken(E);
  for (int64_t t = 0; t < num_tokens; ++t) {
    Stream rng(seed * 0x100000001b3ULL + static_cast<uint64_t>(t));
    std::fill(taken.begin(), taken.end(), 0);
    double remaining = std::accumulate(prob.begin(), prob.end(), 0.0);
    double weight_sum = 0;
    int32_t* ids = out.topk_ids.data() + static_cast<size_t>(t) * k;
    float* w = out.topk_weights.data() + static_cast<size_t>(t) * k;
    for (size_t c = 0; c < k; ++c) {
      // The rank whose cumulative probability (over the ranks not taken) passes the draw; the
      // last free rank when rounding leaves the draw just past the end.
      const double target = rng.Next() * remaining;
      size_t pick = E, last_free = E;
      double acc = 0;
      for (size_t r = 0; r < E && pick == E; ++r) {
        if (taken[r]) continue;
        last_free = r;
        acc += prob[r];
        if (acc > target) pick = r;
      }
      if (pick == E) pick = last_free;
      taken[pick] = 1;
      remaining -= prob[pick];
      ids[c] = expert_of_rank[pick];
      w[c] = static_cast<float>(0.5 + rng.Next());
      weight_sum += w[c];
    }
    for (size_t c = 0; c < k; ++c) w[c] = static_cast<float>(w[c] / weight_sum);
  }
  return out;
}

}  // namespace moeshard
