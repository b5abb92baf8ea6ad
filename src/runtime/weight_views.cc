#include "moeshard/runtime/weight_views.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/check.h"
#include "moeshard/kernels/kernel_backend.h"
#include "moeshard/plan/shard_plan.h"
#include "moeshard/weights/rank_weights.h"
#include "runtime/layer_shape.h"

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

namespace {

// One layer's routed-expert data tensors as an ExpertWeights (scales, zero points and biases
// not bound: what a backend's in-place preparation rewrites), checked against the plan.
Result<ExpertWeights> ExpertDataOf(const ShardPlan& plan, const internal::LayerShape& shape,
                                   const TensorBuffer& w13, const TensorBuffer& w2) {
  ExpertWeights ew;
  ew.scheme = plan.expert_scheme;
  ew.num_experts_local = w13.shape.empty() ? 0 : w13.shape[0];
  ew.hidden = shape.routed_width_padded;
  ew.intermediate = plan.intermediate.padded_local;
  ew.gated = plan.model.gated();
  ew.gate_up_interleaved = plan.experts.gate_up_interleaved;
  ew.w13 = w13.data.data();
  ew.w2 = w2.data.data();
  const int64_t E = ew.num_experts_local, H = ew.hidden, I = ew.intermediate;
  const bool bf16 = ew.scheme.format == WeightFormat::kBf16;
  const std::vector<int64_t> want13 = {E, ew.w13_rows(), H}, want2 = {E, H, I};
  const bool ok = w13.shape.size() == 3 && w2.shape.size() == 3 && w2.shape[0] == E &&
                  (!bf16 || (w13.dtype == DType::kBF16 && w2.dtype == DType::kBF16 &&
                             w13.shape == want13 && w2.shape == want2));
  if (!ok) {
    return InvalidArgumentError(fmt::format(
        "runtime: '{}' and '{}': expected the plan's [{}] and [{}]{}, got {} [{}] and {} [{}]",
        w13.name, w2.name, fmt::join(want13, ", "), fmt::join(want2, ", "), bf16 ? " BF16" : "",
        DTypeName(w13.dtype), fmt::join(w13.shape, ", "), DTypeName(w2.dtype),
        fmt::join(w2.shape, ", ")));
  }
  return ew;
}

// The layer's routed-expert tensor of `role` and `part` (null when the plan or the rank has none).
TensorBuffer* ExpertPart(const RankPlan& rp, RankWeights* weights, TensorRole role, TensorPart part,
                         int64_t layer) {
  for (const TensorShard& s : rp.tensors) {
    if (s.role == role && s.part == part) return weights->FindMutable(ExpandName(s.name, layer));
  }
  return nullptr;
}

// Act-order experts without biases: their scales, zero points and g_idx into the view and the
// args (w13's scales and zero points writable), when every tensor has the dtype and bytes the
// view reads; otherwise nothing is bound and the backend keeps them as loaded (the binder
// reports the mismatch when the layer is bound).
void BindActOrder(const ShardPlan& plan, const RankPlan& rp, RankWeights* weights, int64_t layer,
                  const TensorBuffer& w13, const TensorBuffer& w2, PrepareExpertsArgs* a) {
  ExpertWeights& w = a->weights;
  if (!w.scheme.act_order || !plan.experts.bias_suffix.empty()) return;
  using R = TensorRole;
  using P = TensorPart;
  TensorBuffer* s13 = ExpertPart(rp, weights, R::kExpertsW13, P::kScale, layer);
  TensorBuffer* z13 = ExpertPart(rp, weights, R::kExpertsW13, P::kZeroPoint, layer);
  TensorBuffer* g13 = ExpertPart(rp, weights, R::kExpertsW13, P::kGroupIndex, layer);
  TensorBuffer* s2 = ExpertPart(rp, weights, R::kExpertsW2, P::kScale, layer);
  TensorBuffer* z2 = ExpertPart(rp, weights, R::kExpertsW2, P::kZeroPoint, layer);
  TensorBuffer* g2 = ExpertPart(rp, weights, R::kExpertsW2, P::kGroupIndex, layer);
  if (s13 == nullptr || z13 == nullptr || g13 == nullptr || s2 == nullptr || z2 == nullptr ||
      g2 == nullptr || s2->shape.empty() || w.scheme.group <= 0) {
    return;
  }
  // The dtypes the view reads (fp16 scales, U8 zero points, I32 g_idx): an I64 g_idx can have
  // another tensor's byte count and must not be sorted by.
  if (s13->dtype != DType::kF16 || s2->dtype != DType::kF16 || z13->dtype != DType::kU8 ||
      z2->dtype != DType::kU8 || g13->dtype != DType::kI32 || g2->dtype != DType::kI32) {
    return;
  }
  const int64_t E = w.num_experts_local, H = w.hidden, I = w.intermediate;
  const int64_t groups13 = E * w.w13_rows() * (H / w.scheme.group);
  const int64_t groups2 = E * H * s2->shape.back();
  const auto bytes = [](const TensorBuffer* t) { return static_cast<int64_t>(t->data.size()); };
  if (bytes(&w13) != E * w.w13_rows() * H / 2 || bytes(&w2) != E * H * I / 2 ||
      bytes(s13) != 2 * groups13 || bytes(z13) != groups13 || bytes(s2) != 2 * groups2 ||
      bytes(z2) != groups2 || bytes(g13) != 4 * E * (w.gated ? 2 : 1) * H ||
      bytes(g2) != 4 * E * I) {
    return;
  }
  w.w13_scales = s13->data.data();
  w.w13_zeros = reinterpret_cast<const uint8_t*>(z13->data.data());
  w.w13_group_index = reinterpret_cast<const int32_t*>(g13->data.data());
  w.w2_scales = s2->data.data();
  w.w2_zeros = reinterpret_cast<const uint8_t*>(z2->data.data());
  w.w2_group_index = reinterpret_cast<const int32_t*>(g2->data.data());
  w.w2_scale_cols = s2->shape.back();
  a->w13_scales = s13->data.data();
  a->w13_zeros = reinterpret_cast<uint8_t*>(z13->data.data());
}

}  // namespace

