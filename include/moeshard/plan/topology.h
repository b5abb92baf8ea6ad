// Parallel topology: the flags users type (vLLM / TensorRT-LLM semantics) resolved into the
// sizes every other part of the plan uses, with each divisibility the model imposes checked.
//
//   group   = dp * pcp * tp                 (the ranks sharing one copy of the routed experts)
//   -ep     : moe_ep = group, moe_tp = 1    (vLLM --enable-expert-parallel)
//   no -ep  : moe_tp = group, moe_ep = 1
//   hybrid  : --moe-tp X --moe-ep Y with X * Y = group (TensorRT-LLM, Megatron ETP)
//   world   = group * pp
//
// Rank numbering (vLLM): world rank = pp_stage * group + group_rank, and
//   group_rank = dp_rank * pcp * tp + pcp_rank * tp + tp_rank;
//   moe_tp_rank = group_rank % moe_tp, moe_ep_rank = group_rank / moe_tp.
// This file owns that numbering: code elsewhere asks CoordsOf / RankOf / UnitOf and the group
// queries below instead of spelling a formula again.
//
// A "unit" is the attention-TP ranks of one DP (x PCP) rank of one stage: they hold the same
// tokens. unit = dp_rank * pcp + pcp_rank = group_rank / tp, in [0, dp * pcp).
//
// Thread safety: pure functions over value types.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/config/model_config.h"

namespace moeshard {

// What the user asked for. Zero in moe_tp/moe_ep means "derive from -ep".
struct Topology {
  int64_t tp = 1;
  int64_t dp = 1;
  int64_t pp = 1;
  int64_t pcp = 1;
  bool enable_ep = false;
  int64_t moe_tp = 0;
  int64_t moe_ep = 0;
};

struct ResolvedTopology {
  int64_t tp = 1;
  int64_t dp = 1;
  int64_t pp = 1;
  int64_t pcp = 1;
  int64_t group = 1;  // dp * pcp * tp
  int64_t moe_tp = 1;
  int64_t moe_ep = 1;
  int64_t world = 1;  // group * pp

  bool expert_parallel() const { return moe_ep > 1; }
  // DP (x PCP) ranks of one stage: the units whose tokens differ.
  int64_t num_units() const { return dp * pcp; }
  // "TP8 x DP4 EP32" style label.
  std::string Label() const;
};

// Coordinates of one world rank.
struct RankCoords {
  int64_t rank = 0;
  int64_t pp_stage = 0;
  int64_t group_rank = 0;
  int64_t dp_rank = 0;
  int64_t pcp_rank = 0;
  int64_t tp_rank = 0;
  int64_t moe_tp_rank = 0;
  int64_t moe_ep_rank = 0;
};

// REQUIRES: 0 <= rank < topo.world.
RankCoords CoordsOf(const ResolvedTopology& topo, int64_t rank);

// The world rank at coordinates (pp_stage, dp_rank, pcp_rank, tp_rank); the other fields of
// `coords` (rank, group_rank, moe_*) are derived and not read. RankOf(t, CoordsOf(t, r)) == r.
// REQUIRES: each coordinate within its size.
int64_t RankOf(const ResolvedTopology& topo, const RankCoords& coords);

// The unit of `rank` within its stage: dp_rank * pcp + pcp_rank, in [0, num_units()).
int64_t UnitOf(const ResolvedTopology& topo, int64_t rank);

// The groups of ranks that communicate, each a partition of the world into groups of
// GroupSize ranks:
enum class RankGroup {
  kTp,        // attention TP: one unit's ranks (same stage, dp_rank, pcp_rank), by tp_rank
  kPcp,       // same stage, dp_rank and tp_rank, by pcp_rank
  kDp,        // same stage, pcp_rank and tp_rank, by dp_rank
  kMoeTp,     // the ranks sharing one moe_ep rank of a stage, by moe_tp_rank
  kMoeEp,     // the expert-parallel group: ranks sharing one moe_tp rank of a stage, by moe_ep_rank
  kStage,     // one pipeline stage (dp * pcp * tp ranks), by group_rank
  kPipeline,  // the ranks of one group_rank over the stages, by pp_stage
};
const char* RankGroupName(RankGroup group);

// Ranks in each group of that kind.
int64_t GroupSize(const ResolvedTopology& topo, RankGroup group);
// Which group of that kind `rank` is in: the same number for exactly the ranks of one group,
// dense in [0, world / GroupSize) (a communicator Split's colour).
int64_t GroupIndexOf(const ResolvedTopology& topo, RankGroup group, int64_t rank);
// The position of `rank` in its group, in [0, GroupSize) (a communicator Split's key).
int64_t RankInGroup(const ResolvedTopology& topo, RankGroup group, int64_t rank);
// The world rank at `position` of the group `rank` is in. Allocates nothing (for hot paths).
// REQUIRES: 0 <= position < GroupSize.
int64_t PeerRank(const ResolvedTopology& topo, RankGroup group, int64_t rank, int64_t position);
// Every world rank of the group `rank` is in, by position (`rank` included).
std::vector<int64_t> GroupPeers(const ResolvedTopology& topo, RankGroup group, int64_t rank);

// Checks the flags against each other and against the model's divisibility rules (attention
// heads, KV heads, vocab, dense / shared / routed intermediate sizes, KDA's low-rank
// projection, layers per stage). Errors list the valid values of the flag at fault.
Result<ResolvedTopology> ResolveTopology(const Topology& topology, const ModelConfig& model);

// Attention TP sizes the model allows (heads, KV heads, vocab, dense MLP, KDA), ascending, up
// to `max_tp`.
std::vector<int64_t> ValidAttentionTp(const ModelConfig& model, int64_t max_tp);

}  // namespace moeshard
