#include "moeshard/plan/checkpoint_sizing.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

int64_t Bytes(DType d, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t x : shape) n *= x;
  return *DTypeBytes(d, n);
}

// The tensors a Hugging Face checkpoint of `m` holds, built from the 1-rank plan's logical
// shapes (non-routed: their checkpoint names) and per-expert gate/up/down projections named by
// the family's layout, as the headers would list them. The header-exact copies of released
// checkpoints (tests/checkpoints) check the same against the releases' own names.
std::vector<CheckpointTensorInfo> FakeCheckpoint(const ModelConfig& m) {
  const ShardPlan one = PlanOrDie(m, Opts(1, 1, false, "moeshard-cpu"));
  std::vector<CheckpointTensorInfo> out;
  for (const TensorShard& s : one.ranks[0].tensors) {
    if (s.category == TensorCategory::kRoutedExperts) continue;
    if (s.layers.empty()) {
      out.push_back({s.name, s.dtype, s.logical_shape, Bytes(s.dtype, s.logical_shape)});
      continue;
    }
    for (int64_t l : s.layers) {
      out.push_back(
          {ExpandName(s.name, l), s.dtype, s.logical_shape, Bytes(s.dtype, s.logical_shape)});
    }
  }
  const int64_t I = m.moe_intermediate_size, H = m.routed_expert_hidden_size;
  const WeightScheme& q = m.quant.scheme;
  for (int64_t l = 0; l < m.num_layers; ++l) {
    if (!m.layers[l].moe) continue;
    for (int64_t e = 0; e < m.num_experts; ++e) {
      for (auto [module, rows, cols] :
           {std::tuple{&one.experts.gate, I, H}, std::tuple{&one.experts.up, I, H},
            std::tuple{&one.experts.down, H, I}}) {
        const std::string base = ExpandName(*module, l, e) + ".";
        if (q.format == WeightFormat::kMxfp4) {
          out.push_back({base + "weight_packed", DType::kU8, {rows, cols / 2}, rows * cols / 2});
          out.push_back({base + "weight_scale", DType::kU8, {rows, cols / 32}, rows * cols / 32});
        } else {
          out.push_back({base + "weight", DType::kBF16, {rows, cols}, rows * cols * 2});
        }
      }
    }
  }
  return out;
}

TEST(CheckpointSizingTest, HeadersReproduceThePlanExactly) {
  for (const char* preset : {"tiny-kimi-k3", "tiny-qwen3-moe", "tiny-mixtral"}) {
    const ModelConfig m = PresetOrDie(preset);
    const std::vector<CheckpointTensorInfo> ckpt = FakeCheckpoint(m);
    for (const PlanOptions& o :
         {Opts(1, 1, false, "moeshard-cpu"), Opts(2, 1, false, "moeshard-cpu"),
          Opts(4, 1, true, "moeshard-cpu"), Opts(2, 2, true, "moeshard-cpu")}) {
      const ShardPlan p = PlanOrDie(m, o);
      const CheckpointSizing s = SizeFromCheckpoint(p, ckpt);
      EXPECT_TRUE(s.unplaced.empty()) << preset << ": " << s.unplaced.front();
      EXPECT_EQ(s.placed_bytes, s.total_bytes);
      for (const RankPlan& r : p.ranks) {
        // moeshard-cpu pads nothing, so the exact checkpoint bytes equal the formula's.
        EXPECT_EQ(s.RankTotal(r.coords.rank), r.WeightBytes())
            << preset << " " << p.topology.Label() << " rank " << r.coords.rank;
      }
    }
  }
}

TEST(CheckpointSizingTest, UnknownTensorsAreListed) {
  const ModelConfig m = PresetOrDie("tiny-qwen3-moe");
  std::vector<CheckpointTensorInfo> ckpt = FakeCheckpoint(m);
  ckpt.push_back({"model.layers.99.mlp.experts.0.gate_proj.weight", DType::kBF16, {4, 4}, 32});
  ckpt.push_back({"model.vision_tower.proj.weight", DType::kBF16, {4, 4}, 32});
  const CheckpointSizing s = SizeFromCheckpoint(PlanOrDie(m, Opts(2)), ckpt);
  ASSERT_EQ(s.unplaced.size(), 2u);
  EXPECT_EQ(s.total_bytes - s.placed_bytes, 64);
}

}  // namespace
}  // namespace moeshard
