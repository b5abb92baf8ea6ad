// Flags and output helpers shared by the moeshard subcommands.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/config/model_config.h"
#include "moeshard/plan/shard_plan.h"

namespace moeshard::cli {

// Rewrites vLLM's multi-letter single-dash flags (-tp, -dp, -pp, -ep, also -tp=4) to their long
// forms so CLI11 parses them.
std::vector<std::string> NormalizeArgs(int argc, char** argv);

struct PlanFlags {
  std::string model;
  int64_t tp = 1, dp = 1, pp = 1, pcp = 1;
  bool ep = false;
  int64_t moe_tp = 0, moe_ep = 0;
  std::string backend = "auto";
  std::string padding = "backend";
  std::string placement = "linear";
  int64_t num_redundant_experts = 0;
  std::string shared_experts = "sharded";
  std::string latent_proj = "replicated";
  std::string expert_load;  // a file of tokens per expert per MoE layer (for eplb)
};

// --model plus the topology / backend / padding / placement flags.
void AddModelFlag(CLI::App* app, std::string* model, bool required = true);
void AddPlanFlags(CLI::App* app, PlanFlags* flags);
Result<PlanOptions> ToPlanOptions(const PlanFlags& flags);

// Prints "moeshard <command>: error: <message>" to stderr and returns the exit code (1).
int ReportError(const std::string& command, const Status& status);

// A text table: columns right-aligned except those marked left. Renders as aligned text or as
// GitHub markdown.
class Table {
 public:
  explicit Table(std::vector<std::string> header, std::vector<bool> left = {});
  void Row(std::vector<std::string> cells);
  std::string Text(const std::string& indent = "  ") const;
  std::string Markdown() const;
  bool empty() const { return rows_.empty(); }

 private:
  std::vector<std::string> header_;
  std::vector<bool> left_;
  std::vector<std::vector<std::string>> rows_;
};

// "0-3,8,10-11"
std::string FormatRanges(const std::vector<int64_t>& values);
// "[896, 6144, 1792]"
std::string FormatShape(const std::vector<int64_t>& shape);

// Writes `content` to `path` through a temporary file and a rename (nothing half-written).
Status WriteFileAtomic(const std::string& path, const std::string& content);

}  // namespace moeshard::cli

#include "moeshard/plan/memory.h"

namespace moeshard::cli {

struct MemoryFlags {
  std::string gpu = "h200";
  double gpu_memory_gib = 0;  // overrides --gpu when > 0
  double utilization = 0;     // 0 = the engine's default fraction
  std::string kv_cache_dtype = "auto";
  std::string max_model_len;    // "" = the model's maximum
  int64_t max_num_seqs = 0;     // vLLM's: the scheduler's bound (sampler rows); 0 = the engine's
  int64_t concurrent_seqs = 1;  // sequences of max_model_len each DP rank must hold (the fit)
  int64_t max_num_batched_tokens = 0;  // 0 = the engine's default for the GPU
  double overhead_gib = 0;             // extra overhead row, beyond the sourced terms
  std::string engine = "vllm";         // name[@version]
  std::string all2all_backend;         // "" = the engine's default
  double cuda_graph_gib = 0;
  std::string interconnect = "auto";  // auto (the GPU's), nvlink, pcie
};
void AddMemoryFlags(CLI::App* app, MemoryFlags* flags);
Result<MemoryOptions> ToMemoryOptions(const MemoryFlags& flags);
// What the target GPU decides in the plan: a GPU without native FP8 runs fp8 experts on Marlin
// under `--moe-backend auto` (PlanOptions::native_fp8).
void FollowGpu(const MemoryOptions& memory, PlanOptions* plan);

}  // namespace moeshard::cli
