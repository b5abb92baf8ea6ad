#include "moeshard/runtime/weight_views.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "moeshard/base/check.h"
#include "moeshard/kernels/expert_gemm.h"
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
  constexpr std::string_view kW13 = "mlp.experts.w13_weight";
  int64_t layers = 0;
  for (const TensorBuffer& t : weights->tensors()) {
    const std::string_view name = t.name;
    if (t.category != TensorCategory::kRoutedExperts || t.dtype != DType::kBF16 ||
        name.size() < kW13.size() || name.substr(name.size() - kW13.size()) != kW13 ||
        t.bf16_row_groups || t.shape.size() != 3) {
      continue;
    }
    const std::string w2_name =
        std::string(name.substr(0, name.size() - kW13.size())) + "mlp.experts.w2_weight";
    TensorBuffer* w13 = weights->FindMutable(t.name);
    TensorBuffer* w2 = weights->FindMutable(w2_name);
    const int64_t rows_per_i = plan.model.gated() ? 2 : 1;
    if (w2 == nullptr || w2->dtype != DType::kBF16 || w2->shape.size() != 3 ||
        w2->shape[0] != w13->shape[0] || w2->shape[1] != w13->shape[2] ||
        w13->shape[1] != rows_per_i * w2->shape[2]) {
      return InvalidArgumentError(fmt::format(
          "runtime: '{}': expected BF16 [{}, {}, {}] beside '{}' [{}], got {}", w2_name,
          w13->shape[0], w13->shape[2], w13->shape[1] / rows_per_i, t.name,
          fmt::join(w13->shape, ", "),
          w2 == nullptr
              ? std::string("none")
              : fmt::format("{} [{}]", DTypeName(w2->dtype), fmt::join(w2->shape, ", "))));
    }
    ExpertWeights ew;
    ew.format = WeightFormat::kBf16;
    ew.num_experts_local = w13->shape[0];
    ew.hidden = w13->shape[2];
    ew.intermediate = w2->shape[2];
    ew.gated = plan.model.gated();
    ew.gate_up_interleaved = plan.model.gate_up_fused;
    ew.w13 = w13->data.data();
    ew.w2 = w2->data.data();
    if (!CheckBf16RowGroupShape(ew).ok()) continue;  // stays row-major
    MOESHARD_RETURN_IF_ERROR(RepackBf16RowGroups(ctx, &ew, w13->data.data(), w2->data.data())
                                 .WithContext(fmt::format("runtime: '{}'", t.name)));
    w13->bf16_row_groups = w2->bf16_row_groups = true;
    ++layers;
  }
  return layers;
}

}  // namespace moeshard