Result<int64_t> PrepareExpertWeights(KernelBackend& backend, const ShardPlan& plan,
                                     RankWeights* weights) {
  MOESHARD_CHECK(weights != nullptr, "PrepareExpertWeights: null weights");
  const RankPlan& rp = plan.ranks[static_cast<size_t>(weights->rank())];
  const TensorShard* s13 = nullptr;
  const TensorShard* s2 = nullptr;
  for (const TensorShard& s : rp.tensors) {
    if (s.part != TensorPart::kWeight) continue;
    if (s.role == TensorRole::kExpertsW13) s13 = &s;
    if (s.role == TensorRole::kExpertsW2) s2 = &s;
  }
  if (s13 == nullptr || s2 == nullptr) return int64_t{0};
  MOESHARD_ASSIGN_OR_RETURN(const internal::LayerShape shape,
                            internal::ResolveLayerShape(plan, rp));
  int64_t layers = 0;
  for (int64_t layer : s13->layers) {
    TensorBuffer* w13 = weights->FindMutable(ExpandName(s13->name, layer));
    TensorBuffer* w2 = weights->FindMutable(ExpandName(s2->name, layer));
    if (w13 == nullptr || w2 == nullptr) continue;  // layer not built
    PrepareExpertsArgs args;
    MOESHARD_ASSIGN_OR_RETURN(args.weights, ExpertDataOf(plan, shape, *w13, *w2));
    args.w13 = w13->data.data();
    args.w2 = w2->data.data();
    BindActOrder(plan, rp, weights, layer, *w13, *w2, &args);
    const Result<bool> rewritten = backend.PrepareExperts(args);
    if (!rewritten.ok()) {
      return rewritten.status().WithContext(fmt::format("runtime: '{}'", w13->name));
    }
    if (*rewritten) ++layers;
  }
  return layers;
}

}  // namespace moeshard
