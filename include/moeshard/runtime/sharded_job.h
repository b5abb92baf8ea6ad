// ShardedJob: one rank's part of a whole sharded run, as `moeshard run` and `moeshard bench
// run` drive it: load the rank's weights, build the runtime, feed the DP rank's tokens, time
// the layers, optionally verify against the single-rank reference, and gather a report.
//
// Tokens: without explicit inputs every DP (x PCP) rank -- a "unit" -- gets
// tokens_per_unit[unit % size] tokens of DummyHiddenStates(input_seed, unit, ...). With explicit
// inputs ([T_total, H]) the rows are split over the units in order (TokenChunk: the first
// T_total % units get one more).
//
// Timing: `warmup` untimed forwards, then `iters` timed ones, each started after a world
// barrier; a rank's time per layer is the mean over the timed iterations, and the job's time
// per iteration is the slowest rank's.
//
// Verification: every rank computes the single-rank reference of its unit's tokens on a
// communicator of its own (verify.h) and compares its final output with it; the report merges
// the statistics of all ranks.
//
// Repeated runs: ShardedJob keeps one rank's loaded weights, backend and runtime (and the
// verification reference, once built) across runs, so a caller that runs the same plan on many
// inputs (the Python Runtime) loads once; RunShardedJob is Create then one Run.
//
// Thread safety: RunShardedJob and ShardedJob's methods are COLLECTIVE over the world; one
// thread per rank.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/comm/communicator.h"
#include "moeshard/kernels/kernel_backend.h"
#include "moeshard/plan/shard_plan.h"
#include "moeshard/runtime/verify.h"
#include "moeshard/weights/loader.h"

