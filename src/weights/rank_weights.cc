#include "moeshard/weights/rank_weights.h"

#include <string_view>

#include "base/check.h"
#include "weights/checkpoint_map.h"

namespace moeshard {

const TensorBuffer* RankWeights::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorBuffer* RankWeights::FindLayer(int64_t layer, const std::string& suffix) const {
  return Find(internal::ConcreteName("model.layers.{layer}." + suffix, layer));
}

int64_t RankWeights::BytesOf(TensorCategory category) const {
  int64_t n = 0;
  for (const TensorBuffer& t : tensors_) {
    if (t.category == category) n += static_cast<int64_t>(t.data.size());
  }
  return n;
}

int64_t RankWeights::TotalBytes() const {
  int64_t n = 0;
  for (const TensorBuffer& t : tensors_) n += static_cast<int64_t>(t.data.size());
  return n;
}

TensorBuffer& RankWeights::Add(TensorBuffer buffer) {
  MOESHARD_CHECK(index_.find(buffer.name) == index_.end(), "tensor '{}' added twice to rank {}",
                 buffer.name, rank_);
  index_.emplace(buffer.name, tensors_.size());
  tensors_.push_back(std::move(buffer));
  return tensors_.back();
}

}  // namespace moeshard
