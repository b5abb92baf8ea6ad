#include "moeshard/plan/invariants.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "moeshard/base/math.h"

namespace moeshard {
namespace {

// Checks that the [begin, end) slices held by the ranks tile [0, extent) with every distinct
// slice held by the same number of ranks. `holders` maps slice -> number of holding ranks.
std::string TilingProblem(const std::map<std::pair<int64_t, int64_t>, int64_t>& holders,
                          int64_t extent) {
  int64_t pos = 0;
  int64_t copies = -1;
  for (const auto& [slice, n] : holders) {
    if (slice.first != pos) {
      return slice.first > pos ? fmt::format("gap [{}, {})", pos, slice.first)
                               : fmt::format("overlap at [{}, {})", slice.first, pos);
    }
    if (copies >= 0 && n != copies) {
      return fmt::format("slice [{}, {}) held by {} ranks, others by {}", slice.first, slice.second,
                         n, copies);
    }
    copies = n;
    pos = slice.second;
  }
  if (pos != extent) return fmt::format("slices end at {} of {}", pos, extent);
  return "";
}

// Records one violation of invariant `inv` ("tiling", "waste", "backend").
using AddViolation = std::function<void(const char* inv, std::string detail)>;

// Tiling of non-routed tensors on pipeline stage `stage`: each held by every rank of the group,
// its shards tiling the split part of each block.
void CheckDenseTiling(const ShardPlan& plan, int64_t stage, const AddViolation& add) {
  const ResolvedTopology& t = plan.topology;
  std::map<std::string, std::map<std::pair<int64_t, int64_t>, int64_t>> slices;
  std::map<std::string, int64_t> extent;
  std::map<std::string, int64_t> holders;
  for (const RankPlan& r : plan.ranks) {
    if (r.coords.pp_stage != stage) continue;
    for (const TensorShard& s : r.tensors) {
      if (s.category == TensorCategory::kRoutedExperts) continue;
      // One name template can cover disjoint layer sets (Kimi-K3's MLA and KDA o_proj).
      const std::string key =
          s.layers.empty() ? s.name : fmt::format("{} (layers from {})", s.name, s.layers.front());
      holders[key]++;
      if (s.shard_dim < 0) continue;
      slices[key][{s.shard_begin, s.shard_end}]++;
      // The split part of one block (fused q/k/v: a third; A_log: the heads it reads).
      extent[key] = s.split_extent > 0 ? s.split_extent
                    : !s.section_sizes.empty()
                        ? s.section_sizes[0]
                        : s.logical_shape[s.shard_dim] / std::max<int64_t>(1, s.sections);
    }
  }
  for (const auto& [name, n] : holders) {
    if (n != t.group) {
      add("tiling", fmt::format("'{}' on {} of the {} ranks of stage {}", name, n, t.group, stage));
    }
  }
  for (const auto& [name, s] : slices) {
    const std::string problem = TilingProblem(s, extent[name]);
    if (!problem.empty()) add("tiling", fmt::format("'{}': {}", name, problem));
  }
}

// Routed experts on stage `stage`: every expert's I range tiles [0, I) over the ranks holding
// it, and so does every routed tensor's own slice of its split dim (w13 rows, w2 columns, their
// scales and biases, in storage coordinates): each checkpoint row once per copy of the expert,
// the local shape equal to the slice, the padded shape holding it.
void CheckRoutedTiling(const ShardPlan& plan, int64_t stage, const AddViolation& add) {
  std::map<int64_t, std::map<std::pair<int64_t, int64_t>, int64_t>> per_expert;
  for (const RankPlan& r : plan.ranks) {
    if (r.coords.pp_stage != stage) continue;
    const int64_t b = plan.intermediate.SliceBegin(r.coords.moe_tp_rank);
    const int64_t end = plan.intermediate.SliceEnd(r.coords.moe_tp_rank);
    if (b == end) continue;  // uneven block shards: an empty slice holds no rows
    for (int64_t e : r.expert_slots) per_expert[e][{b, end}]++;
  }
  std::map<std::pair<std::string, int64_t>, std::map<std::pair<int64_t, int64_t>, int64_t>>
      routed_slices;
  std::map<std::string, int64_t> routed_extent;
  for (const RankPlan& r : plan.ranks) {
    if (r.coords.pp_stage != stage) continue;
    for (const TensorShard& s : r.tensors) {
      if (s.category != TensorCategory::kRoutedExperts || s.shard_dim < 0) continue;
      const size_t d = static_cast<size_t>(s.shard_dim);
      const int64_t width = s.shard_end - s.shard_begin;
      if (s.local_shape[d] != s.sections * width || s.padded_shape[d] < s.local_shape[d]) {
        add("tiling", fmt::format("'{}' on rank {}: slice [{}, {}) x {} sections, local {} "
                                  "padded {} along dim {}",
                                  s.name, r.coords.rank, s.shard_begin, s.shard_end, s.sections,
                                  s.local_shape[d], s.padded_shape[d], s.shard_dim));
      }
      routed_extent[s.name] = s.logical_shape[d] / std::max<int64_t>(1, s.sections);
      if (width == 0) continue;  // uneven block shards: an empty slice, all padding
      for (int64_t e : r.expert_slots) routed_slices[{s.name, e}][{s.shard_begin, s.shard_end}]++;
    }
  }
  for (const auto& [key, sl] : routed_slices) {
    const std::string problem = TilingProblem(sl, routed_extent[key.first]);
    if (!problem.empty()) {
      add("tiling", fmt::format("'{}' expert {}: {}", key.first, key.second, problem));
      break;
    }
  }
  if (static_cast<int64_t>(per_expert.size()) != plan.model.num_experts) {
    add("tiling", fmt::format("{} of {} experts placed on stage {}", per_expert.size(),
                              plan.model.num_experts, stage));
  }
  for (const auto& [e, s] : per_expert) {
    const std::string problem = TilingProblem(s, plan.intermediate.logical);
    if (!problem.empty()) {
      add("tiling", fmt::format("expert {} intermediate: {}", e, problem));
      break;
    }
  }
}

// Padding waste below one alignment unit (plus the chosen floor for model-floor).
void CheckPaddingWaste(const ShardPlan& plan, const AddViolation& add) {
  const DimLayout& I = plan.intermediate;
  const int64_t base = plan.options.padding == PaddingPolicy::kModelFloor
                           ? std::max(I.raw_local, I.floor)
                           : I.raw_local;
  if (I.padded_local - base >= I.align) {
    add("waste", fmt::format("intermediate padded {} -> {} wastes {} with alignment {}: more than "
                             "one alignment unit (round_up({}, {}) = {} would do)",
                             I.raw_local, I.padded_local, I.padded_local - I.raw_local, I.align,
                             base, I.align, RoundUp(base, I.align)));
  }
  if (plan.hidden.padding() >= plan.hidden.align) {
    add("waste", fmt::format("hidden padded {} -> {} (alignment {})", plan.hidden.raw_local,
                             plan.hidden.padded_local, plan.hidden.align));
  }
}

// The backend's alignment, quantization-group and parallelism constraints.
void CheckBackendConstraints(const ShardPlan& plan, const AddViolation& add) {
  const ResolvedTopology& t = plan.topology;
  const DimLayout& I = plan.intermediate;
  const BackendSpec& b = plan.backend;
  const int64_t ia = b.IntermediateAlignFor(I.raw_local);
  if (I.padded_local % ia != 0) {
    add("backend", fmt::format("{} needs I_local % {} == 0, got {}", b.name, ia, I.padded_local));
  }
  const int64_t qg = plan.expert_scheme.SplitGranule();
  if (I.raw_local % qg != 0 || I.padded_local % qg != 0) {
    add("backend", fmt::format("quantization group {} does not divide I_local {} / {}", qg,
                               I.raw_local, I.padded_local));
  }
  if (plan.hidden.padded_local % b.hidden_align != 0) {
    add("backend", fmt::format("{} needs H % {} == 0, got {}", b.name, b.hidden_align,
                               plan.hidden.padded_local));
  }
  if (b.ep_only && !t.expert_parallel())
    add("backend", b.name + " runs only with expert parallelism");
  if (b.exact_expert_division && plan.num_slots % t.moe_ep != 0) {
    add("backend",
        fmt::format("{} needs slots % EP == 0, got {} % {}", b.name, plan.num_slots, t.moe_ep));
  }
}

}  // namespace

std::vector<Violation> CheckPlan(const ShardPlan& plan) {
  std::vector<Violation> out;
  const std::string label = plan.topology.Label();
  const AddViolation add = [&](const char* inv, std::string detail) {
    out.push_back(Violation{inv, label, std::move(detail)});
  };
  for (int64_t stage = 0; stage < plan.topology.pp; ++stage) {
    CheckDenseTiling(plan, stage, add);
    CheckRoutedTiling(plan, stage, add);
  }
  CheckPaddingWaste(plan, add);
  CheckBackendConstraints(plan, add);
  return out;
}

std::vector<Strategy> GridStrategies(const ModelConfig& m, const GridOptions& o) {
  std::vector<Strategy> s;
  const PlanOptions base = o.base;
  auto with = [base](Topology t) {
    PlanOptions p = base;
    p.topology = t;
    return p;
  };
  s.push_back({"TP", [=](int64_t n) -> Result<PlanOptions> { return with(Topology{.tp = n}); }});
  s.push_back({"TP+EP", [=](int64_t n) -> Result<PlanOptions> {
                 return with(Topology{.tp = n, .enable_ep = true});
               }});
  int64_t max_gpus = 1;
  for (int64_t g : o.gpu_counts) max_gpus = std::max(max_gpus, g);
  for (int64_t tp : ValidAttentionTp(m, max_gpus)) {
    if (tp > 16) break;
    auto dp_of = [tp](int64_t n) -> Result<int64_t> {
      if (n % tp != 0 || n / tp < 2) return InvalidArgumentError("no DP of this size");
      return n / tp;
    };
    s.push_back({fmt::format("TP{}xDP+EP", tp), [=](int64_t n) -> Result<PlanOptions> {
                   MOESHARD_ASSIGN_OR_RETURN(int64_t dp, dp_of(n));
                   return with(Topology{.tp = tp, .dp = dp, .enable_ep = true});
                 }});
    s.push_back({fmt::format("TP{}xDP", tp), [=](int64_t n) -> Result<PlanOptions> {
                   MOESHARD_ASSIGN_OR_RETURN(int64_t dp, dp_of(n));
                   return with(Topology{.tp = tp, .dp = dp});
                 }});
    if (o.include_pp) {
      s.push_back({fmt::format("TP{}xPP", tp), [=](int64_t n) -> Result<PlanOptions> {
                     MOESHARD_ASSIGN_OR_RETURN(int64_t pp, dp_of(n));
                     return with(Topology{.tp = tp, .pp = pp});
                   }});
      s.push_back({fmt::format("TP{}xPP+EP", tp), [=](int64_t n) -> Result<PlanOptions> {
                     MOESHARD_ASSIGN_OR_RETURN(int64_t pp, dp_of(n));
                     return with(Topology{.tp = tp, .pp = pp, .enable_ep = true});
                   }});
    }
  }
  if (o.include_hybrid) {
    for (int64_t mt : {2, 4, 8}) {
      s.push_back({fmt::format("TP, MoE-TP{}xEP", mt), [=](int64_t n) -> Result<PlanOptions> {
                     if (n % mt != 0 || n / mt < 2) return InvalidArgumentError("too small");
                     return with(Topology{.tp = n, .moe_tp = mt, .moe_ep = n / mt});
                   }});
    }
  }
  return s;
}

std::vector<GridPoint> BuildGrid(const ModelConfig& m, const GridOptions& o) {
  std::vector<GridPoint> out;
  std::vector<int64_t> counts = o.gpu_counts;
  std::sort(counts.begin(), counts.end());
  for (const Strategy& s : GridStrategies(m, o)) {
    for (int64_t n : counts) {
      Result<PlanOptions> opts = s.options(n);
      if (!opts.ok()) continue;
      Result<ShardPlan> plan = BuildShardPlan(m, *opts);
      if (!plan.ok()) continue;
      out.push_back(GridPoint{s.name, n, *std::move(plan)});
    }
  }
  return out;
}

namespace {

// Routed bytes of the rank holding the most, padded and unpadded.
std::pair<int64_t, int64_t> MaxRouted(const ShardPlan& p) {
  int64_t padded = 0, raw = 0;
  for (const RankPlan& r : p.ranks) {
    const int64_t b = r.BytesOf(TensorCategory::kRoutedExperts);
    if (b > padded) {
      padded = b;
      raw = b - r.PaddingBytesOf(TensorCategory::kRoutedExperts);
    }
  }
  return {padded, raw};
}

}  // namespace

std::vector<Violation> CheckGrid(const ModelConfig& m, const std::vector<GridPoint>& grid) {
  std::vector<Violation> out;
  for (const GridPoint& g : grid) {
    for (Violation v : CheckPlan(g.plan)) {
      v.topology = fmt::format("{} ({} GPUs, {})", v.topology, g.gpus, g.strategy);
      out.push_back(std::move(v));
    }
  }
  // Monotonicity within each strategy (grid is ordered by strategy, then GPU count).
  for (size_t i = 1; i < grid.size(); ++i) {
    const GridPoint& a = grid[i - 1];
    const GridPoint& b = grid[i];
    if (a.strategy != b.strategy) continue;
    const auto [pa, ra] = MaxRouted(a.plan);
    const auto [pb, rb] = MaxRouted(b.plan);
    const std::string where = fmt::format("{}: {} GPUs ({}) -> {} GPUs ({})", a.strategy, a.gpus,
                                          a.plan.topology.Label(), b.gpus, b.plan.topology.Label());
    if (pb > pa) {
      out.push_back(
          {"monotonic", where, fmt::format("per-rank routed bytes grew from {} to {}", pa, pb)});
      continue;
    }
    const DimLayout& I = b.plan.intermediate;
    const bool at_min_tile = I.padded_local == I.align;
    const bool chosen_floor = b.plan.options.padding == PaddingPolicy::kModelFloor && I.floor > 0 &&
                              I.padded_local <= RoundUp(I.floor, I.align);
    if (rb < ra && pb >= pa && !at_min_tile && !chosen_floor) {
      out.push_back({"monotonic", where,
                     fmt::format("the unpadded share fell from {} to {} bytes but the allocation "
                                 "stayed at {} bytes (I padded {} -> {}): per-GPU memory stopped "
                                 "falling as GPUs were added",
                                 ra, rb, pb, I.raw_local, I.padded_local)});
    }
  }
  (void)m;
  return out;
}

}  // namespace moeshard
