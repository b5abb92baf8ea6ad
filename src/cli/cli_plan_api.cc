#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/plan_api.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/plan/advice.h"
#include "plan/plan_json.h"

namespace moeshard::cli {
namespace {

Status Positive(const char* flag, int64_t value) {
  if (value >= 1) return Status::Ok();
  return InvalidArgumentError(fmt::format("'{} {}': expected a positive integer", flag, value));
}

Result<std::vector<int64_t>> ParseGpuList(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 65536) {
      return InvalidArgumentError(fmt::format(
          "sweep: '--gpus {}': expected a comma-separated list of GPU counts like 8,16,32,64, "
          "got '{}'",
          s, item));
    }
    out.push_back(v);
  }
  if (out.empty()) return InvalidArgumentError("sweep: '--gpus': expected at least one GPU count");
  return out;
}

SweepRow RowOf(const GridPoint& p, const MemoryOptions& memory) {
  const MemoryPlan mp = PlanMemory(p.plan, memory);
  SweepRow r;
  r.strategy = p.strategy;
  r.label = p.plan.topology.Label();
  r.gpus = p.gpus;
  r.backend = p.plan.backend.name;
  r.kv_tokens = INT64_MAX;
  for (const RankPlan& rank : p.plan.ranks) {
    if (rank.WeightBytes() > r.weights) {
      r.weights = rank.WeightBytes();
      r.routed = rank.BytesOf(TensorCategory::kRoutedExperts);
      r.waste = rank.PaddingBytesOf(TensorCategory::kRoutedExperts);
    }
  }
  for (const RankMemory& rm : mp.ranks) r.kv_tokens = std::min(r.kv_tokens, rm.kv_tokens);
  r.max_model_len = mp.max_model_len;
  r.fits = mp.fits;
  r.i_raw = p.plan.intermediate.raw_local;
  r.i_padded = p.plan.intermediate.padded_local;
  return r;
}

}  // namespace

Status ValidatePlanFlags(const PlanFlags& f) {
  MOESHARD_RETURN_IF_ERROR(Positive("--tensor-parallel-size", f.tp));
  MOESHARD_RETURN_IF_ERROR(Positive("--data-parallel-size", f.dp));
  MOESHARD_RETURN_IF_ERROR(Positive("--pipeline-parallel-size", f.pp));
  MOESHARD_RETURN_IF_ERROR(Positive("--pcp", f.pcp));
  if (f.moe_tp < 0 || f.moe_ep < 0) {
    return InvalidArgumentError(
        fmt::format("'--moe-tp {} --moe-ep {}': expected positive sizes (or leave both unset)",
                    f.moe_tp, f.moe_ep));
  }
  if (f.num_redundant_experts < 0 && f.num_redundant_experts != kRedundantExpertsAuto) {
    return InvalidArgumentError(
        fmt::format("'--num-redundant-experts {}': expected a non-negative integer or auto",
                    f.num_redundant_experts));
  }
  return Status::Ok();
}

Status ValidateMemoryFlags(const MemoryFlags& f) {
  if (f.utilization != 0 && !(f.utilization >= 0.01 && f.utilization <= 1.0)) {
    return InvalidArgumentError(fmt::format(
        "'--gpu-memory-utilization {}': expected a fraction in [0.01, 1.0] (or 0: the engine's "
        "default)",
        f.utilization));
  }
  MOESHARD_RETURN_IF_ERROR(Positive("--concurrent-seqs", f.concurrent_seqs));
  if (f.max_num_seqs < 0) {
    return InvalidArgumentError(
        fmt::format("'--max-num-seqs {}': expected a positive count (or 0: the engine's default)",
                    f.max_num_seqs));
  }
  if (f.max_num_batched_tokens < 0) {
    return InvalidArgumentError(fmt::format(
        "'--max-num-batched-tokens {}': expected a positive count (or 0: the engine's default)",
        f.max_num_batched_tokens));
  }
  if (!(f.cuda_graph_gib >= 0)) {
    return InvalidArgumentError(
        fmt::format("'--cuda-graph-gib {}': expected a non-negative number", f.cuda_graph_gib));
  }
  if (!(f.overhead_gib >= 0)) {
    return InvalidArgumentError(
        fmt::format("'--overhead-gib {}': expected a non-negative number", f.overhead_gib));
  }
  return Status::Ok();
}

