#include "moeshard/runtime/weight_views.h"

#include <fmt/format.h>

#include "moeshard/weights/rank_weights.h"

namespace moeshard {

const WeightView* WeightViews::Find(std::string_view name) const {
  auto it = views_.find(name);
  return it == views_.end() ? nullptr : &it->second;
}

Result<const WeightView*> WeightViews::Get(std::string_view name, DType dtype,
                                           const std::vector<int64_t>& shape) const {
  const WeightView* v = Find(name);
  if (v == nullptr) {
    return NotFoundError(fmt::format(
        "runtime: '{}': expected a {} [{}] tensor, got none (weights loaded for another plan?)",
        name, DTypeName(dtype), fmt::join(shape, ", ")));
  }
  if (v->dtype != dtype || v->shape != shape) {
    return InvalidArgumentError(fmt::format("runtime: '{}': expected {} [{}], got {} [{}]", name,
                                            DTypeName(dtype), fmt::join(shape, ", "),
                                            DTypeName(v->dtype), fmt::join(v->shape, ", ")));
  }
  return v;
}

WeightViews ViewRankWeights(const RankWeights& weights) {
  WeightViews views;
  for (const TensorBuffer& t : weights.tensors()) {
    views.Add(
        t.name,
        WeightView{
            .data = t.data.data(), .dtype = t.dtype, .shape = t.shape, .num_bytes = t.data.size()});
  }
  return views;
}

}  // namespace moeshard
