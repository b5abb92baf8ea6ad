// aiconfigurator 1442: EPLB redundant experts change resident memory: size by slots, not by
// logical experts.
#include <gtest/gtest.h>

#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

TEST(EplbSlotsRegression, BytesFollowSlots) {
  const ModelConfig ds = PresetOrDie("deepseek-v3");  // 256 experts
  PlanOptions o = Opts(8, 4, true);                   // EP 32
  const ShardPlan plain = PlanOrDie(ds, o);
  o.num_redundant_experts = 32;  // 288 slots: 9 per rank instead of 8
  const ShardPlan eplb = PlanOrDie(ds, o);
  EXPECT_EQ(plain.ranks[0].expert_slots.size(), 8u);
  EXPECT_EQ(eplb.ranks[0].expert_slots.size(), 9u);
  EXPECT_EQ(eplb.ranks[0].BytesOf(TensorCategory::kRoutedExperts) * 8,
            plain.ranks[0].BytesOf(TensorCategory::kRoutedExperts) * 9);
  // EPLB needs slots % EP == 0: 256 + 8 = 264 over EP 32 leaves 8 over.
  o.num_redundant_experts = 8;
  Result<ShardPlan> r = BuildShardPlan(ds, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("EPLB requires it"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("--num-redundant-experts 32"), std::string::npos);
}

}  // namespace
}  // namespace moeshard
