#include "moeshard/runtime/sharded_job.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "moeshard/base/numeric.h"
#include "moeshard/kernels/kernel_context.h"
#include "moeshard/runtime/moe_runtime.h"
#include "moeshard/runtime/weight_views.h"

namespace moeshard {
namespace {


double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// One runtime over one plan's rank, with its weights and per-layer output buffer.
struct Instance {
  RankWeights weights{0};
  WeightViews views;
  LoadStats stats;
  int64_t row_group_layers = 0;
  std::unique_ptr<MoeRuntime> runtime;
};

Status Build(const ShardPlan& plan, int64_t rank, const ShardedJobSpec& spec, Communicator& comm,
             KernelContext& ctx, int64_t max_tokens, Instance* out) {
  LoadOptions lo = spec.load;
  lo.max_moe_layers = spec.num_layers;
  lo.num_threads = std::max(1, spec.kernel_threads);
  MOESHARD_ASSIGN_OR_RETURN(out->weights, LoadRankWeights(plan, rank, lo, &out->stats));
  if (spec.cpu_row_groups && ctx.isa() == CpuIsa::kAvx512Bf16) {
    MOESHARD_ASSIGN_OR_RETURN(out->row_group_layers,
                              UseCpuRowGroupLayout(ctx, plan, &out->weights));
  }
  out->views = ViewRankWeights(out->weights);
  MoeRuntimeOptions ro;
  ro.max_tokens = max_tokens;
  const std::vector<int64_t> moe = MoeLayersOf(plan.model, plan.ranks[rank].layers);
  const int64_t n = spec.num_layers < 0 ? static_cast<int64_t>(moe.size())
                                        : std::min<int64_t>(spec.num_layers, moe.size());
  ro.layers.assign(moe.begin(), moe.begin() + n);
  MOESHARD_ASSIGN_OR_RETURN(out->runtime, MoeRuntime::Create(plan, out->views, comm, ctx, ro));
  return Status::Ok();
}

}  // namespace

Result<ShardedJobResult> RunShardedJob(const ShardedJobSpec& spec, Communicator& world) {
  if (spec.plan == nullptr) return InvalidArgumentError("run: 'plan': expected a plan");
  const ShardPlan& plan = *spec.plan;
  const ResolvedTopology& topo = plan.topology;
  const int64_t rank = world.rank();
  const int64_t H = plan.model.hidden_size;
  const int64_t k = plan.model.num_experts_per_tok;
  if (spec.iters < 1 || spec.warmup < 0) {
    return InvalidArgumentError(
        fmt::format("run: '--iters': expected >= 1 timed iterations, got {} (warm-up {})",
                    spec.iters, spec.warmup));
  }
  const RankCoords& rc = plan.ranks.at(rank).coords;
  const int64_t units = topo.dp * topo.pcp;
  const int64_t unit = rc.group_rank / topo.tp;

  // This unit's tokens.
  std::vector<int64_t> unit_tokens(units), unit_offset(units + 1, 0);
  if (spec.inputs != nullptr) {
    const int64_t total = static_cast<int64_t>(spec.inputs->size()) / H;
    for (int64_t u = 0; u < units; ++u) unit_tokens[u] = TokenChunk(total, units, u).size();
  } else {
    if (spec.tokens_per_unit.empty()) {
      return InvalidArgumentError("run: '--tokens': expected at least one count");
    }
    for (int64_t u = 0; u < units; ++u) {
      unit_tokens[u] = spec.tokens_per_unit[u % spec.tokens_per_unit.size()];
      if (unit_tokens[u] < 0) {
        return InvalidArgumentError(
            fmt::format("run: '--tokens': expected >= 0, got {}", unit_tokens[u]));
      }
    }
  }
  for (int64_t u = 0; u < units; ++u) unit_offset[u + 1] = unit_offset[u] + unit_tokens[u];
  const int64_t T = unit_tokens[unit];
  const int64_t max_tokens = *std::max_element(unit_tokens.begin(), unit_tokens.end());
  std::vector<float> x32(T * H);
  if (spec.inputs != nullptr) {
    std::copy(spec.inputs->begin() + unit_offset[unit] * H,
              spec.inputs->begin() + unit_offset[unit + 1] * H, x32.begin());
  } else {
    DummyHiddenStates(spec.input_seed, unit, T, H, x32.data());
  }
  // Token ids, for layers that route by them.
  std::vector<int32_t> tokens;
  if (spec.token_ids != nullptr) {
    if (static_cast<int64_t>(spec.token_ids->size()) != unit_offset[units]) {
      return InvalidArgumentError(
          fmt::format("run: 'token_ids': expected one per input row ({}), got {}",
                      unit_offset[units], spec.token_ids->size()));
    }
    tokens.assign(spec.token_ids->begin() + unit_offset[unit],
                  spec.token_ids->begin() + unit_offset[unit + 1]);
  } else if (plan.model.num_hash_layers() > 0) {
    tokens.resize(static_cast<size_t>(T));
    DummyTokenIds(spec.input_seed, unit, T, plan.model.vocab_size, tokens.data());
  }
  const int32_t* ids = nullptr;
  const float* wts = nullptr;
  if (spec.topk_ids != nullptr && spec.topk_weights != nullptr) {
    ids = spec.topk_ids->data() + unit_offset[unit] * k;
    wts = spec.topk_weights->data() + unit_offset[unit] * k;
  }
  // The hidden states as Forward receives them.
  std::vector<bf16_t> x16;
  const void* x = x32.data();
  if (spec.io_dtype == DType::kBF16) {
    x16.resize(x32.size());
    for (size_t i = 0; i < x32.size(); ++i) x16[i] = FloatToBf16(x32[i]);
    x = x16.data();
  } else if (spec.io_dtype != DType::kF32) {
    return InvalidArgumentError(
        fmt::format("run: 'dtype': expected BF16 or F32, got {}", DTypeName(spec.io_dtype)));
  }

  MOESHARD_ASSIGN_OR_RETURN(
      KernelContext ctx,
      KernelContext::Create({.num_threads = std::max(1, spec.kernel_threads),
                             .cpus = static_cast<size_t>(rank) < spec.rank_cpus.size()
                                         ? spec.rank_cpus[static_cast<size_t>(rank)]
                                         : std::vector<int>{}}));
  // Pin this rank's thread (the pool's thread 0) before loading, so the pages it first touches
  // (the weights it copies in) come from its own NUMA node's memory.
  ctx.pool().ParallelFor(1, 1, [](int64_t, int64_t, int) {});
  Instance inst;
  const auto load_start = std::chrono::steady_clock::now();
  MOESHARD_RETURN_IF_ERROR(Build(plan, rank, spec, world, ctx, max_tokens, &inst));
  const double load_seconds = Seconds(load_start);
  MoeRuntime& rt = *inst.runtime;
  const int64_t nl = rt.num_layers();

  std::vector<uint8_t> out_bytes(T * H * 4);
  std::vector<float> layer_out(nl * T * H);
  std::vector<double> seconds(nl), seconds_sum(nl, 0.0);
  ForwardArgs args;
  args.x = x;
  args.x_dtype = spec.io_dtype;
  args.num_tokens = T;
  args.topk_ids = ids;
  args.topk_weights = wts;
  args.token_ids = tokens.empty() ? nullptr : tokens.data();
  args.out = out_bytes.data();
  args.layer_outputs = layer_out.data();
  args.layer_seconds = seconds.data();
  for (int i = 0; i < spec.warmup; ++i) MOESHARD_RETURN_IF_ERROR(rt.Forward(args));
  double iter_sum = 0;
  for (int i = 0; i < spec.iters; ++i) {
    MOESHARD_RETURN_IF_ERROR(world.Barrier());
    const auto start = std::chrono::steady_clock::now();
    MOESHARD_RETURN_IF_ERROR(rt.Forward(args));
    iter_sum += Seconds(start);
    for (int64_t l = 0; l < nl; ++l) seconds_sum[l] += seconds[l];
  }

  RankReport me;
  me.rank = rank;
  me.num_tokens = T;
  me.measured_bytes = inst.stats.bytes_by_category;
  me.planned_bytes = PlannedBytesByCategory(plan.ranks[rank],
                                            LayersToBuild(plan, plan.ranks[rank], spec.num_layers));
  me.workspace_bytes = rt.WorkspaceBytes();
  me.iter_seconds = iter_sum / spec.iters;
  me.load_seconds = load_seconds;
  for (int64_t l = 0; l < nl; ++l) me.layer_seconds.push_back(seconds_sum[l] / spec.iters);

  if (spec.verify) {
    // The single-rank reference of this unit's tokens, on this rank alone.
    MOESHARD_ASSIGN_OR_RETURN(auto solo, world.Split(static_cast<int>(rank), 0));
    MOESHARD_ASSIGN_OR_RETURN(ShardPlan plan1,
                              BuildShardPlan(plan.model, SingleRankPlanOptions(plan.options)));
    // The reference keeps bf16 experts row-major, so verification also crosses the layouts.
    ShardedJobSpec ref_spec = spec;
    ref_spec.cpu_row_groups = false;
    if (spec.reference_load) ref_spec.load = *spec.reference_load;
    Instance ref;
    MOESHARD_RETURN_IF_ERROR(Build(plan1, 0, ref_spec, *solo, ctx, std::max<int64_t>(T, 1), &ref)
                                 .WithContext("run: single-rank reference"));
    std::vector<uint8_t> ref_bytes(T * H * 4);
    std::vector<float> ref_layers(nl * T * H);
    ForwardArgs ra = args;
    ra.out = ref_bytes.data();
    ra.layer_outputs = ref_layers.data();
    ra.layer_seconds = nullptr;
    MOESHARD_RETURN_IF_ERROR(ref.runtime->Forward(ra).WithContext("run: single-rank reference"));
    if (nl > 0) {
      const size_t off = static_cast<size_t>((nl - 1) * T * H);
      me.error = CompareOutputs({layer_out.data() + off, static_cast<size_t>(T * H)},
                                {ref_layers.data() + off, static_cast<size_t>(T * H)});
    }
  }

  // Every rank's report to every rank, as a fixed-size record of doubles.
  const size_t rec = 5 + 2 * kNumCategories + 5 + static_cast<size_t>(nl);
  std::vector<double> mine(rec, 0.0), all(rec * world.size());
  {
    size_t i = 0;
    mine[i++] = static_cast<double>(me.rank);
    mine[i++] = static_cast<double>(me.num_tokens);
    mine[i++] = static_cast<double>(me.workspace_bytes);
    mine[i++] = me.iter_seconds;
    mine[i++] = me.load_seconds;
    for (TensorCategory c : kAllCategories) {
      auto m = me.measured_bytes.find(c);
      mine[i++] = m == me.measured_bytes.end() ? 0.0 : static_cast<double>(m->second);
    }
    for (TensorCategory c : kAllCategories) {
      auto p = me.planned_bytes.find(c);
      mine[i++] = p == me.planned_bytes.end() ? 0.0 : static_cast<double>(p->second);
    }
    mine[i++] = static_cast<double>(me.error.count);
    mine[i++] = me.error.max_abs_err;
    mine[i++] = me.error.sum_abs_err;
    mine[i++] = me.error.max_abs_ref;
    mine[i++] = static_cast<double>(me.error.num_nonfinite);
    for (int64_t l = 0; l < nl; ++l) mine[i++] = me.layer_seconds[l];
  }
  MOESHARD_RETURN_IF_ERROR(world.AllGather(mine.data(), all.data(), rec * sizeof(double)));
  ShardedJobResult result;
  result.layers = rt.layers();
  result.total_tokens = unit_offset[units];
  result.row_group_layers = inst.row_group_layers;
  for (int r = 0; r < world.size(); ++r) {
    const double* d = all.data() + r * rec;
    RankReport rr;
    size_t i = 0;
    rr.rank = static_cast<int64_t>(d[i++]);
    rr.num_tokens = static_cast<int64_t>(d[i++]);
    rr.workspace_bytes = static_cast<int64_t>(d[i++]);
    rr.iter_seconds = d[i++];
    rr.load_seconds = d[i++];
    for (TensorCategory c : kAllCategories) rr.measured_bytes[c] = static_cast<int64_t>(d[i++]);
    for (TensorCategory c : kAllCategories) rr.planned_bytes[c] = static_cast<int64_t>(d[i++]);
    rr.error.count = static_cast<int64_t>(d[i++]);
    rr.error.max_abs_err = d[i++];
    rr.error.sum_abs_err = d[i++];
    rr.error.max_abs_ref = d[i++];
    rr.error.num_nonfinite = static_cast<int64_t>(d[i++]);
    for (int64_t l = 0; l < nl; ++l) rr.layer_seconds.push_back(d[i++]);
    result.iter_seconds = std::max(result.iter_seconds, rr.iter_seconds);
    result.error.Merge(rr.error);
    result.ranks.push_back(std::move(rr));
  }

  if (spec.collect_outputs) {
    // Attention-TP rank 0 of each unit sends its unit's rows; units arrive in order.
    std::vector<size_t> counts(world.size(), 0);
    for (int r = 0; r < world.size(); ++r) {
      const RankCoords& c = plan.ranks[r].coords;
      if (c.tp_rank == 0) counts[r] = static_cast<size_t>(unit_tokens[c.group_rank / topo.tp]);
    }
    const int64_t total = result.total_tokens;
    std::vector<float> gathered(total * H);
    if (rank == 0) result.outputs.resize(nl * total * H);
    for (int64_t l = 0; l < nl; ++l) {
      const size_t send = rc.tp_rank == 0 ? static_cast<size_t>(T) : 0;
      MOESHARD_RETURN_IF_ERROR(world.AllGatherV(layer_out.data() + l * T * H, send, gathered.data(),
                                                counts, {}, H * sizeof(float)));
      if (rank == 0) {
        std::copy(gathered.begin(), gathered.end(), result.outputs.begin() + l * total * H);
      }
    }
  }
  return result;
}

}  // namespace moeshard
