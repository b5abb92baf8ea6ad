#include "moeshard/plan/shard_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "plan/plan_json.h"
#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::FindTensor;
using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

TEST(PaddingTest, ContractFormula) {
  const ModelConfig k3 = PresetOrDie("kimi-k3");  // I = 3072, mxfp4 group 32
  // TP32 without EP, marlin: raw 96, align lcm(128, 32) = 128, padded 128.
  ShardPlan p = PlanOrDie(k3, Opts(32, 1, false, "marlin"));
  EXPECT_EQ(p.intermediate.logical, 3072);
  EXPECT_EQ(p.intermediate.raw_local, 96);
  EXPECT_EQ(p.intermediate.align, 128);
  EXPECT_EQ(p.intermediate.padded_local, 128);
  EXPECT_EQ(p.intermediate.padding(), 32);
  // The hidden (latent) width 3584 = 14 * 256 meets marlin's 256 without padding.
  EXPECT_EQ(p.hidden.logical, 3584);
  EXPECT_EQ(p.hidden.padded_local, 3584);

  // Plain CPU backend: no alignment, only the mxfp4 group: 96 stays 96.
  p = PlanOrDie(k3, Opts(32, 1, false, "cpu"));
  EXPECT_EQ(p.intermediate.align, 32);
  EXPECT_EQ(p.intermediate.padded_local, 96);

  // aiter-ck alignment depends on the size: 64 up to 192, else 128 (bf16 Qwen3-30B, I = 768).
  const ModelConfig q = PresetOrDie("qwen3-30b-a3b");
  EXPECT_EQ(PlanOrDie(q, Opts(8, 1, false, "aiter-ck")).intermediate.padded_local,
            128);  // 96 -> 128
  EXPECT_EQ(PlanOrDie(q, Opts(4, 1, false, "aiter-ck")).intermediate.padded_local,
            192);  // 192: align 64
  EXPECT_EQ(PlanOrDie(q, Opts(2, 1, false, "aiter-ck")).intermediate.padded_local,
            384);  // 384 -> 384

  // model-floor honours the model's floor (256) only when the experts are split.
  p = PlanOrDie(k3, Opts(32, 1, false, "marlin", PaddingPolicy::kModelFloor));
  EXPECT_EQ(p.intermediate.floor, 256);
  EXPECT_EQ(p.intermediate.padded_local, 256);
  p = PlanOrDie(k3, Opts(32, 1, true, "marlin", PaddingPolicy::kModelFloor));
  EXPECT_EQ(p.intermediate.floor, 0);
  EXPECT_EQ(p.intermediate.padded_local, 3072);
}

