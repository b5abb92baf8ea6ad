#include "moeshard/runtime/sharded_job.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <span>
#include <type_traits>

#include "moeshard/base/numeric.h"
#include "moeshard/kernels/kernel_backend.h"
#include "moeshard/plan/topology.h"
#include "moeshard/runtime/moe_runtime.h"
#include "moeshard/runtime/weight_views.h"

namespace moeshard {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// One runtime over one plan's rank, with its weights.
struct Instance {
  RankWeights weights{0};
  WeightViews views;
  LoadStats stats;
  int64_t prepared_layers = 0;
  int64_t max_tokens = -1;  // the tokens per rank the runtime's buffers were made for
  std::unique_ptr<MoeRuntime> runtime;
};

// Loads `rank`'s weights of `plan` (spec.load) and, if `prepare`, offers the routed experts to
// the backend's weight preparation. No runtime yet (EnsureRuntime).
Status LoadInstance(const ShardPlan& plan, int64_t rank, const ShardedJobSpec& spec,
                    KernelBackend& kernels, bool prepare, Instance* out) {
  LoadOptions lo = spec.load;
  lo.max_moe_layers = spec.num_layers;
  lo.num_threads = std::max(1, spec.kernel_threads);
  MOESHARD_ASSIGN_OR_RETURN(out->weights, LoadRankWeights(plan, rank, lo, &out->stats));
  if (prepare) {
    MOESHARD_ASSIGN_OR_RETURN(out->prepared_layers,
                              PrepareExpertWeights(kernels, plan, &out->weights));
  }
  out->views = ViewRankWeights(out->weights);
  return Status::Ok();
}

// COLLECTIVE over `comm` (every rank asks for the same max_tokens): makes the instance's
// runtime, or a new one when its buffers are smaller than `max_tokens` rows.
Status EnsureRuntime(const ShardPlan& plan, const ShardedJobSpec& spec, Communicator& comm,
                     KernelBackend& kernels, int64_t max_tokens, Instance* inst) {
  if (inst->runtime != nullptr && max_tokens <= inst->max_tokens) return Status::Ok();
  inst->runtime.reset();
  MoeRuntimeOptions ro;
  ro.max_tokens = max_tokens;
  const std::vector<int64_t> moe = MoeLayersOf(plan.model, plan.ranks[comm.rank()].layers);
  const int64_t n = spec.num_layers < 0 ? static_cast<int64_t>(moe.size())
                                        : std::min<int64_t>(spec.num_layers, moe.size());
  ro.layers.assign(moe.begin(), moe.begin() + n);
  MOESHARD_ASSIGN_OR_RETURN(inst->runtime,
                            MoeRuntime::Create(plan, inst->views, comm, kernels, ro));
  inst->max_tokens = max_tokens;
  return Status::Ok();
}

// How the job's tokens fall on the units, and this rank's unit's inputs as Forward takes them.
struct UnitInputs {
  std::vector<int64_t> unit_tokens;     // [num_units] T of each unit
  std::vector<int64_t> unit_offset;     // [num_units + 1] first row of each unit in the job's rows
  int64_t unit = 0;                     // this rank's unit
  std::vector<float> x32;               // [T, H] fp32
  std::vector<bf16_t> x16;              // [T, H] bf16 (io_dtype BF16)
  std::vector<int32_t> token_ids;       // [T] or empty (no hash-routed layers, no ids given)
  const int32_t* topk_ids = nullptr;    // [T, k] routing bypass, or null
  const float* topk_weights = nullptr;  // [T, k], with topk_ids

