// The fp8 block size was read from the config by the planner and the loader but fixed at 128 in
// the kernels: a checkpoint with 64 x 64 blocks would be planned and loaded with 64 and computed
// with 128. The block now travels in the weight scheme from the config to every kernel; the
// single-rank layer is checked against the independent double-precision reference, which reads
// the block from the config.
#include <gtest/gtest.h>

#include "plan/plan_test_util.h"
#include "tests/runtime/layer_reference.h"

namespace moeshard {
namespace {

using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

ModelConfig Blocks64() {
  ModelConfig m = PresetOrDie("tiny-deepseek-v3");
  EXPECT_EQ(m.quant.scheme.format, WeightFormat::kFp8Block);
  m.quant.scheme.block_rows = m.quant.scheme.group = 64;
  return m;
}

TEST(Fp8BlockSizeRegression, PlannedWithTheConfigsBlock) {
  const ShardPlan p = PlanOrDie(Blocks64(), Opts(1, 1, false, "moeshard-cpu"));
  EXPECT_EQ(p.expert_scheme.block_rows, 64);
  for (const TensorShard& s : p.ranks[0].tensors) {
    if (s.role == TensorRole::kExpertsW2 && s.part == TensorPart::kScale) {
      // w2 [H = 256, I = 1024] in 64 x 64 blocks: [4, 16] per expert.
      EXPECT_EQ(s.padded_shape, (std::vector<int64_t>{16, 4, 16}));
    }
  }
}

TEST(Fp8BlockSizeRegression, ComputedWithTheConfigsBlock) {
  CheckLayerAgainstReference(Blocks64());
}

}  // namespace
}  // namespace moeshard
