#include "moeshard/plan/shard_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

#include "base/check.h"
#include "moeshard/base/math.h"
#include "plan/model_tensors.h"

namespace moeshard {

const char* PaddingPolicyName(PaddingPolicy p) {
  switch (p) {
    case PaddingPolicy::kBackend: return "backend";
    case PaddingPolicy::kModelFloor: return "model-floor";
    case PaddingPolicy::kLegacyTp: return "legacy-tp";
  }
  return "?";
}

Result<PaddingPolicy> ParsePaddingPolicy(const std::string& name) {
  for (PaddingPolicy p :
       {PaddingPolicy::kBackend, PaddingPolicy::kModelFloor, PaddingPolicy::kLegacyTp}) {
    if (name == PaddingPolicyName(p)) return p;
  }
  return InvalidArgumentError(
      fmt::format("plan: '--padding-policy {}': expected backend, model-floor or legacy-tp", name));
}

const char* ExpertPlacementName(ExpertPlacement p) {
  switch (p) {
    case ExpertPlacement::kLinear: return "linear";
    case ExpertPlacement::kRoundRobin: return "round-robin";
    case ExpertPlacement::kEplb: return "eplb";
  }
  return "?";
}

Result<ExpertPlacement> ParseExpertPlacement(const std::string& name) {
  if (name == "linear") return ExpertPlacement::kLinear;
  if (name == "round-robin" || name == "round_robin") return ExpertPlacement::kRoundRobin;
  if (name == "eplb") return ExpertPlacement::kEplb;
  return InvalidArgumentError(
      fmt::format("plan: '--expert-placement-strategy {}': expected linear or round-robin", name));
}

int64_t RankPlan::BytesOf(TensorCategory category) const {
  int64_t n = 0;
  for (const TensorShard& t : tensors) n += t.category == category ? t.bytes : 0;
  return n;
}

int64_t RankPlan::PaddingBytesOf(TensorCategory category) const {
  int64_t n = 0;
  for (const TensorShard& t : tensors) n += t.category == category ? t.padding_bytes : 0;
  return n;
}

int64_t RankPlan::WeightBytes() const {
  int64_t n = 0;
  for (const TensorShard& t : tensors) n += t.bytes;
  return n;
}

std::vector<std::vector<int64_t>> ShardPlan::RoutedRankKinds() const {
  // (slots, bytes, -padding bytes) -> ranks: an uneven block shard's short last rank holds the
  // same padded bytes as the others but more of them are padding, so it is a kind of its own,
  // after the full ranks.
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<int64_t>> kinds;
  for (const RankPlan& r : ranks) {
    kinds[{static_cast<int64_t>(r.expert_slots.size()), r.BytesOf(TensorCategory::kRoutedExperts),
           -r.PaddingBytesOf(TensorCategory::kRoutedExperts)}]
        .push_back(r.coords.rank);
  }
  std::vector<std::vector<int64_t>> out;
  for (auto it = kinds.rbegin(); it != kinds.rend(); ++it) out.push_back(it->second);
  return out;
}

std::vector<int64_t> ExpertSlotsOf(int64_t num_experts, int64_t num_slots, int64_t ep,
                                   int64_t ep_rank, ExpertPlacement placement) {
  // Slot s holds expert s % num_experts: redundant slots (EPLB) start as copies of the first
  // experts; a load balancer would reassign them at run time.
  std::vector<int64_t> out;
  switch (placement) {
    case ExpertPlacement::kEplb:  // without a load: the linear slots (SlotsByEpRank balances)
    case ExpertPlacement::kLinear: {
      const int64_t base = num_slots / ep, rem = num_slots % ep;
      const int64_t begin = ep_rank * base + std::min(ep_rank, rem);
      const int64_t count = base + (ep_rank < rem ? 1 : 0);
      for (int64_t s = begin; s < begin + count; ++s) out.push_back(s % num_experts);
      break;
    }
    case ExpertPlacement::kRoundRobin:
      for (int64_t s = ep_rank; s < num_slots; s += ep) out.push_back(s % num_experts);
      break;
  }
  return out;
}

namespace {

// A redundant slot on the rank that already holds its expert balances nothing and doubles the
// expert's memory there. Round-robin with redundant slots does this whenever lcm(experts, ep) <
// slots (12 experts + 4 redundant over EP4: rank 0 holds slots 0, 4, 8, 12 = experts 0, 4, 8,
// 0); vLLM does not offer it (fused_moe layer.py: round-robin only without redundant experts,
// otherwise a warning and linear placement).
Status CheckNoReplicaOnItsOwnRank(const std::vector<int64_t>& experts, int64_t ep_rank,
                                  int64_t num_experts, int64_t num_slots,
                                  ExpertPlacement placement) {
  std::vector<int64_t> first_slot(static_cast<size_t>(num_experts), -1);
  for (size_t i = 0; i < experts.size(); ++i) {
    int64_t& seen = first_slot[static_cast<size_t>(experts[i])];
    if (seen < 0) {
      seen = static_cast<int64_t>(i);
      continue;
    }
    return InvalidArgumentError(fmt::format(
        "plan: '--expert-placement-strategy {}' with {} slots for {} experts ({} redundant): EP "
        "rank {} would hold expert {} twice (its local slots {} and {}); expected every replica "
        "on another rank (use the linear placement, or --expert-placement eplb with "
        "--expert-load, which places replicas by load)",
        ExpertPlacementName(placement), num_slots, num_experts, num_slots - num_experts, ep_rank,
        experts[i], seen, i));
  }
  return Status::Ok();
}

// The experts each MoE EP rank's slots hold; with an expert load, also the per-layer imbalance
// before (linear) and after (the plan's placement), and for kEplb the balanced placement of
// the summed load.
Result<std::vector<std::vector<int64_t>>> SlotsByEpRank(const ModelConfig& model,
                                                        const PlanOptions& options, int64_t ep,
                                                        ShardPlan& plan) {
  const ExpertLoad& load = options.expert_load;
  if (options.placement == ExpertPlacement::kEplb && load.layers.empty()) {
    return InvalidArgumentError(
        "plan: '--expert-placement eplb': expected a measured expert load (--expert-load FILE, "
        "docs/eplb.md gives the format; `moeshard run --expert-load-out FILE` records one), got "
        "none");
  }
  for (size_t l = 0; l < load.layers.size(); ++l) {
    if (static_cast<int64_t>(load.layers[l].size()) != model.num_experts) {
      return InvalidArgumentError(fmt::format(
          "plan: expert load layer {}: {} experts counted, the model has {} (was the load "
          "measured on another model? it names '{}')",
          l, load.layers[l].size(), model.num_experts, load.model));
    }
  }
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(ep));
  for (int64_t r = 0; r < ep; ++r) {
    slots[static_cast<size_t>(r)] =
        ExpertSlotsOf(model.num_experts, plan.num_slots, ep, r, options.placement);
    // Linear placement repeats an expert on a rank only when the rank holds more slots than
    // there are experts (one rank: the runtime's single-rank reference of a redundant plan).
    if (options.placement != ExpertPlacement::kRoundRobin) continue;
    MOESHARD_RETURN_IF_ERROR(CheckNoReplicaOnItsOwnRank(
        slots[static_cast<size_t>(r)], r, model.num_experts, plan.num_slots, options.placement));
  }
  if (load.layers.empty()) return slots;
  const std::vector<std::vector<int64_t>> linear = [&] {
    std::vector<std::vector<int64_t>> out;
    for (int64_t r = 0; r < ep; ++r) {
      out.push_back(
          ExpertSlotsOf(model.num_experts, plan.num_slots, ep, r, ExpertPlacement::kLinear));
    }
    return out;
  }();
  if (options.placement == ExpertPlacement::kEplb) {
    ExpertLoad summed{.model = load.model, .layers = {std::vector<double>(model.num_experts, 0.0)}};
    for (const std::vector<double>& layer : load.layers) {
      for (size_t e = 0; e < layer.size(); ++e) summed.layers[0][e] += layer[e];
    }
    MOESHARD_ASSIGN_OR_RETURN(
        EplbPlacement placed,
        ComputeEplbPlacement(
            summed,
            {.num_slots = plan.num_slots, .num_ranks = ep, .num_nodes = 1, .num_groups = 1}));
    slots = RankExperts(placed.slot_expert[0], ep);
  }
  for (const std::vector<double>& layer : load.layers) {
    plan.load_imbalance_linear.push_back(RankLoadImbalance(layer, linear));
    plan.load_imbalance_placed.push_back(RankLoadImbalance(layer, slots));
  }
  const auto worst = [](const std::vector<double>& v) {
    return *std::max_element(v.begin(), v.end());
  };
  const auto mean = [](const std::vector<double>& v) {
    return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  };
  plan.notes.push_back(fmt::format(
      "expert load ({} MoE layers measured): per-rank load max/mean {:.3f} (worst layer {:.3f}) "
      "with the linear placement, {:.3f} (worst {:.3f}) with {}{}",
      load.layers.size(), mean(plan.load_imbalance_linear), worst(plan.load_imbalance_linear),
      mean(plan.load_imbalance_placed), worst(plan.load_imbalance_placed),
      ExpertPlacementName(options.placement),
      options.placement == ExpertPlacement::kEplb
          ? " (one placement for every layer, from their summed load)"
          : ""));
  return slots;
}

bool UnevenBlockShards(const ModelConfig& m, int64_t logical, int64_t divisor, int64_t group) {
  // MXFP4 experts only: vLLM's gpt-oss loader (gpt_oss.py, load_weights) slices them so. Other
  // block formats keep the refusal, as vLLM does (fp8: "not divisible by block_n").
  if (m.expert_scheme().format != WeightFormat::kMxfp4 || divisor <= 1) return false;
  if (logical % group != 0) return false;  // not whole groups: refused below
  return logical % divisor != 0 || (logical / divisor) % group != 0;
}

}  // namespace

