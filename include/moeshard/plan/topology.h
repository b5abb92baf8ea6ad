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

RankCoords CoordsOf(const ResolvedTopology& topo, int64_t rank);

// Checks the flags against each other and against the model's divisibility rules (attention
// heads, KV heads, vocab, dense / shared / routed intermediate sizes, KDA's low-rank
// projection, layers per stage). Errors list the valid values of the flag at fault.
Result<ResolvedTopology> ResolveTopology(const Topology& topology, const ModelConfig& model);

// Attention TP sizes the model allows (heads, KV heads, vocab, dense MLP, KDA), ascending, up
// to `max_tp`.
std::vector<int64_t> ValidAttentionTp(const ModelConfig& model, int64_t max_tp);

}  // namespace moeshard
