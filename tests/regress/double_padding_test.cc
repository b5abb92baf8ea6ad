// vLLM PR 50583: model-level padding to 8192 global at TP32 made the backend allocate 256 per
// rank where Marlin needed only 128 (96 raw). The backend receives the logical size and owns
// the physical padding; waste stays below one alignment unit.
#include <gtest/gtest.h>

#include "moeshard/plan/invariants.h"
#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

TEST(DoublePaddingRegression, MarlinTp32Allocates128Not256) {
  const ShardPlan p = PlanOrDie(PresetOrDie("kimi-k3"), Opts(32, 1, false, "marlin"));
  EXPECT_EQ(p.intermediate.raw_local, 96);
  EXPECT_EQ(p.intermediate.padded_local, 128);
  EXPECT_LT(p.intermediate.padding(), p.intermediate.align);
  EXPECT_TRUE(CheckPlan(p).empty());
  // legacy-tp is the double-padded layout and the waste invariant flags it.
  const ShardPlan legacy =
      PlanOrDie(PresetOrDie("kimi-k3"), Opts(32, 1, false, "marlin", PaddingPolicy::kLegacyTp));
  EXPECT_EQ(legacy.intermediate.padded_local, 256);
  bool waste = false;
  for (const Violation& v : CheckPlan(legacy)) waste = waste || v.invariant == "waste";
  EXPECT_TRUE(waste);
}

}  // namespace
}  // namespace moeshard
