// Rendering of a plan for people: the routed-expert layout, rank kinds, per-rank memory.
// Shared by plan (one topology) and used by the README's main job.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "moeshard/plan/checkpoint_sizing.h"
#include "moeshard/plan/memory.h"
#include "moeshard/plan/shard_plan.h"

namespace moeshard::cli {

// What plan-like commands read from the flags: the model (from a preset, config.json or a
// checkpoint directory) and, for a checkpoint directory, the tensors its headers declare.
struct PlanInputs {
  ModelConfig model;
  PlanOptions plan_options;
  MemoryOptions memory_options;
  std::string checkpoint;                     // directory, when --model named one with weights
  nlohmann::json checkpoint_json;             // what the headers said (sizes, unplaced tensors)
  std::vector<std::string> unplaced_tensors;  // checkpoint tensors the plan cannot place
  std::shared_ptr<const std::vector<CheckpointTensorInfo>> checkpoint_tensors;  // headers
  int64_t mtp_tensors = 0;  // multi-token-prediction tensors: recognised, not planned
  int64_t mtp_bytes = 0;
  std::vector<int64_t> mtp_layers;
  int64_t checkpoint_shards = 0;
  double header_seconds = 0;  // time to read every header
};

// With a checkpoint: sizes the plan from its headers, fills checkpoint_json and
// unplaced_tensors, and makes the memory plan use the exact per-rank bytes.
void ApplyCheckpointSizing(const ShardPlan& plan, PlanInputs& inputs);

Result<PlanInputs> LoadPlanInputs(const PlanFlags& plan, const MemoryFlags& memory);

struct ReportOptions {
  bool markdown = false;
  bool all_tensors = false;
  int64_t rank = -1;
};

std::string RenderPlanReport(const ShardPlan& plan, const MemoryPlan& memory,
                             const PlanInputs& inputs, const ReportOptions& options);

// The engine rule and every non-weight term of the worst rank, each with its source
// (cli_plan_report_memory.cc).
std::string RenderMemoryTerms(const MemoryPlan& memory, bool markdown);

}  // namespace moeshard::cli
