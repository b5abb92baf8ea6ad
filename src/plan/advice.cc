#include "moeshard/plan/advice.h"

#include <fmt/format.h>

#include "moeshard/base/units.h"

namespace moeshard {

namespace {

bool Fits(const ModelConfig& m, const PlanOptions& p, const MemoryOptions& o) {
  Result<ShardPlan> plan = BuildShardPlan(m, p);
  return plan.ok() && PlanMemory(*plan, o).fits;
}

}  // namespace

std::string SmallestChangeThatFits(const ModelConfig& m, const PlanOptions& p,
                                   const MemoryOptions& o) {
  const Topology& t = p.topology;
  const bool ep = t.enable_ep || t.moe_ep > 1;
  if (o.kv_cache_dtype != KvCacheDtype::kFp8) {
    MemoryOptions fp8 = o;
    fp8.kv_cache_dtype = KvCacheDtype::kFp8;
    if (Fits(m, p, fp8)) return "--kv-cache-dtype fp8";
  }
  if (!ep) {
    PlanOptions with_ep = p;
    with_ep.topology.enable_ep = true;
    with_ep.topology.moe_tp = with_ep.topology.moe_ep = 0;
    if (Fits(m, with_ep, o)) return "-ep (expert parallelism: whole experts per GPU, no MoE TP)";
  }
  {
    MemoryOptions auto_len = o;
    auto_len.max_model_len = 0;
    Result<ShardPlan> plan = BuildShardPlan(m, p);
    if (plan.ok()) {
      MemoryPlan mp = PlanMemory(*plan, auto_len);
      const int64_t wanted = o.max_model_len > 0 ? o.max_model_len : m.max_position_embeddings;
      if (mp.fits && mp.max_model_len > 0 && mp.max_model_len < wanted) {
        return fmt::format("--max-model-len {} (the longest context that fits)", mp.max_model_len);
      }
    }
  }
  const int64_t world = t.tp * t.dp * t.pcp * t.pp;
  for (int64_t mult = 2; mult <= 16; mult *= 2) {
    PlanOptions more_tp = p;
    more_tp.topology.tp = t.tp * mult;
    if (Fits(m, more_tp, o)) {
      return fmt::format("-tp {}{} ({} GPUs)", t.tp * mult, ep ? " -ep" : "", world * mult);
    }
    PlanOptions more_dp = p;
    more_dp.topology.dp = t.dp * mult;
    more_dp.topology.enable_ep = true;
    more_dp.topology.moe_tp = more_dp.topology.moe_ep = 0;
    if (Fits(m, more_dp, o)) {
      return fmt::format("-dp {} -ep ({} GPUs)", t.dp * mult, world * mult);
    }
    PlanOptions more_pp = p;
    more_pp.topology.pp = t.pp * mult;
    if (Fits(m, more_pp, o)) {
      return fmt::format("-pp {} ({} GPUs)", t.pp * mult, world * mult);
    }
  }
  return "";
}

}  // namespace moeshard