  int64_t num_tokens() const { return unit_tokens[unit]; }
  int64_t total_tokens() const { return unit_offset.back(); }
  int64_t max_tokens() const { return *std::max_element(unit_tokens.begin(), unit_tokens.end()); }
  const void* x() const { return x16.empty() ? static_cast<const void*>(x32.data()) : x16.data(); }
};

// Tokens per unit: the explicit inputs split in order, or the counts cycled over the units.
Status SplitTokens(const ShardedJobSpec& spec, int64_t units, int64_t H, UnitInputs* in) {
  in->unit_tokens.assign(units, 0);
  if (spec.inputs != nullptr) {
    const int64_t total = static_cast<int64_t>(spec.inputs->size()) / H;
    for (int64_t u = 0; u < units; ++u) in->unit_tokens[u] = TokenChunk(total, units, u).size();
  } else {
    if (spec.tokens_per_unit.empty()) {
      return InvalidArgumentError("run: '--tokens': expected at least one count");
    }
    for (int64_t u = 0; u < units; ++u) {
      in->unit_tokens[u] = spec.tokens_per_unit[u % spec.tokens_per_unit.size()];
      if (in->unit_tokens[u] < 0) {
        return InvalidArgumentError(
            fmt::format("run: '--tokens': expected >= 0, got {}", in->unit_tokens[u]));
      }
    }
  }
  in->unit_offset.assign(units + 1, 0);
  for (int64_t u = 0; u < units; ++u) {
    in->unit_offset[u + 1] = in->unit_offset[u] + in->unit_tokens[u];
  }
  return Status::Ok();
}

Result<UnitInputs> PrepareInputs(const ShardedJobSpec& spec, int64_t rank) {
  const ShardPlan& plan = *spec.plan;
  const int64_t H = plan.model.hidden_size;
  const int64_t k = plan.model.num_experts_per_tok;
  UnitInputs in;
  MOESHARD_RETURN_IF_ERROR(SplitTokens(spec, plan.topology.num_units(), H, &in));
  in.unit = UnitOf(plan.topology, rank);
  const int64_t T = in.num_tokens(), first = in.unit_offset[in.unit];
  in.x32.resize(T * H);
  if (spec.inputs != nullptr) {
    std::copy(spec.inputs->begin() + first * H, spec.inputs->begin() + (first + T) * H,
              in.x32.begin());
  } else {
    DummyHiddenStates(spec.input_seed, in.unit, T, H, in.x32.data());
  }
  // Token ids, for layers that route by them.
  if (spec.token_ids != nullptr) {
    if (static_cast<int64_t>(spec.token_ids->size()) != in.total_tokens()) {
      return InvalidArgumentError(
          fmt::format("run: 'token_ids': expected one per input row ({}), got {}",
                      in.total_tokens(), spec.token_ids->size()));
    }
    in.token_ids.assign(spec.token_ids->begin() + first, spec.token_ids->begin() + first + T);
  } else if (plan.model.num_hash_layers() > 0) {
    in.token_ids.resize(static_cast<size_t>(T));
    DummyTokenIds(spec.input_seed, in.unit, T, plan.model.vocab_size, in.token_ids.data());
  }
  if (spec.topk_ids != nullptr && spec.topk_weights != nullptr) {
    in.topk_ids = spec.topk_ids->data() + first * k;
    in.topk_weights = spec.topk_weights->data() + first * k;
  }
  // The hidden states as Forward receives them.
  if (spec.io_dtype == DType::kBF16) {
    in.x16.resize(in.x32.size());
    for (size_t i = 0; i < in.x32.size(); ++i) in.x16[i] = FloatToBf16(in.x32[i]);
  } else if (spec.io_dtype != DType::kF32) {
    return InvalidArgumentError(
        fmt::format("run: 'dtype': expected BF16 or F32, got {}", DTypeName(spec.io_dtype)));
  }
  return in;
}

// This rank's single-rank reference (verification): the whole model on a communicator of its
// own, built on the first verified run and kept.
struct Reference {
  std::unique_ptr<Communicator> solo;
  ShardPlan plan;
  Instance inst;
};

// The single-rank reference of this unit's tokens, on this rank alone (COLLECTIVE over `world`
// for the split, on the first call), compared with the sharded run's last layer `last_layer`
// ([T, H] fp32).
Result<ErrorStats> VerifyAgainstReference(const ShardedJobSpec& spec, Communicator& world,
                                          KernelBackend& kernels, const ForwardArgs& args,
                                          std::span<const float> last_layer, int64_t num_layers,
                                          std::unique_ptr<Reference>* cache) {
  const ShardPlan& plan = *spec.plan;
  const int64_t T = args.num_tokens, H = plan.model.hidden_size;
  if (*cache == nullptr) {
    auto ref = std::make_unique<Reference>();
    MOESHARD_ASSIGN_OR_RETURN(ref->solo, world.Split(static_cast<int>(world.rank()), 0));
    MOESHARD_ASSIGN_OR_RETURN(ref->plan,
                              BuildShardPlan(plan.model, SingleRankPlanOptions(plan.options)));
    // The reference keeps the experts as loaded (not prepared), so verification also crosses
    // the backend's layouts. Its loading is not the job's progress.
    ShardedJobSpec ref_spec = spec;
    if (spec.reference_load) ref_spec.load = *spec.reference_load;
    ref_spec.load.progress = nullptr;
    MOESHARD_RETURN_IF_ERROR(
        LoadInstance(ref->plan, 0, ref_spec, kernels, /*prepare=*/false, &ref->inst)
            .WithContext("run: single-rank reference"));
    *cache = std::move(ref);
  }
  Reference& ref = **cache;
  MOESHARD_RETURN_IF_ERROR(
      EnsureRuntime(ref.plan, spec, *ref.solo, kernels, std::max<int64_t>(T, 1), &ref.inst)
          .WithContext("run: single-rank reference"));
  std::vector<uint8_t> ref_bytes(T * H * 4);
  std::vector<float> ref_layers(num_layers * T * H);
  ForwardArgs ra = args;
  ra.out = ref_bytes.data();
  ra.layer_outputs = ref_layers.data();
  ra.layer_seconds = nullptr;
  ra.expert_counts = nullptr;  // the sharded run's counts stay as it recorded them
  ra.slot_counts = nullptr;
  MOESHARD_RETURN_IF_ERROR(ref.inst.runtime->Forward(ra).WithContext("run: single-rank reference"));
  if (num_layers == 0) return ErrorStats{};
  const size_t off = static_cast<size_t>((num_layers - 1) * T * H);
  return CompareOutputs(last_layer, {ref_layers.data() + off, static_cast<size_t>(T * H)});
}

// One rank's report as it travels to every rank: a fixed-size, trivially copyable record
// (the per-layer times follow separately, num_layers doubles per rank).
struct RankRecord {
  int64_t rank = 0;
  int64_t num_tokens = 0;
  int64_t workspace_bytes = 0;
  double iter_seconds = 0;
  double load_seconds = 0;
  std::array<int64_t, kNumCategories> measured_bytes{};  // by kAllCategories order
  std::array<int64_t, kNumCategories> planned_bytes{};
  ErrorStats error;
};
static_assert(std::is_trivially_copyable_v<RankRecord>);

std::array<int64_t, kNumCategories> ByCategory(const std::map<TensorCategory, int64_t>& bytes) {
  std::array<int64_t, kNumCategories> out{};
  for (size_t i = 0; i < kNumCategories; ++i) {
    auto it = bytes.find(kAllCategories[i]);
    out[i] = it == bytes.end() ? 0 : it->second;
  }
  return out;
}

std::map<TensorCategory, int64_t> FromCategories(const std::array<int64_t, kNumCategories>& a) {
  std::map<TensorCategory, int64_t> out;
  for (size_t i = 0; i < kNumCategories; ++i) out[kAllCategories[i]] = a[i];
  return out;
}

// COLLECTIVE over `world`: every rank's report, by world rank. Every category appears in the
// byte maps (0 where a rank has none).
Result<std::vector<RankReport>> GatherReports(Communicator& world, const RankReport& me) {
  RankRecord mine{.rank = me.rank,
                  .num_tokens = me.num_tokens,
                  .workspace_bytes = me.workspace_bytes,
                  .iter_seconds = me.iter_seconds,
                  .load_seconds = me.load_seconds,
                  .measured_bytes = ByCategory(me.measured_bytes),
                  .planned_bytes = ByCategory(me.planned_bytes),
                  .error = me.error};
  // An index into one rank's output means nothing on another.
  mine.error.worst_index = -1;
  const size_t n = static_cast<size_t>(world.size()), nl = me.layer_seconds.size();
  std::vector<RankRecord> all(n);
  std::vector<double> layer_seconds(n * nl);
  MOESHARD_RETURN_IF_ERROR(world.AllGather(&mine, all.data(), sizeof(RankRecord)));
  if (nl > 0) {  // the same on every rank: the MoE layers of the one stage
    MOESHARD_RETURN_IF_ERROR(
        world.AllGather(me.layer_seconds.data(), layer_seconds.data(), nl * sizeof(double)));
  }
  std::vector<RankReport> reports(n);
  for (size_t r = 0; r < n; ++r) {
    const RankRecord& d = all[r];
    RankReport& rr = reports[r];
    rr.rank = d.rank;
    rr.num_tokens = d.num_tokens;
    rr.workspace_bytes = d.workspace_bytes;
    rr.iter_seconds = d.iter_seconds;
    rr.load_seconds = d.load_seconds;
    rr.measured_bytes = FromCategories(d.measured_bytes);
    rr.planned_bytes = FromCategories(d.planned_bytes);
    rr.error = d.error;
    rr.layer_seconds.assign(layer_seconds.begin() + r * nl, layer_seconds.begin() + (r + 1) * nl);
  }
  return reports;
}

// COLLECTIVE over `world`: rank 0 receives every layer's output of every token, units in order
// (attention-TP rank 0 of each unit sends its unit's rows). layer_out: [num_layers, T, H].
Status CollectOutputs(const ShardPlan& plan, const UnitInputs& in, Communicator& world,
                      const std::vector<float>& layer_out, int64_t num_layers,
                      std::vector<float>* outputs) {
  const ResolvedTopology& topo = plan.topology;
  const int64_t H = plan.model.hidden_size, T = in.num_tokens(), total = in.total_tokens();
  const auto sends = [&](int64_t r) { return RankInGroup(topo, RankGroup::kTp, r) == 0; };
  std::vector<size_t> counts(world.size(), 0);
  for (int r = 0; r < world.size(); ++r) {
    if (sends(r)) counts[r] = static_cast<size_t>(in.unit_tokens[UnitOf(topo, r)]);
  }
  std::vector<float> gathered(total * H);
  if (world.rank() == 0) outputs->resize(num_layers * total * H);
  for (int64_t l = 0; l < num_layers; ++l) {
    const size_t send = sends(world.rank()) ? static_cast<size_t>(T) : 0;
    MOESHARD_RETURN_IF_ERROR(world.AllGatherV(layer_out.data() + l * T * H, send, gathered.data(),
                                              counts, {}, H * sizeof(float)));
    if (world.rank() == 0) {
      std::copy(gathered.begin(), gathered.end(), outputs->begin() + l * total * H);
    }
  }
  return Status::Ok();
}

// COLLECTIVE over `world`: the expert load of the last forward (docs/eplb.md), summed over the
// world. experts: [nl, E] this rank's ForwardArgs::expert_counts; slots: [nl, its slots]
// ForwardArgs::slot_counts.
Status GatherExpertLoad(const ShardPlan& plan, Communicator& world,
                        const std::vector<int64_t>& experts, const std::vector<int64_t>& slots,
                        int64_t nl, ShardedJobResult* result) {
  const ResolvedTopology& topo = plan.topology;
  const int64_t E = plan.model.num_experts, n = world.size();
  int64_t max_slots = 0;
  for (const RankPlan& rp : plan.ranks) {
    max_slots = std::max<int64_t>(max_slots, static_cast<int64_t>(rp.expert_slots.size()));
  }
  // One fixed-size record per rank: [nl, E] expert counts, then [nl, max_slots] slot counts.
  const int64_t record = nl * (E + max_slots);
  std::vector<int64_t> mine(record, 0), all(record * n);
  std::copy(experts.begin(), experts.end(), mine.begin());
  const int64_t S = nl > 0 ? static_cast<int64_t>(slots.size()) / nl : 0;
  for (int64_t l = 0; l < nl; ++l) {
    std::copy(slots.begin() + l * S, slots.begin() + (l + 1) * S,
              mine.begin() + nl * E + l * max_slots);
  }
  if (record > 0) {  // nl is the same on every rank
    MOESHARD_RETURN_IF_ERROR(world.AllGather(mine.data(), all.data(), record * sizeof(int64_t)));
  }
  result->expert_tokens.assign(nl, std::vector<int64_t>(E, 0));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t l = 0; l < nl; ++l) {
      for (int64_t e = 0; e < E; ++e) result->expert_tokens[l][e] += all[r * record + l * E + e];
    }
  }
  // The slots of each EP rank, as its moe_tp rank 0 counted them.
  std::vector<int64_t> by_ep(topo.moe_ep, -1);
  for (int64_t r = 0; r < n; ++r) {
    const RankCoords c = CoordsOf(topo, r);
    if (c.moe_tp_rank == 0 && c.pp_stage == 0) by_ep[c.moe_ep_rank] = r;
  }
  result->slot_experts.clear();
  result->slot_ep_rank.clear();
  result->slot_tokens.assign(nl, {});
  for (int64_t p = 0; p < topo.moe_ep; ++p) {
    const int64_t r = by_ep[p];
    if (r < 0) continue;
    const std::vector<int64_t>& held = plan.ranks[r].expert_slots;
    result->slot_experts.insert(result->slot_experts.end(), held.begin(), held.end());
    result->slot_ep_rank.insert(result->slot_ep_rank.end(), held.size(), p);
    for (int64_t l = 0; l < nl; ++l) {
      const int64_t* base = all.data() + r * record + nl * E + l * max_slots;
      result->slot_tokens[l].insert(result->slot_tokens[l].end(), base, base + held.size());
    }
  }
  return Status::Ok();
}

}  // namespace

