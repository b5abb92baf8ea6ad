// vLLM issue 51124 (fixed by PR 51131): Kimi-K3 padded I = 3072 to 256 * tp_size whenever
// 3072 / tp_size < 256, even with expert parallelism on, where experts stay whole. Per-GPU MoE
// memory stopped falling as GPUs were added.
#include <gtest/gtest.h>

#include "moeshard/plan/invariants.h"
#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

TEST(EpPaddingRegression, KimiK3UnderEpNeverPads) {
  const ModelConfig k3 = PresetOrDie("kimi-k3");
  for (const char* backend : {"auto", "marlin", "flashinfer-cutlass", "flashinfer-trtllm",
                              "deepgemm-megamoe", "cpu", "moeshard-cpu"}) {
    for (int64_t tp : {1, 2, 4, 8, 16, 32}) {
      PlanOptions o = Opts(tp, 1, true, backend);
      Result<ShardPlan> p = BuildShardPlan(k3, o);
      if (std::string(backend) == "deepgemm-megamoe" && tp == 1) {
        EXPECT_FALSE(p.ok());  // EP size 1 is no expert parallelism
        continue;
      }
      ASSERT_TRUE(p.ok()) << backend << " tp" << tp << ": " << p.status().ToString();
      // 3072 is a multiple of every backend's alignment (128, 512) and of the mxfp4 group.
      EXPECT_EQ(p->intermediate.padded_local, 3072) << backend << " tp" << tp;
      for (const RankPlan& r : p->ranks) {
        EXPECT_EQ(r.PaddingBytesOf(TensorCategory::kRoutedExperts), 0) << backend << " tp" << tp;
      }
    }
  }
}

TEST(EpPaddingRegression, LegacyPolicyReproducesTheBug) {
  const ModelConfig k3 = PresetOrDie("kimi-k3");
  // 3072 / 16 = 192 < 256: the old engine padded the global I to 256 * 16 = 4096, and under EP
  // each rank holds whole experts of that padded width.
  ShardPlan p = PlanOrDie(k3, Opts(16, 1, true, "marlin", PaddingPolicy::kLegacyTp));
  EXPECT_EQ(p.intermediate.padded_local, 256 * 16);
  p = PlanOrDie(k3, Opts(32, 1, true, "marlin", PaddingPolicy::kLegacyTp));
  EXPECT_EQ(p.intermediate.padded_local, 256 * 32);  // 8192: 2.67x the real 3072
  // At TP8 3072 / 8 = 384 >= 256: no padding even in the old engine.
  p = PlanOrDie(k3, Opts(8, 1, true, "marlin", PaddingPolicy::kLegacyTp));
  EXPECT_EQ(p.intermediate.padded_local, 3072);
  // Without EP the per-partition size saturated at 256: TP16 and TP32 hold the same bytes.
  const ShardPlan t16 = PlanOrDie(k3, Opts(16, 1, false, "marlin", PaddingPolicy::kLegacyTp));
  const ShardPlan t32 = PlanOrDie(k3, Opts(32, 1, false, "marlin", PaddingPolicy::kLegacyTp));
  EXPECT_EQ(t16.intermediate.padded_local, 256);
  EXPECT_EQ(t32.intermediate.padded_local, 256);
  EXPECT_EQ(t16.ranks[0].BytesOf(TensorCategory::kRoutedExperts),
            t32.ranks[0].BytesOf(TensorCategory::kRoutedExperts));
}

TEST(EpPaddingRegression, CheckCatchesLegacyMonotonicityViolation) {
  const ModelConfig k3 = PresetOrDie("kimi-k3");
  GridOptions g;
  g.gpu_counts = {8, 16, 32};
  g.base.backend = "marlin";
  g.base.padding = PaddingPolicy::kLegacyTp;
  std::vector<Violation> v = CheckGrid(k3, BuildGrid(k3, g));
  bool monotonic_ep = false, monotonic_tp = false, waste = false;
  for (const Violation& x : v) {
    if (x.invariant == "monotonic" && x.topology.rfind("TP+EP:", 0) == 0) monotonic_ep = true;
    if (x.invariant == "monotonic" && x.topology.rfind("TP:", 0) == 0) monotonic_tp = true;
    if (x.invariant == "waste") waste = true;
  }
  EXPECT_TRUE(monotonic_ep);
  EXPECT_TRUE(monotonic_tp);
  EXPECT_TRUE(waste);

  // The default policy passes the same grid.
  g.base.padding = PaddingPolicy::kBackend;
  v = CheckGrid(k3, BuildGrid(k3, g));
  for (const Violation& x : v) ADD_FAILURE() << x.invariant << " " << x.topology << " " << x.detail;
}

}  // namespace
}  // namespace moeshard