Result<DimLayout> IntermediateLayout(const ModelConfig& m, const ResolvedTopology& t,
                                     const BackendSpec& backend, PaddingPolicy policy) {
  DimLayout d;
  d.logical = m.moe_intermediate_size;
  d.divisor = t.moe_tp;
  const int64_t group = m.expert_scheme().SplitGranule();
  if (UnevenBlockShards(m, d.logical, d.divisor, group)) {
    // ceil(I / group / moe_tp) groups per rank; the last ranks hold less (docs/uneven-shards.md).
    d.uneven = true;
    d.raw_local = CeilDiv(d.logical / group, d.divisor) * group;
  } else if (d.logical % d.divisor != 0) {
    return InvalidArgumentError(fmt::format(
        "plan: moe_intermediate_size {}: expected divisible by the MoE TP size {}, got remainder "
        "{}",
        d.logical, d.divisor, d.logical % d.divisor));
  }
  if (!d.uneven) d.raw_local = d.logical / d.divisor;
  if (d.raw_local % group != 0) {
    std::vector<int64_t> ok;
    for (int64_t x : Divisors(d.logical)) {
      if ((d.logical / x) % group == 0 && x <= std::max<int64_t>(t.group, 64)) ok.push_back(x);
    }
    return InvalidArgumentError(fmt::format(
        "plan: per-rank moe intermediate {} (= {} / MoE TP {}): expected a multiple of the {} "
        "quantization group ({}), got {} (a scale group would be split between ranks; valid MoE "
        "TP sizes: {}; or use -ep)",
        d.raw_local, d.logical, d.divisor, WeightFormatName(m.expert_scheme().format), group,
        d.raw_local, fmt::join(ok, ", ")));
  }
  d.align = Lcm(backend.IntermediateAlignFor(d.raw_local), group);
  switch (policy) {
    case PaddingPolicy::kBackend: d.padded_local = RoundUp(d.raw_local, d.align); break;
    case PaddingPolicy::kModelFloor:
      d.floor = t.moe_tp > 1 ? m.min_moe_intermediate_per_partition : 0;
      d.padded_local = RoundUp(std::max(d.raw_local, d.floor), d.align);
      break;
    case PaddingPolicy::kLegacyTp: {
      // The pre-fix engine (vLLM issue 51124): when I / tp_size fell below the floor it padded
      // the global I to floor * tp_size, divided by the MoE TP size -- even under EP, where
      // experts are whole and the global size is what each rank holds.
      const int64_t floor = m.min_moe_intermediate_per_partition;
      int64_t global = d.logical;
      if (floor > 0 && d.logical / t.tp < floor) global = floor * t.tp;
      d.floor = global / t.moe_tp;
      d.padded_local = RoundUp(std::max(d.raw_local, d.floor), d.align);
      break;
    }
  }
  return d;
}

