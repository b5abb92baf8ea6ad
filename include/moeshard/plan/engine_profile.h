// Engine profiles and non-weight memory terms: how vLLM, SGLang and TensorRT-LLM size their KV
// cache, and the memory each deployment holds besides weights and KV (CUDA context, NCCL
// communicators, expert-parallel all-to-all buffers, CUDA graph pools). Every number comes from
// data/engines/memory_terms.json, compiled in, each row with its source; docs/engine-memory.md
// describes the rules and the engine logs they were checked against.
//
//   vllm    kv = util * total - weights - profile activation peak - non-torch increase;
//           whole blocks of block_size tokens over the rank's layers, the smallest over ranks
//   sglang  kv = (free after loading) - (1 - mem_fraction_static) * (free before loading),
//           free before loading = total - CUDA context - NCCL (its post-init snapshot)
//   trtllm  kv = free_gpu_memory_fraction * (free after the profiling forward)
//
// Thread safety: the table is parsed once (function-local static); everything is read-only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moeshard/base/status.h"

namespace moeshard {

enum class EngineRule { kVllm, kSglang, kTrtllm };

// How the engine's startup log counts KV tokens: the capacity (tokens of context that fit), or
// vLLM's blocks divided by its layer groups, which differs for models with sliding-window or
// recurrent layers (memory.cc VllmLoggedTokens).
enum class KvTokenReport { kCapacity, kVllmGroups };

// SGLang 0.5's default mem_fraction_static (server_args.py _handle_gpu_memory_settings): the
// device memory less a reserve for activations and CUDA graphs, both sized by GPU memory class.
struct ReservedMemRule {
  struct Row {
    int64_t min_gpu_mib = 0;
    int64_t chunked_prefill = 0;
    int64_t graph_bs_small_tp = 0;  // cuda_graph_max_bs at tp_size < 4
    int64_t graph_bs_large_tp = 0;  // at tp_size >= 4
  };
  std::vector<Row> by_gpu;  // ascending min_gpu_mib
  double base_mib = 0;
  double prefill_mib_per_token = 0;
  int64_t min_prefill_tokens = 0;
  double graph_mib_per_bs = 0;
  double tp_pp_mib_per_8 = 0;
  double dp_attention_mib_per_bs_dp = 0;
  int64_t dp_attention_large_bs = 0;
  double dp_attention_large_mib_per_bs_dp = 0;
  double floor_mib = 0;
  double floor_above_gpu_mib = 0;
};

// What an engine's default fraction may depend on: the device, and the launch's sizes in the
// engine's own terms.
struct FractionInputs {
  int64_t gpu_bytes = 0;
  int64_t tp = 1;  // SGLang's tp_size: the ranks of a PP stage, DP-attention ranks included
  int64_t pp = 1;
  int64_t dp = 1;  // > 1: SGLang's DP attention over that many ranks
};

struct EngineProfile {
  std::string name;     // "vllm"
  std::string version;  // "0.10": the first version the row describes
  EngineRule rule = EngineRule::kVllm;
  double memory_fraction = 0.9;  // default gpu_memory_utilization / fraction (SGLang: by TP)
  std::vector<std::pair<int64_t, double>> memory_fraction_by_tp;  // {min tp, fraction}, desc.
  std::optional<ReservedMemRule> reserved_mem;                    // SGLang 0.5's rule
  int64_t block_size = 16;                                        // KV tokens per block / page
  int64_t max_num_batched_tokens_large = 8192;  // default on GPUs >= large_gpu_min_gib
  int64_t max_num_batched_tokens_small = 2048;
  int64_t max_num_seqs_large = 1024;
  int64_t max_num_seqs_small = 256;
  double large_gpu_min_gib = 70;
  std::string default_all2all_backend;
  bool rejects_moe_tp_with_moe_ep = false;
  // Peak bytes per logit of the profile's dummy sampler run (last PP stage): the gathered bf16
  // logits, their fp32 copy and whatever the top-k / top-p path allocates.
  int64_t sampler_bytes_per_logit = 10;
  KvTokenReport kv_token_report = KvTokenReport::kCapacity;
  std::vector<std::string> sources;

  std::string Label() const { return name + "@" + version; }
  // The engine's default fraction (SGLang's depends on the TP size, from 0.5 on the GPU too).
  double DefaultFraction(const FractionInputs& in) const;
  bool FractionDependsOnTopology() const {
    return !memory_fraction_by_tp.empty() || reserved_mem.has_value();
  }
};

// "vllm", "vllm@0.11", "sglang", "trtllm@1.0": the newest row whose version <= the one asked
// (no version: the oldest row, the long-standing default). Errors name the engines known.
Result<EngineProfile> FindEngine(const std::string& spec);
std::vector<std::string> EngineNames();  // "vllm@0.10", ...

// One row of the memory table: what it is, its bytes on a rank, where the number comes from,
// and whether the engine's KV rule subtracts it (vLLM's snapshot excludes the CUDA context and
// NCCL, which must fit in the memory it leaves unrequested).
struct MemoryTerm {
  std::string name;  // "nccl", "cuda_context", "all2all:deepep_low_latency", ...
  int64_t bytes = 0;
  std::string source;
  bool in_kv_budget = true;  // subtracted before the KV cache is sized
};

// The all-to-all backends vLLM spells (--all2all-backend).
std::vector<std::string> All2AllBackendNames();

struct All2AllParams {
  std::string backend;      // vLLM's name; "" = none (no EP)
  int64_t ep_size = 1;      // ranks in the EP group
  int64_t dp_size = 1;      // DP ranks in the group
  int64_t num_experts = 0;  // slots over the group
  int64_t hidden = 0;       // token hidden size dispatched
  int64_t top_k = 1;
  int64_t act_bytes = 2;              // dispatched element size
  int64_t max_tokens_per_rank = 256;  // VLLM_MOE_DP_CHUNK_SIZE
  bool internode = false;
};
// The buffer the backend allocates per rank (0 for the all-gather backends, whose traffic is an
// activation counted by the profile run), with its source. Unknown backends are an error.
Result<MemoryTerm> All2AllBufferTerm(const All2AllParams& p);

// Table rows by group size (nccl, non-torch profile increase: PCIe or NVLink rows), CUDA context.
MemoryTerm NcclTerm(int64_t group_size);
MemoryTerm CudaContextTerm();
MemoryTerm NonTorchProfileTerm(int64_t tp, bool nvlink);

}  // namespace moeshard
