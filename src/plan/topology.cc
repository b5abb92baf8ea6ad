#include "moeshard/plan/topology.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/check.h"
#include "moeshard/base/math.h"

namespace moeshard {

std::string ResolvedTopology::Label() const {
  std::string s = fmt::format("TP{}", tp);
  if (dp > 1) s += fmt::format(" x DP{}", dp);
  if (pcp > 1) s += fmt::format(" x PCP{}", pcp);
  if (pp > 1) s += fmt::format(" x PP{}", pp);
  if (moe_ep > 1 && moe_tp > 1) {
    s += fmt::format(" (MoE TP{} x EP{})", moe_tp, moe_ep);
  } else if (moe_ep > 1) {
    s += fmt::format(" EP{}", moe_ep);
  }
  return s;
}

RankCoords CoordsOf(const ResolvedTopology& t, int64_t rank) {
  MOESHARD_CHECK(rank >= 0 && rank < t.world, "CoordsOf: rank {} outside the world of {} ({})",
                 rank, t.world, t.Label());
  RankCoords c;
  c.rank = rank;
  c.pp_stage = rank / t.group;
  c.group_rank = rank % t.group;
  c.tp_rank = c.group_rank % t.tp;
  c.pcp_rank = (c.group_rank / t.tp) % t.pcp;
  c.dp_rank = c.group_rank / (t.tp * t.pcp);
  c.moe_tp_rank = c.group_rank % t.moe_tp;
  c.moe_ep_rank = c.group_rank / t.moe_tp;
  return c;
}

int64_t RankOf(const ResolvedTopology& t, const RankCoords& c) {
  MOESHARD_CHECK(c.pp_stage >= 0 && c.pp_stage < t.pp && c.dp_rank >= 0 && c.dp_rank < t.dp &&
                     c.pcp_rank >= 0 && c.pcp_rank < t.pcp && c.tp_rank >= 0 && c.tp_rank < t.tp,
                 "RankOf: coordinates (stage {}, dp {}, pcp {}, tp {}) outside {}", c.pp_stage,
                 c.dp_rank, c.pcp_rank, c.tp_rank, t.Label());
  return c.pp_stage * t.group + (c.dp_rank * t.pcp + c.pcp_rank) * t.tp + c.tp_rank;
}

int64_t UnitOf(const ResolvedTopology& t, int64_t rank) { return (rank % t.group) / t.tp; }

const char* RankGroupName(RankGroup group) {
  switch (group) {
    case RankGroup::kTp: return "attention TP";
    case RankGroup::kPcp: return "PCP";
    case RankGroup::kDp: return "DP";
    case RankGroup::kMoeTp: return "MoE TP";
    case RankGroup::kMoeEp: return "MoE EP";
    case RankGroup::kStage: return "pipeline stage";
    case RankGroup::kPipeline: return "pipeline";
  }
  return "?";
}

int64_t GroupSize(const ResolvedTopology& t, RankGroup group) {
  switch (group) {
    case RankGroup::kTp: return t.tp;
    case RankGroup::kPcp: return t.pcp;
    case RankGroup::kDp: return t.dp;
    case RankGroup::kMoeTp: return t.moe_tp;
    case RankGroup::kMoeEp: return t.moe_ep;
    case RankGroup::kStage: return t.group;
    case RankGroup::kPipeline: return t.pp;
  }
  return 1;
}

int64_t GroupIndexOf(const ResolvedTopology& t, RankGroup group, int64_t rank) {
  const RankCoords c = CoordsOf(t, rank);
  switch (group) {
    case RankGroup::kTp: return rank / t.tp;
    case RankGroup::kPcp: return (c.pp_stage * t.dp + c.dp_rank) * t.tp + c.tp_rank;
    case RankGroup::kDp: return (c.pp_stage * t.pcp + c.pcp_rank) * t.tp + c.tp_rank;
    case RankGroup::kMoeTp: return c.pp_stage * t.moe_ep + c.moe_ep_rank;
    case RankGroup::kMoeEp: return c.pp_stage * t.moe_tp + c.moe_tp_rank;
    case RankGroup::kStage: return c.pp_stage;
    case RankGroup::kPipeline: return c.group_rank;
  }
  return 0;
}

int64_t RankInGroup(const ResolvedTopology& t, RankGroup group, int64_t rank) {
  const RankCoords c = CoordsOf(t, rank);
  switch (group) {
    case RankGroup::kTp: return c.tp_rank;
    case RankGroup::kPcp: return c.pcp_rank;
    case RankGroup::kDp: return c.dp_rank;
    case RankGroup::kMoeTp: return c.moe_tp_rank;
    case RankGroup::kMoeEp: return c.moe_ep_rank;
    case RankGroup::kStage: return c.group_rank;
    case RankGroup::kPipeline: return c.pp_stage;
  }
  return 0;
}

int64_t PeerRank(const ResolvedTopology& t, RankGroup group, int64_t rank, int64_t position) {
  MOESHARD_CHECK(position >= 0 && position < GroupSize(t, group),
                 "PeerRank: position {} outside the {} group of {} ranks ({})", position,
                 RankGroupName(group), GroupSize(t, group), t.Label());
  RankCoords c = CoordsOf(t, rank);
  const int64_t stage_base = c.pp_stage * t.group;
  switch (group) {
    case RankGroup::kTp: c.tp_rank = position; break;
    case RankGroup::kPcp: c.pcp_rank = position; break;
    case RankGroup::kDp: c.dp_rank = position; break;
    case RankGroup::kMoeTp: return stage_base + c.moe_ep_rank * t.moe_tp + position;
    case RankGroup::kMoeEp: return stage_base + position * t.moe_tp + c.moe_tp_rank;
    case RankGroup::kStage: return stage_base + position;
    case RankGroup::kPipeline: return position * t.group + c.group_rank;
  }
  return RankOf(t, c);
}

std::vector<int64_t> GroupPeers(const ResolvedTopology& t, RankGroup group, int64_t rank) {
  std::vector<int64_t> peers(static_cast<size_t>(GroupSize(t, group)));
  for (size_t i = 0; i < peers.size(); ++i) {
    peers[i] = PeerRank(t, group, rank, static_cast<int64_t>(i));
  }
  return peers;
}

namespace {

struct TpRule {
  std::string what;
  bool (*ok)(const ModelConfig&, int64_t);
};

bool KvOk(const ModelConfig& m, int64_t tp) {
  if (m.num_layers_of(AttentionKind::kGqa) == 0) return true;
  // Fewer KV heads than TP ranks: each KV head is replicated tp / kv times.
  return m.num_kv_heads >= tp ? m.num_kv_heads % tp == 0 : tp % m.num_kv_heads == 0;
}

const std::vector<TpRule>& TpRules() {
  static const std::vector<TpRule> rules = {
      {"num_attention_heads",
       [](const ModelConfig& m, int64_t tp) { return m.num_attention_heads % tp == 0; }},
      {"num_key_value_heads", KvOk},
      {"vocab_size", [](const ModelConfig& m, int64_t tp) { return m.vocab_size % tp == 0; }},
      {"intermediate_size (dense MLP)",
       [](const ModelConfig& m, int64_t tp) {
         return m.num_dense_layers() == 0 || m.intermediate_size % tp == 0;
       }},
      {"KDA heads",
       [](const ModelConfig& m, int64_t tp) {
         return m.num_layers_of(AttentionKind::kKda) == 0 || m.kda.num_heads % tp == 0;
       }},
      {"KDA low-rank projection rows",
       [](const ModelConfig& m, int64_t tp) {
         return m.num_layers_of(AttentionKind::kKda) == 0 || m.kda.low_rank_dim % tp == 0;
       }},
      {"linear_num_key_heads",
       [](const ModelConfig& m, int64_t tp) {
         return m.num_layers_of(AttentionKind::kGatedDeltaNet) == 0 || m.gdn.num_k_heads % tp == 0;
       }},
      // DeepSeek-V4's wo_a is split by output group (vLLM n_local_groups = o_groups / tp).
      {"o_groups",
       [](const ModelConfig& m, int64_t tp) {
         return m.num_layers_of(AttentionKind::kCompressedMqa) == 0 || m.cmqa.o_groups % tp == 0;
       }},
  };
  return rules;
}

std::string Values(const std::vector<int64_t>& v) { return fmt::format("{}", fmt::join(v, ", ")); }

}  // namespace

std::vector<int64_t> ValidAttentionTp(const ModelConfig& model, int64_t max_tp) {
  std::vector<int64_t> out;
  for (int64_t tp = 1; tp <= max_tp; ++tp) {
    bool ok = true;
    for (const TpRule& r : TpRules()) ok = ok && r.ok(model, tp);
    if (ok) out.push_back(tp);
  }
  return out;
}

Result<ResolvedTopology> ResolveTopology(const Topology& in, const ModelConfig& m) {
  auto positive = [](const char* flag, int64_t v) -> Status {
    if (v >= 1) return Status::Ok();
    return InvalidArgumentError(
        fmt::format("topology: '{}': expected a positive integer, got {}", flag, v));
  };
  MOESHARD_RETURN_IF_ERROR(positive("--tensor-parallel-size", in.tp));
  MOESHARD_RETURN_IF_ERROR(positive("--data-parallel-size", in.dp));
  MOESHARD_RETURN_IF_ERROR(positive("--pipeline-parallel-size", in.pp));
  MOESHARD_RETURN_IF_ERROR(positive("--pcp", in.pcp));
  if (in.moe_tp < 0 || in.moe_ep < 0) {
    return InvalidArgumentError(
        fmt::format("topology: '--moe-tp/--moe-ep': expected positive integers, got {} and {}",
                    in.moe_tp, in.moe_ep));
  }

  ResolvedTopology t;
  t.tp = in.tp;
  t.dp = in.dp;
  t.pp = in.pp;
  t.pcp = in.pcp;
  t.group = in.dp * in.pcp * in.tp;
  t.world = t.group * in.pp;

  // Attention-side TP rules.
  for (const TpRule& r : TpRules()) {
    if (!r.ok(m, in.tp)) {
      return InvalidArgumentError(fmt::format(
          "topology: '-tp {}': {} of {} does not split {} ways (valid -tp for this model: {})",
          in.tp, r.what, m.name, in.tp, Values(ValidAttentionTp(m, std::max<int64_t>(in.tp, 64)))));
    }
  }

  // MoE split.
  const bool hybrid = in.moe_tp > 0 || in.moe_ep > 0;
  if (hybrid) {
    if (in.enable_ep) {
      return InvalidArgumentError(fmt::format(
          "topology: '--enable-expert-parallel' with '--moe-tp {} --moe-ep {}': expected one of "
          "them, got both (-ep means moe_ep = dp*pcp*tp = {}, moe_tp = 1)",
          in.moe_tp, in.moe_ep, t.group));
    }
    int64_t moe_tp = in.moe_tp, moe_ep = in.moe_ep;
    if (moe_tp == 0) moe_tp = t.group % moe_ep == 0 ? t.group / moe_ep : 0;
    if (moe_ep == 0) moe_ep = t.group % moe_tp == 0 ? t.group / moe_tp : 0;
    if (moe_tp * moe_ep != t.group) {
      std::vector<std::string> pairs;
      for (int64_t d : Divisors(t.group)) pairs.push_back(fmt::format("{}x{}", d, t.group / d));
      return InvalidArgumentError(fmt::format(
          "topology: '--moe-tp {} --moe-ep {}': expected moe_tp * moe_ep = dp * pcp * tp = {}, "
          "got {} (valid moe_tp x moe_ep: {})",
          in.moe_tp, in.moe_ep, t.group, moe_tp * moe_ep, fmt::join(pairs, ", ")));
    }
    t.moe_tp = moe_tp;
    t.moe_ep = moe_ep;
  } else if (in.enable_ep) {
    t.moe_tp = 1;
    t.moe_ep = t.group;
  } else {
    t.moe_tp = t.group;
    t.moe_ep = 1;
  }

  if (m.moe_intermediate_size % t.moe_tp != 0) {
    std::vector<int64_t> ok;
    for (int64_t d : Divisors(m.moe_intermediate_size)) {
      if (d <= std::max<int64_t>(t.group, 64)) ok.push_back(d);
    }
    return InvalidArgumentError(fmt::format(
        "topology: MoE TP {} (dp*pcp*tp{}): moe_intermediate_size {} of {} does not split {} ways "
        "(valid MoE TP sizes: {}; or enable expert parallelism with -ep)",
        t.moe_tp, hybrid ? ", --moe-tp" : " without -ep", m.moe_intermediate_size, m.name, t.moe_tp,
        Values(ok)));
  }
  if (t.moe_ep > m.num_experts) {
    return InvalidArgumentError(fmt::format(
        "topology: EP size {}: expected at most num_experts ({}) so every EP rank holds an "
        "expert, got {} (use fewer ranks per MoE group or a hybrid --moe-tp/--moe-ep)",
        t.moe_ep, m.num_experts, t.moe_ep));
  }
  if (in.pp > m.num_layers) {
    return InvalidArgumentError(
        fmt::format("topology: '-pp {}': expected at most num_hidden_layers ({}) stages, got {}",
                    in.pp, m.num_layers, in.pp));
  }
  return t;
}

}  // namespace moeshard