struct ShardedJob::State {
  State(const ShardedJobSpec& s, Communicator& w) : spec(s), world(w) {}
  ShardedJobSpec spec;  // as created: the plan, weights, backend and threads
  Communicator& world;
  std::unique_ptr<KernelBackend> kernels;
  Instance inst;
  double load_seconds = 0;
  std::unique_ptr<Reference> reference;  // built on the first verified run
};

ShardedJob::ShardedJob(std::unique_ptr<State> state) : state_(std::move(state)) {}
ShardedJob::~ShardedJob() = default;

Result<std::unique_ptr<ShardedJob>> ShardedJob::Create(const ShardedJobSpec& spec,
                                                       Communicator& world) {
  if (spec.plan == nullptr) return InvalidArgumentError("run: 'plan': expected a plan");
  const int64_t rank = world.rank();
  MOESHARD_ASSIGN_OR_RETURN(const UnitInputs in, PrepareInputs(spec, rank));
  auto state = std::make_unique<State>(spec, world);
  // The backend pins this rank's threads at creation, before loading, so the pages they first
  // touch (the weights copied in) come from their own NUMA node's memory.
  KernelBackendOptions ko = spec.kernels;
  ko.num_threads = std::max(1, spec.kernel_threads);
  ko.cpus = static_cast<size_t>(rank) < spec.rank_cpus.size()
                ? spec.rank_cpus[static_cast<size_t>(rank)]
                : std::vector<int>{};
  MOESHARD_ASSIGN_OR_RETURN(state->kernels, CreateKernelBackend(ko));
  const auto load_start = std::chrono::steady_clock::now();
  MOESHARD_RETURN_IF_ERROR(
      LoadInstance(*spec.plan, rank, spec, *state->kernels, /*prepare=*/true, &state->inst));
  MOESHARD_RETURN_IF_ERROR(
      EnsureRuntime(*spec.plan, spec, world, *state->kernels, in.max_tokens(), &state->inst));
  state->load_seconds = Seconds(load_start);
  return std::unique_ptr<ShardedJob>(new ShardedJob(std::move(state)));
}

