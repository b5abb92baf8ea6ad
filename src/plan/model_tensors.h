// The model's non-routed tensors as the plan lays them out: the family descriptor's TensorDefs
// (config/family.h) with the plan options applied (shared experts and latent projections
// replicated or sharded; a tied head copied onto the last stage only under PP). Routed experts
// are not listed here; shard_plan.cc lays them out from the padding contract.
#pragma once

#include <cstdint>
#include <vector>

#include "moeshard/config/family.h"
#include "moeshard/plan/shard_plan.h"

namespace moeshard::internal {

std::vector<TensorDef> PlanTensors(const ModelConfig& model, const PlanOptions& options,
                                   int64_t pp);

// Layers of pipeline stage `stage` (vLLM get_pp_indices: even split, the remainder going to
// the stages before the last).
std::vector<int64_t> StageLayers(int64_t num_layers, int64_t pp, int64_t stage);

}  // namespace moeshard::internal
