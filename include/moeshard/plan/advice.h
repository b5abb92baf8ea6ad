// Advice for an infeasible plan: the smallest change that makes it fit, found by re-planning.
//
// Candidates, in order of how little they change the deployment: fp8 KV cache, expert
// parallelism on, a shorter context, then more GPUs (doubling TP, then DP with EP, then PP).
// Thread safety: pure function.
#pragma once

#include <string>

#include "moeshard/plan/memory.h"
#include "moeshard/plan/shard_plan.h"

namespace moeshard {

// "" when the plan already fits or nothing tried fits.
std::string SmallestChangeThatFits(const ModelConfig& model, const PlanOptions& plan_options,
                                   const MemoryOptions& memory_options);

}  // namespace moeshard
