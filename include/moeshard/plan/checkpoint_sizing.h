// Sizing a plan from a checkpoint's tensors (names, dtypes, shapes from the safetensors headers
// alone): every checkpoint tensor is mapped to the plan tensor it feeds by name, and each rank
// is charged exactly the bytes of the slice it holds. Tensors the plan cannot place are listed,
// never dropped.
//
// Name mapping (after stripping a "language_model." prefix):
//   model.layers.L.mlp.experts.E.{gate,up,down}_proj.*      routed expert E (DeepSeek, Kimi)
//   model.layers.L.block_sparse_moe.experts.E.{w1,w2,w3}.*  routed expert E (Mixtral)
//   model.layers.L.mlp.experts.{gate_up,down}_proj[_blocks|_scales|_bias]  all experts (gpt-oss)
//   anything else: the plan tensor "model.layers.{layer}.<rest>" holding layer L, or a global
//   tensor by its exact name; `<module>.weight_shape` metadata rides with its module.
// A routed expert's bytes go to every rank holding one of its slots, times the fraction of the
// intermediate dimension the rank holds (down_proj's bias is not split).
//
// Thread safety: pure function. The weights layer reads the headers; see cli plan.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "moeshard/base/dtype.h"
#include "moeshard/plan/shard_plan.h"

namespace moeshard {

struct CheckpointTensorInfo {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  int64_t bytes = 0;
};

inline constexpr size_t kNumCategories = std::size(kAllCategories);

struct CheckpointSizing {
  int64_t total_bytes = 0;   // all checkpoint tensors
  int64_t placed_bytes = 0;  // those mapped to the plan
  int64_t num_tensors = 0;
  // [rank][category]: checkpoint bytes each rank holds (unpadded, as stored).
  std::vector<std::array<int64_t, kNumCategories>> rank_bytes;
  std::vector<std::string> unplaced;  // checkpoint tensors with no place in the plan

  int64_t RankTotal(int64_t rank) const;
};

CheckpointSizing SizeFromCheckpoint(const ShardPlan& plan,
                                    const std::vector<CheckpointTensorInfo>& tensors);

}  // namespace moeshard
