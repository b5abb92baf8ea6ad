// moeshard plan: the ShardPlan of one topology -- routed-expert layout (logical -> raw ->
// padded), per-rank weights by category, KV cache, activations, and whether it fits.
#include <fmt/format.h>

#include <cstdio>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "cli/plan_api.h"
#include "cli/plan_report.h"
#include "moeshard/base/units.h"
#include "plan/ownership.h"
#include "plan/plan_json.h"

namespace moeshard::cli {
namespace {

struct PlanCommandFlags {
  PlanFlags plan;
  MemoryFlags memory;
  std::string format = "table";
  bool tensors = false;
  int64_t rank = -1;
  std::string ownership;  // --ownership FILE: the ownership map (docs/ownership.md)
};

int RunPlan(const PlanCommandFlags& f) {
  if (f.format != "table" && f.format != "json" && f.format != "markdown") {
    return ReportError("plan", InvalidArgumentError(fmt::format(
                                   "'--format {}': expected table, json or markdown", f.format)));
  }
  Result<PlanOutcome> outcome = ComputePlan(f.plan, f.memory);
  if (!outcome.ok()) return ReportError("plan", outcome.status());
  const ShardPlan& plan = outcome->plan;
  if (f.rank >= plan.topology.world) {
    return ReportError("plan", InvalidArgumentError(fmt::format(
                                   "'--rank {}': expected a rank below the world size {}", f.rank,
                                   plan.topology.world)));
  }
  if (!f.ownership.empty()) {
    const Status written = WriteFileAtomic(f.ownership, OwnershipMapJson(plan));
    if (!written.ok()) return ReportError("plan", written);
  }
  const MemoryPlan& memory = outcome->memory;
  const std::string& advice = outcome->advice;

  if (f.format == "json") {
    std::printf("%s\n", PlanOutcomeToJson(*outcome, f.tensors).dump(2).c_str());
  } else {
    ReportOptions ro;
    ro.markdown = f.format == "markdown";
    ro.all_tensors = f.tensors;
    ro.rank = f.rank;
    std::fputs(RenderPlanReport(plan, memory, outcome->inputs, ro).c_str(), stdout);
  }
  if (!memory.fits) {
    std::fprintf(
        stderr, "moeshard plan: does not fit: %s%s\n", memory.failure.c_str(),
        advice.empty() ? "" : fmt::format("; smallest change that fits: {}", advice).c_str());
    return 3;
  }
  return 0;
}

MOESHARD_REGISTER_COMMAND(
    plan,
    CommandSpec{
        .name = "plan",
        .description = "show the ShardPlan of one topology: per-rank tensors, padding, memory, fit",
        .order = 10,
        .setup = [](CLI::App* sub) -> CommandRunner {
          auto f = std::make_shared<PlanCommandFlags>();
          AddPlanFlags(sub, &f->plan);
          AddMemoryFlags(sub, &f->memory);
          sub->add_option("--format", f->format, "table (default), json or markdown");
          sub->add_flag("--tensors", f->tensors, "list every tensor of each rank kind");
          sub->add_option("--rank", f->rank, "show this rank's tensors");
          sub->add_option("--ownership", f->ownership,
                          "write the ownership map (every rank's tensors, slices, shapes, padding) "
                          "as JSON to FILE (docs/ownership.md)");
          return [f] { return RunPlan(*f); };
        }});

}  // namespace
}  // namespace moeshard::cli
