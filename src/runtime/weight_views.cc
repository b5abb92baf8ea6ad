#include "moeshard/runtime/weight_views.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/check.h"
#include "moeshard/kernels/expert_gemm.h"
#include "moeshard/plan/shard_plan.h"
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
    views.Add(t.name, WeightView{.data = t.data.data(),
                                 .dtype = t.dtype,
                                 .shape = t.shape,
                                 .num_bytes = t.data.size(),
                                 .bf16_row_groups = t.bf16_row_groups});
  }
  return views;
}

Result<int64_t> UseCpuRowGroupLayout(KernelContext& ctx, const ShardPlan& plan,
                                     RankWeights* weights) {
  MOESHARD_CHECK(weights != nullptr, "UseCpuRowGroupLayout: null weights");
  if (plan.expert_scheme.format != WeightFormat::kBf16) return int64_t{0};
  const RankPlan& rp = plan.ranks[static_cast<size_t>(weights->rank())];
  const TensorShard* s13 = nullptr;
  const TensorShard* s2 = nullptr;
  for (const TensorShard& s : rp.tensors) {
    if (s.part != TensorPart::kWeight) continue;
    if (s.role == TensorRole::kExpertsW13) s13 = &s;
    if (s.role == TensorRole::kExpertsW2) s2 = &s;
  }
  if (s13 == nullptr || s2 == nullptr) return int64_t{0};
  int64_t layers = 0;
  for (int64_t layer : s13->layers) {
    const std::string w13_name = ExpandName(s13->name, layer);
    const std::string w2_name = ExpandName(s2->name, layer);
    TensorBuffer* w13 = weights->FindMutable(w13_name);
    TensorBuffer* w2 = weights->FindMutable(w2_name);
    if (w13 == nullptr || w13->bf16_row_groups) continue;  // layer not built, or done
    const int64_t rows_per_i = plan.model.gated() ? 2 : 1;
    if (w2 == nullptr || w13->dtype != DType::kBF16 || w2->dtype != DType::kBF16 ||
        w13->shape.size() != 3 || w2->shape.size() != 3 || w2->shape[0] != w13->shape[0] ||
        w2->shape[1] != w13->shape[2] || w13->shape[1] != rows_per_i * w2->shape[2]) {
      return InvalidArgumentError(fmt::format(
          "runtime: '{}': expected BF16 [{}, {}, {}] beside '{}' {} [{}], got {}", w2_name,
          w13->shape[0], w13->shape.size() == 3 ? w13->shape[2] : -1,
          w13->shape.size() == 3 ? w13->shape[1] / rows_per_i : -1, w13_name, DTypeName(w13->dtype),
          fmt::join(w13->shape, ", "),
          w2 == nullptr
              ? std::string("none")
              : fmt::format("{} [{}]", DTypeName(w2->dtype), fmt::join(w2->shape, ", "))));
    }
    ExpertWeights ew;
    ew.scheme = plan.expert_scheme;
    ew.num_experts_local = w13->shape[0];
    ew.hidden = w13->shape[2];
    ew.intermediate = w2->shape[2];
    ew.gated = plan.model.gated();
    ew.gate_up_interleaved = plan.experts.gate_up_interleaved;
    ew.w13 = w13->data.data();
    ew.w2 = w2->data.data();
    if (!CheckBf16RowGroupShape(ew).ok()) continue;  // stays row-major
    MOESHARD_RETURN_IF_ERROR(RepackBf16RowGroups(ctx, &ew, w13->data.data(), w2->data.data())
                                 .WithContext(fmt::format("runtime: '{}'", w13_name)));
    w13->bf16_row_groups = w2->bf16_row_groups = true;
    ++layers;
  }
  return layers;
}

}  // namespace moeshard
