// The partition contract's invariants (DESIGN.md rule 7), checked on one plan and over grids of
// topologies. `moeshard check` and the regression tests use these.
//
//   tiling       each slice of each logical tensor is held by exactly 1 + replicas ranks of its
//                stage, and the slices tile the tensor with no gap or overlap (routed experts:
//                every expert's intermediate range tiles [0, I) over the ranks holding it);
//   waste        padding per dimension is below one alignment unit (plus the floor the padding
//                policy chose, for model-floor);
//   backend      every padded shape meets its backend's alignment and the quantization group;
//                EP-only backends run with EP; exact expert division where required;
//   monotonic    within one strategy, per-rank routed bytes never increase as GPUs are added,
//                and fall whenever the unpadded share falls -- unless the padded size already
//                sits at one backend alignment unit, or at the floor model-floor chose.
// (Planned bytes equal allocated bytes is proven by building the shards: weights layer tests.)
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moeshard/plan/shard_plan.h"

namespace moeshard {

struct Violation {
  std::string invariant;  // "tiling", "waste", "backend", "monotonic"
  std::string topology;   // label of the plan (or the pair of plans)
  std::string detail;
};

std::vector<Violation> CheckPlan(const ShardPlan& plan);

// One strategy: how a GPU count becomes a topology.
struct Strategy {
  std::string name;  // "TP", "TP+EP", "TP8xDP+EP", "TP x MoE-TP2xEP", "TP8xPP"
  // The options for `gpus` GPUs, or an error when this strategy has no topology of that size.
  std::function<Result<PlanOptions>(int64_t gpus)> options;
};

struct GridOptions {
  std::vector<int64_t> gpu_counts = {1, 2, 4, 8, 16, 32, 64};
  PlanOptions base;         // backend, padding, placement, redundancy, shared/latent modes
  bool include_pp = false;  // add pipeline-parallel strategies
  bool include_hybrid = true;
};

// The strategies a grid walks for a model: TP; TP+EP; for each attention TP t, t x DP with and
// without EP; hybrids MoE-TP m x EP; with include_pp, t x PP.
std::vector<Strategy> GridStrategies(const ModelConfig& model, const GridOptions& options);

struct GridPoint {
  std::string strategy;
  int64_t gpus = 0;
  ShardPlan plan;
};

// Every valid (strategy, GPU count) plan, in strategy order then GPU count.
std::vector<GridPoint> BuildGrid(const ModelConfig& model, const GridOptions& options);

// CheckPlan on every grid point plus monotonicity within each strategy.
std::vector<Violation> CheckGrid(const ModelConfig& model, const std::vector<GridPoint>& grid);

}  // namespace moeshard
