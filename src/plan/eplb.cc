#include "moeshard/plan/eplb.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>

namespace moeshard {
namespace {

// Packs items of the given weights into `num_packs` packs of equal item count, heaviest item
// first, each onto the lightest pack that still has room (ties: the lower pack). With `kinds`
// (the expert of each replica), a pack that already holds an item of the same kind is passed
// over while another with room does not: a second copy of an expert on one rank serves none
// of its tokens (the dispatcher sends each token to one rank, expert_dispatch.h), so it would
// waste the slot. Returns the pack of every item. items.size() divides by num_packs.
std::vector<int64_t> BalancedPacking(const std::vector<double>& weights, int64_t num_packs,
                                     const std::vector<int64_t>* kinds = nullptr) {
  const int64_t n = static_cast<int64_t>(weights.size());
  const int64_t per_pack = n / num_packs;
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return weights[static_cast<size_t>(a)] > weights[static_cast<size_t>(b)];
  });
  std::vector<double> pack_load(static_cast<size_t>(num_packs), 0.0);
  std::vector<int64_t> pack_items(static_cast<size_t>(num_packs), 0);
  std::vector<int64_t> pack_of(static_cast<size_t>(n), 0);
  std::vector<std::vector<int64_t>> pack_kinds(static_cast<size_t>(num_packs));
  const auto holds = [&](int64_t p, int64_t item) {
    if (kinds == nullptr) return false;
    const std::vector<int64_t>& k = pack_kinds[static_cast<size_t>(p)];
    return std::find(k.begin(), k.end(), (*kinds)[static_cast<size_t>(item)]) != k.end();
  };
  for (int64_t item : order) {
    int64_t best = -1;
    bool best_holds = false;
    for (int64_t p = 0; p < num_packs; ++p) {
      if (pack_items[static_cast<size_t>(p)] == per_pack) continue;
      const bool h = holds(p, item);
      if (best < 0 || (best_holds && !h) ||
          (h == best_holds &&
           pack_load[static_cast<size_t>(p)] < pack_load[static_cast<size_t>(best)])) {
        best = p;
        best_holds = h;
      }
    }
    if (kinds != nullptr) {
      pack_kinds[static_cast<size_t>(best)].push_back((*kinds)[static_cast<size_t>(item)]);
    }
    pack_of[static_cast<size_t>(item)] = best;
    pack_load[static_cast<size_t>(best)] += weights[static_cast<size_t>(item)];
    ++pack_items[static_cast<size_t>(best)];
  }
  return pack_of;
}

// Gives `num_slots` slots to the experts of the given loads: one each, then every further slot
// to the expert with the largest load per slot (ties: the lower expert) among those with fewer
// than `max_replicas` (the ranks they can be spread over; more copies than ranks would put two
// on one rank, where the second serves nothing), or among all once every expert has that
// many. Returns the count per expert.
std::vector<int64_t> Replicate(const std::vector<double>& load, int64_t num_slots,
                               int64_t max_replicas) {
  std::vector<int64_t> count(load.size(), 1);
  for (int64_t extra = num_slots - static_cast<int64_t>(load.size()); extra > 0; --extra) {
    const bool capped =
        std::any_of(count.begin(), count.end(), [&](int64_t c) { return c < max_replicas; });
    size_t best = load.size();
    for (size_t e = 0; e < load.size(); ++e) {
      if (capped && count[e] >= max_replicas) continue;
      if (best == load.size() ||
          load[e] / static_cast<double>(count[e]) > load[best] / static_cast<double>(count[best])) {
        best = e;
      }
    }
    ++count[best];
  }
  return count;
}

Status CheckOptions(const ExpertLoad& load, const EplbOptions& o) {
  if (load.layers.empty() || load.layers.front().empty()) {
    return InvalidArgumentError("expert load: no layers (expected [moe layer][expert] counts)");
  }
  const int64_t experts = static_cast<int64_t>(load.layers.front().size());
  for (size_t l = 0; l < load.layers.size(); ++l) {
    if (static_cast<int64_t>(load.layers[l].size()) != experts) {
      return InvalidArgumentError(
          fmt::format("expert load: layer {} has {} experts, layer 0 has {}: every layer must "
                      "count the same experts",
                      l, load.layers[l].size(), experts));
    }
    for (size_t e = 0; e < load.layers[l].size(); ++e) {
      if (!(load.layers[l][e] >= 0)) {
        return InvalidArgumentError(
            fmt::format("expert load: layer {} expert {}: {} is not a token count (expected >= 0)",
                        l, e, load.layers[l][e]));
      }
    }
  }
  if (o.num_ranks <= 0 || o.num_nodes <= 0 || o.num_groups <= 0 || o.num_ranks % o.num_nodes) {
    return InvalidArgumentError(fmt::format(
        "eplb: {} ranks over {} nodes with {} expert groups: expected positive sizes and ranks "
        "that divide by the nodes",
        o.num_ranks, o.num_nodes, o.num_groups));
  }
  if (o.num_slots < experts || o.num_slots % o.num_ranks) {
    return InvalidArgumentError(fmt::format(
        "eplb: {} slots for {} experts over {} ranks: expected at least one slot per expert and "
        "slots that divide by the ranks (--num-redundant-experts auto picks the fewest)",
        o.num_slots, experts, o.num_ranks));
  }
  if (experts % o.num_groups) {
    return InvalidArgumentError(
        fmt::format("eplb: {} experts do not split into {} groups (the model's n_group)", experts,
                    o.num_groups));
  }
  return Status::Ok();
}

