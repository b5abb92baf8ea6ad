// Experts not divisible by the EP size: vLLM gives the remainder to the first ranks; MegaMoE
// and EPLB require exact division (backends-and-history.md, case 6).
#include <gtest/gtest.h>

#include "moeshard/plan/invariants.h"
#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

TEST(UnevenExpertsRegression, RemainderToTheFirstRanks) {
  // Qwen3-30B-A3B: 128 experts over EP 3 (TP1 x DP3): 43, 43, 42.
  const ShardPlan p = PlanOrDie(PresetOrDie("qwen3-30b-a3b"), Opts(1, 3, true));
  ASSERT_EQ(p.ranks.size(), 3u);
  EXPECT_EQ(p.ranks[0].expert_slots.size(), 43u);
  EXPECT_EQ(p.ranks[1].expert_slots.size(), 43u);
  EXPECT_EQ(p.ranks[2].expert_slots.size(), 42u);
  EXPECT_EQ(p.ranks[1].expert_slots.front(), 43);
  EXPECT_EQ(p.RoutedRankKinds().size(), 2u);
  EXPECT_TRUE(CheckPlan(p).empty());
  ASSERT_FALSE(p.notes.empty());
  EXPECT_NE(p.notes[0].find("first 2 EP ranks"), std::string::npos) << p.notes[0];
}

TEST(UnevenExpertsRegression, MegaMoeRequiresExactDivision) {
  // gpt-oss-120b has 128 experts; 128 % 3 != 0 under MegaMoE is an error that lists valid sizes.
  PlanOptions o = Opts(1, 3, true, "deepgemm-megamoe");
  Result<ShardPlan> r = BuildShardPlan(PresetOrDie("gpt-oss-120b"), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("deepgemm-megamoe requires it"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("valid EP sizes: 1, 2, 4, 8, 16, 32, 64"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace moeshard

namespace moeshard {
namespace {

// vLLM rejects block-fp8 layers whose TP shard is not a multiple of the 128 block ("output_size
// ... is not divisible by weight quantization block_n"): DeepSeek-V3's dense MLP (18432 / 32 =
// 576) and shared expert (2048 / 32 = 64) at TP32, even with EP keeping the routed experts whole.
TEST(QuantBlockSplitRegression, DeepseekFp8Tp32IsRejected) {
  Result<ShardPlan> r =
      BuildShardPlan(testing::PresetOrDie("deepseek-v3"), testing::Opts(32, 1, true));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("expected a multiple of the fp8-block group 128"),
            std::string::npos)
      << r.status().message();
  EXPECT_TRUE(BuildShardPlan(testing::PresetOrDie("deepseek-v3"), testing::Opts(16, 1, true)).ok());
}

}  // namespace
}  // namespace moeshard
