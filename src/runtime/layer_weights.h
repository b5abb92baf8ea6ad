// Weight binding by role: the tensors one MoE layer reads, found in the rank's plan by
// TensorRole and TensorPart (never by spelling a name), checked against the LayerShape, and
// bound as the kernels take them. Biases the kernels read in fp32 and hash tables are
// converted once, here; everything else is a view of the caller's WeightViews. Private to the
// runtime.
//
// Thread safety: LayerWeights is immutable once bound; binding is single-threaded.
#pragma once

#include <cstdint>
#include <vector>

#include "moeshard/base/numeric.h"
#include "moeshard/base/status.h"
#include "moeshard/kernels/dense_ops.h"
#include "moeshard/kernels/expert_gemm.h"
#include "moeshard/kernels/routing.h"
#include "moeshard/plan/shard_plan.h"
#include "moeshard/runtime/weight_views.h"
#include "runtime/layer_shape.h"

namespace moeshard::internal {

// One MoE layer's weights on this rank (H, L, E, S_local: LayerShape).
struct LayerWeights {
  int64_t layer = 0;                       // decoder layer index
  const bf16_t* pre_norm = nullptr;        // [H] bf16: post_attention_layernorm
  DenseWeight router;                      // [E, H]
  std::vector<float> router_bias;          // [E] fp32 or empty
  const float* correction_bias = nullptr;  // [E] fp32 or null
  RoutingParams routing;                   // this layer's (hash layers: by token id)
  std::vector<int32_t> hash_table;         // [vocab, k] int32 (hash layers; empty otherwise)
  DenseWeight latent_down, latent_up;      // [L, H], [H, L] (latent MoE)
  const bf16_t* latent_norm = nullptr;     // [L] bf16 or null
  bool has_shared = false;
  DenseWeight shared_gate, shared_up, shared_down;  // [S_local, H] x2, [H, S_local]
  DenseWeight shared_out_gate;           // [1, H]: sigmoid gate on the shared output, or empty
  ExpertWeights experts;                 // the plan's fused layout (kernels/expert_gemm.h)
  std::vector<float> w13_bias, w2_bias;  // fp32 copies of the bf16 biases (experts points here)

  // Bytes of the converted copies (biases, hash table).
  int64_t ConvertedBytes() const;
};

// The plan's tensor of `role` and `part` on this rank holding `layer` (any layer for -1;
// nullptr when the rank holds none).
const TensorShard* FindShard(const RankPlan& rank_plan, TensorRole role, TensorPart part,
                             int64_t layer = -1);

// Binds decoder layer `layer`'s weights from `views`. Errors name the tensor's role and the
// layer, with the expected and the found dtype and shape. `out` points into `views`' storage.
Status BindLayerWeights(const ShardPlan& plan, const RankPlan& rank_plan, const LayerShape& shape,
                        const WeightViews& views, int64_t layer, LayerWeights* out);

// [E] int32: the local slot holding each global expert on this rank (its first, with EPLB
// replicas), -1 where it holds none.
std::vector<int32_t> LocalExpertSlots(const RankPlan& rank_plan, int64_t num_experts);

}  // namespace moeshard::internal