// One layer, hierarchically over `nodes` nodes and `groups` expert groups (groups divide by
// nodes): returns the expert of every slot and the replica counts.
void PlaceLayer(const std::vector<double>& load, const EplbOptions& o, int64_t nodes,
                int64_t groups, std::vector<int64_t>& slot_expert, std::vector<int64_t>& replicas) {
  const int64_t experts = static_cast<int64_t>(load.size());
  const int64_t group_size = experts / groups;
  // 1. Groups onto nodes.
  std::vector<double> group_load(static_cast<size_t>(groups), 0.0);
  for (int64_t e = 0; e < experts; ++e)
    group_load[static_cast<size_t>(e / group_size)] += load[static_cast<size_t>(e)];
  const std::vector<int64_t> node_of_group = BalancedPacking(group_load, nodes);
  const int64_t slots_per_node = o.num_slots / nodes;
  const int64_t ranks_per_node = o.num_ranks / nodes;
  const int64_t slots_per_rank = o.num_slots / o.num_ranks;
  slot_expert.assign(static_cast<size_t>(o.num_slots), -1);
  replicas.assign(static_cast<size_t>(experts), 0);
  for (int64_t node = 0; node < nodes; ++node) {
    // 2. Replicas within the node, for the experts of its groups.
    std::vector<int64_t> node_experts;
    for (int64_t e = 0; e < experts; ++e) {
      if (node_of_group[static_cast<size_t>(e / group_size)] == node) node_experts.push_back(e);
    }
    std::vector<double> node_load;
    for (int64_t e : node_experts) node_load.push_back(load[static_cast<size_t>(e)]);
    const std::vector<int64_t> count = Replicate(node_load, slots_per_node, ranks_per_node);
    // 3. The node's replicas onto its ranks, by load per replica.
    std::vector<int64_t> replica_expert;
    std::vector<double> replica_load;
    for (size_t i = 0; i < node_experts.size(); ++i) {
      replicas[static_cast<size_t>(node_experts[i])] = count[i];
      for (int64_t c = 0; c < count[i]; ++c) {
        replica_expert.push_back(node_experts[i]);
        replica_load.push_back(node_load[i] / static_cast<double>(count[i]));
      }
    }
    const std::vector<int64_t> rank_of =
        BalancedPacking(replica_load, ranks_per_node, &replica_expert);
    std::vector<int64_t> filled(static_cast<size_t>(ranks_per_node), 0);
    for (size_t r = 0; r < replica_expert.size(); ++r) {
      const int64_t rank = node * ranks_per_node + rank_of[r];
      const int64_t slot = rank * slots_per_rank + filled[static_cast<size_t>(rank_of[r])]++;
      slot_expert[static_cast<size_t>(slot)] = replica_expert[r];
    }
  }
}

// The optional per-slot section: both keys or neither, one row of slot_experts.size() numbers
// per layer.
Status ParseSlots(const nlohmann::json& j, const std::string& source, ExpertLoad* out) {
  const bool has_experts = j.contains("slot_experts"), has_tokens = j.contains("slot_tokens");
  if (!has_experts && !has_tokens) return Status::Ok();
  if (has_experts != has_tokens) {
    return InvalidArgumentError(fmt::format(
        "{}: '{}' without '{}': expected both (the slots' experts and their tokens) or neither",
        source, has_experts ? "slot_experts" : "slot_tokens",
        has_experts ? "slot_tokens" : "slot_experts"));
  }
  const nlohmann::json& experts = j["slot_experts"];
  const nlohmann::json& tokens = j["slot_tokens"];
  if (!experts.is_array() || !tokens.is_array() || tokens.size() != out->layers.size()) {
    return InvalidArgumentError(
        fmt::format("{}: 'slot_experts/slot_tokens': expected an array of experts and {} "
                    "arrays of tokens (one per layer), got {} and {}",
                    source, out->layers.size(), experts.type_name(), tokens.dump().substr(0, 40)));
  }
  for (size_t s = 0; s < experts.size(); ++s) {
    if (!experts[s].is_number_integer() || experts[s].get<int64_t>() < 0) {
      return InvalidArgumentError(fmt::format("{}: slot_experts[{}] is {}, expected an expert id",
                                              source, s, experts[s].dump()));
    }
    out->slot_experts.push_back(experts[s].get<int64_t>());
  }
  for (size_t l = 0; l < tokens.size(); ++l) {
    const nlohmann::json& row = tokens[l];
    if (!row.is_array() || row.size() != experts.size()) {
      return InvalidArgumentError(
          fmt::format("{}: slot_tokens[{}]: expected an array of {} token counts (one per slot)",
                      source, l, experts.size()));
    }
    std::vector<double>& counts = out->slot_tokens.emplace_back();
    for (size_t s = 0; s < row.size(); ++s) {
      if (!row[s].is_number() || row[s].get<double>() < 0) {
        return InvalidArgumentError(fmt::format(
            "{}: slot_tokens[{}][{}] is {}, expected a token count", source, l, s, row[s].dump()));
      }
      counts.push_back(row[s].get<double>());
    }
  }
  return Status::Ok();
}

}  // namespace

