#include "moeshard/plan/topology.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

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
  ResolvedTopology t{
      .tp = 2, .dp = 2, .pp = 2, .pcp = 1, .group = 4, .moe_tp = 2, .moe_ep = 2, .world = 8};
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

// Every topology with tp <= 4, dp <= 3, pcp <= 2, pp <= 3 and each moe_tp x moe_ep split of
// its group (model divisibility aside: the rank queries only read the sizes).
std::vector<ResolvedTopology> TopologyGrid() {
  std::vector<ResolvedTopology> grid;
  for (int64_t tp = 1; tp <= 4; ++tp) {
    for (int64_t dp = 1; dp <= 3; ++dp) {
      for (int64_t pcp = 1; pcp <= 2; ++pcp) {
        for (int64_t pp = 1; pp <= 3; ++pp) {
          const int64_t group = dp * pcp * tp;
          for (int64_t moe_tp = 1; moe_tp <= group; ++moe_tp) {
            if (group % moe_tp != 0) continue;
            grid.push_back({.tp = tp,
                            .dp = dp,
                            .pp = pp,
                            .pcp = pcp,
                            .group = group,
                            .moe_tp = moe_tp,
                            .moe_ep = group / moe_tp,
                            .world = group * pp});
          }
        }
      }
    }
  }
  return grid;
}

// The coordinates of every rank by enumeration in the documented order (stage slowest, then
// dp, pcp, tp), with the MoE split of the group rank counted the same way (moe_ep slowest).
std::vector<RankCoords> EnumerateCoords(const ResolvedTopology& t) {
  std::vector<RankCoords> all;
  for (int64_t s = 0; s < t.pp; ++s) {
    int64_t group_rank = 0;
    for (int64_t d = 0; d < t.dp; ++d) {
      for (int64_t c = 0; c < t.pcp; ++c) {
        for (int64_t r = 0; r < t.tp; ++r, ++group_rank) {
          all.push_back({.rank = static_cast<int64_t>(all.size()),
                         .pp_stage = s,
                         .group_rank = group_rank,
                         .dp_rank = d,
                         .pcp_rank = c,
                         .tp_rank = r});
        }
      }
    }
  }
  for (RankCoords& c : all) {
    int64_t q = 0;
    for (int64_t e = 0; e < t.moe_ep; ++e) {
      for (int64_t m = 0; m < t.moe_tp; ++m, ++q) {
        if (q == c.group_rank) c.moe_ep_rank = e, c.moe_tp_rank = m;
      }
    }
  }
  return all;
}

// What defines a group by its description in topology.h: the coordinates its ranks share, and
// the one that orders them.
struct GroupRule {
  RankGroup group;
  std::vector<int64_t> (*key)(const RankCoords&);
  int64_t (*position)(const RankCoords&);
};

const std::vector<GroupRule>& GroupRules() {
  static const std::vector<GroupRule> rules = {
      {RankGroup::kTp,
       [](const RankCoords& c) {
         return std::vector<int64_t>{c.pp_stage, c.dp_rank, c.pcp_rank};
       },
       [](const RankCoords& c) { return c.tp_rank; }},
      {RankGroup::kPcp,
       [](const RankCoords& c) {
         return std::vector<int64_t>{c.pp_stage, c.dp_rank, c.tp_rank};
       },
       [](const RankCoords& c) { return c.pcp_rank; }},
      {RankGroup::kDp,
       [](const RankCoords& c) {
         return std::vector<int64_t>{c.pp_stage, c.pcp_rank, c.tp_rank};
       },
       [](const RankCoords& c) { return c.dp_rank; }},
      {RankGroup::kMoeTp,
       [](const RankCoords& c) {
         return std::vector<int64_t>{c.pp_stage, c.moe_ep_rank};
       },
       [](const RankCoords& c) { return c.moe_tp_rank; }},
      {RankGroup::kMoeEp,
       [](const RankCoords& c) {
         return std::vector<int64_t>{c.pp_stage, c.moe_tp_rank};
       },
       [](const RankCoords& c) { return c.moe_ep_rank; }},
      {RankGroup::kStage, [](const RankCoords& c) { return std::vector<int64_t>{c.pp_stage}; },
       [](const RankCoords& c) { return c.group_rank; }},
      {RankGroup::kPipeline, [](const RankCoords& c) { return std::vector<int64_t>{c.group_rank}; },
       [](const RankCoords& c) { return c.pp_stage; }},
  };
  return rules;
}

