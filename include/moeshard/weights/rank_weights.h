// RankWeights: the tensors one rank of a ShardPlan holds, allocated exactly as the plan says
// (padded shapes, padding zero-filled) and filled from a checkpoint, a pre-sharded checkpoint,
// or layout-invariant dummy weights.
//
// Naming: one TensorBuffer per plan TensorShard and layer, with the plan's "{layer}"
// placeholder replaced by the layer index ("model.layers.3.mlp.experts.w13_weight_packed").
// Routed experts use the plan's fused per-rank layout (shard_plan.h): w13 [E_local, g*I_pad,
// H_pad] (gate rows [0, I_pad), up rows [I_pad, 2*I_pad); gpt-oss interleaved), w2 [E_local,
// H_pad, I_pad], plus scales and biases; local slot s holds global expert
// RankPlan::expert_slots[s].
//
// Dummy weights are layout-invariant: every element is a counter-based hash of (seed, logical
// tensor name, logical index) -- the name and index of the checkpoint tensor the element comes
// from (e.g. "model.layers.3.mlp.experts.17.up_proj.weight", [row, col]) -- so any rank
// generates exactly its slice without generating the rest, and every topology holds the same
// logical model.
//
// Thread safety: RankWeights is immutable after loading; share it freely between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moeshard/base/aligned_buffer.h"
#include "moeshard/base/status.h"
#include "moeshard/plan/shard_plan.h"

namespace moeshard {

struct TensorBuffer {
  std::string name;  // concrete name, layer filled in
  TensorCategory category = TensorCategory::kRoutedExperts;
  DType dtype = DType::kBF16;
  int64_t layer = -1;                // -1 for non-layer tensors
  std::vector<int64_t> shape;        // padded (allocated) shape
  std::vector<int64_t> local_shape;  // unpadded slice shape
  AlignedBuffer data;                // bytes of `shape`; padding is zero
};

class RankWeights {
 public:
  int64_t rank() const { return rank_; }
  const std::vector<TensorBuffer>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorBuffer* Find(const std::string& name) const;
  // "model.layers.{layer}.<suffix>" for `layer`, e.g. Layer(3, "mlp.experts.w13_weight").
  const TensorBuffer* FindLayer(int64_t layer, const std::string& suffix) const;
  int64_t BytesOf(TensorCategory category) const;
  int64_t TotalBytes() const;

  // For loaders.
  explicit RankWeights(int64_t rank) : rank_(rank) {}
  // The returned reference is valid until the next Add (unless Reserve made room).
  TensorBuffer& Add(TensorBuffer buffer);
  void Reserve(size_t num_tensors) { tensors_.reserve(num_tensors); }
  TensorBuffer* FindMutable(const std::string& name) {
    return const_cast<TensorBuffer*>(static_cast<const RankWeights*>(this)->Find(name));
  }

 private:
  int64_t rank_ = 0;
  std::vector<TensorBuffer> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

}  // namespace moeshard
