#include "moeshard/plan/checkpoint_sizing.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>

namespace moeshard {

int64_t CheckpointSizing::RankTotal(int64_t rank) const {
  int64_t n = 0;
  for (int64_t b : rank_bytes[static_cast<size_t>(rank)]) n += b;
  return n;
}

namespace {

size_t CategoryIndex(TensorCategory c) {
  for (size_t i = 0; i < kNumCategories; ++i) {
    if (kAllCategories[i] == c) return i;
  }
  return 0;
}

// The fraction of its checkpoint tensor a plan shard holds (along the split dimension: its
// slice of every block over the whole extent).
double HeldFraction(const TensorShard& s) {
  if (s.shard_dim < 0) return 1.0;
  const size_t d = static_cast<size_t>(s.shard_dim);
  return static_cast<double>(s.local_shape[d]) / static_cast<double>(s.logical_shape[d]);
}

// A plan tensor on one rank.
struct Holder {
  int64_t rank = 0;
  const TensorShard* shard = nullptr;
};

// What a routed-expert checkpoint template feeds.
struct ExpertPart {
  bool fused = false;      // [E, ...] over all experts
  bool split_by_i = true;  // part of the intermediate dimension (not the down bias or metadata)
  // > 0: the bytes one expert's tensor takes in the rank layout, where the checkpoint stores it
  // converted (AWQ zero points, E8M0 fp8 scales, ...): charged instead of the stored bytes.
  int64_t rank_bytes = 0;
  // Row-uniform fp8 down scales: a rank holds ScaleBytes(H, its slice of I) (each row's scale
  // repeated per block of its own slice), not a share of the whole tensor's blocks.
  bool row_uniform_down = false;
};

// Every checkpoint template of the family's routed experts in the plan's format.
std::unordered_map<std::string, ExpertPart> ExpertTemplates(const ShardPlan& plan) {
  std::unordered_map<std::string, ExpertPart> out;
  const ExpertLayout& x = plan.experts;
  const WeightScheme& q = plan.expert_scheme;
  if (x.fused) {
    for (const std::string* module : {&x.fused_gate_up, &x.fused_down}) {
      if (q.quantized()) {
        out[*module + x.fused_weight_suffix] = {true, true};
        out[*module + x.fused_scale_suffix] = {true, true};
      } else {
        out[*module] = {true, true};
      }
      if (!x.bias_suffix.empty()) out[*module + x.bias_suffix] = {true, module == &x.fused_gate_up};
    }
    return out;
  }
  const QuantLeaves leaves = CheckpointLeaves(q);
  const bool converted = q.quantized() && q.layout != QuantLayout::kNative;
  const int64_t I = plan.intermediate.logical, H = plan.hidden.logical;
  for (const std::string* module : {&x.gate, &x.up, &x.down}) {
    if (module->empty()) continue;
    const int64_t rows = module == &x.down ? H : I, cols = module == &x.down ? I : H;
    auto rank = [&](int64_t bytes) { return converted ? bytes : 0; };
    out[*module + "." + std::string(leaves.weight)] = {false, true,
                                                       rank(q.WeightBytes(rows, cols))};
    // Act-order: every rank keeps all of down's scales and zero points (shard_plan.cc).
    const bool scales_split = !(q.act_order && module == &x.down);
    if (q.has_scales()) {
      out[*module + "." + std::string(leaves.scale)] = {
          false, scales_split, rank(q.ScaleBytes(rows, cols)), q.RowUniform() && module == &x.down};
    }
    if (q.has_zero_points()) {
      out[*module + "." + std::string(leaves.zero)] = {false, scales_split,
                                                       rank(q.ZeroBytes(rows, cols))};
    }
    if (q.has_global_scale()) out[*module + "." + std::string(leaves.global)] = {false, false};
    if (!leaves.input.empty()) out[*module + "." + std::string(leaves.input)] = {false, false};
    if (!leaves.group_index.empty()) {
      out[*module + "." + std::string(leaves.group_index)] = {false, module == &x.down};
    }
    if (plan.model.quant.weight_shape_meta && q.quantized()) {
      out[*module + ".weight_shape"] = {false, false};
    }
  }
  return out;
}

// The checkpoint name a non-routed plan tensor is read from: its own, or for a part of a
// quantized linear in another layout (AWQ's qweight for the rank's weight_packed, ...) the
// layout's leaf.
// With `converted_only`, "" (never a plan name) for such a part even when the layout keeps the
// rank's name (compressed-tensors' weight_zero_point), so callers can tell it is converted.
std::string CheckpointTemplate(const ShardPlan& plan, const TensorShard& s,
                               bool converted_only = false) {
  if (!s.tied_source.empty()) return converted_only ? s.name : s.tied_source;
  const WeightScheme& q = plan.model.quant.scheme;
  if (!q.quantized() || q.layout == QuantLayout::kNative) return s.name;
  const WeightFormatSpec& f = q.spec();
  const QuantLeaves leaves = CheckpointLeaves(q);
  std::string_view rank_leaf, leaf;
  switch (s.part) {
    case TensorPart::kWeight:
      if (s.dtype != f.weight_dtype) return s.name;
      rank_leaf = f.weight_leaf, leaf = leaves.weight;
      break;
    case TensorPart::kScale: rank_leaf = f.scale_leaf, leaf = leaves.scale; break;
    case TensorPart::kZeroPoint: rank_leaf = f.zero_leaf, leaf = leaves.zero; break;
    case TensorPart::kGlobalScale: rank_leaf = f.global_leaf, leaf = leaves.global; break;
    case TensorPart::kShapeMeta:
    case TensorPart::kInputScale:
    case TensorPart::kGroupIndex:
    case TensorPart::kValue: return s.name;
  }
  if (converted_only) return "";
  return s.name.substr(0, s.name.size() - rank_leaf.size()) + std::string(leaf);
}

}  // namespace

CheckpointSizing SizeFromCheckpoint(const ShardPlan& plan,
                                    const std::vector<CheckpointTensorInfo>& tensors) {
  CheckpointSizing out;
  const ModelConfig& m = plan.model;
  const ResolvedTopology& t = plan.topology;
  const int64_t world = static_cast<int64_t>(plan.ranks.size());
  out.rank_bytes.assign(static_cast<size_t>(world), {});

  // Non-routed plan tensors by checkpoint template.
  std::unordered_map<std::string, std::vector<Holder>> plain;
  for (const RankPlan& r : plan.ranks) {
    for (const TensorShard& s : r.tensors) {
      if (s.category == TensorCategory::kRoutedExperts) continue;
      plain[CheckpointTemplate(plan, s)].push_back({r.coords.rank, &s});
    }
  }
  // expert -> (rank, slots) per pipeline stage, and each layer's stage.
  std::vector<std::vector<std::vector<std::pair<int64_t, int64_t>>>> holders(
      static_cast<size_t>(t.pp),
      std::vector<std::vector<std::pair<int64_t, int64_t>>>(static_cast<size_t>(m.num_experts)));
  std::vector<int64_t> stage_of_layer(static_cast<size_t>(m.num_layers), 0);
  for (const RankPlan& r : plan.ranks) {
    std::map<int64_t, int64_t> count;
    for (int64_t e : r.expert_slots) count[e]++;
    for (const auto& [e, n] : count) {
      holders[static_cast<size_t>(r.coords.pp_stage)][static_cast<size_t>(e)].push_back(
          {r.coords.rank, n});
    }
    for (int64_t l : r.layers) stage_of_layer[static_cast<size_t>(l)] = r.coords.pp_stage;
  }
  const std::unordered_map<std::string, ExpertPart> expert_templates = ExpertTemplates(plan);
  // The part of I each rank holds (uneven block shards: less on the last ranks).
  auto i_fraction = [&](int64_t rank) {
    const DimLayout& I = plan.intermediate;
    return static_cast<double>(
               I.SliceWidth(plan.ranks[static_cast<size_t>(rank)].coords.moe_tp_rank)) /
           static_cast<double>(I.logical);
  };
  const size_t routed = CategoryIndex(TensorCategory::kRoutedExperts);
  std::set<int64_t> mtp_layers;

  auto charge_expert = [&](int64_t layer, int64_t expert, double bytes, const ExpertPart& part) {
    for (const auto& [rank, n] : holders[static_cast<size_t>(
             stage_of_layer[static_cast<size_t>(layer)])][static_cast<size_t>(expert)]) {
      if (part.row_uniform_down) {
        const int64_t i_local =
            plan.intermediate.SliceWidth(plan.ranks[static_cast<size_t>(rank)].coords.moe_tp_rank);
        out.rank_bytes[static_cast<size_t>(rank)][routed] +=
            plan.expert_scheme.ScaleBytes(plan.hidden.logical, i_local) * n;
        continue;
      }
      const double f = part.split_by_i ? i_fraction(rank) : 1.0;
      out.rank_bytes[static_cast<size_t>(rank)][routed] += std::llround(bytes * f) * n;
    }
  };

  for (const CheckpointTensorInfo& ct : tensors) {
    out.total_bytes += ct.bytes;
    ++out.num_tensors;
    if (int64_t mtp_layer = -1; IsMtpTensor(m, ct.name, &mtp_layer)) {
      ++out.mtp_tensors;
      out.mtp_bytes += ct.bytes;
      if (mtp_layer >= 0) mtp_layers.insert(mtp_layer);
      continue;
    }
    bool placed = false;
    // A non-layer plan tensor is matched by its whole name first: a vision tower's own block
    // index reads like a decoder layer to KeyOfName (Llama-4's `vision_model.model.layers.5.*`).
    if (auto p = plain.find(ct.name); p != plain.end()) {
      for (const Holder& h : p->second) {
        const TensorShard& s = *h.shard;
        if (!s.layers.empty()) continue;
        out.rank_bytes[static_cast<size_t>(h.rank)][CategoryIndex(s.category)] +=
            static_cast<int64_t>(static_cast<double>(ct.bytes) * HeldFraction(s));
        placed = true;
      }
    }
    const NameKey k = KeyOfName(ct.name);
    const bool in_model = k.layer < m.num_layers;
    if (!placed && in_model) {
      if (auto e = expert_templates.find(k.key); e != expert_templates.end() && k.layer >= 0 &&
                                                 m.layers[static_cast<size_t>(k.layer)].moe) {
        if (e->second.fused && !ct.shape.empty() && ct.shape[0] == m.num_experts) {
          const double per_expert =
              static_cast<double>(ct.bytes) / static_cast<double>(m.num_experts);
          for (int64_t x = 0; x < m.num_experts; ++x) {
            charge_expert(k.layer, x, per_expert, e->second);
          }
          placed = true;
        } else if (!e->second.fused && k.expert >= 0 && k.expert < m.num_experts) {
          const int64_t bytes = e->second.rank_bytes > 0 ? e->second.rank_bytes : ct.bytes;
          charge_expert(k.layer, k.expert, static_cast<double>(bytes), e->second);
          placed = true;
        }
      } else if (auto p = plain.find(k.key); p != plain.end()) {
        for (const Holder& h : p->second) {
          const TensorShard& s = *h.shard;
          if (k.layer >= 0 && !std::binary_search(s.layers.begin(), s.layers.end(), k.layer)) {
            continue;
          }
          // A part of a quantized linear stored in another layout takes the rank layout's
          // bytes (the loader converts it); everything else its share of the stored bytes.
          const bool converted = CheckpointTemplate(plan, s, true) != s.name;
          out.rank_bytes[static_cast<size_t>(h.rank)][CategoryIndex(s.category)] +=
              converted ? s.bytes / s.count()
                        : static_cast<int64_t>(static_cast<double>(ct.bytes) * HeldFraction(s));
          placed = true;
        }
      }
    }
    if (placed) {
      out.placed_bytes += ct.bytes;
    } else {
      out.unplaced.push_back(ct.name);
    }
  }
  out.mtp_layers.assign(mtp_layers.begin(), mtp_layers.end());
  return out;
}

}  // namespace moeshard
