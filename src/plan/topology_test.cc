#include "moeshard/plan/topology.h"

#include <gtest/gtest.h>

#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::PresetOrDie;

TEST(TopologyTest, VllmSemantics) {
  const ModelConfig m = PresetOrDie("kimi-k3");
  Result<ResolvedTopology> no_ep = ResolveTopology(Topology{.tp = 8, .dp = 4}, m);
  ASSERT_TRUE(no_ep.ok()) << no_ep.status().ToString();
  EXPECT_EQ(no_ep->group, 32);
  EXPECT_EQ(no_ep->moe_tp, 32);  // the divisor is dp*pcp*tp, not tp (PR 50928)
  EXPECT_EQ(no_ep->moe_ep, 1);
  EXPECT_EQ(no_ep->world, 32);

  Result<ResolvedTopology> ep = ResolveTopology(Topology{.tp = 16, .dp = 2, .enable_ep = true}, m);
  ASSERT_TRUE(ep.ok());
  EXPECT_EQ(ep->moe_tp, 1);
  EXPECT_EQ(ep->moe_ep, 32);
  EXPECT_EQ(ep->tp, 16);  // attention TP is untouched by EP (vLLM 54956)

  Result<ResolvedTopology> hybrid = ResolveTopology(Topology{.tp = 8, .moe_tp = 2, .moe_ep = 4}, m);
  ASSERT_TRUE(hybrid.ok());
  EXPECT_EQ(hybrid->moe_tp, 2);
  EXPECT_EQ(hybrid->moe_ep, 4);
  Result<ResolvedTopology> derived = ResolveTopology(Topology{.tp = 8, .moe_ep = 4}, m);
  ASSERT_TRUE(derived.ok());
  EXPECT_EQ(derived->moe_tp, 2);

  Result<ResolvedTopology> pp = ResolveTopology(Topology{.tp = 8, .pp = 2, .pcp = 2}, m);
  ASSERT_TRUE(pp.ok());
  EXPECT_EQ(pp->group, 16);
  EXPECT_EQ(pp->world, 32);
}

TEST(TopologyTest, RankCoordinates) {
  ResolvedTopology t{.tp = 2, .dp = 2, .pp = 2, .pcp = 1, .group = 4, .moe_tp = 2, .moe_ep = 2, .world = 8};
  // world rank = stage * group + group_rank; group_rank = dp * pcp * tp + pcp * tp + tp.
  RankCoords c = CoordsOf(t, 7);
  EXPECT_EQ(c.pp_stage, 1);
  EXPECT_EQ(c.group_rank, 3);
  EXPECT_EQ(c.dp_rank, 1);
  EXPECT_EQ(c.tp_rank, 1);
  EXPECT_EQ(c.moe_tp_rank, 1);
  EXPECT_EQ(c.moe_ep_rank, 1);
  c = CoordsOf(t, 2);
  EXPECT_EQ(c.dp_rank, 1);
  EXPECT_EQ(c.tp_rank, 0);
  EXPECT_EQ(c.moe_ep_rank, 1);
  EXPECT_EQ(c.moe_tp_rank, 0);
}

TEST(TopologyTest, ErrorsListValidValues) {
  const ModelConfig k3 = PresetOrDie("kimi-k3");
  Result<ResolvedTopology> r = ResolveTopology(Topology{.tp = 3}, k3);
  ASSERT_FALSE(r.ok());
  // 96 heads allow 3, the 163840 vocab and KDA's 128 rows do not: valid TP is 1..32 powers of 2.
  EXPECT_NE(r.status().message().find("valid -tp for this model: 1, 2, 4, 8, 16, 32"),
            std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("-tp 3"), std::string::npos);

  r = ResolveTopology(Topology{.tp = 64}, k3);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_attention_heads"), std::string::npos);

  r = ResolveTopology(Topology{.tp = 8, .moe_tp = 3, .moe_ep = 4}, k3);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("expected moe_tp * moe_ep = dp * pcp * tp = 8"),
            std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("2x4"), std::string::npos);

  r = ResolveTopology(Topology{.tp = 8, .enable_ep = true, .moe_tp = 2, .moe_ep = 4}, k3);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("got both"), std::string::npos);

  r = ResolveTopology(Topology{.tp = 0}, k3);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("positive"), std::string::npos);

  // Mixtral: I = 14336 = 2^11 * 7 does not split 3 ways; 8 experts cannot go over EP 16.
  const ModelConfig mix = PresetOrDie("mixtral-8x7b");
  r = ResolveTopology(Topology{.tp = 1, .dp = 3}, mix);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("moe_intermediate_size 14336"), std::string::npos)
      << r.status().message();
  r = ResolveTopology(Topology{.tp = 8, .dp = 2, .enable_ep = true}, mix);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("EP size 16"), std::string::npos) << r.status().message();

  r = ResolveTopology(Topology{.tp = 1, .pp = 100}, mix);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("-pp 100"), std::string::npos);
}

TEST(TopologyTest, KvHeadsReplicateBeyondTheirCount) {
  const ModelConfig q = PresetOrDie("qwen3-235b-a22b");  // 4 KV heads
  EXPECT_TRUE(ResolveTopology(Topology{.tp = 8}, q).ok());   // each KV head on 2 ranks
  EXPECT_TRUE(ResolveTopology(Topology{.tp = 16}, q).ok());
  const std::vector<int64_t> valid = ValidAttentionTp(q, 64);
  EXPECT_EQ(valid, (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64}));
}

}  // namespace
}  // namespace moeshard
