// EPLB placement (DeepSeek's algorithm, plan/eplb.h): a hand-worked case, the invariants of
// every placement over a grid, balance against the linear placement on skewed loads, the
// hierarchical rule, the load file and the errors.
#include "moeshard/plan/eplb.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "moeshard/plan/shard_plan.h"

namespace moeshard {
namespace {

// Zipf-like loads: expert e gets 1000 / (1 + rank of e)^s tokens, ranks shuffled per layer.
std::vector<double> ZipfLoad(int64_t experts, double s, int64_t layer) {
  std::vector<double> load(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t rank = (e * 7 + layer * 3) % experts;  // a fixed permutation (7 coprime)
    load[static_cast<size_t>(e)] = std::round(1000.0 / std::pow(1.0 + rank, s));
  }
  return load;
}

std::vector<std::vector<int64_t>> LinearRankExperts(int64_t experts, int64_t slots, int64_t ranks) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < ranks; ++r) {
    out.push_back(ExpertSlotsOf(experts, slots, ranks, r, ExpertPlacement::kLinear));
  }
  return out;
}

TEST(EplbTest, HandWorkedCase) {
  // Loads 8, 4, 2, 2 on 6 slots over 2 ranks. Replicas, at most 2 an expert (the ranks): expert
  // 0 takes the first extra slot (8/1), then is capped, and expert 1 (4/1) the second: counts
  // 2, 2, 1, 1. Packing by load per replica (4, 4, 2, 2, 2, 2), heaviest first onto the lighter
  // rank with room that does not hold the expert yet (ties: the lower rank): e0 -> r0 (4);
  // e0 -> r1 (4); e1 -> r0 (6); e1 -> r1 (6); e2 -> r0 (8, full); e3 -> r1 (8). Within a rank
  // the slots follow expert order: r0 = e0 e1 e2, r1 = e0 e1 e3; perfect balance.
  // (DeepSeek's uncapped rule would give expert 0 three replicas, two on one rank.)
  const ExpertLoad load{.model = "hand", .layers = {{8, 4, 2, 2}}};
  Result<EplbPlacement> p = ComputeEplbPlacement(load, {.num_slots = 6, .num_ranks = 2});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->replicas[0], (std::vector<int64_t>{2, 2, 1, 1}));
  EXPECT_EQ(p->slot_expert[0], (std::vector<int64_t>{0, 1, 2, 0, 1, 3}));
  EXPECT_NEAR(RankLoadImbalance(load.layers[0], RankExperts(p->slot_expert[0], 2)), 1.0, 1e-9);
  // The load model splits an expert over the ranks holding it: a repeat on one rank counts
  // once. Ranks {e0, e0, e2} and {e0, e1, e3}: 4 + 2 = 6 and 4 + 4 + 2 = 10, max/mean 10/8
  // (counting the repeat as a third share would give 7.33 and 8.67).
  EXPECT_NEAR(RankLoadImbalance(load.layers[0], {{0, 0, 2}, {0, 1, 3}}), 10.0 / 8, 1e-9);
}

TEST(EplbTest, NoRankHoldsTwoCopiesWhileAnotherRankCouldTakeOne) {
  // Skewed loads with many redundant slots: the hot experts' replicas land on distinct ranks.
  for (int64_t ranks : {2, 4, 8}) {
    for (int64_t redundant : {4, 8, 16}) {
      const int64_t experts = 16, slots = experts + redundant;
      if (slots % ranks != 0) continue;
      SCOPED_TRACE(testing::Message() << ranks << " ranks, " << slots << " slots");
      ExpertLoad load;
      for (int64_t l = 0; l < 3; ++l) load.layers.push_back(ZipfLoad(experts, 1.5, l));
      Result<EplbPlacement> p =
          ComputeEplbPlacement(load, {.num_slots = slots, .num_ranks = ranks});
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      for (size_t l = 0; l < load.layers.size(); ++l) {
        for (const std::vector<int64_t>& held : RankExperts(p->slot_expert[l], ranks)) {
          const std::set<int64_t> distinct(held.begin(), held.end());
          EXPECT_EQ(distinct.size(), held.size()) << "layer " << l;
        }
        for (int64_t c : p->replicas[l]) EXPECT_LE(c, ranks);
      }
    }
  }
}

