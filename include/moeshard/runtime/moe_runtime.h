// MoeRuntime: the sharded MoE forward of DESIGN.md, for one rank of a ShardPlan.
//
// What one layer computes, per token (the MoE sub-block of a pre-norm decoder layer):
//
//   h   = RMSNorm(x) * post_attention_layernorm                       [H]
//   ids, w = router(h)       fp32 logits, the model's routing method  (or given top-k; hash
//                            layers read the experts of the token's id from their table)
//   z   = latent MoE ? RMSNorm(latent_down(h)) * latent_norm : h       [L]  (L = H if not latent)
//   r   = sum_k w_k * expert_{ids_k}(z)                                [L]
//   y   = x + (latent MoE ? latent_up(r) : r) + shared_experts(h)      [H]  (residual)
//
// and layer l's y is layer l+1's x. The residual stream stays fp32 between layers; the caller's
// input and output are bf16 or fp32.
//
// How the ranks share the work (sequence-parallel MoE, as vLLM's use_sequence_parallel_moe):
//   * The attention-TP ranks of one DP (and PCP) rank -- a "unit" -- hold the same [T, H]
//     hidden states. Tokens are split into tp chunks (the first T % tp ranks get one more);
//     each rank routes its chunk and builds the experts' input rows for it.
//   * moe_tp > 1: the chunks of the ranks sharing one moe_ep rank are all-gathered (AllGatherV,
//     uneven and empty chunks allowed); every such rank computes its I/moe_tp slice of every
//     expert for all of them; the partial outputs are reduce-scattered back to the chunk owners.
//   * moe_ep > 1: over the ranks sharing one moe_tp rank, (token, expert) pairs are dispatched
//     to the expert's owner, computed with the grouped GEMM there and combined back
//     (expert_dispatch.h), weighted at the source. Hybrids do both (dispatch inside the
//     gathered set, reduce-scatter over moe_tp afterwards). The down-projection bias is added
//     once, by moe_tp rank 0.
//   * Shared experts: replicated (computed on the chunk) or column/row split over attention TP
//     (computed on all T tokens of the unit, reduce-scattered into chunks).
//   * The chunk's new hidden states are all-gathered over attention TP, so every rank of a unit
//     ends each layer with the same (bitwise) [T, H].
//
// Sub-communicators (attention TP, moe_tp, moe_ep) are split from the world at Create.
//
// Memory: every buffer is sized at Create from the plan and `max_tokens` and reused for every
// layer and call; Forward allocates nothing (tested by counting operator new in a steady-state
// call, tests/runtime/steady_state_test.cc). WorkspaceBytes() reports them.
//
// Not supported (Unimplemented at Create): pipeline parallelism (pp > 1) and
// --latent-proj sharded.
//
// Thread safety: one thread per MoeRuntime (the rank's thread); Create and Forward are
// COLLECTIVE over the world communicator.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moeshard/base/dtype.h"
#include "moeshard/base/status.h"
#include "moeshard/comm/communicator.h"
#include "moeshard/kernels/expert_gemm.h"
#include "moeshard/kernels/kernel_backend.h"
#include "moeshard/kernels/routing.h"
#include "moeshard/plan/shard_plan.h"
#include "moeshard/runtime/weight_views.h"

