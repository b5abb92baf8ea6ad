// moeshard check: verifies the partition contract's invariants over a grid of topologies
// (every strategy, GPU counts 1, 2, 4, ... up to --max-gpus) and lists each violation; with
// --against DUMP, compares an engine's per-rank parameter list with the plan of one topology
// (docs/ownership.md).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "cli/plan_api.h"
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
  std::string format = "text";
};

void PrintNames(const char* what, const std::vector<std::string>& names) {
  if (names.empty()) return;
  std::printf("note: %zu %s (not failed: engines fuse and rename these), e.g.:\n", names.size(),
              what);
  for (size_t i = 0; i < names.size() && i < 5; ++i) std::printf("  %s\n", names[i].c_str());
}

int RunCheckAgainst(const CheckFlags& f) {
  Result<AgainstOutcome> o = PrepareCheckAgainst(f.plan);
  if (!o.ok()) return ReportError("check", o.status());
  EngineDump dump;
  const Status read = ReadEngineDump(f.against, dump);
  if (!read.ok()) return ReportError("check", read);
  CompareDump(dump, *o);
  const OwnershipReport& r = o->report;
  if (f.format == "json") {
    std::printf("%s\n", AgainstOutcomeToJson(*o).dump(2).c_str());
    return r.diffs.empty() ? 0 : 1;
  }
  std::printf(
      "moeshard check --against %s: %s %s, backend %s, padding policy %s: %lld rank "
      "records, %lld params matched; coverage compared for %lld split tensors (%lld "
      "without declared slices)\n",
      f.against.c_str(), o->model.name.c_str(), o->plan.topology.Label().c_str(),
      o->plan.backend.name.c_str(), o->padding_policy.c_str(),
      static_cast<long long>(o->rank_records), static_cast<long long>(r.params_matched),
      static_cast<long long>(r.coverage_checked), static_cast<long long>(r.coverage_undeclared));
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

// --format json without --against: the violations as JSON (what moeshard.check returns).
int RunCheckJson(const CheckFlags& f) {
  Result<CheckOutcome> o = ComputeCheck(f.plan, f.max_gpus, f.pp);
  if (!o.ok()) return ReportError("check", o.status());
  std::printf("%s\n", ViolationsToJson(o->violations).dump(2).c_str());
  return o->violations.empty() ? 0 : 1;
}

int RunCheck(const CheckFlags& f) {
  if (f.format != "text" && f.format != "json") {
    return ReportError("check", InvalidArgumentError(
                                    fmt::format("'--format {}': expected text or json", f.format)));
  }
  if (!f.against.empty()) return RunCheckAgainst(f);
  if (f.format == "json") return RunCheckJson(f);
  Result<ModelConfig> model = LoadModelConfig(f.plan.model);
  if (!model.ok()) return ReportError("check", model.status());
  Result<PlanOptions> base = ToPlanOptions(f.plan);
  if (!base.ok()) return ReportError("check", base.status());
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
          sub->add_option("--format", f->format,
                          "text (default) or json (the violations, or with --against the "
                          "report; what moeshard.check / check_against return)");
          return [f] { return RunCheck(*f); };
        }});

}  // namespace
}  // namespace moeshard::cli
