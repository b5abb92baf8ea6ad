// `moeshard run`: build the ranks of a plan and run its MoE layers, sharded, on local threads
// (default) or one MPI process per rank (picked automatically under mpirun); print measured
// memory next to the plan, time per layer and tokens per second, and with --verify the error
// against the single-rank reference on the same layout-invariant weights.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "cli/run_api.h"
#include "moeshard/base/cpu_info.h"
#include "moeshard/base/numa.h"
#include "moeshard/base/numeric.h"
#include "moeshard/comm/launcher.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/kernels/kernel_backend.h"
#include "moeshard/plan/eplb.h"
#include "moeshard/runtime/moe_runtime.h"
#include "moeshard/runtime/routing_simulation.h"
#include "moeshard/runtime/sharded_job.h"
#include "moeshard/weights/presharded.h"
#include "moeshard/weights/safetensors.h"
#include "moeshard/weights/safetensors_writer.h"
#include "weights/presharded_manifest.h"

namespace moeshard::cli {
namespace {

struct RunFlags {
  PlanFlags plan;
  std::string checkpoint;
  std::string load_format = "auto";
  std::vector<int64_t> tokens = {16};
  int64_t layers = -1;
  std::string comm = "auto";  // mpi under mpirun, else local
  bool verify = false;
  int iters = 3;
  int warmup = 1;
  uint64_t seed = 0;
  std::string input;
  std::string output;
  std::string dtype = "bf16";
  std::string kernel_backend = "cpu";
  std::string isa;            // cpu backend setting; empty: its default (auto)
  std::string expert_layout;  // cpu backend setting; empty: its default (auto)
  std::string activations;    // kernel backend setting; empty: its default (bf16)
  int threads = 0;
  bool no_pin = false;
  double atol = Tolerance{}.atol;
  double rtol = Tolerance{}.rtol;
  std::string expert_load_out;     // write the measured expert load here (docs/eplb.md)
  std::string routing_simulation;  // zipf[:S] or uniform_random: replaces the router
};

struct Inputs {
  std::vector<float> hidden;  // [T, H]
  std::vector<int32_t> ids;   // [T, k] or empty
  std::vector<float> weights;
  std::vector<int32_t> tokens;  // [T] token ids or empty
};

Result<Inputs> ReadInputs(const std::string& path, const ModelConfig& m) {
  MOESHARD_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  Inputs in;
  const std::string where = fmt::format("run: '--input {}'", path);
  MOESHARD_ASSIGN_OR_RETURN(const TensorInfo* h, file->Get("hidden_states"));
  if (h->shape.size() != 2 || h->shape[1] != m.hidden_size ||
      (h->dtype != DType::kBF16 && h->dtype != DType::kF32)) {
    return InvalidArgumentError(
        fmt::format("{}: 'hidden_states': expected BF16 or F32 [T, {}], got {} [{}]", where,
                    m.hidden_size, DTypeName(h->dtype), fmt::join(h->shape, ", ")));
  }
  const int64_t T = h->shape[0];
  std::vector<std::byte> raw(h->num_bytes());
  MOESHARD_RETURN_IF_ERROR(file->ReadTensor(*h, raw));
  in.hidden.resize(T * m.hidden_size);
  for (size_t i = 0; i < in.hidden.size(); ++i) {
    if (h->dtype == DType::kF32) {
      std::memcpy(&in.hidden[i], raw.data() + 4 * i, 4);
    } else {
      bf16_t b;
      std::memcpy(&b, raw.data() + 2 * i, 2);
      in.hidden[i] = Bf16ToFloat(b);
    }
  }
  const TensorInfo* ids = file->Find("topk_ids");
  const TensorInfo* w = file->Find("topk_weights");
  if ((ids == nullptr) != (w == nullptr)) {
    return InvalidArgumentError(fmt::format(
        "{}: 'topk_ids/topk_weights': expected both or neither (routing bypass)", where));
  }
  if (ids != nullptr) {
    const std::vector<int64_t> shape = {T, m.num_experts_per_tok};
    if (ids->dtype != DType::kI32 || ids->shape != shape || w->dtype != DType::kF32 ||
        w->shape != shape) {
      return InvalidArgumentError(fmt::format(
          "{}: 'topk_ids/topk_weights': expected I32 and F32 [{}, {}], got {} [{}] and {} [{}]",
          where, T, m.num_experts_per_tok, DTypeName(ids->dtype), fmt::join(ids->shape, ", "),
          DTypeName(w->dtype), fmt::join(w->shape, ", ")));
    }
    in.ids.resize(T * m.num_experts_per_tok);
    in.weights.resize(in.ids.size());
    MOESHARD_RETURN_IF_ERROR(
        file->ReadTensor(*ids, {reinterpret_cast<std::byte*>(in.ids.data()), in.ids.size() * 4}));
    MOESHARD_RETURN_IF_ERROR(file->ReadTensor(
        *w, {reinterpret_cast<std::byte*>(in.weights.data()), in.weights.size() * 4}));
  }
  // Token ids: the input of hash-routed layers (DeepSeek-V4's first num_hash_layers).
  if (const TensorInfo* tok = file->Find("token_ids")) {
    if ((tok->dtype != DType::kI32 && tok->dtype != DType::kI64) ||
        tok->shape != std::vector<int64_t>{T}) {
      return InvalidArgumentError(
          fmt::format("{}: 'token_ids': expected I32 or I64 [{}] (one per hidden_states row), "
                      "got {} [{}]",
                      where, T, DTypeName(tok->dtype), fmt::join(tok->shape, ", ")));
    }
    std::vector<std::byte> raw_ids(tok->num_bytes());
    MOESHARD_RETURN_IF_ERROR(file->ReadTensor(*tok, raw_ids));
    in.tokens.resize(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      int64_t v = 0;
      if (tok->dtype == DType::kI64) {
        std::memcpy(&v, raw_ids.data() + 8 * t, 8);
      } else {
        int32_t v32 = 0;
        std::memcpy(&v32, raw_ids.data() + 4 * t, 4);
        v = v32;
      }
      if (v < 0 || v >= m.vocab_size) {
        return InvalidArgumentError(
            fmt::format("{}: 'token_ids[{}]': expected a token id in [0, {}) (vocab_size), got {}",
                        where, t, m.vocab_size, v));
      }
      in.tokens[static_cast<size_t>(t)] = static_cast<int32_t>(v);
    }
  }
  return in;
}

std::string Mib(int64_t bytes) {
  return fmt::format("{:.2f}", static_cast<double>(bytes) / (1 << 20));
}

// Rank 0's report. Returns false when something does not hold (memory != plan, verification).
bool PrintReport(const ShardPlan& plan, const ShardedJobSpec& spec, const ShardedJobResult& r,
                 const std::string& comm) {
  bool ok = true;
  fmt::print("moeshard run: {} on {} (world {}), backend {}, comm {}\n", plan.model.name,
             plan.topology.Label(), plan.topology.world, plan.backend.name, comm);
  if (!spec.rank_cpus.empty() && !spec.rank_cpus[0].empty()) {
    fmt::print(
        "  kernel threads pinned: rank 0 on CPUs [{}]{}\n", fmt::join(spec.rank_cpus[0], ", "),
        spec.rank_cpus.size() > 1 ? fmt::format(", rank {} on [{}]", spec.rank_cpus.size() - 1,
                                                fmt::join(spec.rank_cpus.back(), ", "))
                                  : std::string());
  }
  if (std::any_of(spec.rank_numa_nodes.begin(), spec.rank_numa_nodes.end(),
                  [](int n) { return n >= 0; })) {
    fmt::print(
        "  ranks on NUMA nodes [{}] (each rank's weights first touched by its node's CPUs)\n",
        fmt::join(spec.rank_numa_nodes, ", "));
  }
  fmt::print(
      "  MoE layers [{}], {} tokens in all ({} DP ranks holding [{}]), {} warm-up + {} timed "
      "iterations\n",
      fmt::join(r.layers, ", "), r.total_tokens, r.unit_tokens.size(),
      fmt::join(r.unit_tokens, ", "), spec.warmup, spec.iters);
  fmt::print("  kernel backend {}\n", r.kernel_backend);
  if (r.prepared_layers > 0) {
    fmt::print("  routed experts prepared in the {} ({} layers on rank 0; same bytes)\n",
               r.prepared_layout, r.prepared_layers);
  }
  fmt::print("  intermediate {} -> raw {} -> padded {}; expert hidden {} -> padded {}\n\n",
             plan.intermediate.logical, plan.intermediate.raw_local, plan.intermediate.padded_local,
             plan.hidden.logical, plan.hidden.padded_local);

  // Memory: measured (allocated by the loader) next to the plan, per category with bytes.
  std::vector<TensorCategory> cats;
  for (TensorCategory c : kAllCategories) {
    for (const RankReport& rr : r.ranks) {
      if (rr.planned_bytes.at(c) > 0 || rr.measured_bytes.at(c) > 0) {
        cats.push_back(c);
        break;
      }
    }
  }
  std::vector<std::string> header = {"rank"};
  for (TensorCategory c : cats) header.emplace_back(TensorCategoryName(c));
  header.insert(header.end(), {"total", "plan", "workspace"});
  Table mem(header, {true});
  for (const RankReport& rr : r.ranks) {
    std::vector<std::string> row = {std::to_string(rr.rank)};
    int64_t measured = 0, planned = 0;
    for (TensorCategory c : cats) {
      const int64_t m = rr.measured_bytes.at(c), p = rr.planned_bytes.at(c);
      measured += m;
      planned += p;
      row.push_back(m == p ? Mib(m) : fmt::format("{} (plan {})", Mib(m), Mib(p)));
      ok &= m == p;
    }
    row.push_back(Mib(measured));
    row.push_back(measured == planned ? Mib(planned) : Mib(planned) + " MISMATCH");
    row.push_back(Mib(rr.workspace_bytes));
    mem.Row(row);
  }
  fmt::print(
      "memory per rank, MiB (measured = allocated by the loader; plan = the ShardPlan's "
      "prediction for the layers built):\n{}\n",
      mem.Text());

  // Time per layer: the slowest rank's mean.
  std::vector<double> slow(r.layers.size(), 0.0);
  for (const RankReport& rr : r.ranks) {
    for (size_t l = 0; l < slow.size(); ++l) slow[l] = std::max(slow[l], rr.layer_seconds[l]);
  }
  std::string per_layer;
  for (size_t l = 0; l < slow.size(); ++l) {
    per_layer += fmt::format("{}layer {}: {:.3f} ms", l ? ", " : "", r.layers[l], slow[l] * 1e3);
  }
  fmt::print("time per layer (slowest rank): {}\n", per_layer);
  fmt::print("forward: {:.3f} ms for {} layers, {:.0f} tokens/s ({:.3f} ms per layer)\n",
             r.iter_seconds * 1e3, r.layers.size(),
             r.iter_seconds > 0 ? static_cast<double>(r.total_tokens) / r.iter_seconds : 0.0,
             r.layers.empty() ? 0.0 : r.iter_seconds * 1e3 / r.layers.size());
  if (spec.verify) {
    fmt::print("verify against the single-rank reference (last layer, fp32): {}\n",
               r.error.Summary(spec.tolerance));
    for (const RankReport& rr : r.ranks) {
      if (!rr.error.Passes(spec.tolerance)) {
        fmt::print("  rank {}: {}\n", rr.rank, rr.error.Summary(spec.tolerance));
      }
    }
    ok &= r.error.Passes(spec.tolerance);
  }
  if (!ok) fmt::print("FAILED\n");
  return ok;
}

// The recorded expert load (ShardedJobResult::expert_tokens / slot_tokens) as the file
// `--expert-load` reads, with the run's slots.
ExpertLoad MeasuredLoad(const ShardPlan& plan, const ShardedJobResult& r) {
  ExpertLoad load;
  load.model = plan.model.name;
  for (const std::vector<int64_t>& layer : r.expert_tokens) {
    load.layers.emplace_back(layer.begin(), layer.end());
  }
  load.slot_experts = r.slot_experts;
  for (const std::vector<int64_t>& layer : r.slot_tokens) {
    load.slot_tokens.emplace_back(layer.begin(), layer.end());
  }
  return load;
}

// What the measured load says: per layer, the tokens each EP rank's slots served and their
// max / mean, and how the hottest expert's tokens fell on its slots.
void PrintExpertLoad(const ShardPlan& plan, const ShardedJobResult& r) {
  const int64_t ep = plan.topology.moe_ep;
  for (size_t l = 0; l < r.expert_tokens.size(); ++l) {
    const std::vector<int64_t>& experts = r.expert_tokens[l];
    const std::vector<int64_t>& slots = r.slot_tokens[l];
    std::vector<int64_t> rank_tokens(static_cast<size_t>(ep), 0);
    for (size_t s = 0; s < slots.size(); ++s) rank_tokens[r.slot_ep_rank[s]] += slots[s];
    const int64_t total = std::accumulate(rank_tokens.begin(), rank_tokens.end(), int64_t{0});
    const int64_t most = *std::max_element(rank_tokens.begin(), rank_tokens.end());
    const size_t hot =
        static_cast<size_t>(std::max_element(experts.begin(), experts.end()) - experts.begin());
    std::vector<std::string> split;
    for (size_t s = 0; s < slots.size(); ++s) {
      if (r.slot_experts[s] == static_cast<int64_t>(hot)) {
        split.push_back(fmt::format("slot {} (EP rank {}): {}", s, r.slot_ep_rank[s], slots[s]));
      }
    }
    fmt::print(
        "expert load, layer {} (measured): {} (token, expert) pairs; tokens per EP rank [{}], "
        "max/mean {:.3f}; hottest expert {} ({} tokens) served by {}\n",
        r.layers[l], total, fmt::join(rank_tokens, ", "),
        total > 0 ? static_cast<double>(most) * static_cast<double>(ep) / static_cast<double>(total)
                  : 1.0,
        hot, experts[hot], fmt::join(split, ", "));
  }
}

Status WriteOutputs(const std::string& path, const ShardPlan& plan, const ShardedJobResult& r) {
  SafetensorsWriter w;
  w.SetMetadata({{"model", plan.model.name},
                 {"topology", plan.topology.Label()},
                 {"backend", plan.backend.name},
                 {"layers", fmt::format("{}", fmt::join(r.layers, ","))},
                 {"layer",
                  "out = x + latent_up(routed(norm(x))) + shared(norm(x)); see "
                  "include/moeshard/runtime/moe_runtime.h"}});
  const int64_t H = plan.model.hidden_size, T = r.total_tokens;
  for (size_t l = 0; l < r.layers.size(); ++l) {
    const float* p = r.outputs.data() + l * T * H;
    MOESHARD_RETURN_IF_ERROR(
        w.Add(fmt::format("layers.{}.hidden_states", r.layers[l]), DType::kF32, {T, H},
              {reinterpret_cast<const std::byte*>(p), static_cast<size_t>(T * H * 4)}));
  }
  return w.Finish(path);
}

// --routing-simulation: top-k ids and weights for every token of the job (the explicit inputs'
// rows, or the --tokens of every DP rank), seeded by --seed, in inputs->ids / weights.
Status SimulateInputRouting(const RunFlags& f, const ShardPlan& plan, Inputs* inputs) {
  MOESHARD_ASSIGN_OR_RETURN(const RoutingSimulation sim,
                            ParseRoutingSimulation(f.routing_simulation));
  if (!inputs->ids.empty()) {
    return InvalidArgumentError(fmt::format(
        "run: '--routing-simulation {}': the --input file already gives topk_ids (use one or "
        "the other)",
        f.routing_simulation));
  }
  int64_t total = 0;
  if (!inputs->hidden.empty()) {
    total = static_cast<int64_t>(inputs->hidden.size()) / plan.model.hidden_size;
  } else if (!f.tokens.empty()) {
    for (int64_t u = 0; u < plan.topology.num_units(); ++u) {
      total += std::max<int64_t>(0, f.tokens[static_cast<size_t>(u) % f.tokens.size()]);
    }
  }
  SimulatedRouting routed =
      SimulateRouting(sim, total, plan.model.num_experts, plan.model.num_experts_per_tok, f.seed);
  inputs->ids = std::move(routed.topk_ids);
  inputs->weights = std::move(routed.topk_weights);
  return Status::Ok();
}

int RunRun(const RunFlags& f) {
  auto fail = [](const Status& s) { return ReportError("run", s); };
  Result<RunSetup> setup = PrepareRun(f.plan, f.load_format, f.checkpoint, f.seed, f.verify);
  if (!setup.ok()) return fail(setup.status());
  const ModelConfig* model = &setup->model;
  const ShardPlan* plan = &setup->plan;

  ShardedJobSpec spec;
  spec.plan = plan;
  spec.load = setup->load;
  spec.reference_load = setup->reference_load;
  spec.num_layers = f.layers;
  spec.tokens_per_unit = f.tokens;
  spec.input_seed = f.seed;
  spec.warmup = f.warmup;
  spec.iters = f.iters;
  spec.verify = f.verify;
  spec.tolerance = Tolerance{.atol = f.atol, .rtol = f.rtol};
  spec.kernels.name = f.kernel_backend;
  if (!f.isa.empty()) spec.kernels.settings["isa"] = f.isa;
  if (!f.expert_layout.empty()) spec.kernels.settings["expert-layout"] = f.expert_layout;
  if (!f.activations.empty()) spec.kernels.settings["activations"] = f.activations;
  {
    // The backend's options checked once here (a backend of one thread), not on every rank.
    KernelBackendOptions check = spec.kernels;
    check.num_threads = 1;
    const Result<std::unique_ptr<KernelBackend>> b = CreateKernelBackend(check);
    if (!b.ok()) return fail(b.status().WithContext("run"));
  }
  spec.collect_outputs = !f.output.empty();
  if (f.dtype == "bf16") {
    spec.io_dtype = DType::kBF16;
  } else if (f.dtype == "f32" || f.dtype == "fp32") {
    spec.io_dtype = DType::kF32;
  } else {
    return fail(
        InvalidArgumentError(fmt::format("run: '--dtype {}': expected bf16 or f32", f.dtype)));
  }
  Inputs inputs;
  if (!f.input.empty()) {
    auto in = ReadInputs(f.input, *model);
    if (!in.ok()) return fail(in.status());
    inputs = std::move(*in);
    spec.inputs = &inputs.hidden;
    if (!inputs.tokens.empty()) spec.token_ids = &inputs.tokens;
    if (!inputs.ids.empty()) {
      spec.topk_ids = &inputs.ids;
      spec.topk_weights = &inputs.weights;
    }
  }
  if (!f.routing_simulation.empty()) {
    const Status s = SimulateInputRouting(f, *plan, &inputs);
    if (!s.ok()) return fail(s);
    spec.topk_ids = &inputs.ids;
    spec.topk_weights = &inputs.weights;
  }
  spec.record_expert_load = !f.expert_load_out.empty();

  // Local threads, or this process's rank of an mpirun job: the factory reads the environment.
  auto launcher = CreateLauncher({.comm = f.comm,
                                  .world = static_cast<int>(plan->topology.world),
                                  .job = plan->topology.Label(),
                                  .command = "moeshard run ..."});
  if (!launcher.ok()) return fail(launcher.status().WithContext("run"));
  spec.kernel_threads = f.threads > 0 ? f.threads : (*launcher)->DefaultThreadsPerRank();
  // Each rank's kernel threads on CPUs of their own, when the ranks do not oversubscribe them.
  if (!f.no_pin) spec.rank_cpus = (*launcher)->RankCpus(spec.kernel_threads, &spec.rank_numa_nodes);
  bool report_ok = true;  // rank 0's report held (only rank 0 prints it)
  const Status s = (*launcher)->Run([&](Communicator& w) -> Status {
    MOESHARD_ASSIGN_OR_RETURN(ShardedJobResult r, RunShardedJob(spec, w));
    if (w.rank() != 0) return Status::Ok();
    report_ok = PrintReport(*plan, spec, r, (*launcher)->name());
    if (spec.record_expert_load) {
      PrintExpertLoad(*plan, r);
      MOESHARD_RETURN_IF_ERROR(
          WriteFileAtomic(f.expert_load_out, ExpertLoadJson(MeasuredLoad(*plan, r))));
      fmt::print("wrote {} (tokens per expert of {} MoE layers, one forward; docs/eplb.md)\n",
                 f.expert_load_out, r.layers.size());
    }
    if (!f.output.empty()) {
      MOESHARD_RETURN_IF_ERROR(WriteOutputs(f.output, *plan, r));
      fmt::print("wrote {} ({} layers x [{}, {}] F32)\n", f.output, r.layers.size(), r.total_tokens,
                 plan->model.hidden_size);
    }
    std::fflush(stdout);
    return Status::Ok();
  });
  if (!s.ok()) return fail(s);
  return report_ok ? 0 : 1;
}

// ---- bench run ----------------------------------------------------------------------------------
// Sharded overhead: the same layer work (same model, same total tokens) on 1 rank and on N
// ranks, as ratios. Registered as `moeshard bench run` by bench_command.cc.

struct BenchRunFlags {
  std::string model = "tiny-kimi-k3";
  std::vector<int64_t> ranks = {2, 4};
  std::vector<std::string> modes = {"ep", "tp", "dp-ep"};
  int64_t tokens = 256;
  int64_t layers = -1;
  int iters = 5;
  int warmup = 2;
  std::string backend = "moeshard-cpu";
  std::string json;
  uint64_t seed = 0;
};

struct BenchRow {
  std::string mode;
  int64_t ranks = 1;
  std::string topology;
  int kernel_threads = 1;
  double seconds = 0;
};

Result<Topology> BenchTopology(const std::string& mode, int64_t n) {
  if (mode == "ep") return Topology{.tp = n, .enable_ep = true};
  if (mode == "tp") return Topology{.tp = n};
  if (mode == "dp-ep") return Topology{.dp = n, .enable_ep = true};
  if (mode == "dp-tp") return Topology{.dp = n};
  return InvalidArgumentError(fmt::format(
      "bench run: '--modes {}': expected ep (-tp N -ep), tp (-tp N), dp-ep (-dp N -ep) or dp-tp "
      "(-dp N)",
      mode));
}

// The slowest rank's mean forward time of `topology` on `world` (or a fresh local job when
// world is null).
Result<double> BenchOne(const ModelConfig& model, const Topology& topology, const BenchRunFlags& f,
                        int kernel_threads, Communicator* world) {
  PlanOptions o;
  o.topology = topology;
  o.backend = f.backend;
  MOESHARD_ASSIGN_OR_RETURN(ShardPlan plan, BuildShardPlan(model, o));
  const int64_t units = plan.topology.dp * plan.topology.pcp;
  if (f.tokens % units != 0) {
    return InvalidArgumentError(
        fmt::format("bench run: '--tokens {}': expected a multiple of the {} DP ranks of {}",
                    f.tokens, units, plan.topology.Label()));
  }
  ShardedJobSpec spec;
  spec.plan = &plan;
  spec.load.seed = f.seed;
  spec.num_layers = f.layers;
  spec.tokens_per_unit = {f.tokens / units};
  spec.input_seed = f.seed;
  spec.warmup = f.warmup;
  spec.iters = f.iters;
  spec.kernel_threads = kernel_threads;
  double seconds = 0;
  auto body = [&](Communicator& w) -> Status {
    MOESHARD_ASSIGN_OR_RETURN(ShardedJobResult r, RunShardedJob(spec, w));
    if (w.rank() == 0) seconds = r.iter_seconds;
    return Status::Ok();
  };
  if (world != nullptr) {
    MOESHARD_RETURN_IF_ERROR(body(*world));
  } else {
    MOESHARD_ASSIGN_OR_RETURN(
        auto local,
        CreateLauncher({.comm = "local", .world = static_cast<int>(plan.topology.world)}));
    MOESHARD_RETURN_IF_ERROR(local->Run(body));
  }
  return seconds;
}

Status ReportBench(const BenchRunFlags& f, const std::string& comm, const BenchRow& base,
                   const std::vector<BenchRow>& rows) {
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  fmt::print(
      "sharded overhead: {} layers of {}, {} tokens in all per iteration, {} warm-up + {} "
      "timed iterations, comm {}\nmachine: {}, {} cores; every configuration uses all cores "
      "(kernel threads per rank = max(1, cores / ranks)); more ranks than cores oversubscribe\n\n",
      f.layers < 0 ? std::string("all MoE") : std::to_string(f.layers), f.model, f.tokens, f.warmup,
      f.iters, comm, CpuDescription(), hw);
  fmt::print(
      "| mode | ranks | topology | threads/rank | ms/iter | ratio t_N/t_1 | efficiency "
      "t_1/t_N | tokens/s |\n|---|--:|---|--:|--:|--:|--:|--:|\n");
  auto line = [&](const BenchRow& r) {
    fmt::print("| {} | {} | {} | {} | {:.3f} | {:.2f} | {:.0f}% | {:.0f} |\n", r.mode, r.ranks,
               r.topology, r.kernel_threads, r.seconds * 1e3, r.seconds / base.seconds,
               100.0 * base.seconds / r.seconds, static_cast<double>(f.tokens) / r.seconds);
  };
  line(base);
  for (const BenchRow& r : rows) line(r);
  if (f.json.empty()) return Status::Ok();
  std::string j = fmt::format(
      "{{\n  \"machine\": {{\"cpu\": \"{}\", \"cores\": {}}},\n  \"model\": \"{}\",\n  "
      "\"tokens\": {},\n  \"layers\": {},\n  \"comm\": \"{}\",\n  \"iters\": {},\n  "
      "\"baseline_seconds\": {},\n  \"results\": [\n",
      CpuDescription(), hw, f.model, f.tokens, f.layers, comm, f.iters, base.seconds);
  for (size_t i = 0; i < rows.size(); ++i) {
    const BenchRow& r = rows[i];
    j += fmt::format(
        "    {{\"mode\": \"{}\", \"ranks\": {}, \"topology\": \"{}\", \"threads_per_rank\": {}, "
        "\"seconds\": {}, \"ratio\": {}, \"efficiency\": {}}}{}\n",
        r.mode, r.ranks, r.topology, r.kernel_threads, r.seconds, r.seconds / base.seconds,
        base.seconds / r.seconds, i + 1 < rows.size() ? "," : "");
  }
  j += "  ]\n}\n";
  MOESHARD_RETURN_IF_ERROR(WriteFileAtomic(f.json, j));
  fmt::print("wrote {}\n", f.json);
  return Status::Ok();
}

Status RunBenchRun(const BenchRunFlags& f) {
  MOESHARD_ASSIGN_OR_RETURN(ModelConfig model, LoadModelConfig(f.model));
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<Launcher> launcher, CreateLauncher({}));
  if (launcher->in_process()) {
    BenchRow base{"1 rank", 1, "TP1", hw, 0};
    MOESHARD_ASSIGN_OR_RETURN(base.seconds, BenchOne(model, Topology{}, f, hw, nullptr));
    // The same single rank on one core: separates the kernels' own thread scaling from the
    // cost of sharding.
    BenchRow one{"1 rank, 1 thread", 1, "TP1", 1, 0};
    MOESHARD_ASSIGN_OR_RETURN(one.seconds, BenchOne(model, Topology{}, f, 1, nullptr));
    std::vector<BenchRow> rows = {one};
    for (const std::string& mode : f.modes) {
      for (int64_t n : f.ranks) {
        MOESHARD_ASSIGN_OR_RETURN(Topology t, BenchTopology(mode, n));
        MOESHARD_ASSIGN_OR_RETURN(ResolvedTopology rt, ResolveTopology(t, model));
        const int threads = std::max(1, hw / static_cast<int>(n));
        BenchRow row{mode, n, rt.Label(), threads, 0};
        MOESHARD_ASSIGN_OR_RETURN(row.seconds, BenchOne(model, t, f, threads, nullptr));
        rows.push_back(row);
      }
    }
    return ReportBench(f, launcher->name(), base, rows);
  }
  // Under mpirun: the baseline on rank 0 alone (the others wait in a sleeping barrier), then
  // every mode at the job's size.
  const int threads = launcher->DefaultThreadsPerRank();
  return launcher->Run([&](Communicator& world) -> Status {
    const int n = world.size();
    MOESHARD_ASSIGN_OR_RETURN(auto solo, world.Split(world.rank(), 0));
    BenchRow base{"1 rank", 1, "TP1", hw, 0};
    if (world.rank() == 0) {
      MOESHARD_ASSIGN_OR_RETURN(base.seconds, BenchOne(model, Topology{}, f, hw, solo.get()));
    }
    BenchRow one{"1 rank, 1 thread", 1, "TP1", 1, 0};
    if (world.rank() == 0) {
      MOESHARD_ASSIGN_OR_RETURN(one.seconds, BenchOne(model, Topology{}, f, 1, solo.get()));
    }
    MOESHARD_RETURN_IF_ERROR(world.Barrier());
    std::vector<BenchRow> rows = {one};
    for (const std::string& mode : f.modes) {
      MOESHARD_ASSIGN_OR_RETURN(Topology t, BenchTopology(mode, n));
      MOESHARD_ASSIGN_OR_RETURN(ResolvedTopology rt, ResolveTopology(t, model));
      BenchRow row{mode, n, rt.Label(), threads, 0};
      MOESHARD_ASSIGN_OR_RETURN(row.seconds, BenchOne(model, t, f, threads, &world));
      rows.push_back(row);
    }
    if (world.rank() == 0) {
      return ReportBench(f, fmt::format("{} ({} processes)", launcher->name(), n), base, rows);
    }
    return Status::Ok();
  });
}

}  // namespace

