// Helpers for plan tests: load a preset and build a plan, failing the test on error.
#pragma once

#include <gtest/gtest.h>

#include "base/check.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/plan/shard_plan.h"

namespace moeshard::testing {

inline ModelConfig PresetOrDie(const std::string& name) {
  Result<ModelConfig> r = LoadModelConfig(name);
  MOESHARD_CHECK(r.ok(), "{}", r.status().ToString());
  return *std::move(r);
}

inline ShardPlan PlanOrDie(const ModelConfig& m, const PlanOptions& o) {
  Result<ShardPlan> r = BuildShardPlan(m, o);
  MOESHARD_CHECK(r.ok(), "{}", r.status().ToString());
  return *std::move(r);
}

inline PlanOptions Opts(int64_t tp, int64_t dp = 1, bool ep = false, std::string backend = "auto",
                        PaddingPolicy padding = PaddingPolicy::kBackend) {
  PlanOptions o;
  o.topology.tp = tp;
  o.topology.dp = dp;
  o.topology.enable_ep = ep;
  o.backend = std::move(backend);
  o.padding = padding;
  return o;
}

inline const TensorShard* FindTensor(const RankPlan& r, const std::string& name) {
  for (const TensorShard& t : r.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace moeshard::testing
