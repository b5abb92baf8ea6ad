// LayerSteps: one MoE layer's forward on one rank, step by step, over the runtime's parts (the
// layer's bound weights, the workspace, the communicator groups). The steps, in order, as
// moe_runtime.h's "How the ranks share the work" describes (C: this rank's chunk of the unit's
// T tokens; U: the chunks of its moe_tp peers together):
//
//   1 PreNorm        stream -> xn: the chunk, or all T rows when shared experts are TP-split
//   2 RouteChunk     xn chunk -> chunk_ids / chunk_w [C, k] (router + routing, or given top-k)
//   3 ExpertInputs   xn chunk (-> latent_down, latent norm) -> chunk_rows [C, Lp] bf16
//   4 GatherMoeTp    chunk_rows / ids / weights -> union_* [U, ...]         (moe_tp > 1)
//   5 RoutedExperts  union rows -> union_out [U, Lp]: local experts, or Dispatch / experts on
//                    the received rows / Combine over the EP group           (moe_ep > 1)
//   6 ReduceMoeTp    union_out -> chunk_out [C, Lp]: sum of the moe_tp partials (moe_tp > 1)
//   7 ToHidden       routed [C, Lp] (-> latent_up) -> chunk_y [C, H]
//   8 SharedExperts  chunk_y += shared experts (replicated on the chunk, or TP-split on all T
//                    rows and reduce-scattered), scaled by their gate when gated
//   9 GatherUnit     chunk_y += residual; all-gathered over attention TP into stream [T, H]
//
// Steps 1-3 and 7 are in layer_steps.cc, 4-6 in routed_experts.cc, 8 in shared_experts.cc.
//
// Thread safety: one thread (the rank's). Run is COLLECTIVE over the groups the layout uses;
// it allocates nothing.
#pragma once

#include <cstdint>

#include "moeshard/base/status.h"
#include "moeshard/kernels/kernel_backend.h"
#include "moeshard/plan/topology.h"
#include "moeshard/runtime/moe_runtime.h"
#include "runtime/comm_groups.h"
#include "runtime/layer_shape.h"
#include "runtime/layer_weights.h"
#include "runtime/workspace.h"

namespace moeshard::internal {

// What one Forward call gives every layer.
struct LayerInput {
  int64_t num_tokens = 0;                // T of the unit
  TokenRange chunk;                      // this rank's tokens of the unit
  const int32_t* given_ids = nullptr;    // [T, k] routing bypass, or null
  const float* given_weights = nullptr;  // [T, k], with given_ids
  const int32_t* token_ids = nullptr;    // [T] (hash-routed layers), or null
};

// Where one layer's expert-load counters go (ForwardArgs::expert_counts / slot_counts), each
// optional; overwritten.
struct LayerCounts {
  int64_t* experts = nullptr;  // [E] pairs of this rank's chunk routed to each global expert
  int64_t* slots = nullptr;    // [num_slots] rows each local slot computed (moe_tp rank 0)
  int64_t num_slots = 0;
};

// The parts a layer runs over (owned by the runtime, outliving the steps).
struct LayerParts {
  KernelBackend* kernels = nullptr;
  const LayerShape* shape = nullptr;
  const ResolvedTopology* topology = nullptr;
  const RankCoords* coords = nullptr;
  const int32_t* global_to_local = nullptr;  // [E] local slot of each global expert, or -1
  CommGroups* groups = nullptr;
  Workspace* workspace = nullptr;
};

class LayerSteps {
 public:
  explicit LayerSteps(const LayerParts& parts);

  // stream [T, H] -> stream [T, H]: one layer. REQUIRES: the workspace's per-call counts
  // (tp_rows, mt_rows, ...) filled for this call's T.
  Status Run(const LayerWeights& ly, const LayerInput& in, const LayerCounts& counts = {});

 private:
  // The routed rows of one call as steps 4-6 pass them on: the union's (or, with moe_tp 1,
  // the chunk's) rows, expert ids and weights, and where the routed output ends up.
  struct Routed {
    int64_t num_rows = 0;            // U
    const bf16_t* rows = nullptr;    // [U, Lp] bf16
    const int32_t* ids = nullptr;    // [U, k]
    const float* weights = nullptr;  // [U, k]
    const float* output = nullptr;   // [C, Lp] fp32, after step 6
  };

  void PreNorm(const LayerWeights& ly, const LayerInput& in);
  Status RouteChunk(const LayerWeights& ly, const LayerInput& in, const float* xc);
  void ExpertInputs(const LayerWeights& ly, const float* xc, int64_t C);
  Status GatherMoeTp(int64_t C, Routed* r);
  Status RoutedExperts(const LayerWeights& ly, Routed* r, const LayerCounts& counts);
  // counts [E] = the pairs of ids [num_rows, k] per global expert.
  void CountExperts(const int32_t* ids, int64_t num_rows, int64_t* counts) const;
  // counts.slots [num_slots] += rows per local slot of the experts `expert_ids` [num_rows] (one
  // expert per row), on moe_tp rank 0 only; nothing without counts.slots.
  void CountSlots(const int32_t* expert_ids, int64_t num_rows, const LayerCounts& counts) const;
  Status ReduceMoeTp(Routed* r);
  void ToHidden(const LayerWeights& ly, const Routed& r, int64_t C);
  Status SharedExperts(const LayerWeights& ly, const LayerInput& in, const float* xc);
  // chunk_y += shared_chunk, each token's row scaled by its shared-expert gate when gated.
  void AddSharedOutput(const LayerWeights& ly, const float* xc, int64_t C);
  Status GatherUnit(const LayerInput& in);

  KernelBackend& kb_;
  const LayerShape& shape_;
  const ResolvedTopology& topo_;
  const RankCoords& coords_;
  const int32_t* global_to_local_;
  CommGroups& groups_;
  Workspace& ws_;
};

}  // namespace moeshard::internal
