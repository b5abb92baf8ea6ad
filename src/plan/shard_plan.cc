#include "moeshard/plan/shard_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "moeshard/base/math.h"
#include "plan/model_tensors.h"

namespace moeshard {

using internal::LogicalTensor;
using internal::QuantStorage;
using internal::Split;
using internal::Where;

const char* TensorCategoryName(TensorCategory c) {
  switch (c) {
    case TensorCategory::kEmbedding: return "embedding";
    case TensorCategory::kAttention: return "attention";
    case TensorCategory::kDenseMlp: return "dense_mlp";
    case TensorCategory::kRouter: return "router";
    case TensorCategory::kSharedExperts: return "shared_experts";
    case TensorCategory::kLatentProj: return "latent_proj";
    case TensorCategory::kRoutedExperts: return "routed_experts";
    case TensorCategory::kNorm: return "norms";
    case TensorCategory::kLmHead: return "lm_head";
  }
  return "?";
}

const char* PaddingPolicyName(PaddingPolicy p) {
  switch (p) {
    case PaddingPolicy::kBackend: return "backend";
    case PaddingPolicy::kModelFloor: return "model-floor";
    case PaddingPolicy::kLegacyTp: return "legacy-tp";
  }
  return "?";
}

Result<PaddingPolicy> ParsePaddingPolicy(const std::string& name) {
  for (PaddingPolicy p : {PaddingPolicy::kBackend, PaddingPolicy::kModelFloor, PaddingPolicy::kLegacyTp}) {
    if (name == PaddingPolicyName(p)) return p;
  }
  return InvalidArgumentError(fmt::format(
      "plan: '--padding-policy {}': expected backend, model-floor or legacy-tp", name));
}

const char* ExpertPlacementName(ExpertPlacement p) {
  switch (p) {
    case ExpertPlacement::kLinear: return "linear";
    case ExpertPlacement::kRoundRobin: return "round-robin";
  }
  return "?";
}

Result<ExpertPlacement> ParseExpertPlacement(const std::string& name) {
  if (name == "linear") return ExpertPlacement::kLinear;
  if (name == "round-robin" || name == "round_robin") return ExpertPlacement::kRoundRobin;
  return InvalidArgumentError(fmt::format(
      "plan: '--expert-placement-strategy {}': expected linear or round-robin", name));
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
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> kinds;  // (slots, bytes) -> ranks
  for (const RankPlan& r : ranks) {
    kinds[{static_cast<int64_t>(r.expert_slots.size()), r.BytesOf(TensorCategory::kRoutedExperts)}]
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

Result<DimLayout> IntermediateLayout(const ModelConfig& m, const ResolvedTopology& t,
                                     const BackendSpec& backend, PaddingPolicy policy) {
  DimLayout d;
  d.logical = m.moe_intermediate_size;
  d.divisor = t.moe_tp;
  if (d.logical % d.divisor != 0) {
    return InvalidArgumentError(fmt::format(
        "plan: moe_intermediate_size {}: expected divisible by the MoE TP size {}, got remainder "
        "{}",
        d.logical, d.divisor, d.logical % d.divisor));
  }
  d.raw_local = d.logical / d.divisor;
  const int64_t group = QuantGroupAlong(m.quant);
  if (d.raw_local % group != 0) {
    std::vector<int64_t> ok;
    for (int64_t x : Divisors(d.logical)) {
      if ((d.logical / x) % group == 0 && x <= std::max<int64_t>(t.group, 64)) ok.push_back(x);
    }
    return InvalidArgumentError(fmt::format(
        "plan: per-rank moe intermediate {} (= {} / MoE TP {}): expected a multiple of the {} "
        "quantization group ({}), got {} (a scale group would be split between ranks; valid MoE "
        "TP sizes: {}; or use -ep)",
        d.raw_local, d.logical, d.divisor, QuantMethodName(m.quant.method), group, d.raw_local,
        fmt::join(ok, ", ")));
  }
  d.align = Lcm(backend.IntermediateAlignFor(d.raw_local), group);
  switch (policy) {
    case PaddingPolicy::kBackend:
      d.padded_local = RoundUp(d.raw_local, d.align);
      break;
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

std::string ReplaceSuffix(const std::string& name, const std::string& suffix) {
  const std::string w = ".weight";
  if (name.size() >= w.size() && name.compare(name.size() - w.size(), w.size(), w) == 0) {
    return name.substr(0, name.size() - w.size()) + "." + suffix;
  }
  return name + "." + suffix;
}

// Adds the shards of one non-routed logical tensor for one rank.
Status AddShards(const LogicalTensor& t, const ModelConfig& m, const ResolvedTopology& topo,
                 const RankCoords& rc, const LayerSet& layers, std::vector<TensorShard>& out) {
  const int64_t tp = topo.tp, r = rc.tp_rank;
  int dim = -1;
  int64_t begin = 0, end = 0;
  std::vector<int64_t> local = t.shape;
  switch (t.split) {
    case Split::kReplicated: break;
    case Split::kColumn:
    case Split::kRow: {
      dim = t.split == Split::kColumn ? 0 : 1;
      const int64_t n = t.shape[dim] / tp;
      begin = r * n;
      end = begin + n;
      local[dim] = n;
      break;
    }
    case Split::kKvColumn: {
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
  if (dim >= 0 && begin == 0 && end == t.shape[dim]) dim = -1;
  if (t.quant == QuantMethod::kNone) {
    out.push_back(MakeShard(t.name, t.category, t.dtype, t.shape, local, local, dim, begin, end, layers));
    return Status::Ok();
  }
  if (dim >= 0) {
    // A quantization scale group must not straddle two ranks: fp8 blocks along both dims,
    // mxfp4 / int4 groups along the input dim.
    int64_t group = 1;
    if (t.quant == QuantMethod::kFp8Block) group = dim == 0 ? m.quant.block_out : m.quant.block_in;
    if (t.quant == QuantMethod::kMxfp4 || t.quant == QuantMethod::kInt4) {
      group = dim == 1 ? QuantGroupAlong(m.quant) : 1;
    }
    if ((end - begin) % group != 0) {
      std::vector<int64_t> ok;
      for (int64_t d = 1; d <= 64; d *= 2) {
        if (t.shape[dim] % d == 0 && (t.shape[dim] / d) % group == 0) ok.push_back(d);
      }
      return InvalidArgumentError(fmt::format(
          "plan: '{}' {} split {} ways by TP gives {} {}: expected a multiple of the {} group {} "
          "(a scale block would straddle ranks; TP sizes that keep it whole: {})",
          t.name, fmt::format("[{}]", fmt::join(t.shape, ", ")), tp, end - begin,
          dim == 0 ? "rows" : "columns", QuantMethodName(t.quant), group, fmt::join(ok, ", ")));
    }
  }
  const QuantStorage logical = internal::QuantizedLinear(t.quant, m.quant, t.shape, m.dtype);
  const QuantStorage q = internal::QuantizedLinear(t.quant, m.quant, local, m.dtype);
  // Storage coordinates: packed weights split the input dim in bytes, scales in groups.
  auto scaled = [&](const std::vector<int64_t>& lg, const std::vector<int64_t>& lc, int64_t& b,
                    int64_t& e) {
    if (dim < 0) return;
    const int64_t per = lg[dim] / std::max<int64_t>(1, t.shape[dim] / (end - begin));
    b = (begin / (end - begin)) * per;
    e = b + lc[dim];
  };
  int64_t wb = begin, we = end, sb = begin, se = end;
  scaled(logical.weight_shape, q.weight_shape, wb, we);
  out.push_back(MakeShard(ReplaceSuffix(t.name, q.weight_suffix), t.category, q.weight_dtype,
                          logical.weight_shape, q.weight_shape, q.weight_shape, dim, wb, we, layers));
  if (!q.scale_shape.empty()) {
    scaled(logical.scale_shape, q.scale_shape, sb, se);
    out.push_back(MakeShard(ReplaceSuffix(t.name, q.scale_suffix), t.category, q.scale_dtype,
                            logical.scale_shape, q.scale_shape, q.scale_shape, dim, sb, se, layers));
  }
  return Status::Ok();
}

// Routed-expert tensors of one rank in the fused layout (see shard_plan.h).
void AddRoutedExperts(const ShardPlan& plan, const RankCoords& rc, int64_t num_slots_local,
                      const LayerSet& moe_layers, std::vector<TensorShard>& out) {
  if (moe_layers.empty() || num_slots_local == 0) return;
  const ModelConfig& m = plan.model;
  const int64_t E = m.num_experts, El = num_slots_local;
  const int64_t g = m.gated() ? 2 : 1;
  const DimLayout& I = plan.intermediate;
  const DimLayout& H = plan.hidden;
  const int64_t i_begin = rc.moe_tp_rank * I.raw_local, i_end = i_begin + I.raw_local;
  const std::string p = "model.layers.{layer}.mlp.experts.";
  const auto cat = TensorCategory::kRoutedExperts;
  const int dim_i_w13 = I.divisor > 1 ? 1 : -1;
  const int dim_i_w2 = I.divisor > 1 ? 2 : -1;

  // Logical [E, out, in] per projection, local raw and padded, in storage units.
  auto add = [&](const std::string& name, int64_t out_logical, int64_t out_raw, int64_t out_pad,
                 int64_t in_logical, int64_t in_raw, int64_t in_pad, int shard_dim, int64_t begin,
                 int64_t end) {
    const QuantMethod qm = plan.expert_format;
    const QuantStorage lg = internal::QuantizedLinear(qm, m.quant, {out_logical, in_logical}, m.dtype);
    const QuantStorage raw = internal::QuantizedLinear(qm, m.quant, {out_raw, in_raw}, m.dtype);
    const QuantStorage pad = internal::QuantizedLinear(qm, m.quant, {out_pad, in_pad}, m.dtype);
    // Storage-unit begin/end along the split dim (dim 1 = out rows, dim 2 = in columns).
    // Along the input dim (dim 2) packed weights and scales count bytes / groups, not elements:
    // the rank's range is its shard index times its local storage width.
    auto storage_range = [&](const std::vector<int64_t>& raw_shape) {
      if (shard_dim != 2) return std::pair<int64_t, int64_t>{begin, end};
      const int64_t shard_idx = begin / (end - begin);
      return std::pair<int64_t, int64_t>{shard_idx * raw_shape[1], (shard_idx + 1) * raw_shape[1]};
    };
    auto [wb, we] = storage_range(raw.weight_shape);
    out.push_back(MakeShard(p + name + "_" + (qm == QuantMethod::kNone ? "weight" : lg.weight_suffix),
                            cat, raw.weight_dtype, {E, lg.weight_shape[0], lg.weight_shape[1]},
                            {El, raw.weight_shape[0], raw.weight_shape[1]},
                            {El, pad.weight_shape[0], pad.weight_shape[1]}, shard_dim, wb, we,
                            moe_layers));
    if (!raw.scale_shape.empty()) {
      auto [sb, se] = storage_range(raw.scale_shape);
      if (shard_dim == 1 && qm == QuantMethod::kFp8Block) {
        sb = begin / m.quant.block_out;
        se = CeilDiv(end, m.quant.block_out);
      }
      out.push_back(MakeShard(p + name + "_" + lg.scale_suffix, cat, raw.scale_dtype,
                              {E, lg.scale_shape[0], lg.scale_shape[1]},
                              {El, raw.scale_shape[0], raw.scale_shape[1]},
                              {El, pad.scale_shape[0], pad.scale_shape[1]}, shard_dim, sb, se,
                              moe_layers));
    }
  };
  // gate_up: [E, g*I, H]; the I range of each of gate and up is [i_begin, i_end).
  add("w13", g * I.logical, g * I.raw_local, g * I.padded_local, H.logical, H.raw_local,
      H.padded_local, dim_i_w13, g * i_begin, g * i_end);
  add("w2", H.logical, H.raw_local, H.padded_local, I.logical, I.raw_local, I.padded_local,
      dim_i_w2, i_begin, i_end);
  if (m.expert_bias) {
    // Biases in the model dtype: w13_bias [E, g*I] split like w13's rows; w2_bias [E, H] whole
    // (added once, by moe_tp rank 0, after the reduction).
    out.push_back(MakeShard(p + "w13_bias", cat, m.dtype, {E, g * I.logical}, {El, g * I.raw_local},
                            {El, g * I.padded_local}, dim_i_w13 < 0 ? -1 : 1, g * i_begin,
                            g * i_end, moe_layers));
    out.push_back(MakeShard(p + "w2_bias", cat, m.dtype, {E, H.logical}, {El, H.raw_local},
                            {El, H.padded_local}, -1, 0, 0, moe_layers));
  }
}

}  // namespace

Result<ShardPlan> BuildShardPlan(const ModelConfig& model, const PlanOptions& options) {
  ShardPlan plan;
  plan.model = model;
  plan.options = options;
  MOESHARD_ASSIGN_OR_RETURN(plan.topology, ResolveTopology(options.topology, model));
  const ResolvedTopology& t = plan.topology;

  if (options.backend == "auto") {
    plan.backend = DefaultBackend(model);
  } else {
    MOESHARD_ASSIGN_OR_RETURN(const BackendSpec* b, FindBackend(options.backend));
    plan.backend = *b;
  }
  const BackendSpec& backend = plan.backend;
  plan.expert_format = model.quant.method;
  if (!backend.Supports(plan.expert_format)) {
    std::vector<std::string> ok;
    for (const BackendSpec& b : BackendCatalog()) {
      if (b.Supports(plan.expert_format)) ok.push_back(b.name);
    }
    return InvalidArgumentError(fmt::format(
        "plan: '--moe-backend {}': does not run {} experts, which {} has (backends that do: {})",
        backend.name, QuantMethodName(plan.expert_format), model.name, fmt::join(ok, ", ")));
  }
  if (backend.ep_only && !t.expert_parallel()) {
    return InvalidArgumentError(fmt::format(
        "plan: '--moe-backend {}': expected expert parallelism (it owns dispatch and combine), "
        "got MoE EP size 1 (add -ep or --moe-ep)",
        backend.name));
  }

  if (options.num_redundant_experts < 0) {
    return InvalidArgumentError(fmt::format(
        "plan: '--num-redundant-experts {}': expected >= 0", options.num_redundant_experts));
  }
  plan.num_slots = model.num_experts + options.num_redundant_experts;
  const bool exact = backend.exact_expert_division || options.num_redundant_experts > 0;
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
        options.num_redundant_experts > 0 ? "EPLB requires it" : backend.name + " requires it",
        plan.num_slots % t.moe_ep, fmt::join(ok, ", "), up));
  }
  if (plan.num_slots % t.moe_ep != 0) {
    plan.notes.push_back(fmt::format(
        "{} experts do not divide by EP {}: the first {} EP ranks hold one expert more", plan.num_slots,
        t.moe_ep, plan.num_slots % t.moe_ep));
  }

  MOESHARD_ASSIGN_OR_RETURN(plan.intermediate,
                            IntermediateLayout(model, t, backend, options.padding));
  plan.hidden.logical = model.routed_expert_hidden_size;
  plan.hidden.raw_local = plan.hidden.logical;
  plan.hidden.divisor = 1;
  int64_t hidden_group = 1;
  if (model.quant.method == QuantMethod::kFp8Block) hidden_group = model.quant.block_in;
  if (model.quant.method == QuantMethod::kMxfp4) hidden_group = 32;
  if (model.quant.method == QuantMethod::kInt4) hidden_group = model.quant.group_size;
  if (plan.hidden.logical % hidden_group != 0) {
    return InvalidArgumentError(fmt::format(
        "plan: routed expert hidden size {}: expected a multiple of the {} group {}, got {}",
        plan.hidden.logical, QuantMethodName(model.quant.method), hidden_group, plan.hidden.logical));
  }
  plan.hidden.align = Lcm(backend.hidden_align, hidden_group);
  plan.hidden.padded_local = RoundUp(plan.hidden.raw_local, plan.hidden.align);
  if (options.padding == PaddingPolicy::kLegacyTp) {
    plan.notes.push_back(
        "padding policy legacy-tp reproduces engines before vLLM PR 51131: I padded to "
        "min_moe_intermediate_per_partition * tp_size even under expert parallelism");
  }

  const std::vector<LogicalTensor> logical = internal::EnumerateTensors(model, options, t.pp);
  plan.ranks.reserve(t.world);
  std::vector<std::vector<int64_t>> stage_layers(t.pp);
  for (int64_t s = 0; s < t.pp; ++s) stage_layers[s] = internal::StageLayers(model.num_layers, t.pp, s);

  // Per stage: each logical tensor's layers on that stage, and the stage's MoE layers, shared
  // by every rank of the stage.
  std::vector<std::vector<LayerSet>> stage_tensor_layers(t.pp);
  std::vector<LayerSet> stage_moe_layers(t.pp);
  for (int64_t s = 0; s < t.pp; ++s) {
    const std::vector<int64_t>& sl = stage_layers[s];
    for (const LogicalTensor& lt : logical) {
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
    rp.expert_slots = ExpertSlotsOf(model.num_experts, plan.num_slots, t.moe_ep,
                                    rp.coords.moe_ep_rank, options.placement);
    const bool first = stage == 0, last = stage == t.pp - 1;
    rp.tensors.reserve(2 * logical.size() + 8);
    for (size_t i = 0; i < logical.size(); ++i) {
      const LogicalTensor& lt = logical[i];
      if (lt.where == Where::kLayers) {
        if (stage_tensor_layers[stage][i].empty()) continue;
      } else if ((lt.where == Where::kFirstStage && !first) ||
                 (lt.where == Where::kLastStage && !last)) {
        continue;
      }
      MOESHARD_RETURN_IF_ERROR(
          AddShards(lt, model, t, rp.coords, stage_tensor_layers[stage][i], rp.tensors));
    }
    AddRoutedExperts(plan, rp.coords, static_cast<int64_t>(rp.expert_slots.size()),
                     stage_moe_layers[stage], rp.tensors);
    plan.ranks.push_back(std::move(rp));
  }
  return plan;
}

}  // namespace moeshard