Result<ExpertLoad> ParseExpertLoad(std::string_view json_text, const std::string& source) {
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError(fmt::format(
        "{}: not a JSON object (expected {{\"model\": ..., \"layers\": [[tokens per expert], "
        "...]}}; docs/eplb.md)",
        source));
  }
  ExpertLoad out;
  if (j.contains("model") && j["model"].is_string()) out.model = j["model"].get<std::string>();
  if (!j.contains("layers") || !j["layers"].is_array()) {
    return InvalidArgumentError(
        fmt::format("{}: 'layers' missing or not an array (expected one array of token counts "
                    "per MoE layer)",
                    source));
  }
  for (size_t l = 0; l < j["layers"].size(); ++l) {
    const nlohmann::json& row = j["layers"][l];
    if (!row.is_array()) {
      return InvalidArgumentError(fmt::format(
          "{}: layers[{}] is {}, expected an array of token counts", source, l, row.type_name()));
    }
    std::vector<double>& counts = out.layers.emplace_back();
    for (size_t e = 0; e < row.size(); ++e) {
      if (!row[e].is_number()) {
        return InvalidArgumentError(fmt::format("{}: layers[{}][{}] is {}, expected a token count",
                                                source, l, e, row[e].dump()));
      }
      counts.push_back(row[e].get<double>());
    }
  }
  MOESHARD_RETURN_IF_ERROR(ParseSlots(j, source, &out));
  return out;
}

std::string ExpertLoadJson(const ExpertLoad& load) {
  nlohmann::json j = {{"model", load.model}, {"layers", nlohmann::json::array()}};
  for (const std::vector<double>& layer : load.layers) j["layers"].push_back(layer);
  if (!load.slot_experts.empty()) {
    j["slot_experts"] = load.slot_experts;
    j["slot_tokens"] = nlohmann::json::array();
    for (const std::vector<double>& layer : load.slot_tokens) j["slot_tokens"].push_back(layer);
  }
  return j.dump() + "\n";
}

Result<EplbPlacement> ComputeEplbPlacement(const ExpertLoad& load, const EplbOptions& options) {
  MOESHARD_RETURN_IF_ERROR(CheckOptions(load, options));
  // DeepSeek's policy: hierarchical when the groups divide by the nodes, else global.
  const bool hierarchical = options.num_groups % options.num_nodes == 0;
  const int64_t nodes = hierarchical ? options.num_nodes : 1;
  const int64_t groups = hierarchical ? options.num_groups : 1;
  EplbPlacement out;
  out.slot_expert.resize(load.layers.size());
  out.replicas.resize(load.layers.size());
  for (size_t l = 0; l < load.layers.size(); ++l) {
    PlaceLayer(load.layers[l], options, nodes, groups, out.slot_expert[l], out.replicas[l]);
  }
  return out;
}

std::vector<std::vector<int64_t>> RankExperts(const std::vector<int64_t>& slot_expert,
                                              int64_t num_ranks) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(num_ranks));
  const size_t per_rank = slot_expert.size() / static_cast<size_t>(num_ranks);
  for (size_t s = 0; s < slot_expert.size(); ++s) out[s / per_rank].push_back(slot_expert[s]);
  return out;
}

double RankLoadImbalance(const std::vector<double>& expert_load,
                         const std::vector<std::vector<int64_t>>& rank_experts) {
  // The distinct experts of each rank: a second copy on one rank serves no tokens of its own.
  std::vector<std::vector<int64_t>> held(rank_experts.size());
  std::vector<int64_t> copies(expert_load.size(), 0);
  for (size_t r = 0; r < rank_experts.size(); ++r) {
    held[r] = rank_experts[r];
    std::sort(held[r].begin(), held[r].end());
    held[r].erase(std::unique(held[r].begin(), held[r].end()), held[r].end());
    for (int64_t e : held[r]) ++copies[static_cast<size_t>(e)];
  }
  double max_load = 0, total = 0;
  for (const auto& experts : held) {
    double rank_load = 0;
    for (int64_t e : experts) {
      rank_load +=
          expert_load[static_cast<size_t>(e)] / static_cast<double>(copies[static_cast<size_t>(e)]);
    }
    max_load = std::max(max_load, rank_load);
    total += rank_load;
  }
  if (total <= 0 || rank_experts.empty()) return 1.0;
  return max_load / (total / static_cast<double>(rank_experts.size()));
}

}  // namespace moeshard