// Declared in bench_command.cc, which lists it among the bench suites.
CommandRunner SetupBenchRun(CLI::App* bench) {
  CLI::App* sub = bench->add_subcommand(
      "run",
      "sharded overhead: the same MoE layers and total tokens on 1 rank and on N ranks (local "
      "threads, or the mpirun job's processes), as ratios");
  auto f = std::make_shared<BenchRunFlags>();
  AddModelFlag(sub, &f->model, /*required=*/false);
  sub->add_option("--ranks", f->ranks, "rank counts to compare with 1 (local; default 2,4)")
      ->delimiter(',');
  sub->add_option("--modes", f->modes,
                  "ep (-tp N -ep), tp (-tp N), dp-ep, dp-tp (default ep,tp,dp-ep)")
      ->delimiter(',');
  sub->add_option("--tokens", f->tokens, "tokens per iteration in all (default 256)");
  sub->add_option("--layers", f->layers, "the first N MoE layers (default all)");
  sub->add_option("--iters", f->iters, "timed iterations (default 5)");
  sub->add_option("--warmup", f->warmup, "untimed iterations (default 2)");
  sub->add_option("--moe-backend", f->backend, "plan backend (default moeshard-cpu)");
  sub->add_option("--seed", f->seed, "dummy weights and inputs seed");
  sub->add_option("--json", f->json, "also write the results as JSON");
  return [sub, f]() -> int {
    if (!sub->parsed()) return -1;
    const Status s = RunBenchRun(*f);
    if (!s.ok()) {
      std::fprintf(stderr, "moeshard bench run: error: %s\n", s.ToString().c_str());
      return 1;
    }
    return 0;
  };
}

