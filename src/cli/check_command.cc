// moeshard check: verifies the partition contract's invariants over a grid of topologies
// (every strategy, GPU counts 1, 2, 4, ... up to --max-gpus) and lists each violation; with
// --against DUMP, compares an engine's per-rank parameter list with the plan of one topology
// (docs/ownership.md).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/plan/invariants.h"
#include "plan/ownership.h"

namespace moeshard::cli {
namespace {

struct CheckFlags {
  PlanFlags plan;
  int64_t max_gpus = 64;
  bool pp = false;
  std::string against;  // an engine dump: a file, or a folder of per-rank files
};

// Reads a dump file, or every *.json / *.jsonl file of a folder (one per rank).
Status ReadDump(const std::string& path, EngineDump& dump) {
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

void PrintNames(const char* what, const std::vector<std::string>& names) {
  if (names.empty()) return;
  std::printf("note: %zu %s (not failed: engines fuse and rename these), e.g.:\n", names.size(),
              what);
  for (size_t i = 0; i < names.size() && i < 5; ++i) std::printf("  %s\n", names[i].c_str());
}

int RunCheckAgainst(const CheckFlags& f, const ModelConfig& model, const PlanOptions& options) {
  Result<ShardPlan> plan = BuildShardPlan(model, options);
  if (!plan.ok()) return ReportError("check", plan.status());
  EngineDump dump;
  const Status read = ReadDump(f.against, dump);
  if (!read.ok()) return ReportError("check", read);
  const OwnershipReport r = CheckOwnership(*plan, dump);
  std::printf(
      "moeshard check --against %s: %s %s, backend %s, padding policy %s: %zu rank "
      "records, %lld params matched; coverage compared for %lld split tensors (%lld "
      "without declared slices)\n",
      f.against.c_str(), model.name.c_str(), plan->topology.Label().c_str(),
      plan->backend.name.c_str(), f.plan.padding.c_str(), dump.ranks.size(),
      static_cast<long long>(r.params_matched), static_cast<long long>(r.coverage_checked),
      static_cast<long long>(r.coverage_undeclared));
  PrintNames("dump params the plan does not know", r.unknown_params);
  PrintNames("non-expert plan tensors absent from the dump", r.absent_tensors);
  if (r.diffs.empty()) {
    std::printf("OK: the dump matches the plan\n");
    return 0;
  }
  std::printf("%zu difference%s from the plan:\n", r.diffs.size(), r.diffs.size() == 1 ? "" : "s");
  for (const OwnershipDiff& d : r.diffs) {
    std::printf("  [%s] %s, rank %s: expected %s, got %s\n", d.rule.c_str(), d.tensor.c_str(),
                d.ranks.c_str(), d.expected.c_str(), d.actual.c_str());
  }
  return 1;
}

int RunCheck(const CheckFlags& f) {
  Result<ModelConfig> model = LoadModelConfig(f.plan.model);
  if (!model.ok()) return ReportError("check", model.status());
  Result<PlanOptions> base = ToPlanOptions(f.plan);
  if (!base.ok()) return ReportError("check", base.status());
  if (!f.against.empty()) return RunCheckAgainst(f, *model, *base);
  if (f.max_gpus < 1) {
    return ReportError("check", InvalidArgumentError(fmt::format(
                                    "'--max-gpus {}': expected a positive integer", f.max_gpus)));
  }
  GridOptions g;
  g.base = *base;
  g.include_pp = f.pp;
  g.gpu_counts.clear();
  for (int64_t n = 1; n <= f.max_gpus; n *= 2) g.gpu_counts.push_back(n);
  const std::vector<GridPoint> grid = BuildGrid(*model, g);
  const std::vector<Violation> violations = CheckGrid(*model, grid);
  std::set<std::string> strategies;
  for (const GridPoint& p : grid) strategies.insert(p.strategy);
  std::printf(
      "moeshard check: %s, backend %s, padding policy %s: %zu plans over %zu strategies "
      "and GPU counts up to %lld\n",
      model->name.c_str(), f.plan.backend.c_str(), f.plan.padding.c_str(), grid.size(),
      strategies.size(), static_cast<long long>(f.max_gpus));
  std::printf(
      "invariants: tiling, waste < one alignment unit, backend constraints, per-rank "
      "routed bytes fall as GPUs are added\n");
  if (grid.empty()) {
    return ReportError("check", FailedPreconditionError(
                                    "no valid topology in the grid (is --moe-backend right for "
                                    "this model?)"));
  }
  if (violations.empty()) {
    std::printf("OK: no violations\n");
    return 0;
  }
  std::printf("%zu violation%s:\n", violations.size(), violations.size() == 1 ? "" : "s");
  for (const Violation& v : violations) {
    std::printf("  [%s] %s: %s\n", v.invariant.c_str(), v.topology.c_str(), v.detail.c_str());
  }
  return 1;
}

MOESHARD_REGISTER_COMMAND(
    check,
    CommandSpec{
        .name = "check",
        .description = "verify the partition contract's invariants over a grid of topologies",
        .order = 30,
        .setup = [](CLI::App* sub) -> CommandRunner {
          auto f = std::make_shared<CheckFlags>();
          AddPlanFlags(sub, &f->plan);
          sub->add_option("--max-gpus", f->max_gpus,
                          "largest GPU count of the grid (powers of two)");
          sub->add_flag("--with-pp", f->pp, "also check pipeline-parallel strategies");
          sub->add_option("--against", f->against,
                          "compare an engine's per-rank parameter dump (a file, or a folder of "
                          "per-rank files; docs/ownership.md) with the plan of the given topology");
          return [f] { return RunCheck(*f); };
        }});

}  // namespace
}  // namespace moeshard::cli
