// What `moeshard plan`, `sweep` and `check` compute from their flags, without printing: shared by
// the CLI commands and the Python module (python/src/module.cc), so both give the same plan, the
// same JSON and the same error messages.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "cli/plan_report.h"
#include "moeshard/plan/invariants.h"
#include "moeshard/plan/memory.h"
#include "plan/ownership.h"

namespace moeshard::cli {

// The checks CLI11 applies to the plan and memory flags (positive sizes, utilization in
// [0.01, 1]), for callers that fill the flags without CLI11. `name` of each flag is given as the
// caller spells it (e.g. "tp" from Python).
Status ValidatePlanFlags(const PlanFlags& plan);
Status ValidateMemoryFlags(const MemoryFlags& memory);

// One topology's plan with its memory plan and, when it does not fit, the smallest change that
// does (empty when it fits or nothing found).
struct PlanOutcome {
  PlanInputs inputs;
  ShardPlan plan;
  MemoryPlan memory;
  std::string advice;
};
Result<PlanOutcome> ComputePlan(const PlanFlags& plan, const MemoryFlags& memory);
// `moeshard plan --format json`'s document (with every tensor when `tensors`).
nlohmann::json PlanOutcomeToJson(const PlanOutcome& outcome, bool tensors);

// sweep: the flags beyond the plan and memory ones.
struct SweepOptions {
  std::string gpus = "8,16,32,64";
  bool pp = false;
  bool fits_only = false;
  std::string strategy;  // only strategies whose name contains this
  std::string sort = "gpus";
};

// One topology of a sweep: the largest rank's weights, the smallest KV capacity, and the fit.
struct SweepRow {
  std::string strategy;
  std::string label;
  int64_t gpus = 0;
  int64_t weights = 0;  // max over ranks
  int64_t routed = 0;
  int64_t waste = 0;      // routed padding bytes on that rank
  int64_t kv_tokens = 0;  // min over ranks
  int64_t max_model_len = 0;
  bool fits = false;
  std::string backend;
  int64_t i_raw = 0, i_padded = 0;
};

// What sweep reads from its flags, validated (in the CLI's order: model, plan flags, memory
// flags, --gpus, --sort).
struct SweepSetup {
  ModelConfig model;
  PlanOptions base;
  MemoryOptions memory;
  std::vector<int64_t> gpu_counts;
};
Result<SweepSetup> PrepareSweep(const PlanFlags& plan, const MemoryFlags& memory,
                                const SweepOptions& options);
// Every topology of the grid, filtered and sorted as the options say.
std::vector<SweepRow> ComputeSweepRows(const SweepSetup& setup, const SweepOptions& options);
// `moeshard sweep --format json`'s document: an array with one object per row.
nlohmann::json SweepRowsToJson(const std::vector<SweepRow>& rows);

// check: the grid (GPU counts 1, 2, 4, ... up to max_gpus) and its violations, as `moeshard
// check` computes them (same validation and messages; an empty grid is an error).
struct CheckOutcome {
  ModelConfig model;
  std::vector<GridPoint> grid;
  std::vector<Violation> violations;
};
Result<CheckOutcome> ComputeCheck(const PlanFlags& plan, int64_t max_gpus, bool pp);
// `moeshard check --format json`'s document without --against: [{invariant, topology, detail}].
nlohmann::json ViolationsToJson(const std::vector<Violation>& violations);

// check --against: reads a dump file, or every *.json / *.jsonl file of a folder (one per rank),
// into `dump` (docs/ownership.md).
Status ReadEngineDump(const std::string& path, EngineDump& dump);

// An engine dump compared with the plan of the flags' topology (no memory flags: the same plan
// `moeshard check --against` builds).
struct AgainstOutcome {
  ModelConfig model;
  ShardPlan plan;
  std::string padding_policy;  // as given (--padding-policy)
  int64_t rank_records = 0;    // the dump's rank records
  OwnershipReport report;
};
// The model and plan (errors as the CLI's, checked before the dump is read), then the comparison.
Result<AgainstOutcome> PrepareCheckAgainst(const PlanFlags& plan);
void CompareDump(const EngineDump& dump, AgainstOutcome& outcome);
// `moeshard check --against DUMP --format json`'s document: model, topology, backend,
// padding_policy, rank_records, params_matched, coverage_checked, coverage_undeclared,
// unknown_params, absent_tensors, ok, and findings [{rule, tensor, ranks, expected, actual}].
nlohmann::json AgainstOutcomeToJson(const AgainstOutcome& outcome);

}  // namespace moeshard::cli