namespace {

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Bytes(DType dtype, const std::vector<int64_t>& shape) {
  auto b = DTypeBytes(dtype, Elements(shape));
  MOESHARD_CHECK(b.has_value(), "tensor of {} elements of {} is not whole bytes", Elements(shape),
                 DTypeName(dtype));
  return *b;
}

TensorShard MakeShard(std::string name, TensorCategory cat, DType dtype,
                      std::vector<int64_t> logical, std::vector<int64_t> local,
                      std::vector<int64_t> padded, int shard_dim, int64_t begin, int64_t end,
                      const LayerSet& layers) {
  TensorShard s;
  s.name = std::move(name);
  s.category = cat;
  s.dtype = dtype;
  s.logical_shape = std::move(logical);
  s.local_shape = std::move(local);
  s.padded_shape = std::move(padded);
  s.shard_dim = shard_dim;
  s.shard_begin = begin;
  s.shard_end = end;
  s.layers = layers;
  const int64_t n = s.count();
  s.bytes = Bytes(dtype, s.padded_shape) * n;
  s.padding_bytes = s.bytes - Bytes(dtype, s.local_shape) * n;
  return s;
}

std::string Dims(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// The part of `shape[dim]` one rank's slice is taken from: one block of `sections`, or the
// leading `split_extent` entries of it.
int64_t SplitExtent(const TensorDef& t, int dim) {
  const int64_t block = t.shape[static_cast<size_t>(dim)] / std::max<int64_t>(1, t.sections);
  return t.split_extent > 0 ? t.split_extent : block;
}

// One rank's slice of a non-routed tensor: [begin, end) of `dim` (-1: the whole tensor) and the
// rank's local shape.
struct TpWindow {
  int dim = -1;
  int64_t begin = 0, end = 0;
  std::vector<int64_t> local;
};

// The slice TP rank `r` of `tp` holds, or why the tensor does not split `tp` ways.
Status TpWindowOf(const TensorDef& t, int64_t tp, int64_t r, TpWindow& w) {
  TpSplit split = t.split;
  if (t.split_heads > 0 && t.split_heads % tp != 0) split = TpSplit::kReplicated;
  const int64_t sections = std::max<int64_t>(1, t.sections);
  int& dim = w.dim;
  int64_t& begin = w.begin;
  int64_t& end = w.end;
  std::vector<int64_t>& local = w.local;
  local = t.shape;
  switch (split) {
    case TpSplit::kReplicated: break;
    case TpSplit::kColumn:
    case TpSplit::kRow: {
      dim = split == TpSplit::kColumn ? 0 : 1;
      if (!t.section_sizes.empty()) {
        int64_t held = 0;
        for (int64_t size : t.section_sizes) {
          if (size % tp != 0) {
            return InvalidArgumentError(fmt::format(
                "plan: '{}' {}: expected each of its blocks [{}] to divide by TP {}, got {}",
                t.name, Dims(t.shape), fmt::join(t.section_sizes, ", "), tp, size));
          }
          held += size / tp;
        }
        begin = r * (t.section_sizes[0] / tp);
        end = begin + t.section_sizes[0] / tp;
        local[static_cast<size_t>(dim)] = held;
        break;
      }
      const int64_t extent = SplitExtent(t, dim);
      if (extent % tp != 0) {
        std::vector<int64_t> ok;
        for (int64_t d : Divisors(extent)) {
          if (d <= 64) ok.push_back(d);
        }
        return InvalidArgumentError(fmt::format(
            "plan: '{}' {}: expected {} {} to divide by TP {}, got remainder {} (TP sizes that "
            "divide it: {})",
            t.name, Dims(t.shape), extent, dim == 0 ? "rows" : "columns", tp, extent % tp,
            fmt::join(ok, ", ")));
      }
      const int64_t n = extent / tp;
      begin = r * n;
      end = begin + n;
      local[static_cast<size_t>(dim)] = sections * n;
      break;
    }
    case TpSplit::kKvColumn: {
      dim = 0;
      const int64_t heads = t.shape[0] / t.unit;
      if (heads >= tp) {
        const int64_t n = t.shape[0] / tp;
        begin = r * n;
        end = begin + n;
      } else {  // one KV head shared by tp / heads ranks
        const int64_t head = r / (tp / heads);
        begin = head * t.unit;
        end = begin + t.unit;
      }
      local[0] = end - begin;
      break;
    }
  }
  if (dim >= 0 && sections == 1 && begin == 0 && end == t.shape[static_cast<size_t>(dim)]) {
    dim = -1;
  }
  return Status::Ok();
}

// Appends shards of one tensor (its value, or a part of a linear weight) with the tensor's
// role, category and section layout.
struct ShardSink {
  const TensorDef& t;
  const LayerSet& layers;
  std::vector<TensorShard>& out;

  // `dim` < 0: every holder keeps the whole part.
  void Push(std::string name, DType dtype, std::vector<int64_t> logical,
            const std::vector<int64_t>& shard_local, int dim, int64_t b, int64_t e,
            TensorPart part) const {
    const int64_t sections = std::max<int64_t>(1, t.sections);
    TensorShard s = MakeShard(std::move(name), t.category, dtype, std::move(logical), shard_local,
                              shard_local, dim, b, e, layers);
    s.role = t.role;
    s.part = part;
    s.sections = dim >= 0 ? sections : 1;
    if (dim >= 0) s.section_sizes = t.section_sizes;
    s.split_extent = dim >= 0 ? t.split_extent : 0;
    s.tied_source = t.tied_source;
    if (t.linear) s.linear_shape = t.shape;
    out.push_back(std::move(s));
  }
};

// A scale must not straddle two ranks: fp8 blocks along both dims, mxfp4 / int4 groups along
// the input dim.
Status CheckScalesWhole(const TensorDef& t, int64_t tp, const TpWindow& w) {
  const WeightScheme& q = t.format;
  const int dim = w.dim;
  const int64_t begin = w.begin, end = w.end;
  const int64_t sections = std::max<int64_t>(1, t.sections);
  const int64_t granule = dim == 0 ? q.RowGranule() : q.ColGranule();
  if ((end - begin) % granule != 0 || sections != 1 || t.split_extent != 0 ||
      !t.section_sizes.empty()) {
    std::vector<int64_t> ok;
    for (int64_t d = 1; d <= 64; d *= 2) {
      if (t.shape[static_cast<size_t>(dim)] % d == 0 &&
          (t.shape[static_cast<size_t>(dim)] / d) % granule == 0) {
        ok.push_back(d);
      }
    }
    return InvalidArgumentError(fmt::format(
        "plan: '{}' {} split {} ways by TP gives {} {}: expected a multiple of the {} group {} "
        "(a scale block would straddle ranks; TP sizes that keep it whole: {})",
        t.name, Dims(t.shape), tp, end - begin, dim == 0 ? "rows" : "columns",
        WeightFormatName(q.format), granule,
        ok.empty() ? std::string("none: it is not whole blocks, so only replicated")
                   : fmt::format("{}", fmt::join(ok, ", "))));
  }
  return Status::Ok();
}

// The parts of a linear weight in its storage format: weight, scales, zero points, group
// indices, global and input scales, compressed-tensors' weight_shape.
void AddLinearShards(const TensorDef& t, const ModelConfig& m, const TpWindow& w,
                     const ShardSink& sink) {
  const WeightScheme& q = t.format;
  const int dim = w.dim;
  const int64_t begin = w.begin, end = w.end;
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const int64_t lrows = w.local[0], lcols = w.local[1];
  // Storage coordinates of [begin, end) along the split dim: rows stay rows; columns count
  // packed bytes in the weight and groups in the scales.
  const std::vector<int64_t> w_logical = q.WeightShape(rows, cols);
  const std::vector<int64_t> w_local = q.WeightShape(lrows, lcols);
  const auto [wb, we] = q.WeightSlice(dim != 1, begin, end);
  const std::string leaf(q.spec().weight_leaf);
  sink.Push(t.name + "." + leaf, q.WeightDType(t.dtype), w_logical, w_local, dim, wb, we,
            TensorPart::kWeight);
  if (q.has_scales()) {
    // Act-order with the input split: the rank's channels may be in any group, so it keeps
    // every group's scales and zero points (whole, like the replicated case).
    const bool whole = q.act_order && dim == 1;
    const int s_dim = whole ? -1 : dim;
    const auto [sb, se] = s_dim < 0
                              ? std::pair<int64_t, int64_t>{whole ? 0 : begin, whole ? 0 : end}
                              : q.ScaleSlice(dim == 0, begin, end);
    const std::vector<int64_t> s_local = q.ScaleShape(lrows, whole ? cols : lcols);
    sink.Push(t.name + "." + std::string(q.spec().scale_leaf), q.spec().scale_dtype,
              q.ScaleShape(rows, cols), s_local, s_dim, sb, se, TensorPart::kScale);
    if (q.has_zero_points()) {  // one per scale, sliced like the scales
      sink.Push(t.name + "." + std::string(q.spec().zero_leaf), q.spec().zero_dtype,
                q.ScaleShape(rows, cols), s_local, s_dim, sb, se, TensorPart::kZeroPoint);
    }
  }
  const QuantLeaves leaves = CheckpointLeaves(q);
  if (!leaves.group_index.empty()) {
    // g_idx [in]: split where the input is (row parallelism), whole elsewhere.
    const int g_dim = dim == 1 ? 0 : -1;
    sink.Push(t.name + "." + std::string(leaves.group_index), DType::kI32, {cols}, {lcols}, g_dim,
              g_dim >= 0 ? begin : 0, g_dim >= 0 ? end : 0, TensorPart::kGroupIndex);
  }
  // One value for the whole tensor: every holder keeps it.
  if (q.has_global_scale()) {
    sink.Push(t.name + "." + std::string(q.spec().global_leaf), DType::kF32, {1}, {1}, -1, 0, 0,
              TensorPart::kGlobalScale);
  }
  if (!leaves.input.empty()) {
    sink.Push(t.name + "." + std::string(leaves.input), DType::kF32, {1}, {1}, -1, 0, 0,
              TensorPart::kInputScale);
  }
  if (t.shape_meta) {  // metadata: every holder keeps the whole [out, in]
    sink.Push(t.name + ".weight_shape", m.family->shape_meta_dtype, {2}, {2}, -1, 0, 0,
              TensorPart::kShapeMeta);
    sink.out.back().meta_values = t.shape;
  }
}

// Adds the shards of one non-routed tensor for one rank: the weight (or plain tensor), its
// scales when quantized, and compressed-tensors' weight_shape.
Status AddShards(const TensorDef& t, const ModelConfig& m, const ResolvedTopology& topo,
                 const RankCoords& rc, const LayerSet& layers, std::vector<TensorShard>& out) {
  const int64_t tp = topo.tp;
  TpWindow w;
  MOESHARD_RETURN_IF_ERROR(TpWindowOf(t, tp, rc.tp_rank, w));
  const ShardSink sink{t, layers, out};
  if (!t.linear) {
    sink.Push(t.name, t.dtype, t.shape, w.local, w.dim, w.begin, w.end, TensorPart::kValue);
    return Status::Ok();
  }
  if (w.dim >= 0 && t.format.quantized()) MOESHARD_RETURN_IF_ERROR(CheckScalesWhole(t, tp, w));
  AddLinearShards(t, m, w, sink);
  return Status::Ok();
}

// Routed-expert tensors of one rank in the fused layout (see shard_plan.h).
void AddRoutedExperts(const ShardPlan& plan, const RankCoords& rc, int64_t num_slots_local,
                      const LayerSet& moe_layers, std::vector<TensorShard>& out) {
  if (moe_layers.empty() || num_slots_local == 0) return;
  const ModelConfig& m = plan.model;
  const WeightScheme& q = plan.expert_scheme;
  const int64_t E = m.num_experts, El = num_slots_local;
  const int64_t g = m.gated() ? 2 : 1;
  const DimLayout& I = plan.intermediate;
  const DimLayout& H = plan.hidden;
  // This rank's slice of I; uneven block shards: the last ranks' are short or empty.
  const int64_t i_begin = I.SliceBegin(rc.moe_tp_rank), i_end = I.SliceEnd(rc.moe_tp_rank);
  const int64_t i_raw = i_end - i_begin;
  const std::string& p = plan.experts.rank_prefix;
  const auto cat = TensorCategory::kRoutedExperts;
  const bool split_i = I.divisor > 1;

  auto push = [&](TensorShard s, TensorRole role, TensorPart part, int64_t sections) {
    s.role = role;
    s.part = part;
    s.sections = s.shard_dim >= 0 ? sections : 1;
    out.push_back(std::move(s));
  };
  // One projection [E, out, in] (logical / raw local / padded local in elements), split along
  // `shard_dim` (1 = out rows, 2 = in columns; -1 none) at [begin, end) of each of `sections`
  // blocks, stored as the expert scheme says.
  auto add = [&](const std::string& proj, TensorRole role, int64_t out_logical, int64_t out_raw,
                 int64_t out_pad, int64_t in_logical, int64_t in_raw, int64_t in_pad, int shard_dim,
                 int64_t sections, int64_t begin, int64_t end) {
    const std::string wname = p + proj + "_" + std::string(q.spec().weight_leaf);
    const std::vector<int64_t> lg = q.WeightShape(out_logical, in_logical);
    const std::vector<int64_t> raw = q.WeightShape(out_raw, in_raw);
    const std::vector<int64_t> pad = q.WeightShape(out_pad, in_pad);
    const auto [wb, we] = q.WeightSlice(shard_dim != 2, begin, end);
    push(MakeShard(wname, cat, q.WeightDType(m.dtype), {E, lg[0], lg[1]}, {El, raw[0], raw[1]},
                   {El, pad[0], pad[1]}, shard_dim, wb, we, moe_layers),
         role, TensorPart::kWeight, sections);
    if (q.has_scales()) {
      // Act-order with the input split (w2 under MoE TP): every group's scales and zero
      // points on each rank, as vLLM's act-order GPTQ MoE (is_k_full false) holds them.
      const bool whole = q.act_order && shard_dim == 2;
      const int s_dim = whole ? -1 : shard_dim;
      const auto [sb, se] = s_dim < 0
                                ? std::pair<int64_t, int64_t>{whole ? 0 : begin, whole ? 0 : end}
                                : q.ScaleSlice(shard_dim == 1, begin, end);
      const std::vector<int64_t> slg = q.ScaleShape(out_logical, in_logical);
      const std::vector<int64_t> sraw = q.ScaleShape(out_raw, whole ? in_logical : in_raw);
      const std::vector<int64_t> spad = q.ScaleShape(out_pad, whole ? in_logical : in_pad);
      push(MakeShard(p + proj + "_" + std::string(q.spec().scale_leaf), cat, q.spec().scale_dtype,
                     {E, slg[0], slg[1]}, {El, sraw[0], sraw[1]}, {El, spad[0], spad[1]}, s_dim, sb,
                     se, moe_layers),
           role, TensorPart::kScale, sections);
      if (q.has_zero_points()) {  // one per scale, sliced and padded like the scales
        push(MakeShard(p + proj + "_" + std::string(q.spec().zero_leaf), cat, q.spec().zero_dtype,
                       {E, slg[0], slg[1]}, {El, sraw[0], sraw[1]}, {El, spad[0], spad[1]}, s_dim,
                       sb, se, moe_layers),
             role, TensorPart::kZeroPoint, sections);
      }
    }
    // One F32 per checkpoint tensor: w13 [E, g] (gate, up), w2 [E], whole on every holder.
    const QuantLeaves leaves = CheckpointLeaves(q);
    auto per_tensor = [&](std::string_view leaf, TensorPart part) {
      const std::vector<int64_t> lg =
          proj == "w13" ? std::vector<int64_t>{E, g} : std::vector<int64_t>{E};
      std::vector<int64_t> local = lg;
      local[0] = El;
      push(MakeShard(p + proj + "_" + std::string(leaf), cat, DType::kF32, lg, local, local, -1, 0,
                     0, moe_layers),
           role, part, 1);
    };
    if (q.has_global_scale()) per_tensor(q.spec().global_leaf, TensorPart::kGlobalScale);
    if (!leaves.input.empty()) per_tensor(leaves.input, TensorPart::kInputScale);
    if (!leaves.group_index.empty()) {
      // g_idx per checkpoint tensor: w13 [E, g, H] (gate, up), w2 [E, I] split like w2's input.
      if (proj == "w13") {
        push(MakeShard(p + "w13_" + std::string(leaves.group_index), cat, DType::kI32,
                       {E, g, in_logical}, {El, g, in_raw}, {El, g, in_pad}, -1, 0, 0, moe_layers),
             role, TensorPart::kGroupIndex, 1);
      } else {
        push(MakeShard(p + "w2_" + std::string(leaves.group_index), cat, DType::kI32,
                       {E, in_logical}, {El, in_raw}, {El, in_pad}, shard_dim == 2 ? 1 : -1, begin,
                       end, moe_layers),
             role, TensorPart::kGroupIndex, 1);
      }
    }
    if (m.quant.weight_shape_meta && q.quantized()) {
      // compressed-tensors' per-expert weight_shape: gate and up for w13, down for w2.
      const int64_t n = proj == "w13" ? g : 1;
      push(MakeShard(p + proj + "_weight_shape", cat, m.family->shape_meta_dtype, {E, n, 2},
                     {El, n, 2}, {El, n, 2}, -1, 0, 0, moe_layers),
           role, TensorPart::kShapeMeta, 1);
    }
  };
  // gate_up: [E, g*I, H]: gate rows [0, I) and up rows [I, 2I), each split at [i_begin, i_end)
  // (interleaved gate/up: the rank's 2*[i_begin, i_end) rows are contiguous).
  const bool interleaved = plan.experts.gate_up_interleaved;
  add("w13", TensorRole::kExpertsW13, g * I.logical, g * i_raw, g * I.padded_local, H.logical,
      H.raw_local, H.padded_local, split_i ? 1 : -1, interleaved ? 1 : g,
      interleaved ? g * i_begin : i_begin, interleaved ? g * i_end : i_end);
  add("w2", TensorRole::kExpertsW2, H.logical, H.raw_local, H.padded_local, I.logical, i_raw,
      I.padded_local, split_i ? 2 : -1, 1, i_begin, i_end);
  if (!plan.experts.bias_suffix.empty()) {
    const DType bd = plan.experts.bias_dtype;
    // w13_bias [E, g*I] split like w13's rows; w2_bias [E, H] whole (added once, by moe_tp
    // rank 0, after the reduction).
    push(MakeShard(p + "w13_bias", cat, bd, {E, g * I.logical}, {El, g * i_raw},
                   {El, g * I.padded_local}, split_i ? 1 : -1, interleaved ? g * i_begin : i_begin,
                   interleaved ? g * i_end : i_end, moe_layers),
         TensorRole::kExpertsW13Bias, TensorPart::kValue, interleaved ? 1 : g);
    push(MakeShard(p + "w2_bias", cat, bd, {E, H.logical}, {El, H.raw_local}, {El, H.padded_local},
                   -1, 0, 0, moe_layers),
         TensorRole::kExpertsW2Bias, TensorPart::kValue, 1);
  }
}

// The MoE backend the plan is for (auto: the family's default), checked against the experts'
// format and the topology.
Status ChooseBackend(const ModelConfig& model, const PlanOptions& options, ShardPlan& plan) {
  const ResolvedTopology& t = plan.topology;
  if (options.backend == "auto") {
    plan.backend = DefaultBackend(model, options.native_fp8, options.gpu_sm);
  } else {
    MOESHARD_ASSIGN_OR_RETURN(const BackendSpec* b, FindBackend(options.backend));
    plan.backend = *b;
  }
  const BackendSpec& backend = plan.backend;
  plan.expert_scheme = model.expert_scheme();
  plan.experts = model.family->experts(model);
  if (!backend.Supports(plan.expert_scheme.format)) {
    std::vector<std::string> ok;
    for (const BackendSpec& b : BackendCatalog()) {
      if (b.Supports(plan.expert_scheme.format)) ok.push_back(b.name);
    }
    return InvalidArgumentError(fmt::format(
        "plan: '--moe-backend {}': does not run {} experts, which {} has (backends that do: {})",
        backend.name, WeightFormatName(plan.expert_scheme.format), model.name,
        fmt::join(ok, ", ")));
  }
  if (backend.ep_only && !t.expert_parallel()) {
    return InvalidArgumentError(fmt::format(
        "plan: '--moe-backend {}': expected expert parallelism (it owns dispatch and combine), "
        "got MoE EP size 1 (add -ep or --moe-ep)",
        backend.name));
  }
  return Status::Ok();
}

// The expert slots (experts plus EPLB's redundant ones) and how they divide over EP.
Status CountExpertSlots(const ModelConfig& model, const PlanOptions& options, ShardPlan& plan) {
  const ResolvedTopology& t = plan.topology;
  const BackendSpec& backend = plan.backend;
  int64_t redundant = options.num_redundant_experts;
  if (redundant == kRedundantExpertsAuto) {
    redundant = (t.moe_ep - model.num_experts % t.moe_ep) % t.moe_ep;
    plan.notes.push_back(fmt::format(
        "--num-redundant-experts auto: {} redundant experts, {} slots over EP {} ({} per rank)",
        redundant, model.num_experts + redundant, t.moe_ep,
        (model.num_experts + redundant) / t.moe_ep));
  } else if (redundant < 0) {
    return InvalidArgumentError(fmt::format(
        "plan: '--num-redundant-experts {}': expected a count >= 0 or auto", redundant));
  }
  plan.num_slots = model.num_experts + redundant;
  const bool exact =
      backend.exact_expert_division || redundant > 0 || options.placement == ExpertPlacement::kEplb;
  if (plan.num_slots % t.moe_ep != 0 && exact) {
    std::vector<int64_t> ok;
    for (int64_t d : Divisors(plan.num_slots)) {
      if (d <= std::max<int64_t>(t.group, 64)) ok.push_back(d);
    }
    const int64_t up = RoundUp(plan.num_slots, t.moe_ep) - model.num_experts;
    return InvalidArgumentError(fmt::format(
        "plan: {} expert slots over EP {}: expected an exact division ({}), got remainder {} "
        "(valid EP sizes: {}; or --num-redundant-experts {})",
        plan.num_slots, t.moe_ep,
        redundant > 0 ? "EPLB requires it" : backend.name + " requires it",
        plan.num_slots % t.moe_ep, fmt::join(ok, ", "), up));
  }
  if (plan.num_slots % t.moe_ep != 0) {
    plan.notes.push_back(
        fmt::format("{} experts do not divide by EP {}: the first {} EP ranks hold one expert more",
                    plan.num_slots, t.moe_ep, plan.num_slots % t.moe_ep));
  }
  return Status::Ok();
}

// The routed experts' intermediate (I) and hidden dims: split, aligned and padded per rank.
Status LayOutExpertDims(const ModelConfig& model, const PlanOptions& options, ShardPlan& plan) {
  const ResolvedTopology& t = plan.topology;
  const BackendSpec& backend = plan.backend;
  MOESHARD_ASSIGN_OR_RETURN(plan.intermediate,
                            IntermediateLayout(model, t, backend, options.padding));
  if (plan.intermediate.uneven) {
    const DimLayout& I = plan.intermediate;
    const int64_t groups = I.logical / plan.expert_scheme.SplitGranule();
    const int64_t full = I.logical / I.raw_local;  // parts holding raw_local rows
    const int64_t rest = I.logical % I.raw_local;
    const int64_t empty = I.divisor - full - (rest > 0 ? 1 : 0);
    plan.notes.push_back(fmt::format(
        "uneven block shards: I {} is {} {} groups of {}, not divisible by MoE TP {}: MoE TP "
        "ranks hold ceil({} / {}) groups = {} rows ({} of them){}{}, every rank padded to {} with "
        "zeros (vLLM gpt_oss.py load_weights)",
        I.logical, groups, WeightFormatName(plan.expert_scheme.format),
        plan.expert_scheme.SplitGranule(), I.divisor, groups, I.divisor, I.raw_local, full,
        rest > 0 ? fmt::format(", the next {}", rest) : "",
        empty > 0 ? fmt::format(", the last {} none", empty) : "", I.padded_local));
  }
  plan.hidden.logical = model.routed_expert_hidden_size;
  plan.hidden.raw_local = plan.hidden.logical;
  plan.hidden.divisor = 1;
  const int64_t hidden_group = plan.expert_scheme.SplitGranule();
  if (plan.hidden.logical % hidden_group != 0) {
    return InvalidArgumentError(fmt::format(
        "plan: routed expert hidden size {}: expected a multiple of the {} group {}, got {}",
        plan.hidden.logical, WeightFormatName(plan.expert_scheme.format), hidden_group,
        plan.hidden.logical));
  }
  plan.hidden.align = Lcm(backend.hidden_align, hidden_group);
  plan.hidden.padded_local = RoundUp(plan.hidden.raw_local, plan.hidden.align);
  if (options.padding == PaddingPolicy::kLegacyTp) {
    plan.notes.emplace_back(
        "padding policy legacy-tp reproduces engines before vLLM PR 51131: I padded to "
        "min_moe_intermediate_per_partition * tp_size even under expert parallelism");
  }
  return Status::Ok();
}

// Every rank's coordinates, layers, expert slots and tensor shards, stage by stage.
Status AddRanks(const ModelConfig& model, const PlanOptions& options, ShardPlan& plan) {
  const ResolvedTopology& t = plan.topology;
  MOESHARD_ASSIGN_OR_RETURN(const std::vector<std::vector<int64_t>> slots_by_ep_rank,
                            SlotsByEpRank(model, options, t.moe_ep, plan));
  const std::vector<TensorDef> logical = internal::PlanTensors(model, options, t.pp);
  plan.ranks.reserve(t.world);
  std::vector<std::vector<int64_t>> stage_layers(t.pp);
  for (int64_t s = 0; s < t.pp; ++s)
    stage_layers[s] = internal::StageLayers(model.num_layers, t.pp, s);

  // Per stage: each logical tensor's layers on that stage, and the stage's MoE layers, shared
  // by every rank of the stage.
  std::vector<std::vector<LayerSet>> stage_tensor_layers(t.pp);
  std::vector<LayerSet> stage_moe_layers(t.pp);
  for (int64_t s = 0; s < t.pp; ++s) {
    const std::vector<int64_t>& sl = stage_layers[s];
    for (const TensorDef& lt : logical) {
      std::vector<int64_t> layers;
      std::set_intersection(lt.layers.begin(), lt.layers.end(), sl.begin(), sl.end(),
                            std::back_inserter(layers));
      stage_tensor_layers[s].push_back(LayerSet(std::move(layers)));
    }
    std::vector<int64_t> moe_layers;
    for (int64_t l : sl) {
      if (model.layers[l].moe) moe_layers.push_back(l);
    }
    stage_moe_layers[s] = LayerSet(std::move(moe_layers));
  }

  for (int64_t rank = 0; rank < t.world; ++rank) {
    RankPlan rp;
    rp.coords = CoordsOf(t, rank);
    const int64_t stage = rp.coords.pp_stage;
    rp.layers = stage_layers[stage];
    rp.expert_slots = slots_by_ep_rank[static_cast<size_t>(rp.coords.moe_ep_rank)];
    const bool first = stage == 0, last = stage == t.pp - 1;
    rp.tensors.reserve(2 * logical.size() + 8);
    for (size_t i = 0; i < logical.size(); ++i) {
      const TensorDef& lt = logical[i];
      if (lt.where == StagePlacement::kLayers) {
        if (stage_tensor_layers[stage][i].empty()) continue;
      } else if ((lt.where == StagePlacement::kFirstStage && !first) ||
                 (lt.where == StagePlacement::kLastStage && !last)) {
        continue;
      }
      MOESHARD_RETURN_IF_ERROR(
          AddShards(lt, model, t, rp.coords, stage_tensor_layers[stage][i], rp.tensors));
    }
    AddRoutedExperts(plan, rp.coords, static_cast<int64_t>(rp.expert_slots.size()),
                     stage_moe_layers[stage], rp.tensors);
    plan.ranks.push_back(std::move(rp));
  }
  return Status::Ok();
}

}  // namespace

Result<ShardPlan> BuildShardPlan(const ModelConfig& model, const PlanOptions& options) {
  ShardPlan plan;
  plan.model = model;
  plan.options = options;
  MOESHARD_ASSIGN_OR_RETURN(plan.topology, ResolveTopology(options.topology, model));
  MOESHARD_RETURN_IF_ERROR(ChooseBackend(model, options, plan));
  MOESHARD_RETURN_IF_ERROR(CountExpertSlots(model, options, plan));
  MOESHARD_RETURN_IF_ERROR(LayOutExpertDims(model, options, plan));
  MOESHARD_RETURN_IF_ERROR(AddRanks(model, options, plan));
  return plan;
}

}  // namespace moeshard
