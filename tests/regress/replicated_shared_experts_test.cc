// vLLM 50656 / 50912: shared experts, dense MLPs and latent projections are replicated unless
// explicitly sharded; Kimi-K3's replicated BF16 shared experts cost about 264 MB per layer per
// rank. Planner peers double-counted them or forgot the latent projections.
#include <gtest/gtest.h>

#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

TEST(SharedExpertsRegression, KimiK3ReplicatedCosts264MBPerLayer) {
  const ModelConfig k3 = PresetOrDie("kimi-k3");
  PlanOptions o = Opts(32, 1, true);
  o.shared_experts = SharedExpertsMode::kReplicated;
  const ShardPlan rep = PlanOrDie(k3, o);
  // gate, up [6144, 7168] and down [7168, 6144] in bf16 (quantization ignores shared_experts).
  const int64_t per_layer = 3LL * 6144 * 7168 * 2;
  EXPECT_EQ(per_layer, 264'241'152);
  EXPECT_EQ(rep.ranks[0].BytesOf(TensorCategory::kSharedExperts), 92 * per_layer);
  o.shared_experts = SharedExpertsMode::kSharded;
  const ShardPlan sh = PlanOrDie(k3, o);
  EXPECT_EQ(sh.ranks[0].BytesOf(TensorCategory::kSharedExperts), 92 * per_layer / 32);
}

TEST(SharedExpertsRegression, LatentProjectionsAndDenseLayersAreCounted) {
  const ModelConfig k3 = PresetOrDie("kimi-k3");
  const ShardPlan p = PlanOrDie(k3, Opts(8, 1, true));
  // latent_down [3584, 7168] + latent_up [7168, 3584] bf16, replicated, plus the latent norm.
  EXPECT_EQ(p.ranks[3].BytesOf(TensorCategory::kLatentProj),
            92LL * (2 * 3584 * 7168 * 2 + 3584 * 2));
  // Layer 0 is dense with intermediate 33792, TP-sharded (bf16: the mlp projections are ignored
  // by the quantization config).
  EXPECT_EQ(p.ranks[3].BytesOf(TensorCategory::kDenseMlp), 3LL * 33792 / 8 * 7168 * 2);
}

}  // namespace
}  // namespace moeshard