bool SameCoords(const RankCoords& a, const RankCoords& b) {
  return a.rank == b.rank && a.pp_stage == b.pp_stage && a.group_rank == b.group_rank &&
         a.dp_rank == b.dp_rank && a.pcp_rank == b.pcp_rank && a.tp_rank == b.tp_rank &&
         a.moe_tp_rank == b.moe_tp_rank && a.moe_ep_rank == b.moe_ep_rank;
}

TEST(TopologyTest, CoordsRankOfAndUnitMatchEnumeration) {
  int64_t checked = 0;
  for (const ResolvedTopology& t : TopologyGrid()) {
    const std::vector<RankCoords> all = EnumerateCoords(t);
    ASSERT_EQ(static_cast<int64_t>(all.size()), t.world);
    for (const RankCoords& want : all) {
      const RankCoords got = CoordsOf(t, want.rank);
      ASSERT_TRUE(SameCoords(got, want)) << t.Label() << " rank " << want.rank;
      ASSERT_EQ(RankOf(t, want), want.rank) << t.Label();
      ASSERT_EQ(UnitOf(t, want.rank), want.dp_rank * t.pcp + want.pcp_rank) << t.Label();
      ASSERT_LT(UnitOf(t, want.rank), t.num_units());
      ++checked;
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(TopologyTest, GroupQueriesMatchEnumeration) {
  for (const ResolvedTopology& t : TopologyGrid()) {
    const std::vector<RankCoords> all = EnumerateCoords(t);
    for (const GroupRule& rule : GroupRules()) {
      const std::string what =
          fmt::format("{} group of {} (moe {}x{}, pp {})", RankGroupName(rule.group), t.Label(),
                      t.moe_tp, t.moe_ep, t.pp);
      const int64_t size = GroupSize(t, rule.group);
      std::set<int64_t> indices;
      for (const RankCoords& me : all) {
        // Brute force: every rank sharing my key, ordered by position.
        std::vector<int64_t> want;
        for (const RankCoords& other : all) {
          if (rule.key(other) == rule.key(me)) want.push_back(other.rank);
        }
        std::sort(want.begin(), want.end(), [&](int64_t a, int64_t b) {
          return rule.position(all[a]) < rule.position(all[b]);
        });
        ASSERT_EQ(static_cast<int64_t>(want.size()), size) << what;
        ASSERT_EQ(GroupPeers(t, rule.group, me.rank), want) << what << ", rank " << me.rank;
        ASSERT_EQ(RankInGroup(t, rule.group, me.rank), rule.position(me)) << what;
        for (int64_t p = 0; p < size; ++p) {
          ASSERT_EQ(PeerRank(t, rule.group, me.rank, p), want[p]) << what;
          // Same group, same index; positions are each peer's own.
          ASSERT_EQ(GroupIndexOf(t, rule.group, want[p]), GroupIndexOf(t, rule.group, me.rank))
              << what;
          ASSERT_EQ(RankInGroup(t, rule.group, want[p]), p) << what;
        }
        indices.insert(GroupIndexOf(t, rule.group, me.rank));
      }
      // One index per group, dense from 0: ranks of different groups never share one.
      ASSERT_EQ(static_cast<int64_t>(indices.size()), t.world / size) << what;
      ASSERT_EQ(*indices.begin(), 0) << what;
      ASSERT_EQ(*indices.rbegin(), t.world / size - 1) << what;
    }
  }
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
  const ModelConfig q = PresetOrDie("qwen3-235b-a22b");     // 4 KV heads
  EXPECT_TRUE(ResolveTopology(Topology{.tp = 8}, q).ok());  // each KV head on 2 ranks
  EXPECT_TRUE(ResolveTopology(Topology{.tp = 16}, q).ok());
  const std::vector<int64_t> valid = ValidAttentionTp(q, 64);
  EXPECT_EQ(valid, (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64}));
}

}  // namespace
}  // namespace moeshard
