// compressed-tensors pack-quantized (int4) checkpoints store `<module>.weight_shape` beside
// each packed weight (Kimi-K2-Thinking: I64 [2]). `plan` placed them, `build` listed them as "not
// placed": the loader now maps them (per expert into w13_weight_shape / w2_weight_shape, whole
// on every holder), and dummy weights write the real logical shape into them.
#include <gtest/gtest.h>

#include <cstring>

#include "moeshard/weights/loader.h"
#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

TEST(WeightShapePlacedRegression, LoaderMapsEveryWeightShape) {
  const ModelConfig m = PresetOrDie("kimi-k2");  // int4 pack-quantized experts
  ASSERT_TRUE(m.quant.weight_shape_meta);
  ShardPlan p = PlanOrDie(m, Opts(8, 1, true));
  Result<std::vector<SourceTensorSpec>> specs = ExpectedCheckpointTensors(p);
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  int64_t shapes = 0;
  for (const SourceTensorSpec& s : *specs) {
    if (s.name.size() > 13 && s.name.substr(s.name.size() - 13) == ".weight_shape") {
      ++shapes;
      EXPECT_EQ(s.dtype, DType::kI64) << s.name;
      EXPECT_EQ(s.shape, (std::vector<int64_t>{2})) << s.name;
    }
  }
  // 60 MoE layers x 384 experts x gate, up, down (attention and shared experts stay bf16).
  EXPECT_EQ(shapes, 60 * 384 * 3);
}

TEST(WeightShapePlacedRegression, DummyWeightsHoldTheLogicalShape) {
  ModelConfig m = PresetOrDie("tiny-deepseek-v3");
  // Make it an int4 pack-quantized model as Kimi-K2 is.
  m.quant = PresetOrDie("kimi-k2").quant;
  const ShardPlan p = PlanOrDie(m, Opts(2, 1, false, "moeshard-cpu"));
  LoadOptions lo;
  lo.max_moe_layers = 1;
  Result<RankWeights> w = LoadRankWeights(p, 1, lo);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const TensorShard* meta = nullptr;
  for (const TensorShard& s : p.ranks[1].tensors) {
    if (s.role == TensorRole::kExpertsW13 && s.part == TensorPart::kShapeMeta) meta = &s;
  }
  ASSERT_NE(meta, nullptr);
  const TensorBuffer* b = w->Find(ExpandName(meta->name, meta->layers.front()));
  ASSERT_NE(b, nullptr);
  // [E_local, 2 (gate, up), 2]: each the whole expert's logical [I, H], not the rank's slice.
  std::vector<int64_t> v(b->data.size() / 8);
  std::memcpy(v.data(), b->data.data(), b->data.size());
  ASSERT_EQ(v.size(), static_cast<size_t>(p.ranks[1].expert_slots.size() * 4));
  for (size_t i = 0; i < v.size(); i += 2) {
    EXPECT_EQ(v[i], m.moe_intermediate_size);
    EXPECT_EQ(v[i + 1], m.hidden_size);
  }
}

}  // namespace
}  // namespace moeshard