TEST(EplbTest, EveryPlacementFillsEverySlotAndHoldsEveryExpert) {
  for (int64_t experts : {8, 12, 16, 64}) {
    for (int64_t ranks : {1, 2, 4, 8}) {
      for (int64_t redundant : {0, 4, 8}) {
        const int64_t slots = experts + redundant;
        if (slots % ranks != 0) continue;
        SCOPED_TRACE(testing::Message()
                     << experts << " experts " << slots << " slots " << ranks << " ranks");
        ExpertLoad load;
        for (int64_t l = 0; l < 3; ++l) load.layers.push_back(ZipfLoad(experts, 1.2, l));
        Result<EplbPlacement> p =
            ComputeEplbPlacement(load, {.num_slots = slots, .num_ranks = ranks});
        ASSERT_TRUE(p.ok()) << p.status().ToString();
        for (size_t l = 0; l < load.layers.size(); ++l) {
          const std::vector<int64_t>& map = p->slot_expert[l];
          ASSERT_EQ(static_cast<int64_t>(map.size()), slots);
          std::vector<int64_t> held(static_cast<size_t>(experts), 0);
          for (int64_t e : map) {
            ASSERT_GE(e, 0);
            ASSERT_LT(e, experts);
            ++held[static_cast<size_t>(e)];
          }
          EXPECT_EQ(held, p->replicas[l]);
          // Every expert held (with slots = 2 x experts over 2 ranks, each on both ranks).
          EXPECT_GE(*std::min_element(held.begin(), held.end()), 1);
        }
      }
    }
  }
}

TEST(EplbTest, SkewedLoadIsBalancedBetterThanTheLinearPlacement) {
  const int64_t experts = 64, ranks = 8;
  for (int64_t redundant : {0, 8, 16}) {
    const int64_t slots = experts + redundant;
    ExpertLoad load;
    for (int64_t l = 0; l < 4; ++l) load.layers.push_back(ZipfLoad(experts, 1.0, l));
    Result<EplbPlacement> p = ComputeEplbPlacement(load, {.num_slots = slots, .num_ranks = ranks});
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    for (size_t l = 0; l < load.layers.size(); ++l) {
      const double before =
          RankLoadImbalance(load.layers[l], LinearRankExperts(experts, slots, ranks));
      const double after = RankLoadImbalance(load.layers[l], RankExperts(p->slot_expert[l], ranks));
      SCOPED_TRACE(testing::Message() << "redundant " << redundant << " layer " << l << ": "
                                      << before << " -> " << after);
      EXPECT_GT(before, 1.3);  // the skew is real
      EXPECT_LT(after, before);
      if (redundant >= 16) {
        EXPECT_LT(after, 1.1);
      }
    }
  }
}

TEST(EplbTest, HierarchicalKeepsEachGroupOnOneNode) {
  // 32 experts in 8 groups, 2 nodes of 4 ranks, 40 slots: every replica of a group's experts
  // lands on the node its group was packed onto.
  const int64_t experts = 32, groups = 8, nodes = 2, ranks = 8, slots = 40;
  ExpertLoad load{.model = "", .layers = {ZipfLoad(experts, 1.1, 0)}};
  Result<EplbPlacement> p = ComputeEplbPlacement(
      load, {.num_slots = slots, .num_ranks = ranks, .num_nodes = nodes, .num_groups = groups});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const int64_t slots_per_node = slots / nodes;
  std::vector<std::set<int64_t>> nodes_of_group(static_cast<size_t>(groups));
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t e = p->slot_expert[0][static_cast<size_t>(s)];
    nodes_of_group[static_cast<size_t>(e / (experts / groups))].insert(s / slots_per_node);
  }
  for (const std::set<int64_t>& n : nodes_of_group) EXPECT_EQ(n.size(), 1u);
  // Groups that do not divide by the nodes fall back to the global policy (still valid).
  Result<EplbPlacement> global = ComputeEplbPlacement(
      load, {.num_slots = slots, .num_ranks = ranks, .num_nodes = 4, .num_groups = 2});
  ASSERT_TRUE(global.ok()) << global.status().ToString();
}