Result<PlanOutcome> ComputePlan(const PlanFlags& plan_flags, const MemoryFlags& memory_flags) {
  MOESHARD_ASSIGN_OR_RETURN(PlanInputs in, LoadPlanInputs(plan_flags, memory_flags));
  MOESHARD_ASSIGN_OR_RETURN(ShardPlan plan, BuildShardPlan(in.model, in.plan_options));
  ApplyCheckpointSizing(plan, in);
  MOESHARD_ASSIGN_OR_RETURN(const EngineProfile engine, FindEngine(in.memory_options.engine));
  MOESHARD_RETURN_IF_ERROR(CheckEngineTopology(engine, plan));
  MemoryPlan memory = PlanMemory(plan, in.memory_options);
  std::string advice;
  if (!memory.fits) advice = SmallestChangeThatFits(in.model, in.plan_options, in.memory_options);
  return PlanOutcome{std::move(in), std::move(plan), std::move(memory), std::move(advice)};
}

nlohmann::json PlanOutcomeToJson(const PlanOutcome& o, bool tensors) {
  nlohmann::json j = ShardPlanToJson(o.plan, tensors);
  AddMemoryToJson(o.memory, j);
  const ParamCounts p = CountParams(o.plan);
  j["params"] = {{"total", p.total}, {"active", p.active}};
  j["advice"] = o.advice;
  if (!o.inputs.checkpoint.empty()) j["checkpoint"] = o.inputs.checkpoint_json;
  return j;
}

Result<SweepSetup> PrepareSweep(const PlanFlags& plan, const MemoryFlags& memory,
                                const SweepOptions& options) {
  SweepSetup s;
  MOESHARD_ASSIGN_OR_RETURN(s.model, LoadModelConfig(plan.model));
  MOESHARD_ASSIGN_OR_RETURN(s.base, ToPlanOptions(plan));
  MOESHARD_ASSIGN_OR_RETURN(s.memory, ToMemoryOptions(memory));
  FollowGpu(s.memory, &s.base);
  MOESHARD_ASSIGN_OR_RETURN(s.gpu_counts, ParseGpuList(options.gpus));
  static const char* kSorts[] = {"gpus", "weights", "kv", "waste"};
  if (std::find(std::begin(kSorts), std::end(kSorts), options.sort) == std::end(kSorts)) {
    return InvalidArgumentError(
        fmt::format("'--sort {}': expected gpus, weights, kv or waste", options.sort));
  }
  return s;
}

std::vector<SweepRow> ComputeSweepRows(const SweepSetup& setup, const SweepOptions& options) {
  GridOptions g;
  g.base = setup.base;
  g.gpu_counts = setup.gpu_counts;
  g.include_pp = options.pp;
  std::vector<SweepRow> rows;
  for (const GridPoint& p : BuildGrid(setup.model, g)) {
    if (!options.strategy.empty() && p.strategy.find(options.strategy) == std::string::npos) {
      continue;
    }
    SweepRow r = RowOf(p, setup.memory);
    if (options.fits_only && !r.fits) continue;
    rows.push_back(std::move(r));
  }
  const std::string& sort = options.sort;
  std::stable_sort(rows.begin(), rows.end(), [&](const SweepRow& a, const SweepRow& b) {
    if (sort == "weights") return a.weights < b.weights;
    if (sort == "kv") return a.kv_tokens > b.kv_tokens;
    if (sort == "waste") return a.waste < b.waste;
    if (a.gpus != b.gpus) return a.gpus < b.gpus;
    return a.weights < b.weights;
  });
  return rows;
}

