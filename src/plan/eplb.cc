#include "moeshard/plan/eplb.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>

namespace moeshard {
namespace {

// Packs items of the given weights into `num_packs` packs of equal item count, heaviest item
// first, each onto the lightest pack that still has room (ties: the lower pack). Returns the
// pack of every item. items.size() divides by num_packs.
std::vector<int64_t> BalancedPacking(const std::vector<double>& weights, int64_t num_packs) {
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
  for (int64_t item : order) {
    int64_t best = -1;
    for (int64_t p = 0; p < num_packs; ++p) {
      if (pack_items[static_cast<size_t>(p)] == per_pack) continue;
      if (best < 0 || pack_load[static_cast<size_t>(p)] < pack_load[static_cast<size_t>(best)]) {
        best = p;
      }
    }
    pack_of[static_cast<size_t>(item)] = best;
    pack_load[static_cast<size_t>(best)] += weights[static_cast<size_t>(item)];
    ++pack_items[static_cast<size_t>(best)];
  }
  return pack_of;
}

// Gives `num_slots` slots to the experts of the given loads: one each, then every further slot
// to the expert with the largest load per slot (ties: the lower expert). Returns the count per
// expert.
std::vector<int64_t> Replicate(const std::vector<double>& load, int64_t num_slots) {
  std::vector<int64_t> count(load.size(), 1);
  for (int64_t extra = num_slots - static_cast<int64_t>(load.size()); extra > 0; --extra) {
    size_t best = 0;
    for (size_t e = 1; e < load.size(); ++e) {
      if (load[e] / static_cast<double>(count[e]) > load[best] / static_cast<double>(count[best])) {
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
    const std::vector<int64_t> count = Replicate(node_load, slots_per_node);
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
    const std::vector<int64_t> rank_of = BalancedPacking(replica_load, ranks_per_node);
    std::vector<int64_t> filled(static_cast<size_t>(ranks_per_node), 0);
    for (size_t r = 0; r < replica_expert.size(); ++r) {
      const int64_t rank = node * ranks_per_node + rank_of[r];
      const int64_t slot = rank * slots_per_rank + filled[static_cast<size_t>(rank_of[r])]++;
      slot_expert[static_cast<size_t>(slot)] = replica_expert[r];
    }
  }
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
  return out;
}

std::string ExpertLoadJson(const ExpertLoad& load) {
  nlohmann::json j = {{"model", load.model}, {"layers", nlohmann::json::array()}};
  for (const std::vector<double>& layer : load.layers) j["layers"].push_back(layer);
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
  std::vector<int64_t> copies(expert_load.size(), 0);
  for (const auto& experts : rank_experts) {
    for (int64_t e : experts) ++copies[static_cast<size_t>(e)];
  }
  double max_load = 0, total = 0;
  for (const auto& experts : rank_experts) {
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