namespace {

Status CheckRunFields(const ShardedJobSpec& spec) {
  if (spec.iters < 1 || spec.warmup < 0) {
    return InvalidArgumentError(
        fmt::format("run: '--iters': expected >= 1 timed iterations, got {} (warm-up {})",
                    spec.iters, spec.warmup));
  }
  return Status::Ok();
}

// The job as created, with `run`'s tokens, inputs, routing, timing and verification.
ShardedJobSpec WithRunFields(const ShardedJobSpec& built, const ShardedJobSpec& run) {
  ShardedJobSpec s = built;
  s.tokens_per_unit = run.tokens_per_unit;
  s.input_seed = run.input_seed;
  s.inputs = run.inputs;
  s.topk_ids = run.topk_ids;
  s.topk_weights = run.topk_weights;
  s.token_ids = run.token_ids;
  s.io_dtype = run.io_dtype;
  s.warmup = run.warmup;
  s.iters = run.iters;
  s.verify = run.verify;
  s.tolerance = run.tolerance;
  s.collect_outputs = run.collect_outputs;
  s.record_expert_load = run.record_expert_load;
  return s;
}

}  // namespace

Result<ShardedJobResult> ShardedJob::Run(const ShardedJobSpec& run) {
  State& st = *state_;
  if (run.plan != nullptr && run.plan != st.spec.plan) {
    return InvalidArgumentError("run: 'plan': expected the plan the job was created with");
  }
  const ShardedJobSpec spec = WithRunFields(st.spec, run);
  const ShardPlan& plan = *spec.plan;
  Communicator& world = st.world;
  const int64_t rank = world.rank();
  const int64_t H = plan.model.hidden_size;
  MOESHARD_RETURN_IF_ERROR(CheckRunFields(spec));
  MOESHARD_ASSIGN_OR_RETURN(const UnitInputs in, PrepareInputs(spec, rank));
  const int64_t T = in.num_tokens();
  MOESHARD_RETURN_IF_ERROR(
      EnsureRuntime(plan, spec, world, *st.kernels, in.max_tokens(), &st.inst));
  MoeRuntime& rt = *st.inst.runtime;
  const int64_t nl = rt.num_layers();
  std::vector<uint8_t> out_bytes(T * H * 4);
  std::vector<float> layer_out(nl * T * H);
  std::vector<double> seconds(nl), seconds_sum(nl, 0.0);
  ForwardArgs args;
  args.x = in.x();
  args.x_dtype = spec.io_dtype;
  args.num_tokens = T;
  args.topk_ids = in.topk_ids;
  args.topk_weights = in.topk_weights;
  args.token_ids = in.token_ids.empty() ? nullptr : in.token_ids.data();
  args.out = out_bytes.data();
  args.layer_outputs = layer_out.data();
  args.layer_seconds = seconds.data();
  std::vector<int64_t> expert_counts, slot_counts;  // [nl, E], [nl, slots]: the last forward's
  if (spec.record_expert_load) {
    expert_counts.assign(nl * rt.num_experts(), 0);
    slot_counts.assign(nl * rt.num_expert_slots(), 0);
    args.expert_counts = expert_counts.data();
    args.slot_counts = slot_counts.data();
  }
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
  me.measured_bytes = st.inst.stats.bytes_by_category;
  me.planned_bytes = PlannedBytesByCategory(plan.ranks[rank],
                                            LayersToBuild(plan, plan.ranks[rank], spec.num_layers));
  me.workspace_bytes = rt.WorkspaceBytes();
  me.iter_seconds = iter_sum / spec.iters;
  me.load_seconds = st.load_seconds;
  for (int64_t l = 0; l < nl; ++l) me.layer_seconds.push_back(seconds_sum[l] / spec.iters);
  if (spec.verify) {
    const std::span<const float> last =
        nl > 0 ? std::span<const float>(layer_out).subspan((nl - 1) * T * H, T * H)
               : std::span<const float>();
    MOESHARD_ASSIGN_OR_RETURN(
        me.error, VerifyAgainstReference(spec, world, *st.kernels, args, last, nl, &st.reference));
  }

  ShardedJobResult result;
  result.layers = rt.layers();
  result.total_tokens = in.total_tokens();
  result.unit_tokens = in.unit_tokens;
  result.kernel_backend = st.kernels->Describe();
  result.prepared_layers = st.inst.prepared_layers;
  result.prepared_layout = st.kernels->PreparedLayout();
  MOESHARD_ASSIGN_OR_RETURN(result.ranks, GatherReports(world, me));
  for (const RankReport& rr : result.ranks) {
    result.iter_seconds = std::max(result.iter_seconds, rr.iter_seconds);
    result.error.Merge(rr.error);
  }
  if (spec.collect_outputs) {
    MOESHARD_RETURN_IF_ERROR(CollectOutputs(plan, in, world, layer_out, nl, &result.outputs));
  }
  if (spec.record_expert_load) {
    MOESHARD_RETURN_IF_ERROR(
        GatherExpertLoad(plan, world, expert_counts, slot_counts, nl, &result));
  }
  return result;
}

Result<ShardedJobResult> RunShardedJob(const ShardedJobSpec& spec, Communicator& world) {
  MOESHARD_RETURN_IF_ERROR(CheckRunFields(spec));
  MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<ShardedJob> job, ShardedJob::Create(spec, world));
  return job->Run(spec);
}

}  // namespace moeshard
