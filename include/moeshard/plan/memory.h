// The memory model: per rank, weights (from the ShardPlan), the engine's activation peak and
// non-weight terms (CUDA context, NCCL, all-to-all buffers, user overhead; each a sourced row of
// data/engines/memory_terms.json, see engine_profile.h) against a GPU, sized by the engine's own
// KV rule (--engine vllm|sglang|trtllm, default vllm):
//
//   vllm    kv_cache = util * gpu - weights - activations - in-budget terms
//   sglang  kv_cache = gpu - out-of-load terms - weights - (1 - fraction) * gpu
//   trtllm  kv_cache = fraction * (gpu - weights - activations - terms)
//   kv_tokens = whole blocks of (kv_cache - per-sequence state) / kv_per_token; the engine gives
//               every rank the smallest count (MemoryPlan::engine_kv_tokens, as the engine logs
//               it: vLLM counts a hybrid model's blocks per layer group, see memory.cc)
//   fits      = kv_cache >= 0, the terms the engine does not budget fit beside its fraction,
//               and kv_tokens >= max_model_len * max_num_seqs
//
// KV per token per rank: MLA layers store the compressed latent (kv_lora_rank + rope dims),
// replicated on every TP rank; GQA layers store 2 * local KV heads * head_dim (KV heads
// replicated when fewer than TP); linear-attention (KDA) layers hold a fixed state per
// sequence. Each DP rank owns its own sequences, so max_num_seqs is per DP rank.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/plan/checkpoint_sizing.h"
#include "moeshard/plan/engine_profile.h"
#include "moeshard/plan/shard_plan.h"

namespace moeshard {

struct GpuSpec {
  std::string name;         // "h200"
  std::string description;  // "NVIDIA H200 141 GB"
  int64_t bytes = 0;        // total device memory
  std::string source;       // where the number comes from
  // CUDA compute capability x 10 (80: A100, 90: H100); 0 where unknown or not CUDA (AMD).
  int sm = 0;
  // The GPUs of a server are joined by NVLink (SXM boards, NVSwitch): vLLM then runs its custom
  // and symmetric-memory all-reduce and NCCL over NVLink, whose buffers its profile counts as
  // non-torch memory (memory_terms.json non_torch_profile nvlink_rows). --interconnect overrides.
  bool nvlink = false;
  // The GPU runs FP8 GEMMs natively (vLLM: has_device_capability(89)); an unknown GPU counts
  // as native.
  bool NativeFp8() const { return sm == 0 || sm >= 89; }
};

const std::vector<GpuSpec>& GpuCatalog();
Result<GpuSpec> FindGpu(const std::string& name);

enum class KvCacheDtype { kAuto, kBf16, kFp8 };
Result<KvCacheDtype> ParseKvCacheDtype(const std::string& name);  // auto|bf16|fp8|fp8_e4m3|fp8_e5m2

// "128k" = 128000, "128K" = 131072, "1M" = 1000000 (vLLM: lower case decimal, upper case
// binary), plain integers; "auto" returns 0 (= the largest length that fits).
Result<int64_t> ParseMaxModelLen(const std::string& text);

struct MemoryOptions {
  GpuSpec gpu;
  std::string engine = "vllm";        // engine profile, "name[@version]" (engine_profile.h)
  std::string all2all_backend;        // vLLM's name; "" = the engine's default (EP only)
  double gpu_memory_utilization = 0;  // the engine's fraction; <= 0: the engine's default
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  int64_t max_model_len = -1;  // -1: the model's max_position_embeddings; 0: auto
  int64_t max_num_seqs = 1;    // sequences of max_model_len each DP rank must hold (the fit)
  int64_t max_num_batched_tokens = 0;  // tokens of the profile forward; 0: the engine's default
  int64_t engine_max_num_seqs = 0;     // the scheduler's max_num_seqs (sampler); 0: default
  int64_t overhead_bytes = 0;          // extra user overhead per GPU (--overhead-gib), a row
  int64_t cuda_graph_bytes = 0;        // CUDA graph pool per GPU (--cuda-graph-gib), a row
  // A checkpoint's tensors (from its headers): when set, each rank's weights are the bytes of
  // the checkpoint slices it holds plus the padding its plan adds, sized for whichever plan is
  // being evaluated (the advice search re-plans other topologies with the same checkpoint).
  std::shared_ptr<const std::vector<CheckpointTensorInfo>> checkpoint_tensors;
};

struct RankMemory {
  int64_t rank = 0;
  int64_t budget = 0;
  int64_t weights = 0;
  int64_t activations = 0;
  int64_t overhead = 0;        // the terms the engine subtracts before sizing the KV cache
  int64_t outside_budget = 0;  // the terms it does not (vLLM: context, NCCL, graphs)
  int64_t preload = 0;  // in use when SGLang snapshots free memory before loading (context, NCCL)
  std::vector<MemoryTerm> terms;    // every non-weight term, sourced (activations included)
  int64_t kv_cache = 0;             // by the engine's rule (may be < 0)
  int64_t kv_bytes_per_token = 0;   // all full-attention layers of the rank's stage
  int64_t state_bytes_per_seq = 0;  // linear-attention state + sliding windows per sequence
  int64_t kv_tokens = 0;            // tokens that fit in kv_cache (0 if none)
  // What the engine logs for this rank: kv_tokens, except where its log counts otherwise (vLLM
  // divides the blocks of a model with sliding-window or recurrent layers by its layer groups).
  int64_t engine_kv_tokens = 0;
  int64_t required_kv = 0;  // bytes for max_model_len * max_num_seqs
  int64_t free = 0;         // kv_cache - required_kv
  bool fits = false;
};

struct MemoryPlan {
  MemoryOptions options;  // as resolved: utilization, batched tokens, backend filled in
  EngineProfile engine;
  int64_t max_model_len = 0;     // resolved
  int64_t engine_kv_tokens = 0;  // what the engine logs: the smallest over ranks
  int kv_dtype_bytes = 2;
  std::vector<RankMemory> ranks;
  bool fits = false;
  int64_t worst_rank = 0;  // the rank with the least free memory
  std::string failure;     // why it does not fit, which rank, shortfall, smallest change
};

// Per-rank memory for a plan. `suggest` (may be null) is called to look for the smallest
// change that fits, by re-planning with other options; see planner.h.
MemoryPlan PlanMemory(const ShardPlan& plan, const MemoryOptions& options);

// Activation peak of one rank (bytes) in the engine's profile forward of max_num_batched_tokens
// tokens (and, on the last stage, its sampler over max_num_seqs rows, at the engine's bytes per
// logit). See memory.cc.
int64_t ActivationBytes(const ShardPlan& plan, const RankPlan& rank, const MemoryOptions& options,
                        const EngineProfile& engine);

// The engine profile's refusals for this topology (vLLM cannot express moe_tp > 1 with
// moe_ep > 1), or Ok.
Status CheckEngineTopology(const EngineProfile& engine, const ShardPlan& plan);

// Total and active (per token) parameters of the model, logical (unpadded, unquantized count).
struct ParamCounts {
  int64_t total = 0;
  int64_t active = 0;
};
ParamCounts CountParams(const ShardPlan& plan);

}  // namespace moeshard
