// The expert load the runtime records (ForwardArgs::expert_counts / slot_counts, gathered by
// RunShardedJob into ShardedJobResult::expert_tokens / slot_tokens) and the simulated routing
// that `run --routing-simulation` feeds it: every (token, top-k choice) pair counted exactly
// once over the world, whatever the layout (TP ranks of a unit share tokens, moe_tp ranks
// compute the same rows), and a hot expert's tokens split over its replicas.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "moeshard/comm/launcher.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/plan/shard_plan.h"
#include "moeshard/runtime/routing_simulation.h"
#include "moeshard/runtime/sharded_job.h"

namespace moeshard {
namespace {

struct Case {
  const char* name;
  Topology topology;
  int64_t redundant = 0;
  std::vector<int64_t> tokens;
};

// Tokens per logical expert of the routing given to the job, counted directly: the truth.
std::vector<int64_t> CountIds(const std::vector<int32_t>& ids, int64_t experts) {
  std::vector<int64_t> out(static_cast<size_t>(experts), 0);
  for (int32_t e : ids) ++out[static_cast<size_t>(e)];
  return out;
}

ShardedJobResult RunJob(const ShardPlan& plan, const std::vector<int64_t>& tokens,
                        const SimulatedRouting* routing) {
  ShardedJobSpec spec;
  spec.plan = &plan;
  spec.tokens_per_unit = tokens;
  spec.warmup = 1;  // two forwards: the counts are the last one's, not their sum
  spec.iters = 1;
  spec.record_expert_load = true;
  if (routing != nullptr) {
    spec.topk_ids = &routing->topk_ids;
    spec.topk_weights = &routing->topk_weights;
  }
  ShardedJobResult result;
  auto launcher = CreateLauncher({.comm = "local", .world = static_cast<int>(plan.topology.world)});
  EXPECT_TRUE(launcher.ok()) << launcher.status().ToString();
  const Status s = (*launcher)->Run([&](Communicator& w) -> Status {
    MOESHARD_ASSIGN_OR_RETURN(ShardedJobResult r, RunShardedJob(spec, w));
    if (w.rank() == 0) result = std::move(r);
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  return result;
}

TEST(ExpertLoadTest, EveryPairCountedOnceInEveryLayout) {
  Result<ModelConfig> model = LoadModelConfig("tiny-qwen3-moe");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const int64_t E = model->num_experts, k = model->num_experts_per_tok;
  const std::vector<Case> cases = {
      {"one rank", {}, 0, {37}},
      {"TP2 (moe_tp 2: both ranks compute every row)", {.tp = 2}, 0, {37}},
      {"TP2 EP (the unit's tokens in two chunks)", {.tp = 2, .enable_ep = true}, 0, {37}},
      {"DP2 TP2 hybrid moe_tp 2 x moe_ep 2",
       {.tp = 2, .dp = 2, .moe_tp = 2, .moe_ep = 2},
       0,
       {13, 6}},
      {"DP4 EP with 4 redundant experts", {.dp = 4, .enable_ep = true}, 4, {17, 0, 9, 30}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    PlanOptions o;
    o.topology = c.topology;
    o.num_redundant_experts = c.redundant;
    Result<ShardPlan> plan = BuildShardPlan(*model, o);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    int64_t total = 0;
    for (int64_t u = 0; u < plan->topology.num_units(); ++u) {
      total += c.tokens[static_cast<size_t>(u) % c.tokens.size()];
    }
    const SimulatedRouting routing = SimulateRouting({.zipf_s = 1.0}, total, E, k, 7);
    const ShardedJobResult r = RunJob(*plan, c.tokens, &routing);
    ASSERT_EQ(r.expert_tokens.size(), r.layers.size());
    ASSERT_FALSE(r.layers.empty());
    const std::vector<int64_t> truth = CountIds(routing.topk_ids, E);
    for (size_t l = 0; l < r.layers.size(); ++l) {
      // The routing bypass serves every layer: each layer's counts are the given routing's.
      EXPECT_EQ(r.expert_tokens[l], truth) << "layer " << r.layers[l];
      // Each expert's tokens are the sum over the slots holding it (first copy on a rank).
      std::vector<int64_t> by_slot(static_cast<size_t>(E), 0);
      ASSERT_EQ(r.slot_tokens[l].size(), r.slot_experts.size());
      for (size_t s = 0; s < r.slot_experts.size(); ++s) {
        by_slot[static_cast<size_t>(r.slot_experts[s])] += r.slot_tokens[l][s];
      }
      EXPECT_EQ(by_slot, truth) << "layer " << r.layers[l];
    }
    const int64_t slots = plan->num_slots;
    EXPECT_EQ(static_cast<int64_t>(r.slot_experts.size()), slots);
    EXPECT_EQ(static_cast<int64_t>(r.slot_ep_rank.size()), slots);
  }
}

TEST(ExpertLoadTest, RouterCountsMatchTheSingleRankRun) {
  // Without a routing bypass the router decides; the sharded layout must count what one rank
  // counts (the same logical model, the same tokens).
  Result<ModelConfig> model = LoadModelConfig("tiny-qwen3-moe");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Result<ShardPlan> one = BuildShardPlan(*model, {});
  PlanOptions o;
  o.topology = {.tp = 2, .dp = 2, .enable_ep = true};
  Result<ShardPlan> four = BuildShardPlan(*model, o);
  ASSERT_TRUE(one.ok() && four.ok());
  // DP unit 0 holds the single rank's 40 tokens (DummyHiddenStates of unit 0), unit 1 none.
  // The first layer routes identical inputs; later layers see outputs that differ in the last
  // bits (sharded partial sums), which may flip a near tie, so only their totals are compared.
  const ShardedJobResult r1 = RunJob(*one, {40}, nullptr);
  const ShardedJobResult r4 = RunJob(*four, {40, 0}, nullptr);
  ASSERT_EQ(r1.expert_tokens.size(), r4.expert_tokens.size());
  ASSERT_FALSE(r1.expert_tokens.empty());
  EXPECT_EQ(r4.expert_tokens[0], r1.expert_tokens[0]);
  for (size_t l = 0; l < r1.expert_tokens.size(); ++l) {
    int64_t sum = 0;
    for (int64_t t : r4.expert_tokens[l]) sum += t;
    EXPECT_EQ(sum, 40 * model->num_experts_per_tok);
  }
}

TEST(ExpertLoadTest, HotExpertTokensSplitOverItsReplicas) {
  // An EPLB placement of a Zipf load gives the hottest expert several slots; the dispatcher
  // must send its tokens to all of them, not one.
  Result<ModelConfig> model = LoadModelConfig("tiny-qwen3-moe");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const int64_t E = model->num_experts, k = model->num_experts_per_tok;
  const SimulatedRouting routing = SimulateRouting({.zipf_s = 1.5}, 4 * 64, E, k, 3);
  PlanOptions o;
  o.topology = {.dp = 4, .enable_ep = true};
  o.num_redundant_experts = 4;
  o.placement = ExpertPlacement::kEplb;
  const std::vector<int64_t> truth = CountIds(routing.topk_ids, E);
  o.expert_load.layers = {std::vector<double>(truth.begin(), truth.end())};
  Result<ShardPlan> plan = BuildShardPlan(*model, o);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const ShardedJobResult r = RunJob(*plan, {64}, &routing);
  const int64_t hot = std::max_element(truth.begin(), truth.end()) - truth.begin();
  std::set<int64_t> ranks;
  std::vector<int64_t> shares;
  for (size_t s = 0; s < r.slot_experts.size(); ++s) {
    if (r.slot_experts[s] != hot) continue;
    ranks.insert(r.slot_ep_rank[s]);
    shares.push_back(r.slot_tokens[0][s]);
  }
  ASSERT_GE(ranks.size(), 2u) << "the hottest expert should have replicas on several EP ranks";
  for (int64_t t : shares) {
    EXPECT_GT(t, truth[hot] / (4 * static_cast<int64_t>(shares.size())))
        << "a replica of expert " << hot << " served too few of its " << truth[hot] << " tokens";
  }
}

TEST(RoutingSimulationTest, ZipfIsSeededDistinctNormalisedAndSkewed) {
  const int64_t T = 4000, E = 16, k = 4;
  const SimulatedRouting a = SimulateRouting({.zipf_s = 1.0}, T, E, k, 11);
  const SimulatedRouting b = SimulateRouting({.zipf_s = 1.0}, T, E, k, 11);
  const SimulatedRouting c = SimulateRouting({.zipf_s = 1.0}, T, E, k, 12);
  EXPECT_EQ(a.topk_ids, b.topk_ids);
  EXPECT_NE(a.topk_ids, c.topk_ids);
  // A token's draw does not depend on how many tokens follow it.
  const SimulatedRouting prefix = SimulateRouting({.zipf_s = 1.0}, 10, E, k, 11);
  EXPECT_TRUE(std::equal(prefix.topk_ids.begin(), prefix.topk_ids.end(), a.topk_ids.begin()));
  for (int64_t t = 0; t < T; ++t) {
    std::set<int32_t> ids(a.topk_ids.begin() + t * k, a.topk_ids.begin() + (t + 1) * k);
    EXPECT_EQ(static_cast<int64_t>(ids.size()), k) << "token " << t;
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += a.topk_weights[t * k + j];
    EXPECT_NEAR(sum, 1.0f, 1e-5f);
  }
  std::vector<int64_t> counts = CountIds(a.topk_ids, E);
  std::sort(counts.rbegin(), counts.rend());
  // Zipf s = 1 over 16 experts, 4 distinct draws a token: the hottest expert is in most tokens,
  // the coldest in few; uniform routing would put every expert in T * k / E = 1000.
  EXPECT_GT(counts.front(), 2 * counts.back() + 1000);
  const SimulatedRouting u = SimulateRouting({.zipf_s = 0}, T, E, k, 11);
  for (int64_t n : CountIds(u.topk_ids, E)) EXPECT_NEAR(static_cast<double>(n), 1000.0, 150.0);
  // top_k = E: every expert once.
  const SimulatedRouting all = SimulateRouting({.zipf_s = 3.0}, 5, 6, 6, 1);
  for (int64_t n : CountIds(all.topk_ids, 6)) EXPECT_EQ(n, 5);
}

TEST(RoutingSimulationTest, ParsesTheFlag) {
  EXPECT_DOUBLE_EQ(ParseRoutingSimulation("zipf")->zipf_s, 1.0);
  EXPECT_DOUBLE_EQ(ParseRoutingSimulation("zipf:1.5")->zipf_s, 1.5);
  EXPECT_DOUBLE_EQ(ParseRoutingSimulation("uniform_random")->zipf_s, 0.0);
  for (const char* bad : {"zipf:", "zipf:-1", "zipf:x", "zipf:1.2x", "normal", "zipf:inf"}) {
    Result<RoutingSimulation> r = ParseRoutingSimulation(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("expected zipf, zipf:S"), std::string::npos);
  }
}

}  // namespace
}  // namespace moeshard