namespace moeshard {

struct MoeRuntimeOptions {
  // Most tokens a unit holds in one Forward ([T, H] with T <= max_tokens); sizes the buffers.
  int64_t max_tokens = 0;
  // MoE layers to run, in order (decoder layer indices of this rank's stage). Empty: every MoE
  // layer of the stage.
  std::vector<int64_t> layers;
};

struct ForwardArgs {
  const void* x = nullptr;      // [num_tokens, hidden_size] row-major, dtype x_dtype: the unit's
                                // tokens (identical on every attention-TP rank of the unit)
  DType x_dtype = DType::kF32;  // kF32 or kBF16
  int64_t num_tokens = 0;       // T of this unit, 0 <= T <= max_tokens (0 allowed)
  // Optional: bypass the router in every layer. [num_tokens, top_k] int32 global expert ids
  // and fp32 weights (used as given: no renormalisation, no scaling).
  const int32_t* topk_ids = nullptr;
  const float* topk_weights = nullptr;
  // [num_tokens] int32 token ids in [0, vocab_size): required when a layer routes by token id
  // (ModelConfig LayerSpec::hash_routing, DeepSeek-V4's first layers) and its router is not
  // bypassed; ignored otherwise. Identical on the attention-TP ranks of a unit, as x is.
  const int32_t* token_ids = nullptr;
  void* out = nullptr;  // [num_tokens, hidden_size], dtype x_dtype; may equal x
  // Optional: [num_layers(), num_tokens, hidden_size] fp32, every layer's output.
  float* layer_outputs = nullptr;
  // Optional: [num_layers()] seconds each layer took on this rank (wall clock, including
  // waiting in collectives).
  double* layer_seconds = nullptr;
  // Optional expert-load counters, overwritten by every call (docs/eplb.md):
  //   expert_counts [num_layers(), num_experts] int64: the (token, top-k choice) pairs of this
  //     rank's chunk routed to each global expert. The chunks of a unit's attention-TP ranks
  //     tile its tokens and the units hold disjoint tokens, so the sum over the world counts
  //     every pair of the step once.
  //   slot_counts [num_layers(), num_expert_slots()] int64: the rows each of this rank's expert
  //     slots computed (an expert held twice by one rank serves from its first slot). Counted on
  //     moe_tp rank 0 only (zero on the others, which compute other I slices of the same rows),
  //     so the sum over the world is the same pair count again.
  int64_t* expert_counts = nullptr;
  int64_t* slot_counts = nullptr;
};

class MoeRuntime {
 public:
  // COLLECTIVE over `world` (splits the sub-communicators). `plan`, `weights`, `world` and
  // `kernels` must outlive the runtime. Every operation runs on `kernels` (any backend of
  // kernel_backend.h; its buffers hold the activations), which must have prepared the
  // weights' routed experts if it is to use its own layout (PrepareExpertWeights). world.size()
  // must equal the plan's world and world.rank() selects plan.ranks[rank]. Errors: a weight missing
  // or of the wrong shape or dtype (naming the tensor), unsupported options (naming the flag).
  static Result<std::unique_ptr<MoeRuntime>> Create(const ShardPlan& plan,
                                                    const WeightViews& weights, Communicator& world,
                                                    KernelBackend& kernels,
                                                    const MoeRuntimeOptions& options);
  ~MoeRuntime();

  // COLLECTIVE over the world: runs the layers. Every rank must call it; ranks of one unit
  // must pass the same num_tokens (checked: InvalidArgument naming both ranks).
  Status Forward(const ForwardArgs& args);

  const std::vector<int64_t>& layers() const;
  int64_t num_layers() const { return static_cast<int64_t>(layers().size()); }
  int64_t hidden_size() const;
  int64_t top_k() const;
  int64_t num_experts() const;       // global (logical) experts
  int64_t num_expert_slots() const;  // this rank's expert slots (RankPlan::expert_slots)
  // Bytes of the runtime's own buffers (activations, dispatch, converted biases).
  int64_t WorkspaceBytes() const;

 private:
  struct Impl;  // src/runtime/moe_runtime.cc: the runtime's parts
  explicit MoeRuntime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Which tokens of a unit of `num_tokens` attention-TP rank `tp_rank` of `tp` handles:
// [begin, end), the first num_tokens % tp ranks one more.
struct TokenRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
TokenRange TokenChunk(int64_t num_tokens, int64_t tp, int64_t tp_rank);

// The kernels' enums for the model's.
Activation KernelActivation(ExpertActivation activation);
ActivationParams KernelActivationParams(const ModelConfig& model);
RoutingParams KernelRoutingParams(const ModelConfig& model);
// The routing of decoder layer `layer`: hash layers route by token id (kSqrtSoftplusHash; the
// table pointer is the caller's to set), the others as KernelRoutingParams(model).
RoutingParams KernelRoutingParams(const ModelConfig& model, int64_t layer);
// The MoE layers among `layers`, in order.
std::vector<int64_t> MoeLayersOf(const ModelConfig& model, const std::vector<int64_t>& layers);

}  // namespace moeshard
