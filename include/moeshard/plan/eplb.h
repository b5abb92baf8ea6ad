// Expert-parallel load balancing (EPLB): which logical expert each routed-expert slot holds, per
// MoE layer, so that every EP rank gets a similar share of the routed tokens.
//
// The algorithm is the one DeepSeek describes for its EPLB (github.com/deepseek-ai/EPLB,
// README "Hierarchical Load Balancing" and "Global Load Balancing"; DeepSeek-V3 technical
// report, section 3.4 "redundant experts"):
//   1. hierarchical, when the expert groups divide by the nodes: the groups of experts (the
//      model's n_group) are packed onto nodes so that node loads are balanced; within each node
//      the heaviest experts get replicas (each new replica goes to the expert with the largest
//      load per replica) until the node's slots are filled; the node's replicas are then packed
//      onto its ranks, heaviest first, each onto the least-loaded rank that still has room;
//   2. global, otherwise: the same with one node and one group.
// A replica serves an equal share of its expert's tokens (the runtime splits them so), which is
// the load the packing balances. One departure from DeepSeek's description, for moeshard's
// runtime, which sends each token of an expert to one of the ranks holding it (a second copy on
// the same rank would serve nothing): an expert gets at most as many replicas as the node has
// ranks while any expert has fewer, and a replica goes to the least-loaded rank with room that
// does not hold its expert yet, when there is one.
//
// Thread safety: pure functions over value types.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "moeshard/base/status.h"

namespace moeshard {

// Tokens routed to each logical expert, per MoE layer (docs/eplb.md gives the file format;
// `moeshard run --expert-load-out FILE` records one).
struct ExpertLoad {
  std::string model;                        // the model it was measured on (informational)
  std::vector<std::vector<double>> layers;  // [moe layer][logical expert]
  // Optional (written by `run`; the placement does not read them): the expert slots of the run
  // that measured the load, EP rank by EP rank, and the tokens each slot served, so that the
  // split of a hot expert's tokens over its replicas can be read back.
  std::vector<int64_t> slot_experts = {};             // [slot] logical expert
  std::vector<std::vector<double>> slot_tokens = {};  // [moe layer][slot]
};

// The expert-load file: {"model": "<name>", "layers": [[tokens per expert], ...]} with one
// row per MoE layer in layer order, optionally "slot_experts": [expert of each slot] and
// "slot_tokens": [[tokens per slot], ...] (one row per layer). Errors name the source, the
// field and what was expected.
Result<ExpertLoad> ParseExpertLoad(std::string_view json_text, const std::string& source);
std::string ExpertLoadJson(const ExpertLoad& load);

struct EplbOptions {
  int64_t num_slots = 0;   // physical experts: logical experts + redundant ones
  int64_t num_ranks = 0;   // MoE EP size; slots divide by it
  int64_t num_nodes = 1;   // ranks divide by it; hierarchical when groups divide by it
  int64_t num_groups = 1;  // expert groups (the model's n_group; 1 when it has none)
};

struct EplbPlacement {
  // [moe layer][slot] -> logical expert. Slot s lives on EP rank s / (num_slots / num_ranks).
  std::vector<std::vector<int64_t>> slot_expert;
  // [moe layer][logical expert] -> number of slots holding it (>= 1).
  std::vector<std::vector<int64_t>> replicas;
};

// Fails on sizes that do not divide (slots by ranks, ranks by nodes), fewer slots than
// experts, a layer whose expert count differs from the first, or a negative load.
Result<EplbPlacement> ComputeEplbPlacement(const ExpertLoad& load, const EplbOptions& options);

// The experts each rank holds under a per-layer slot map ([rank] -> its slots' experts).
std::vector<std::vector<int64_t>> RankExperts(const std::vector<int64_t>& slot_expert,
                                              int64_t num_ranks);

// Max over mean of the per-rank load of one layer when rank r holds the experts
// rank_experts[r] and each expert's tokens are split evenly over the ranks holding it, as the
// runtime's dispatcher splits them (a repeat on one rank counts once: it serves no tokens of
// its own). 1.0 is perfect balance; a layer without load gives 1.0.
double RankLoadImbalance(const std::vector<double>& expert_load,
                         const std::vector<std::vector<int64_t>>& rank_experts);

}  // namespace moeshard
