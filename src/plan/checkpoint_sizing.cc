#include "moeshard/plan/checkpoint_sizing.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <string_view>
#include <unordered_map>

namespace moeshard {

int64_t CheckpointSizing::RankTotal(int64_t rank) const {
  int64_t n = 0;
  for (int64_t b : rank_bytes[rank]) n += b;
  return n;
}

namespace {

size_t CategoryIndex(TensorCategory c) {
  for (size_t i = 0; i < kNumCategories; ++i) {
    if (kAllCategories[i] == c) return i;
  }
  return 0;
}

bool ConsumeInt(std::string_view& s, int64_t& out) {
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  if (ec != std::errc() || p == s.data()) return false;
  s.remove_prefix(p - s.data());
  return true;
}

bool ConsumePrefix(std::string_view& s, std::string_view prefix) {
  if (s.substr(0, prefix.size()) != prefix) return false;
  s.remove_prefix(prefix.size());
  return true;
}

// Holder lookup for non-routed tensors: for each rank, name -> its shards with that name.
struct RankIndex {
  std::unordered_map<std::string, std::vector<const TensorShard*>> by_name;
};

double HeldFraction(const TensorShard& s) {
  if (s.shard_dim < 0) return 1.0;
  return static_cast<double>(s.shard_end - s.shard_begin) /
         static_cast<double>(s.logical_shape[s.shard_dim]);
}

}  // namespace

CheckpointSizing SizeFromCheckpoint(const ShardPlan& plan,
                                    const std::vector<CheckpointTensorInfo>& tensors) {
  CheckpointSizing out;
  const int64_t world = static_cast<int64_t>(plan.ranks.size());
  out.rank_bytes.assign(world, {});
  std::vector<RankIndex> index(world);
  for (int64_t r = 0; r < world; ++r) {
    for (const TensorShard& s : plan.ranks[r].tensors) {
      if (s.category == TensorCategory::kRoutedExperts) continue;
      index[r].by_name[s.name].push_back(&s);
    }
  }
  // expert -> (rank, slot count) per pipeline stage.
  const ResolvedTopology& t = plan.topology;
  std::vector<std::vector<std::vector<std::pair<int64_t, int64_t>>>> holders(
      t.pp, std::vector<std::vector<std::pair<int64_t, int64_t>>>(plan.model.num_experts));
  std::vector<int64_t> stage_of_layer(plan.model.num_layers, 0);
  for (const RankPlan& r : plan.ranks) {
    std::map<int64_t, int64_t> count;
    for (int64_t e : r.expert_slots) count[e]++;
    for (const auto& [e, n] : count) holders[r.coords.pp_stage][e].push_back({r.coords.rank, n});
    for (int64_t l : r.layers) stage_of_layer[l] = r.coords.pp_stage;
  }
  const double i_fraction =
      static_cast<double>(plan.intermediate.raw_local) / static_cast<double>(plan.intermediate.logical);
  const size_t routed = CategoryIndex(TensorCategory::kRoutedExperts);

  auto charge_expert = [&](int64_t layer, int64_t expert, int64_t bytes, bool split_by_i) {
    const double f = split_by_i ? i_fraction : 1.0;
    for (const auto& [rank, n] : holders[stage_of_layer[layer]][expert]) {
      out.rank_bytes[rank][routed] += static_cast<int64_t>(static_cast<double>(bytes) * f) * n;
    }
  };

  for (const CheckpointTensorInfo& ct : tensors) {
    out.total_bytes += ct.bytes;
    ++out.num_tensors;
    std::string_view name = ct.name;
    ConsumePrefix(name, "language_model.");
    bool placed = false;
    std::string_view rest = name;
    int64_t layer = -1;
    if (ConsumePrefix(rest, "model.layers.") && ConsumeInt(rest, layer) && ConsumePrefix(rest, ".") &&
        layer >= 0 && layer < plan.model.num_layers) {
      const bool moe = plan.model.layers[layer].moe;
      std::string_view e = rest;
      int64_t expert = -1;
      if (moe && (ConsumePrefix(e, "mlp.experts.") || ConsumePrefix(e, "block_sparse_moe.experts.")) &&
          ConsumeInt(e, expert) && ConsumePrefix(e, ".") && expert >= 0 &&
          expert < plan.model.num_experts) {
        // Per-expert tensors; a down projection bias is [H] and not split by I.
        const bool is_bias = e.find("bias") != std::string_view::npos;
        const bool down = e.substr(0, 9) == "down_proj" || e.substr(0, 2) == "w2";
        charge_expert(layer, expert, ct.bytes, !(is_bias && down));
        placed = true;
      } else if (moe && ConsumePrefix(e, "mlp.experts.") &&
                 (e.substr(0, 12) == "gate_up_proj" || e.substr(0, 9) == "down_proj") &&
                 !ct.shape.empty() && ct.shape[0] == plan.model.num_experts) {
        // gpt-oss fused tensors: [E, ...] over all experts.
        const bool down_bias = e == "down_proj_bias";
        const int64_t per_expert = ct.bytes / plan.model.num_experts;
        for (int64_t x = 0; x < plan.model.num_experts; ++x) charge_expert(layer, x, per_expert, !down_bias);
        placed = true;
      } else {
        std::string key = "model.layers.{layer}.";
        key.append(rest);
        std::string module_key;
        if (auto dot = key.rfind('.'); dot != std::string::npos) module_key = key.substr(0, dot);
        const int64_t stage = stage_of_layer[layer];
        for (const RankPlan& r : plan.ranks) {
          if (r.coords.pp_stage != stage) continue;
          const TensorShard* hit = nullptr;
          auto it = index[r.coords.rank].by_name.find(key);
          if (it != index[r.coords.rank].by_name.end()) {
            for (const TensorShard* s : it->second) {
              if (std::binary_search(s->layers.begin(), s->layers.end(), layer)) hit = s;
            }
          }
          if (hit) {
            out.rank_bytes[r.coords.rank][CategoryIndex(hit->category)] +=
                static_cast<int64_t>(static_cast<double>(ct.bytes) * HeldFraction(*hit));
            placed = true;
            continue;
          }
          // Metadata such as compressed-tensors' weight_shape rides with its module, whole.
          for (const char* suffix : {".weight", ".weight_packed"}) {
            auto mt = index[r.coords.rank].by_name.find(module_key + suffix);
            if (mt == index[r.coords.rank].by_name.end() || !ct.name.ends_with("weight_shape")) continue;
            for (const TensorShard* s : mt->second) {
              if (std::binary_search(s->layers.begin(), s->layers.end(), layer)) {
                out.rank_bytes[r.coords.rank][CategoryIndex(s->category)] += ct.bytes;
                placed = true;
                break;
              }
            }
            break;
          }
        }
      }
    } else {
      // Global tensors: embeddings, head, final norm.
      const std::string key(name);
      for (const RankPlan& r : plan.ranks) {
        auto it = index[r.coords.rank].by_name.find(key);
        if (it == index[r.coords.rank].by_name.end()) continue;
        const TensorShard* s = it->second.front();
        out.rank_bytes[r.coords.rank][CategoryIndex(s->category)] +=
            static_cast<int64_t>(static_cast<double>(ct.bytes) * HeldFraction(*s));
        placed = true;
      }
    }
    if (placed) {
      out.placed_bytes += ct.bytes;
    } else {
      out.unplaced.push_back(ct.name);
    }
  }
  return out;
}

}  // namespace moeshard