namespace moeshard {

struct ShardedJobSpec {
  const ShardPlan* plan = nullptr;
  LoadOptions load;  // weight source; max_moe_layers is set from num_layers
  // The weights the single-rank reference loads for verification; unset: `load`. A
  // pre-sharded source serves one plan only, so its reference reads the checkpoint (or dummy
  // seed) the directory was made from (PreshardedOrigin).
  std::optional<LoadOptions> reference_load;
  int64_t num_layers = -1;                      // the first N MoE layers of the stage; -1: all
  std::vector<int64_t> tokens_per_unit = {16};  // without inputs; cycled over the units
  uint64_t input_seed = 0;
  // Optional explicit inputs (identical on every rank): [T_total, H] fp32, and optional
  // [T_total, top_k] routing that bypasses the router.
  const std::vector<float>* inputs = nullptr;
  const std::vector<int32_t>* topk_ids = nullptr;
  const std::vector<float>* topk_weights = nullptr;
  // Optional [T_total] int32 token ids, split over the units as the inputs are. Without them a
  // model with hash-routed layers gets DummyTokenIds(input_seed, unit, ...) per unit.
  const std::vector<int32_t>* token_ids = nullptr;
  DType io_dtype = DType::kBF16;  // the dtype of the hidden states handed to Forward
  int warmup = 1;
  int iters = 1;
  bool verify = false;
  Tolerance tolerance;
  int kernel_threads = 1;  // threads of each rank's kernel context
  // CPUs each rank's kernel threads are pinned to, by world rank (empty, or an empty entry:
  // not pinned). See SplitCpus: ranks get disjoint runs of the process's CPUs when they fit, and
  // on several NUMA nodes each rank's from one node (SplitCpusByNode), so the weights its
  // threads load land in that node's memory.
  std::vector<std::vector<int>> rank_cpus;
  std::vector<int> rank_numa_nodes;  // the node of each rank's CPUs (-1: not placed by node)
  bool collect_outputs = false;      // rank 0 receives every layer's output of every token
  // The kernel backend each rank runs on (kernel_backend.h): its registry name and its own
  // settings ("cpu": isa, expert-layout). num_threads and cpus are set from kernel_threads and
  // rank_cpus. The routed experts are offered to its weight preparation after loading
  // (PrepareExpertWeights); the verification reference keeps them as loaded, so verification
  // also crosses the layouts.
  KernelBackendOptions kernels;
  // Record one forward's expert load (ShardedJobResult::expert_tokens, slot_tokens).
  bool record_expert_load = false;
};

struct RankReport {
  int64_t rank = 0;
  int64_t num_tokens = 0;                            // this rank's unit's T
  std::map<TensorCategory, int64_t> measured_bytes;  // allocated by the loader
  std::map<TensorCategory, int64_t> planned_bytes;   // the plan's prediction, same layers
  int64_t workspace_bytes = 0;                       // the runtime's own buffers
  std::vector<double> layer_seconds;                 // mean per timed iteration
  double iter_seconds = 0;                           // mean forward time
  double load_seconds = 0;
  ErrorStats error;  // against the reference (count 0 without verification)
};

struct ShardedJobResult {
  std::vector<int64_t> layers;       // the MoE layers run
  int64_t total_tokens = 0;          // over all units
  std::vector<int64_t> unit_tokens;  // [dp * pcp] tokens of each unit, in order
  std::string kernel_backend;        // this rank's backend, described (KernelBackend::Describe)
  int64_t prepared_layers = 0;       // this rank's layers the backend rewrote into its layout
  std::string prepared_layout;       // that layout (KernelBackend::PreparedLayout)
  std::vector<RankReport> ranks;     // every rank's report (all ranks receive all)
  double iter_seconds = 0;           // slowest rank's mean forward time
  ErrorStats error;                  // merged over ranks
  // collect_outputs, rank 0 only: [num_layers, total_tokens, H] fp32, units in order.
  std::vector<float> outputs;
  // record_expert_load, every rank: the last forward's expert load (docs/eplb.md).
  //   expert_tokens [num_layers][E]: (token, top-k choice) pairs routed to each logical expert,
  //     summed over the world, every pair counted once (ForwardArgs::expert_counts).
  //   slot_experts [num_slots]: the logical expert of every slot, EP rank by EP rank (the
  //     slots of the world rank at moe_ep_rank p, moe_tp_rank 0, in its order);
  //     slot_ep_rank [num_slots] the EP rank of each.
  //   slot_tokens [num_layers][num_slots]: the rows each slot computed (ForwardArgs::
  //     slot_counts), so a hot expert's replicas show how its tokens were split.
  std::vector<std::vector<int64_t>> expert_tokens;
  std::vector<int64_t> slot_experts;
  std::vector<int64_t> slot_ep_rank;
  std::vector<std::vector<int64_t>> slot_tokens;
};

// One rank's built job: its kernel backend, loaded (and prepared) weights and runtime.
class ShardedJob {
 public:
  // COLLECTIVE over `world` (size = the plan's world): creates the backend, loads this rank's
  // weights (spec.load, spec.num_layers) and builds the runtime for spec's token counts.
  // `spec.plan` and `world` must outlive the job; the spec itself is copied.
  static Result<std::unique_ptr<ShardedJob>> Create(const ShardedJobSpec& spec,
                                                    Communicator& world);
  ~ShardedJob();

  // COLLECTIVE over the job's world: one run with `run`'s tokens_per_unit, input_seed, inputs,
  // routing, token_ids, io_dtype, warmup, iters, verify, tolerance, collect_outputs and
  // record_expert_load; the other fields are the job's (run.plan must be null or the job's
  // plan). The runtime's buffers are remade when the run's tokens per rank exceed those built
  // for.
  Result<ShardedJobResult> Run(const ShardedJobSpec& run);

 private:
  struct State;
  explicit ShardedJob(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// COLLECTIVE over `world` (size = the plan's world): ShardedJob::Create(spec), then Run(spec).
Result<ShardedJobResult> RunShardedJob(const ShardedJobSpec& spec, Communicator& world);

}  // namespace moeshard
