// `moeshard plan --model <checkpoint dir>` crashed (vector::_M_range_check) whenever the plan did
// not fit: the advice search re-planned other topologies but the memory model kept per-rank
// weight bytes sized from the headers for the requested world, indexed by the new ranks. Seen
// with Kimi-K3 -tp 8 -ep and DeepSeek-V3 -tp 4 -ep on the default GPU. The memory options now
// carry the checkpoint's tensors, and every plan evaluated is sized from them.
#include <gtest/gtest.h>

#include <memory>

#include "moeshard/plan/advice.h"
#include "moeshard/plan/checkpoint_sizing.h"
#include "moeshard/plan/memory.h"
#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

// The checkpoint of `m` as its headers list it: non-routed tensors by their checkpoint names,
// experts per the family's layout (bf16 models only).
std::shared_ptr<std::vector<CheckpointTensorInfo>> Headers(const ModelConfig& m) {
  const ShardPlan one = PlanOrDie(m, Opts(1, 1, false, "moeshard-cpu"));
  auto out = std::make_shared<std::vector<CheckpointTensorInfo>>();
  for (const TensorShard& s : one.ranks[0].tensors) {
    if (s.category == TensorCategory::kRoutedExperts) continue;
    const int64_t per = s.bytes / s.count();
    if (s.layers.empty()) out->push_back({s.name, s.dtype, s.logical_shape, per});
    for (int64_t l : s.layers)
      out->push_back({ExpandName(s.name, l), s.dtype, s.logical_shape, per});
  }
  const int64_t I = m.moe_intermediate_size, H = m.hidden_size;
  for (int64_t l = 0; l < m.num_layers; ++l) {
    if (!m.layers[static_cast<size_t>(l)].moe) continue;
    for (int64_t e = 0; e < m.num_experts; ++e) {
      for (const std::string* mod : {&one.experts.gate, &one.experts.up, &one.experts.down}) {
        const bool down = mod == &one.experts.down;
        out->push_back({ExpandName(*mod, l, e) + ".weight",
                        DType::kBF16,
                        {down ? H : I, down ? I : H},
                        I * H * 2});
      }
    }
  }
  return out;
}

TEST(CheckpointAdviceCrashRegression, AdviceSizesEachCandidateFromTheHeaders) {
  const ModelConfig m = PresetOrDie("qwen3-30b-a3b");
  const PlanOptions o = Opts(1, 1, true);
  const ShardPlan plan = PlanOrDie(m, o);
  MemoryOptions mo;
  mo.gpu = GpuSpec{"custom", "40 GiB GPU", int64_t{40} << 30, "test"};
  mo.checkpoint_tensors = Headers(m);
  const MemoryPlan mp = PlanMemory(plan, mo);
  ASSERT_FALSE(mp.fits);  // 57 GB of bf16 experts on one 40 GiB GPU
  // The advice re-plans with 2, 4, ... GPUs: each candidate is sized from the same headers.
  const std::string advice = SmallestChangeThatFits(m, o, mo);
  EXPECT_NE(advice, "");
  EXPECT_NE(advice.find("GPUs"), std::string::npos) << advice;
  // And the header sizing matches the plan on a 4-rank candidate.
  const ShardPlan four = PlanOrDie(m, Opts(4, 1, true));
  const MemoryPlan mp4 = PlanMemory(four, mo);
  ASSERT_EQ(mp4.ranks.size(), 4u);
  for (const RankPlan& r : four.ranks) {
    EXPECT_EQ(mp4.ranks[static_cast<size_t>(r.coords.rank)].weights, r.WeightBytes());
  }
}

}  // namespace
}  // namespace moeshard