namespace {

MOESHARD_REGISTER_COMMAND(
    run, CommandSpec{
             .name = "run",
             .description = "run a plan's MoE layers sharded over local threads or MPI "
                            "processes; memory vs plan, time, and --verify against one rank",
             .order = 50,
             .setup = [](CLI::App* sub) -> CommandRunner {
               auto f = std::make_shared<RunFlags>();
               AddPlanFlags(sub, &f->plan);
               sub->add_option("--checkpoint", f->checkpoint,
                               "checkpoint directory (safetensors, or presharded)");
               sub->add_option("--load-format", f->load_format, LoadFormatHelp());
               sub->add_option("--tokens", f->tokens,
                               "tokens per DP rank (one value, or one per DP rank, cycled)")
                   ->delimiter(',');
               sub->add_option("--layers", f->layers, "run the first N MoE layers (default all)");
               sub->add_option("--comm", f->comm,
                               "auto (default: mpi under mpirun, else local), local (threads) or "
                               "mpi");
               sub->add_flag("--verify", f->verify,
                             "compare with the single-rank reference; exit 1 when it fails");
               sub->add_option("--iters", f->iters, "timed iterations (default 3)");
               sub->add_option("--warmup", f->warmup, "untimed iterations first (default 1)");
               sub->add_option("--seed", f->seed, "dummy weights and inputs seed (default 0)");
               sub->add_option("--input", f->input,
                               "safetensors with hidden_states [T, H] (bf16/f32) and optionally "
                               "topk_ids [T, k] i32 + topk_weights [T, k] f32, and token_ids [T] "
                               "i32/i64 (hash-routed layers; generated from --seed when absent)");
               sub->add_option("--output", f->output,
                               "write every layer's output as safetensors (F32 [T, H])");
               sub->add_option("--dtype", f->dtype, "hidden-state dtype: bf16 (default) or f32");
               sub->add_option("--kernel-backend", f->kernel_backend,
                               "kernel backend by name: cpu (default) or reference (the scalar "
                               "oracle; slow, for tests)");
               sub->add_option("--isa", f->isa,
                               "cpu backend: instruction set, auto (default; or "
                               "MOESHARD_CPU_ISA), avx512-bf16, avx512-vnni, avx512, "
                               "avx2-vnni, avx2, neon, sve, portable");
               sub->add_option("--expert-layout", f->expert_layout,
                               "cpu backend: bf16 routed experts auto (default; the row-group "
                               "layout on AVX-512 BF16 CPUs) or row-major");
               sub->add_option(
                   "--activations", f->activations,
                   "routed experts' inputs: bf16 (default) or int8 (MXFP4, int4 and "
                   "NVFP4 experts quantize them per scale group, as llama.cpp's "
                   "q8_0; for CPUs without AVX-512 BF16, where it is faster; error up to "
                   "max|x| / 254 per input)");
               sub->add_option("--threads", f->threads,
                               "kernel threads per rank (default: cores / ranks, at least 1)");
               sub->add_flag("--no-pin", f->no_pin,
                             "do not pin each rank's kernel threads to CPUs of their own (they "
                             "are pinned when the ranks' threads fit the process's CPUs)");
               sub->add_option("--atol", f->atol, "verification: absolute tolerance (2e-2)");
               sub->add_option("--rtol", f->rtol,
                               "verification: tolerance relative to max |reference| (1e-2)");
               sub->add_option("--expert-load-out", f->expert_load_out,
                               "write the tokens routed to each expert per MoE layer (one "
                               "forward, all DP ranks) and each slot's share, in the format "
                               "--expert-load reads (docs/eplb.md)");
               sub->add_option("--routing-simulation", f->routing_simulation,
                               "replace the router: zipf[:S] (Zipf-skewed experts, exponent S, "
                               "default 1) or uniform_random, seeded by --seed (as vLLM's "
                               "VLLM_MOE_ROUTING_SIMULATION_STRATEGY; docs/eplb.md)");
               return [f] { return RunRun(*f); };
             }});

}  // namespace
}  // namespace moeshard::cli
