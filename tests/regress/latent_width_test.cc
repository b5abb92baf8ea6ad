// inference-sim 1690: latent MoE routed experts run in the latent width (Kimi-K3: 3584), not
// hidden_size (7168); using hidden_size over-counts routed weights about 2x.
// inference-sim 1656: planners charged every routed expert to every TP rank. vLLM 54956: the
// MoE TP size is 1 under EP; attention must keep using the attention TP size.
#include <gtest/gtest.h>

#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::FindTensor;
using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

TEST(LatentWidthRegression, RoutedExpertsUseTheLatentWidth) {
  const ShardPlan p = PlanOrDie(PresetOrDie("kimi-k3"), Opts(16, 1, true));
  const TensorShard* w2 = FindTensor(
      p.ranks[0], "language_model.model.layers.{layer}.block_sparse_moe.experts.w2_weight_packed");
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(w2->logical_shape[1], 3584);
  EXPECT_NE(w2->logical_shape[1], 7168);
}

TEST(LatentWidthRegression, RoutedExpertsSplitOverTheWholeGroup) {
  // Summed over the ranks of a group, routed bytes equal one copy of the experts: each rank
  // holds 1/group, neither all of them nor 1/(TP^2 * DP).
  for (bool ep : {false, true}) {
    const ShardPlan p = PlanOrDie(PresetOrDie("qwen3-235b-a22b"), Opts(4, 2, ep));
    int64_t sum = 0;
    for (const RankPlan& r : p.ranks) sum += r.BytesOf(TensorCategory::kRoutedExperts);
    EXPECT_EQ(sum, 94LL * 128 * 3 * 1536 * 4096 * 2) << "ep=" << ep;
  }
}

TEST(LatentWidthRegression, AttentionKeepsAttentionTpUnderEp) {
  const ShardPlan p = PlanOrDie(PresetOrDie("qwen3-235b-a22b"), Opts(8, 2, true));
  EXPECT_EQ(p.topology.moe_tp, 1);
  const TensorShard* q = FindTensor(p.ranks[0], "model.layers.{layer}.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->local_shape[0], 64 * 128 / 8);  // split 8 ways by attention TP, not 1 or 16
}

}  // namespace
}  // namespace moeshard
