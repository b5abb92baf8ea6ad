// The plan's backend catalog entry for moeshard's own CPU kernels must state exactly the shape
// constraints the kernels declare (include/moeshard/kernels/cpu_constraints.h), and a plan for
// that backend must only produce shapes the kernels accept.
#include <gtest/gtest.h>

#include "moeshard/config/config_loader.h"
#include "moeshard/kernels/cpu_constraints.h"
#include "moeshard/kernels/expert_gemm.h"
#include "moeshard/kernels/kernel_backend.h"
#include "moeshard/plan/backend.h"
#include "moeshard/plan/shard_plan.h"

namespace moeshard {
namespace {

TEST(BackendConstraintsTest, CatalogMatchesKernels) {
  Result<const BackendSpec*> b = FindBackend(kCpuBackendName);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)->intermediate_align, kCpuIntermediateAlignment);
  EXPECT_EQ((*b)->hidden_align, kCpuHiddenAlignment);
  EXPECT_EQ((*b)->intermediate_align_small, 0);
  for (WeightFormat q :
       {WeightFormat::kBf16, WeightFormat::kFp8Block, WeightFormat::kMxfp4, WeightFormat::kInt4}) {
    EXPECT_TRUE((*b)->Supports(q)) << WeightFormatName(q);
  }
  // The kernels' MXFP4 group is the format table's, and the table's fp8 default is the block
  // the kernels' constants name.
  EXPECT_EQ(WeightScheme::Default(WeightFormat::kMxfp4).SplitGranule(), kCpuMxfp4GroupSize);
  EXPECT_EQ(WeightScheme::Default(WeightFormat::kFp8Block).SplitGranule(), kCpuFp8BlockSize);
}

TEST(BackendConstraintsTest, PlannedShapesAreAcceptedByTheKernels) {
  // Every tiny preset at several topologies on moeshard-cpu: the padded per-rank expert shapes
  // pass the kernels' own validation, on every kernel backend.
  std::vector<std::pair<std::string, std::unique_ptr<KernelBackend>>> backends;
  for (const std::string& name : KernelBackendNames()) {
    Result<std::unique_ptr<KernelBackend>> b =
        CreateKernelBackend({.name = name, .num_threads = 1});
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backends.emplace_back(name, std::move(*b));
  }
  ASSERT_GE(backends.size(), 2u);
  for (const char* preset :
       {"tiny-kimi-k3", "tiny-deepseek-v3", "tiny-qwen3-moe", "tiny-mixtral", "tiny-gpt-oss"}) {
    const ModelConfig m = *LoadModelConfig(preset);
    for (auto [tp, ep] : {std::pair{1, false}, {2, false}, {4, false}, {8, true}, {4, true}}) {
      PlanOptions o;
      o.topology.tp = tp;
      o.topology.enable_ep = ep;
      o.backend = kCpuBackendName;
      Result<ShardPlan> p = BuildShardPlan(m, o);
      ASSERT_TRUE(p.ok()) << preset << " tp" << tp << ": " << p.status().ToString();
      ExpertWeights w;
      w.scheme = p->expert_scheme;
      w.num_experts_local = static_cast<int64_t>(p->ranks[0].expert_slots.size());
      w.hidden = p->hidden.padded_local;
      w.intermediate = p->intermediate.padded_local;
      w.gated = m.gated();
      w.gate_up_interleaved = p->experts.gate_up_interleaved;
      std::vector<std::byte> dummy(1);
      w.w13 = w.w2 = dummy.data();
      if (w.scheme.quantized()) w.w13_scales = w.w2_scales = dummy.data();
      ActivationParams act;
      act.kind = IsGated(act.kind) == w.gated ? act.kind : Activation::kReluSquared;
      EXPECT_TRUE(ValidateExpertWeights(w, act).ok())
          << preset << " tp" << tp << ": " << ValidateExpertWeights(w, act).ToString();
      // And every kernel backend's MoeExperts takes them (an empty batch: validation only).
      std::vector<int32_t> to_local(static_cast<size_t>(m.num_experts), -1);
      for (size_t s = 0; s < p->ranks[0].expert_slots.size(); ++s) {
        int32_t& l = to_local[static_cast<size_t>(p->ranks[0].expert_slots[s])];
        if (l < 0) l = static_cast<int32_t>(s);
      }
      for (auto& [name, backend] : backends) {
        MoeExpertsParams mp;
        mp.top_k = m.num_experts_per_tok;
        mp.num_experts_global = m.num_experts;
        mp.expert_global_to_local = to_local.data();
        mp.weights = &w;
        mp.activation = act;
        const Status st = backend->MoeExperts(mp);
        EXPECT_TRUE(st.ok()) << preset << " tp" << tp << " on " << name << ": " << st.ToString();
      }
    }
  }
}

}  // namespace
}  // namespace moeshard
