// `moeshard run`: build the ranks of a plan and run its MoE layers, sharded, on local threads
// (default) or one MPI process per rank (picked automatically under mpirun); print measured
// memory next to the plan, time per layer and tokens per second, and with --verify the error
// against the single-rank reference on the same layout-invariant weights.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "moeshard/base/numeric.h"
#include "moeshard/comm/local_comm.h"
#include "moeshard/comm/mpi_comm.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/runtime/moe_runtime.h"
#include "moeshard/runtime/sharded_job.h"
#include "moeshard/weights/safetensors.h"
#include "moeshard/weights/safetensors_writer.h"

namespace moeshard::cli {
namespace {

struct RunFlags {
  PlanFlags plan;
  std::string checkpoint;
  std::string load_format;  // "" = dummy without --checkpoint, else safetensors
  std::vector<int64_t> tokens = {16};
  int64_t layers = -1;
  std::string comm;  // "" = mpi under mpirun, else local
  bool verify = false;
  int iters = 3;
  int warmup = 1;
  uint64_t seed = 0;
  std::string input;
  std::string output;
  std::string dtype = "bf16";
  int threads = 0;
  double atol = Tolerance{}.atol;
  double rtol = Tolerance{}.rtol;
};

struct Inputs {
  std::vector<float> hidden;  // [T, H]
  std::vector<int32_t> ids;   // [T, k] or empty
  std::vector<float> weights;
};

Result<Inputs> ReadInputs(const std::string& path, const ModelConfig& m) {
  MOESHARD_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  Inputs in;
  const std::string where = fmt::format("run: '--input {}'", path);
  MOESHARD_ASSIGN_OR_RETURN(const TensorInfo* h, file->Get("hidden_states"));
  if (h->shape.size() != 2 || h->shape[1] != m.hidden_size ||
      (h->dtype != DType::kBF16 && h->dtype != DType::kF32)) {
    return InvalidArgumentError(fmt::format(
        "{}: 'hidden_states': expected BF16 or F32 [T, {}], got {} [{}]", where, m.hidden_size,
        DTypeName(h->dtype), fmt::join(h->shape, ", ")));
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
    MOESHARD_RETURN_IF_ERROR(file->ReadTensor(
        *ids, {reinterpret_cast<std::byte*>(in.ids.data()), in.ids.size() * 4}));
    MOESHARD_RETURN_IF_ERROR(file->ReadTensor(
        *w, {reinterpret_cast<std::byte*>(in.weights.data()), in.weights.size() * 4}));
  }
  return in;
}

std::string Mib(int64_t bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / (1 << 20)); }

// Rank 0's report. Returns false when something does not hold (memory != plan, verification).
bool PrintReport(const ShardPlan& plan, const ShardedJobSpec& spec, const ShardedJobResult& r,
                 const std::string& comm) {
  bool ok = true;
  fmt::print("moeshard run: {} on {} (world {}), backend {}, comm {}\n", plan.model.name,
             plan.topology.Label(), plan.topology.world, plan.backend.name, comm);
  fmt::print("  MoE layers [{}], {} tokens in all ({} DP ranks holding [{}]), {} warm-up + {} timed "
             "iterations\n",
             fmt::join(r.layers, ", "), r.total_tokens, plan.topology.dp * plan.topology.pcp,
             [&] {
               std::vector<int64_t> t;
               for (const RankReport& rr : r.ranks) {
                 if (plan.ranks[rr.rank].coords.tp_rank == 0) t.push_back(rr.num_tokens);
               }
               return fmt::format("{}", fmt::join(t, ", "));
             }(),
             spec.warmup, spec.iters);
  fmt::print("  intermediate {} -> raw {} -> padded {}; expert hidden {} -> padded {}\n\n",
             plan.intermediate.logical, plan.intermediate.raw_local,
             plan.intermediate.padded_local, plan.hidden.logical, plan.hidden.padded_local);

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
  for (TensorCategory c : cats) header.push_back(TensorCategoryName(c));
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
  fmt::print("memory per rank, MiB (measured = allocated by the loader; plan = the ShardPlan's "
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

Status WriteOutputs(const std::string& path, const ShardPlan& plan, const ShardedJobResult& r) {
  SafetensorsWriter w;
  w.SetMetadata({{"model", plan.model.name},
                 {"topology", plan.topology.Label()},
                 {"backend", plan.backend.name},
                 {"layers", fmt::format("{}", fmt::join(r.layers, ","))},
                 {"layer", "out = x + latent_up(routed(norm(x))) + shared(norm(x)); see "
                           "include/moeshard/runtime/moe_runtime.h"}});
  const int64_t H = plan.model.hidden_size, T = r.total_tokens;
  for (size_t l = 0; l < r.layers.size(); ++l) {
    const float* p = r.outputs.data() + l * T * H;
    MOESHARD_RETURN_IF_ERROR(w.Add(fmt::format("layers.{}.hidden_states", r.layers[l]),
                                   DType::kF32, {T, H},
                                   {reinterpret_cast<const std::byte*>(p),
                                    static_cast<size_t>(T * H * 4)}));
  }
  return w.Finish(path);
}

int RunRun(const RunFlags& f) {
  auto fail = [](const Status& s) { return ReportError("run", s); };
  auto model = LoadModelConfig(f.plan.model);
  if (!model.ok()) return fail(model.status());
  PlanFlags pf = f.plan;
  if (pf.backend == "auto") pf.backend = "moeshard-cpu";  // the kernels this binary runs
  auto options = ToPlanOptions(pf);
  if (!options.ok()) return fail(options.status());
  auto plan = BuildShardPlan(*model, *options);
  if (!plan.ok()) return fail(plan.status());

  ShardedJobSpec spec;
  spec.plan = &*plan;
  const std::string format =
      f.load_format.empty() ? (f.checkpoint.empty() ? "dummy" : "safetensors") : f.load_format;
  if (format == "dummy") {
    spec.load.source = LoadOptions::Source::kDummy;
  } else if (format == "safetensors" || format == "presharded") {
    if (f.checkpoint.empty()) {
      return fail(InvalidArgumentError(
          fmt::format("run: '--load-format {}': expected --checkpoint DIR", format)));
    }
    spec.load.source = format == "safetensors" ? LoadOptions::Source::kCheckpoint
                                               : LoadOptions::Source::kPresharded;
    spec.load.checkpoint_dir = f.checkpoint;
  } else {
    return fail(InvalidArgumentError(fmt::format(
        "run: '--load-format {}': expected dummy, safetensors or presharded", format)));
  }
  spec.load.seed = f.seed;
  spec.num_layers = f.layers;
  spec.tokens_per_unit = f.tokens;
  spec.input_seed = f.seed;
  spec.warmup = f.warmup;
  spec.iters = f.iters;
  spec.verify = f.verify;
  spec.tolerance = Tolerance{.atol = f.atol, .rtol = f.rtol};
  spec.collect_outputs = !f.output.empty();
  if (f.dtype == "bf16") {
    spec.io_dtype = DType::kBF16;
  } else if (f.dtype == "f32" || f.dtype == "fp32") {
    spec.io_dtype = DType::kF32;
  } else {
    return fail(InvalidArgumentError(
        fmt::format("run: '--dtype {}': expected bf16 or f32", f.dtype)));
  }
  Inputs inputs;
  if (!f.input.empty()) {
    auto in = ReadInputs(f.input, *model);
    if (!in.ok()) return fail(in.status());
    inputs = std::move(*in);
    spec.inputs = &inputs.hidden;
    if (!inputs.ids.empty()) {
      spec.topk_ids = &inputs.ids;
      spec.topk_weights = &inputs.weights;
    }
  }

  const bool under_mpi = LaunchedUnderMpi();
  const std::string comm = f.comm.empty() ? (under_mpi ? "mpi" : "local") : f.comm;
  const int world = static_cast<int>(plan->topology.world);
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  bool report_ok = true;
  auto per_rank = [&](Communicator& w) -> Status {
    MOESHARD_ASSIGN_OR_RETURN(ShardedJobResult r, RunShardedJob(spec, w));
    if (w.rank() != 0) return Status::Ok();
    report_ok = PrintReport(*plan, spec, r, comm);
    if (!f.output.empty()) {
      MOESHARD_RETURN_IF_ERROR(WriteOutputs(f.output, *plan, r));
      fmt::print("wrote {} ({} layers x [{}, {}] F32)\n", f.output, r.layers.size(),
                 r.total_tokens, plan->model.hidden_size);
    }
    std::fflush(stdout);
    return Status::Ok();
  };
  if (comm == "mpi") {
    if (!under_mpi) {
      return fail(FailedPreconditionError(fmt::format(
          "run: '--comm mpi': expected to run under mpirun (mpirun -np {} moeshard run ...)",
          world)));
    }
    auto session = MpiSession::Init(nullptr, nullptr);
    if (!session.ok()) return fail(session.status());
    if ((*session)->world_size() != world) {
      return fail(InvalidArgumentError(fmt::format(
          "run: 'mpirun -np': expected {} processes for {}, got {}", world,
          plan->topology.Label(), (*session)->world_size())));
    }
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int per_node = local != nullptr ? std::max(1, std::atoi(local)) : world;
    spec.kernel_threads = f.threads > 0 ? f.threads : std::max(1, hw / per_node);
    MpiCommOptions mo;
    RunMpiRank(**session, mo, per_rank);
    // Every rank learns whether rank 0's report held (exit codes agree).
    return (*session)->world_rank() == 0 && !report_ok ? 1 : 0;
  }
  if (comm != "local") {
    return fail(InvalidArgumentError(
        fmt::format("run: '--comm {}': expected local or mpi", comm)));
  }
  spec.kernel_threads = f.threads > 0 ? f.threads : std::max(1, hw / world);
  const Status s = RunLocalRanks(world, LocalCommOptions{}, per_rank);
  if (!s.ok()) return fail(s);
  return report_ok ? 0 : 1;
}

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
               sub->add_option("--load-format", f->load_format,
                               "dummy (default without --checkpoint), safetensors, presharded");
               sub->add_option("--tokens", f->tokens,
                               "tokens per DP rank (one value, or one per DP rank, cycled)")
                   ->delimiter(',');
               sub->add_option("--layers", f->layers, "run the first N MoE layers (default all)");
               sub->add_option("--comm", f->comm,
                               "local (threads, default) or mpi (default under mpirun)");
               sub->add_flag("--verify", f->verify,
                             "compare with the single-rank reference; exit 1 when it fails");
               sub->add_option("--iters", f->iters, "timed iterations (default 3)");
               sub->add_option("--warmup", f->warmup, "untimed iterations first (default 1)");
               sub->add_option("--seed", f->seed, "dummy weights and inputs seed (default 0)");
               sub->add_option("--input", f->input,
                               "safetensors with hidden_states [T, H] (bf16/f32) and optionally "
                               "topk_ids [T, k] i32 + topk_weights [T, k] f32");
               sub->add_option("--output", f->output,
                               "write every layer's output as safetensors (F32 [T, H])");
               sub->add_option("--dtype", f->dtype, "hidden-state dtype: bf16 (default) or f32");
               sub->add_option("--threads", f->threads,
                               "kernel threads per rank (default: cores / ranks, at least 1)");
               sub->add_option("--atol", f->atol, "verification: absolute tolerance (2e-2)");
               sub->add_option("--rtol", f->rtol,
                               "verification: tolerance relative to max |reference| (1e-2)");
               return [f] { return RunRun(*f); };
             }});

}  // namespace
}  // namespace moeshard::cli
