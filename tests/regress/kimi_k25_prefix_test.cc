// Kimi-K2.5 / K2.6 (`kimi_k25`): the text tensors sit under "language_model." (SGLang
// kimi_k25.py strips the prefix when loading); `plan` worked but the loader looked for the
// unprefixed names. The config is the release's (tests/checkpoints/configs/kimi-k2.5.json).
#include <gtest/gtest.h>

#include "moeshard/config/config_loader.h"
#include "moeshard/weights/loader.h"
#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::Opts;
using testing::PlanOrDie;

TEST(KimiK25PrefixRegression, LoaderReadsThePrefixedNames) {
  Result<ModelConfig> m =
      LoadModelConfigFile(MOESHARD_SOURCE_DIR "/tests/checkpoints/configs/kimi-k2.5.json");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->family_name(), "kimi_k25");
  const ShardPlan p = PlanOrDie(*m, Opts(8, 1, true));
  Result<std::vector<SourceTensorSpec>> specs = ExpectedCheckpointTensors(p);
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  int64_t text = 0, vision = 0;
  for (const SourceTensorSpec& s : *specs) {
    if (s.name.rfind("vision_tower.", 0) == 0 || s.name.rfind("mm_projector.", 0) == 0) {
      ++vision;
      continue;
    }
    EXPECT_EQ(s.name.rfind("language_model.", 0), 0u) << s.name;
    ++text;
  }
  EXPECT_GT(text, 0);
  EXPECT_GT(vision, 0);
  // An expert tensor as the release spells it.
  bool found = false;
  for (const SourceTensorSpec& s : *specs) {
    found |= s.name == "language_model.model.layers.1.mlp.experts.0.gate_proj.weight_packed";
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace moeshard
