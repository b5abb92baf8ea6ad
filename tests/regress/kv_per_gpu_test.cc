// inference-sim 1545, llm-d-planner 194: planners that ignore the KV-cache dtype or count
// aggregate instead of per-GPU memory misstate KV capacity.
#include <gtest/gtest.h>

#include "moeshard/plan/memory.h"
#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

TEST(KvPerGpuRegression, PerRankAndDtypeAware) {
  const ModelConfig m = PresetOrDie("mixtral-8x7b");  // 32 layers, 8 KV heads of 128
  MemoryOptions mo;
  mo.gpu = *FindGpu("h100");
  mo.max_model_len = 32768;
  // TP2: 4 KV heads per rank -> 32 * 2 * 4 * 128 * 2 bytes per token on each GPU.
  MemoryPlan tp2 = PlanMemory(PlanOrDie(m, Opts(2)), mo);
  EXPECT_EQ(tp2.ranks[1].kv_bytes_per_token, 32 * 2 * 4 * 128 * 2);
  // DP2 x TP1: each DP rank holds all 8 heads for its own sequences.
  MemoryPlan dp2 = PlanMemory(PlanOrDie(m, Opts(1, 2, true)), mo);
  EXPECT_EQ(dp2.ranks[1].kv_bytes_per_token, 32 * 2 * 8 * 128 * 2);
  mo.kv_cache_dtype = KvCacheDtype::kFp8;
  EXPECT_EQ(PlanMemory(PlanOrDie(m, Opts(2)), mo).ranks[0].kv_bytes_per_token, 32 * 2 * 4 * 128);
}

}  // namespace
}  // namespace moeshard