nlohmann::json SweepRowsToJson(const std::vector<SweepRow>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const SweepRow& r : rows) {
    j.push_back({{"strategy", r.strategy},
                 {"topology", r.label},
                 {"gpus", r.gpus},
                 {"backend", r.backend},
                 {"weights_per_gpu", r.weights},
                 {"routed_per_gpu", r.routed},
                 {"routed_padding_per_gpu", r.waste},
                 {"intermediate_raw_local", r.i_raw},
                 {"intermediate_padded_local", r.i_padded},
                 {"kv_tokens", r.kv_tokens},
                 {"max_model_len", r.max_model_len},
                 {"fits", r.fits}});
  }
  return j;
}

Result<CheckOutcome> ComputeCheck(const PlanFlags& plan, int64_t max_gpus, bool pp) {
  CheckOutcome o;
  MOESHARD_ASSIGN_OR_RETURN(o.model, LoadModelConfig(plan.model));
  MOESHARD_ASSIGN_OR_RETURN(PlanOptions base, ToPlanOptions(plan));
  if (max_gpus < 1) {
    return InvalidArgumentError(
        fmt::format("'--max-gpus {}': expected a positive integer", max_gpus));
  }
  GridOptions g;
  g.base = base;
  g.include_pp = pp;
  g.gpu_counts.clear();
  for (int64_t n = 1; n <= max_gpus; n *= 2) g.gpu_counts.push_back(n);
  o.grid = BuildGrid(o.model, g);
  if (o.grid.empty()) {
    return FailedPreconditionError(
        "no valid topology in the grid (is --moe-backend right for this model?)");
  }
  o.violations = CheckGrid(o.model, o.grid);
  return o;
}

nlohmann::json ViolationsToJson(const std::vector<Violation>& violations) {
  nlohmann::json j = nlohmann::json::array();
  for (const Violation& v : violations) {
    j.push_back({{"invariant", v.invariant}, {"topology", v.topology}, {"detail", v.detail}});
  }
  return j;
}

Status ReadEngineDump(const std::string& path, EngineDump& dump) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
      const std::string ext = e.path().extension().string();
      if (e.is_regular_file() && (ext == ".json" || ext == ".jsonl")) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) {
      return NotFoundError(fmt::format(
          "check: '{}': no .json or .jsonl files in the folder (expected one dump per rank, "
          "written by scripts/dump_named_parameters.py)",
          path));
    }
  } else {
    files.push_back(path);
  }
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return NotFoundError(fmt::format("check: '{}': cannot open the dump", file));
    std::ostringstream text;
    text << in.rdbuf();
    MOESHARD_RETURN_IF_ERROR(ParseEngineDump(text.str(), file, dump));
  }
  return Status::Ok();
}

Result<AgainstOutcome> PrepareCheckAgainst(const PlanFlags& plan) {
  AgainstOutcome o;
  MOESHARD_ASSIGN_OR_RETURN(o.model, LoadModelConfig(plan.model));
  MOESHARD_ASSIGN_OR_RETURN(PlanOptions options, ToPlanOptions(plan));
  MOESHARD_ASSIGN_OR_RETURN(o.plan, BuildShardPlan(o.model, options));
  o.padding_policy = plan.padding;
  return o;
}

void CompareDump(const EngineDump& dump, AgainstOutcome& o) {
  o.rank_records = static_cast<int64_t>(dump.ranks.size());
  o.report = CheckOwnership(o.plan, dump);
}

nlohmann::json AgainstOutcomeToJson(const AgainstOutcome& o) {
  const OwnershipReport& r = o.report;
  nlohmann::json findings = nlohmann::json::array();
  for (const OwnershipDiff& d : r.diffs) {
    findings.push_back({{"rule", d.rule},
                        {"tensor", d.tensor},
                        {"ranks", d.ranks},
                        {"expected", d.expected},
                        {"actual", d.actual}});
  }
  return {{"model", o.model.name},
          {"topology", o.plan.topology.Label()},
          {"backend", o.plan.backend.name},
          {"padding_policy", o.padding_policy},
          {"rank_records", o.rank_records},
          {"params_matched", r.params_matched},
          {"coverage_checked", r.coverage_checked},
          {"coverage_undeclared", r.coverage_undeclared},
          {"unknown_params", r.unknown_params},
          {"absent_tensors", r.absent_tensors},
          {"ok", r.diffs.empty()},
          {"findings", findings}};
}

}  // namespace moeshard::cli