TEST(PaddingTest, QuantGroupAndBackendRules) {
  // DeepSeek-V3 fp8: I = 2048 at MoE TP 32 gives 64, which splits a 128-row scale block.
  const ModelConfig ds = PresetOrDie("deepseek-v3");
  Result<ShardPlan> r = BuildShardPlan(ds, Opts(32));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("quantization group (128), got 64"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("valid MoE TP sizes: 1, 2, 4, 8, 16"), std::string::npos)
      << r.status().message();
  EXPECT_TRUE(BuildShardPlan(ds, Opts(16, 2, true)).ok());  // EP keeps experts whole

  // A backend that cannot run the format.
  r = BuildShardPlan(PresetOrDie("qwen3-30b-a3b"), Opts(8, 1, false, "marlin"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("does not run bf16 experts"), std::string::npos)
      << r.status().message();
  // MegaMoE is EP only.
  r = BuildShardPlan(PresetOrDie("kimi-k3"), Opts(8, 1, false, "deepgemm-megamoe"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("add -ep"), std::string::npos) << r.status().message();
  // Unknown backend lists the catalog.
  r = BuildShardPlan(PresetOrDie("kimi-k3"), Opts(8, 1, false, "cutlass3"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("moeshard-cpu"), std::string::npos);
}

// Round-robin over redundant slots would put a replica beside its own expert (12 experts + 4
// redundant slots over EP4: rank 0 gets slots 0, 4, 8, 12 = experts 0, 4, 8, 0): refused,
// naming the rank and the expert; linear placement of the same slots holds each expert once
// per rank.
TEST(PlacementTest, RoundRobinRefusesAReplicaOnItsOwnRank) {
  const ModelConfig m = PresetOrDie("tiny-qwen3-moe");
  ASSERT_EQ(m.num_experts, 12);
  PlanOptions o = Opts(4, 1, true);
  o.num_redundant_experts = 4;
  o.placement = ExpertPlacement::kRoundRobin;
  const Result<ShardPlan> r = BuildShardPlan(m, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("EP rank 0 would hold expert 0 twice"), std::string::npos)
      << r.status().message();
  o.placement = ExpertPlacement::kLinear;
  const Result<ShardPlan> linear = BuildShardPlan(m, o);
  ASSERT_TRUE(linear.ok()) << linear.status().message();
  for (const RankPlan& rank : linear->ranks) {
    const std::set<int64_t> distinct(rank.expert_slots.begin(), rank.expert_slots.end());
    EXPECT_EQ(distinct.size(), rank.expert_slots.size()) << rank.coords.rank;
  }
  o.num_redundant_experts = 0;  // without redundancy round-robin is a permutation
  o.placement = ExpertPlacement::kRoundRobin;
  EXPECT_TRUE(BuildShardPlan(m, o).ok());
}

TEST(PlacementTest, LinearRoundRobinUneven) {
  EXPECT_EQ(ExpertSlotsOf(10, 10, 4, 0, ExpertPlacement::kLinear), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(ExpertSlotsOf(10, 10, 4, 1, ExpertPlacement::kLinear), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(ExpertSlotsOf(10, 10, 4, 2, ExpertPlacement::kLinear), (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(ExpertSlotsOf(10, 10, 4, 3, ExpertPlacement::kLinear), (std::vector<int64_t>{8, 9}));
  EXPECT_EQ(ExpertSlotsOf(10, 10, 4, 1, ExpertPlacement::kRoundRobin),
            (std::vector<int64_t>{1, 5, 9}));
  EXPECT_EQ(ExpertSlotsOf(10, 10, 4, 3, ExpertPlacement::kRoundRobin),
            (std::vector<int64_t>{3, 7}));
  // EPLB: 8 experts + 4 redundant slots over 4 ranks: 3 slots each; slots 8..11 copy 0..3.
  EXPECT_EQ(ExpertSlotsOf(8, 12, 4, 3, ExpertPlacement::kLinear), (std::vector<int64_t>{1, 2, 3}));
  // Every expert is placed exactly once when there is no redundancy, for both placements.
  for (ExpertPlacement pl : {ExpertPlacement::kLinear, ExpertPlacement::kRoundRobin}) {
    for (int64_t ep : {1, 3, 7, 16}) {
      std::multiset<int64_t> seen;
      for (int64_t r = 0; r < ep; ++r) {
        for (int64_t e : ExpertSlotsOf(128, 128, ep, r, pl)) seen.insert(e);
      }
      ASSERT_EQ(seen.size(), 128u);
      for (int64_t e = 0; e < 128; ++e) EXPECT_EQ(seen.count(e), 1u);
    }
  }
}

// `--num-redundant-experts auto`: the fewest redundant experts that make the slots divide by
// the MoE EP size, (ep - E mod ep) mod ep (vLLM issue 30075), for every EP size up to 40.
TEST(ShardPlanTest, RedundantExpertsAutoIsTheFewestThatDivide) {
  const ModelConfig m = PresetOrDie("qwen3-30b-a3b");  // 128 experts
  for (int64_t ep = 1; ep <= 40; ++ep) {
    PlanOptions o = Opts(/*tp=*/1, /*dp=*/ep, /*ep=*/true);
    o.num_redundant_experts = kRedundantExpertsAuto;
    Result<ShardPlan> plan = BuildShardPlan(m, o);
    ASSERT_TRUE(plan.ok()) << "EP " << ep << ": " << plan.status().ToString();
    const int64_t redundant = plan->num_slots - 128;
    EXPECT_EQ(plan->num_slots % ep, 0) << "EP " << ep;
    EXPECT_GE(redundant, 0);
    EXPECT_LT(redundant, ep) << "EP " << ep;  // fewer would not divide: the smallest multiple
    // The same count given explicitly plans the same slots (an EPLB plan needs exact division).
    o.num_redundant_experts = redundant;
    if (redundant > 0) {
      EXPECT_EQ(PlanOrDie(m, o).num_slots, plan->num_slots);
    }
  }
  PlanOptions o = Opts(1, 6, true);
  o.num_redundant_experts = kRedundantExpertsAuto;
  const ShardPlan six = PlanOrDie(m, o);
  EXPECT_EQ(six.num_slots, 132);  // 128 + 4: 22 slots per rank
  o.num_redundant_experts = -2;
  Result<ShardPlan> bad = BuildShardPlan(m, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("expected a count >= 0 or auto"), std::string::npos)
      << bad.status().message();
}

TEST(ShardPlanTest, RoutedTensorsKimiK3TP32EP) {
  // Kimi-K3, MXFP4 experts, TP32 with EP on marlin: 896 / 32 = 28 whole experts per rank in the
  // latent width 3584, I = 3072 unpadded.
  const ShardPlan p = PlanOrDie(PresetOrDie("kimi-k3"), Opts(32, 1, true, "marlin"));
  ASSERT_EQ(p.ranks.size(), 32u);
  const RankPlan& r = p.ranks[5];
  EXPECT_EQ(r.expert_slots.size(), 28u);
  EXPECT_EQ(r.expert_slots.front(), 5 * 28);
  const TensorShard* w13 = FindTensor(
      r, "language_model.model.layers.{layer}.block_sparse_moe.experts.w13_weight_packed");
  const TensorShard* w13s = FindTensor(
      r, "language_model.model.layers.{layer}.block_sparse_moe.experts.w13_weight_scale");
  const TensorShard* w2 = FindTensor(
      r, "language_model.model.layers.{layer}.block_sparse_moe.experts.w2_weight_packed");
  const TensorShard* w2s =
      FindTensor(r, "language_model.model.layers.{layer}.block_sparse_moe.experts.w2_weight_scale");
  ASSERT_TRUE(w13 && w13s && w2 && w2s);
  EXPECT_EQ(w13->padded_shape, (std::vector<int64_t>{28, 6144, 1792}));  // 2*3072 rows, 3584/2
  EXPECT_EQ(w13s->padded_shape, (std::vector<int64_t>{28, 6144, 112}));  // 3584/32
  EXPECT_EQ(w2->padded_shape, (std::vector<int64_t>{28, 3584, 1536}));   // 3072/2
  EXPECT_EQ(w2s->padded_shape, (std::vector<int64_t>{28, 3584, 96}));    // 3072/32
  EXPECT_EQ(w13->count(), 92);
  // Per layer: 28 * (6144*1792 + 6144*112 + 3584*1536 + 3584*96) = 28 * 17,547,264 bytes.
  const int64_t per_layer = 28LL * (6144 * 1792 + 6144 * 112 + 3584 * 1536 + 3584 * 96);
  EXPECT_EQ(per_layer, 491'323'392);
  EXPECT_EQ(r.BytesOf(TensorCategory::kRoutedExperts), per_layer * 92);
  EXPECT_EQ(r.PaddingBytesOf(TensorCategory::kRoutedExperts), 0);
}

TEST(ShardPlanTest, GptOssBiasesAndHiddenPadding) {
  // gpt-oss-120b on marlin: H = 2880 pads to 3072 (marlin H % 256); I = 2880 at EP stays whole
  // but pads to 2944 (next multiple of 128).
  const ShardPlan p = PlanOrDie(PresetOrDie("gpt-oss-120b"), Opts(4, 1, true, "marlin"));
  EXPECT_EQ(p.hidden.padded_local, 3072);
  EXPECT_EQ(p.intermediate.padded_local, 2944);
  const RankPlan& r = p.ranks[0];
  const TensorShard* b13 = FindTensor(r, "model.layers.{layer}.mlp.experts.w13_bias");
  const TensorShard* b2 = FindTensor(r, "model.layers.{layer}.mlp.experts.w2_bias");
  ASSERT_TRUE(b13 && b2);
  EXPECT_EQ(b13->padded_shape, (std::vector<int64_t>{32, 2 * 2944}));
  EXPECT_EQ(b2->padded_shape, (std::vector<int64_t>{32, 3072}));
  // FlashInfer CUTLASS aligns H to 128: 2880 = 22.5 * 128 -> 2944.
  EXPECT_EQ(PlanOrDie(PresetOrDie("gpt-oss-120b"), Opts(4, 1, true, "flashinfer-cutlass"))
                .hidden.padded_local,
            2944);
}

TEST(ShardPlanTest, TensorsTileEveryLogicalTensor) {
  // Column/row splits over attention TP cover each tensor exactly; KV heads replicate when
  // fewer than TP (Qwen3-235B has 4 KV heads: at TP8 each head sits on two ranks).
  const ShardPlan p = PlanOrDie(PresetOrDie("qwen3-235b-a22b"), Opts(8));
  std::map<int64_t, int> k_begin_count;
  for (const RankPlan& r : p.ranks) {
    const TensorShard* k = FindTensor(r, "model.layers.{layer}.self_attn.k_proj.weight");
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(k->local_shape, (std::vector<int64_t>{128, 4096}));
    k_begin_count[k->shard_begin]++;
    const TensorShard* q = FindTensor(r, "model.layers.{layer}.self_attn.q_proj.weight");
    EXPECT_EQ(q->shard_begin, r.coords.tp_rank * 1024);
    EXPECT_EQ(q->shard_end - q->shard_begin, 64 * 128 / 8);
  }
  EXPECT_EQ(k_begin_count.size(), 4u);
  for (const auto& [begin, n] : k_begin_count) EXPECT_EQ(n, 2) << begin;
}

TEST(ShardPlanTest, JsonHasTheContractFields) {
  const ShardPlan p = PlanOrDie(PresetOrDie("kimi-k3"), Opts(16, 1, true));
  const nlohmann::json j = ShardPlanToJson(p, false);
  EXPECT_EQ(j["routed_experts"]["intermediate"]["logical"], 3072);
  EXPECT_EQ(j["routed_experts"]["intermediate"]["raw_local"], 3072);
  EXPECT_EQ(j["routed_experts"]["intermediate"]["padded_local"], 3072);
  ASSERT_EQ(j["ranks"].size(), 16u);
  EXPECT_TRUE(j["ranks"][3]["bytes"]["routed_experts"].is_number_integer());
  EXPECT_EQ(j["ranks"][3]["bytes"]["routed_experts"].get<int64_t>(),
            p.ranks[3].BytesOf(TensorCategory::kRoutedExperts));
  EXPECT_EQ(j["ranks"][3]["experts"].size(), 56u);
}

TEST(ShardPlanTest, PipelineStagesSplitLayersLikeVllm) {
  // 61 layers over 4 stages: 15 each, the remainder 1 going to the stage before the last.
  const ModelConfig k2 = PresetOrDie("kimi-k2");
  PlanOptions o = Opts(8, 1, true);
  o.topology.pp = 4;
  const ShardPlan p = PlanOrDie(k2, o);
  ASSERT_EQ(p.ranks.size(), 32u);
  EXPECT_EQ(p.ranks[0].layers.size(), 15u);
  EXPECT_EQ(p.ranks[8].layers.size(), 15u);
  EXPECT_EQ(p.ranks[16].layers.size(), 16u);
  EXPECT_EQ(p.ranks[24].layers.size(), 15u);
  EXPECT_GT(p.ranks[0].BytesOf(TensorCategory::kEmbedding), 0);
  EXPECT_EQ(p.ranks[0].BytesOf(TensorCategory::kLmHead), 0);
  EXPECT_EQ(p.ranks[31].BytesOf(TensorCategory::kEmbedding), 0);
  EXPECT_GT(p.ranks[31].BytesOf(TensorCategory::kLmHead), 0);
  EXPECT_EQ(p.ranks[0].layers.front(), 0);
  EXPECT_EQ(p.ranks[31].layers.back(), 60);
}

}  // namespace
}  // namespace moeshard
