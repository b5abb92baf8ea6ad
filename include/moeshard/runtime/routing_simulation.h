// Simulated routing: top-k expert ids and weights drawn from a seeded distribution instead of
// the router, for `moeshard run --routing-simulation` (and anyone feeding the routing bypass,
// ShardedJobSpec::topk_ids / topk_weights). Dummy weights route near-uniformly; the skewed
// loads that redundant experts and EPLB exist for need a skewed routing. The single-rank
// reference takes the same ids and weights, so verification still compares like with like.
//
// The name and `uniform_random` follow vLLM's routing simulator (the environment variable
// VLLM_MOE_ROUTING_SIMULATION_STRATEGY, vllm/model_executor/layers/fused_moe/
// routing_simulator.py, strategy "uniform_random"); `zipf` is moeshard's:
//
//   zipf[:S]        expert popularity follows Zipf's law with exponent S (default 1.0): the
//                   expert of popularity rank r (0-based) is drawn with probability
//                   proportional to 1 / (r + 1)^S. Which expert holds rank r is a seeded
//                   permutation, so the hot experts are not simply the first ones.
//   uniform_random  every expert equally likely (zipf:0).
//
// Each token draws top_k distinct experts, one after the other from the remaining ones in
// proportion to their probability, and random weights in [0.5, 1.5) normalised to sum 1 (as a
// renormalised top-k). Every token's draw depends only on (seed, token index): the same
// routing for any split of the tokens over ranks.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "moeshard/base/status.h"

namespace moeshard {

struct RoutingSimulation {
  double zipf_s = 1.0;  // 0: uniform_random
  std::string Describe() const;
};

// "zipf", "zipf:S" (S >= 0, finite) or "uniform_random"; InvalidArgument naming the flag
// otherwise.
Result<RoutingSimulation> ParseRoutingSimulation(std::string_view text);

struct SimulatedRouting {
  std::vector<int32_t> topk_ids;    // [num_tokens, top_k] distinct experts per token
  std::vector<float> topk_weights;  // [num_tokens, top_k], each row sums to 1
};

// REQUIRES: 0 < top_k <= num_experts, num_tokens >= 0.
SimulatedRouting SimulateRouting(const RoutingSimulation& sim, int64_t num_tokens,
                                 int64_t num_experts, int64_t top_k, uint64_t seed);

}  // namespace moeshard
