// vLLM PR 50928: without EP the experts are split over dp * pcp * tp ranks, not tp. At TP8 x DP4
// the real shard of Kimi-K3's I = 3072 is 3072 / 32 = 96, while the code tested 3072 / 8 = 384.
// PR 42595: loaders must compute checkpoint offsets from the unpadded size.
#include <gtest/gtest.h>

#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::FindTensor;
using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

TEST(WrongDivisorRegression, Tp8Dp4ShardIs96) {
  const ShardPlan p = PlanOrDie(PresetOrDie("kimi-k3"), Opts(8, 4, false, "marlin"));
  EXPECT_EQ(p.topology.moe_tp, 32);
  EXPECT_EQ(p.intermediate.raw_local, 3072 / (4 * 1 * 8));
  EXPECT_EQ(p.intermediate.raw_local, 96);
  EXPECT_EQ(p.intermediate.padded_local, 128);  // marlin: next multiple of 128
  // PCP counts too: TP8 x PCP2 x DP2 is also a group of 32.
  PlanOptions o = Opts(8, 2, false, "marlin");
  o.topology.pcp = 2;
  EXPECT_EQ(PlanOrDie(PresetOrDie("kimi-k3"), o).intermediate.raw_local, 96);
}

TEST(WrongDivisorRegression, OffsetsComeFromTheUnpaddedSize) {
  const ShardPlan p = PlanOrDie(PresetOrDie("kimi-k3"), Opts(8, 4, false, "marlin"));
  for (const RankPlan& r : p.ranks) {
    const TensorShard* w2 = FindTensor(
        r, "language_model.model.layers.{layer}.block_sparse_moe.experts.w2_weight_packed");
    ASSERT_NE(w2, nullptr);
    // The down projection's input columns [96 * moe_tp_rank, 96 * (moe_tp_rank + 1)), in packed
    // bytes (two values per byte): 48 bytes per rank, not the padded 64.
    EXPECT_EQ(w2->shard_begin, r.coords.moe_tp_rank * 48);
    EXPECT_EQ(w2->shard_end - w2->shard_begin, 48);
    EXPECT_EQ(w2->local_shape[2], 48);
    EXPECT_EQ(w2->padded_shape[2], 64);
    const TensorShard* w13 = FindTensor(
        r, "language_model.model.layers.{layer}.block_sparse_moe.experts.w13_weight_packed");
    EXPECT_EQ(w13->local_shape[1], 2 * 96);
    EXPECT_EQ(w13->padded_shape[1], 2 * 128);
  }
}

}  // namespace
}  // namespace moeshard
