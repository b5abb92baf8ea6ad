// Planned bytes equal allocated bytes, per category, for every full-size preset at two realistic
// topologies (DESIGN.md invariant "planned bytes equal the bytes the loader allocates").
//
// Scaled down to fit a CI machine: the first and the last rank of each topology are built with
// only the first 2 MoE layers of their stage (LoadOptions::max_moe_layers, `build --layers 2`),
// compared with the plan restricted to the same layers, and without generating values
// (LoadOptions::fill = false): every buffer is still allocated from the plan and every
// checkpoint window is mapped and checked to cover exactly the buffer's unpadded bytes. The
// values themselves are covered by the tiny-preset tests (src/weights/loader_test.cc) and the
// full-size `moeshard build` ctests, which fill a rank of gpt-oss-20b and Mixtral for real.
#include <gtest/gtest.h>

#include "moeshard/config/config_loader.h"
#include "moeshard/weights/loader.h"

namespace moeshard {
namespace {

struct Case {
  std::string preset;
  Topology topology;
  std::string label;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.preset << " " << c.label; }

std::vector<Case> Cases() {
  return {
      {"kimi-k3", Topology{.tp = 8}, "tp8"},
      {"kimi-k3", Topology{.tp = 16, .enable_ep = true}, "tp16-ep16"},
      {"kimi-k2", Topology{.tp = 8}, "tp8"},
      {"kimi-k2", Topology{.tp = 16, .enable_ep = true}, "tp16-ep16"},
      {"deepseek-v3", Topology{.tp = 8}, "tp8"},
      {"deepseek-v3", Topology{.tp = 8, .dp = 2, .enable_ep = true}, "tp8-dp2-ep16"},
      {"qwen3-235b-a22b", Topology{.tp = 8}, "tp8"},
      {"qwen3-235b-a22b", Topology{.tp = 4, .pp = 2, .enable_ep = true}, "tp4-pp2-ep4"},
      {"qwen3-30b-a3b", Topology{.tp = 2}, "tp2"},
      {"qwen3-30b-a3b", Topology{.tp = 4, .enable_ep = true}, "tp4-ep4"},
      {"mixtral-8x7b", Topology{.tp = 8}, "tp8"},
      {"mixtral-8x7b", Topology{.tp = 8, .moe_tp = 4, .moe_ep = 2}, "tp8-moetp4-moeep2"},
      {"gpt-oss-120b", Topology{.tp = 2}, "tp2"},
      {"gpt-oss-120b", Topology{.tp = 8, .enable_ep = true}, "tp8-ep8"},
      {"gpt-oss-20b", Topology{.tp = 2}, "tp2"},
      {"gpt-oss-20b", Topology{.tp = 4, .enable_ep = true}, "tp4-ep4"},
  };
}

class FullSizeAllocationTest : public ::testing::TestWithParam<Case> {};

TEST_P(FullSizeAllocationTest, AllocatedEqualsPlannedPerCategory) {
  const Case& c = GetParam();
  Result<ModelConfig> model = LoadModelConfig(c.preset);
  ASSERT_TRUE(model.ok()) << model.status().message();
  PlanOptions o;
  o.topology = c.topology;
  Result<ShardPlan> plan = BuildShardPlan(*model, o);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  auto loader = WeightLoader::Create(*plan, {.max_moe_layers = 2, .fill = false});
  ASSERT_TRUE(loader.ok()) << loader.status().message();
  for (int64_t rank : {int64_t{0}, plan->topology.world - 1}) {
    const RankPlan& rp = plan->ranks[static_cast<size_t>(rank)];
    const std::vector<int64_t> layers = LayersToBuild(*plan, rp, 2);
    LoadStats st;
    Result<RankWeights> w = (*loader)->Load(rank, &st);
    ASSERT_TRUE(w.ok()) << w.status().message();
    const auto planned = PlannedBytesByCategory(rp, layers);
    int64_t total = 0;
    for (TensorCategory cat : kAllCategories) {
      EXPECT_EQ(w->BytesOf(cat), planned.at(cat))
          << c.preset << " " << c.label << " rank " << rank << " " << TensorCategoryName(cat);
      EXPECT_EQ(st.bytes_by_category[cat], planned.at(cat));
      total += planned.at(cat);
    }
    EXPECT_EQ(w->TotalBytes(), total);
    EXPECT_GT(w->BytesOf(TensorCategory::kRoutedExperts), 0) << "the restriction kept MoE layers";
    // Two MoE layers: each routed-expert tensor exists at exactly two layers.
    int64_t moe_layers = 0;
    for (int64_t l : layers) moe_layers += plan->model.layers[static_cast<size_t>(l)].moe ? 1 : 0;
    EXPECT_EQ(moe_layers, 2);
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, FullSizeAllocationTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string n = i.param.preset + "_" + i.param.label;
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace moeshard