TEST(EplbTest, LoadFileRoundTripsAndBadInputIsNamed) {
  const ExpertLoad load{.model = "tiny-qwen3-moe", .layers = {{1, 2, 3}, {4, 5, 6}}};
  Result<ExpertLoad> back = ParseExpertLoad(ExpertLoadJson(load), "load.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->model, load.model);
  EXPECT_EQ(back->layers, load.layers);
  auto error = [](const char* text) {
    Result<ExpertLoad> r = ParseExpertLoad(text, "load.json");
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(error("[1, 2]").find("load.json: not a JSON object"), std::string::npos);
  EXPECT_NE(error(R"({"layers": 3})").find("'layers' missing or not an array"), std::string::npos);
  EXPECT_NE(
      error(R"({"layers": [[1, "x"]]})").find("layers[0][1] is \"x\", expected a token count"),
      std::string::npos);
  auto place_error = [](const ExpertLoad& l, const EplbOptions& o) {
    Result<EplbPlacement> r = ComputeEplbPlacement(l, o);
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(place_error(load, {.num_slots = 4, .num_ranks = 3})
                .find("4 slots for 3 experts over 3 ranks"),
            std::string::npos);
  EXPECT_NE(
      place_error(load, {.num_slots = 2, .num_ranks = 1}).find("at least one slot per expert"),
      std::string::npos);
  EXPECT_NE(
      place_error({.model = "", .layers = {{1, 2}, {1, 2, 3}}}, {.num_slots = 4, .num_ranks = 2})
          .find("layer 1 has 3 experts, layer 0 has 2"),
      std::string::npos);
  EXPECT_NE(place_error({.model = "", .layers = {{1, -2}}}, {.num_slots = 2, .num_ranks = 2})
                .find("layer 0 expert 1: -2 is not a token count"),
            std::string::npos);
}

TEST(EplbTest, LoadFileSlotSectionRoundTripsAndIsChecked) {
  // The per-slot section `run --expert-load-out` writes: expert 2 on two slots, its 6 tokens
  // of layer 0 split 4 + 2.
  const ExpertLoad load{.model = "m",
                        .layers = {{1, 2, 6}, {0, 3, 3}},
                        .slot_experts = {0, 2, 1, 2},
                        .slot_tokens = {{1, 4, 2, 2}, {0, 3, 3, 0}}};
  Result<ExpertLoad> back = ParseExpertLoad(ExpertLoadJson(load), "load.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->slot_experts, load.slot_experts);
  EXPECT_EQ(back->slot_tokens, load.slot_tokens);
  // Without the section the file is as before.
  const ExpertLoad plain{.model = "m", .layers = {{1, 2, 6}}};
  EXPECT_EQ(ExpertLoadJson(plain).find("slot_"), std::string::npos);
  auto error = [](const char* text) {
    Result<ExpertLoad> r = ParseExpertLoad(text, "load.json");
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(error(R"({"layers": [[1, 2]], "slot_experts": [0, 1]})")
                .find("'slot_experts' without 'slot_tokens'"),
            std::string::npos);
  EXPECT_NE(error(R"({"layers": [[1, 2]], "slot_experts": [0, 1], "slot_tokens": []})")
                .find("expected an array of experts and 1 arrays of tokens"),
            std::string::npos);
  EXPECT_NE(error(R"({"layers": [[1, 2]], "slot_experts": [0, 1], "slot_tokens": [[1]]})")
                .find("slot_tokens[0]: expected an array of 2 token counts"),
            std::string::npos);
  EXPECT_NE(error(R"({"layers": [[1, 2]], "slot_experts": [0, -1], "slot_tokens": [[1, 1]]})")
                .find("slot_experts[1] is -1, expected an expert id"),
            std::string::npos);
}

}  // namespace
}  // namespace moeshard
