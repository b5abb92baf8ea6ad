// moeshard check: verifies the partition contract's invariants over a grid of topologies
// (every strategy, GPU counts 1, 2, 4, ... up to --max-gpus) and lists each violation.
#include <fmt/format.h>

#include <cstdio>
#include <set>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/plan/invariants.h"

namespace moeshard::cli {
namespace {

struct CheckFlags {
  PlanFlags plan;
  int64_t max_gpus = 64;
  bool pp = false;
};

int RunCheck(const CheckFlags& f) {
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
  std::printf("moeshard check: %s, backend %s, padding policy %s: %zu plans over %zu strategies "
              "and GPU counts up to %lld\n",
              model->name.c_str(), f.plan.backend.c_str(), f.plan.padding.c_str(), grid.size(),
              strategies.size(), static_cast<long long>(f.max_gpus));
  std::printf("invariants: tiling, waste < one alignment unit, backend constraints, per-rank "
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

MOESHARD_REGISTER_COMMAND(check, CommandSpec{
    .name = "check",
    .description = "verify the partition contract's invariants over a grid of topologies",
    .order = 30,
    .setup = [](CLI::App* sub) -> CommandRunner {
      auto f = std::make_shared<CheckFlags>();
      AddPlanFlags(sub, &f->plan);
      sub->add_option("--max-gpus", f->max_gpus, "largest GPU count of the grid (powers of two)");
      sub->add_flag("--with-pp", f->pp, "also check pipeline-parallel strategies");
      return [f] { return RunCheck(*f); };
    }});

}  // namespace
}  // namespace moeshard::cli
