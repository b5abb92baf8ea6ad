// JSON form of a ShardPlan (what `moeshard plan --format json` prints and the pre-sharded
// checkpoint manifest stores). Every byte count is an integer number of bytes.
//
// Thread safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include "moeshard/plan/shard_plan.h"

namespace moeshard {

nlohmann::json DimLayoutToJson(const DimLayout& d);
nlohmann::json TensorShardToJson(const TensorShard& t);
// `include_tensors`: add every rank's tensor list (large for big worlds).
nlohmann::json ShardPlanToJson(const ShardPlan& plan, bool include_tensors);

}  // namespace moeshard

#include "moeshard/plan/memory.h"

namespace moeshard {

// Adds the memory budget to a plan's JSON: top-level "memory" (GPU, utilization, KV dtype,
// max_model_len, fits, failure) and, per rank, bytes.kv_cache (the KV cache the rank can hold),
// bytes.activations, bytes.overhead, bytes.free, kv_tokens and fits.
void AddMemoryToJson(const MemoryPlan& memory, nlohmann::json& plan_json);

}  // namespace moeshard
