// Sizing a plan from a checkpoint's tensors (names, dtypes, shapes from the safetensors headers
// alone): every checkpoint tensor is mapped through the family descriptor (config/family.h) to
// the plan tensors it feeds, and each rank is charged exactly the bytes of the slice it holds.
// Tensors the plan cannot place are listed, never dropped; multi-token-prediction weights
// (DeepSeek-V3's `model.layers.61.*`, Qwen3-Next's `mtp.*`: IsMtpTensor in config/family.h,
// loaded only for speculative decoding) are reported as such.
//
// Mapping: a name equal to a non-layer plan tensor's (embeddings, head, vision tower) is
// charged to the ranks holding it; otherwise the name's layer and expert indices become
// "{layer}" / "{expert}" (KeyOfName) and the template names
//   - a plan tensor (its checkpoint name, or the source of a tied head) on the ranks of the
//     layer's stage: charged bytes x the fraction of the tensor the rank holds;
//   - a routed expert's gate/up/down part (ExpertLayout: per expert, or fused over experts):
//     charged to every rank holding one of the expert's slots, times the fraction of the
//     intermediate dimension the rank holds (biases of the down projection and weight_shape
//     metadata whole).
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

struct CheckpointSizing {
  int64_t total_bytes = 0;   // all checkpoint tensors
  int64_t placed_bytes = 0;  // those mapped to the plan
  int64_t num_tensors = 0;
  // [rank][category]: checkpoint bytes each rank holds (unpadded, as stored).
  std::vector<std::array<int64_t, kNumCategories>> rank_bytes;
  std::vector<std::string> unplaced;  // checkpoint tensors with no place in the plan
  // Tensors of the multi-token-prediction layers: recognised, not planned.
  int64_t mtp_tensors = 0;
  int64_t mtp_bytes = 0;
  std::vector<int64_t> mtp_layers;

  int64_t RankTotal(int64_t rank) const;
};

CheckpointSizing SizeFromCheckpoint(const ShardPlan& plan,
                                    const std::vector<CheckpointTensorInfo>& tensors);

}  // namespace moeshard
