#include "runtime/layer_weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "moeshard/kernels/moe_forward.h"
#include "moeshard/runtime/moe_runtime.h"

namespace moeshard::internal {
namespace {

using R = TensorRole;
using P = TensorPart;

std::vector<float> ToFloat(const WeightView& v) {
  size_t n = 1;
  for (int64_t d : v.shape) n *= static_cast<size_t>(d);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = v.dtype == DType::kF32 ? v.as<float>()[i] : Bf16ToFloat(v.as<bf16_t>()[i]);
  }
  return out;
}

template <typename T>
int64_t Bytes(const std::vector<T>& v) {
  return static_cast<int64_t>(v.size() * sizeof(T));
}

// Binds one layer's tensors of one rank; each Bind* fills its part of `ly`.
class WeightBinder {
 public:
  WeightBinder(const ShardPlan& plan, const RankPlan& rank_plan, const LayerShape& shape,
               const WeightViews& views, int64_t layer)
      : plan_(plan), rank_plan_(rank_plan), shape_(shape), views_(views), layer_(layer) {}

  Status BindRouting(LayerWeights* ly);
  Status BindLatent(LayerWeights* ly);
  Status BindShared(LayerWeights* ly);
  Status BindExperts(LayerWeights* ly);

 private:
  // The view of the rank's tensor of `role` and `part`; nullptr when absent and not required.
  Result<const WeightView*> View(TensorRole role, TensorPart part, bool required);
  // A bf16 [n] vector (norm weights).
  Result<const bf16_t*> NormVector(TensorRole role, const char* what, int64_t n, bool required);
  Result<DenseWeight> Dense(TensorRole role);
  // The zero points (int4-zp) and global scales (nvfp4) of a quantized weight whose scales have
  // `scale_shape`: `globals` takes the tensor's values, `global` its first one.
  Status BindZerosAndGlobal(TensorRole role, const WeightScheme& q,
                            const std::vector<int64_t>& scale_shape, const uint8_t** zeros,
                            const float** globals, float* global);
  Status BindHashTable(LayerWeights* ly);
  // Act-order: the g_idx of `role` ([parts..., cols] int32) for scales of `scale_shape`, each
  // entry checked to name one of the scale columns.
  Result<const int32_t*> GroupIndex(TensorRole role, int64_t cols,
                                    const std::vector<int64_t>& scale_shape);

  const ShardPlan& plan_;
  const RankPlan& rank_plan_;
  const LayerShape& shape_;
  const WeightViews& views_;
  const int64_t layer_;
};

Result<const WeightView*> WeightBinder::View(TensorRole role, TensorPart part, bool required) {
  const TensorShard* t = FindShard(rank_plan_, role, part, layer_);
  if (t == nullptr) {
    if (!required) return static_cast<const WeightView*>(nullptr);
    return NotFoundError(fmt::format(
        "runtime: layer {}: expected a {} tensor in the plan of rank {} (a model without it "
        "cannot run here)",
        layer_, TensorRoleName(role), rank_plan_.coords.rank));
  }
  return views_.Get(ExpandName(t->name, layer_), t->dtype, t->padded_shape);
}

Result<const bf16_t*> WeightBinder::NormVector(TensorRole role, const char* what, int64_t n,
                                               bool required) {
  MOESHARD_ASSIGN_OR_RETURN(const WeightView* v, View(role, P::kValue, required));
  if (v == nullptr) return static_cast<const bf16_t*>(nullptr);
  if (v->dtype != DType::kBF16 || v->shape != std::vector<int64_t>{n}) {
    return InvalidArgumentError(
        fmt::format("runtime: {} of layer {}: expected BF16 [{}], got {} [{}]", what, layer_, n,
                    DTypeName(v->dtype), fmt::join(v->shape, ", ")));
  }
  return v->as<bf16_t>();
}

Result<DenseWeight> WeightBinder::Dense(TensorRole role) {
  MOESHARD_ASSIGN_OR_RETURN(const WeightView* v, View(role, P::kWeight, true));
  MOESHARD_ASSIGN_OR_RETURN(const WeightView* sv, View(role, P::kScale, false));
  DenseWeight d;
  d.rows = v->shape[0];
  d.data = v->data;
  if (sv == nullptr) {
    if (v->dtype != DType::kBF16 && v->dtype != DType::kF32) {
      return InvalidArgumentError(fmt::format(
          "runtime: {} of layer {}: expected an unquantized BF16 or F32 weight, got {} without "
          "scales",
          TensorRoleName(role), layer_, DTypeName(v->dtype)));
    }
    d.f32 = v->dtype == DType::kF32;
    d.cols = v->shape[1];
    return d;
  }
  // Quantized: the model's scheme (block and group sizes from its config).
  d.scheme = plan_.model.quant.scheme;
  d.scales = sv->data;
  d.cols = d.scheme.packed() ? v->shape[1] * 2 : v->shape[1];
  if (d.scheme.act_order) {  // every group's scales when the rank holds a slice of the input
    MOESHARD_ASSIGN_OR_RETURN(d.group_index, GroupIndex(role, d.cols, sv->shape));
    d.scale_cols = sv->shape.back();
  }
  if (d.scheme.WeightDType() != v->dtype ||
      (!d.scheme.act_order && d.scheme.ScaleShape(d.rows, d.cols) != sv->shape)) {
    return InvalidArgumentError(fmt::format(
        "runtime: {} of layer {}: expected {} storage with scales [{}], got {} [{}] with scales "
        "[{}]",
        TensorRoleName(role), layer_, WeightFormatName(d.scheme.format),
        fmt::join(d.scheme.ScaleShape(d.rows, d.cols), ", "), DTypeName(v->dtype),
        fmt::join(v->shape, ", "), fmt::join(sv->shape, ", ")));
  }
  MOESHARD_RETURN_IF_ERROR(
      BindZerosAndGlobal(role, d.scheme, sv->shape, &d.zeros, nullptr, &d.global));
  return d;
}

Result<const int32_t*> WeightBinder::GroupIndex(TensorRole role, int64_t cols,
                                                const std::vector<int64_t>& scale_shape) {
  MOESHARD_ASSIGN_OR_RETURN(const WeightView* gv, View(role, P::kGroupIndex, true));
  if (gv->dtype != DType::kI32 || gv->shape.empty() || gv->shape.back() != cols) {
    return InvalidArgumentError(fmt::format(
        "runtime: {} of layer {}: expected an I32 g_idx of {} input channels (act-order GPTQ), "
        "got {} [{}]",
        TensorRoleName(role), layer_, cols, DTypeName(gv->dtype), fmt::join(gv->shape, ", ")));
  }
  const int64_t groups = scale_shape.back();
  int64_t n = 1;
  for (int64_t d : gv->shape) n *= d;
  const int32_t* g = gv->as<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (g[i] < 0 || g[i] >= groups) {
      return InvalidArgumentError(fmt::format(
          "runtime: {} of layer {}: g_idx entry {} (input channel {}) is {}, expected a group in "
          "[0, {}) (a corrupt act-order GPTQ checkpoint, or one quantized with another "
          "group_size than its config's)",
          TensorRoleName(role), layer_, i, i % cols, g[i], groups));
    }
  }
  return g;
}

Status WeightBinder::BindZerosAndGlobal(TensorRole role, const WeightScheme& q,
                                        const std::vector<int64_t>& scale_shape,
                                        const uint8_t** zeros, const float** globals,
                                        float* global) {
  if (q.has_zero_points()) {
    MOESHARD_ASSIGN_OR_RETURN(const WeightView* z, View(role, P::kZeroPoint, true));
    if (z->dtype != DType::kU8 || z->shape != scale_shape) {
      return InvalidArgumentError(fmt::format(
          "runtime: {} of layer {}: expected U8 zero points [{}] beside the scales, got {} [{}]",
          TensorRoleName(role), layer_, fmt::join(scale_shape, ", "), DTypeName(z->dtype),
          fmt::join(z->shape, ", ")));
    }
    *zeros = z->as<uint8_t>();
  }
  if (q.has_global_scale()) {
    MOESHARD_ASSIGN_OR_RETURN(const WeightView* gs, View(role, P::kGlobalScale, true));
    if (gs->dtype != DType::kF32) {
      return InvalidArgumentError(
          fmt::format("runtime: {} of layer {}: expected an F32 global scale, got {}",
                      TensorRoleName(role), layer_, DTypeName(gs->dtype)));
    }
    if (globals != nullptr) *globals = gs->as<float>();
    if (global != nullptr) *global = *gs->as<float>();
  }
  return Status::Ok();
}

Status WeightBinder::BindHashTable(LayerWeights* ly) {
  const int64_t vocab = plan_.model.vocab_size, k = shape_.top_k, E = shape_.num_experts;
  MOESHARD_ASSIGN_OR_RETURN(const WeightView* ht, View(R::kHashTable, P::kValue, true));
  if ((ht->dtype != DType::kI32 && ht->dtype != DType::kI64) ||
      ht->shape != std::vector<int64_t>{vocab, k}) {
    return InvalidArgumentError(fmt::format(
        "runtime: hash table of layer {}: expected I64 or I32 [{}, {}] (vocab, top-k), got {} "
        "[{}]",
        layer_, vocab, k, DTypeName(ht->dtype), fmt::join(ht->shape, ", ")));
  }
  // The router reads int32 expert ids; every entry is checked once, here.
  ly->hash_table.resize(static_cast<size_t>(vocab * k));
  for (int64_t i = 0; i < vocab * k; ++i) {
    const int64_t e = ht->dtype == DType::kI64 ? ht->as<int64_t>()[i] : ht->as<int32_t>()[i];
    if (e < 0 || e >= E) {
      return InvalidArgumentError(fmt::format(
          "runtime: hash table of layer {}: entry [{}, {}] is {}, expected an expert in [0, {})",
          layer_, i / k, i % k, e, E));
    }
    ly->hash_table[static_cast<size_t>(i)] = static_cast<int32_t>(e);
  }
  ly->routing.hash_table = ly->hash_table.data();
  return Status::Ok();
}

Status WeightBinder::BindRouting(LayerWeights* ly) {
  const ModelConfig& m = plan_.model;
  const int64_t H = shape_.hidden, E = shape_.num_experts;
  MOESHARD_ASSIGN_OR_RETURN(ly->pre_norm, NormVector(R::kPreMoeNorm, "pre-MoE norm", H, true));
  MOESHARD_ASSIGN_OR_RETURN(ly->router, Dense(R::kRouter));
  if (ly->router.rows != E || ly->router.cols != H) {
    return InvalidArgumentError(
        fmt::format("runtime: router of layer {}: expected [{}, {}], got [{}, {}]", layer_, E, H,
                    ly->router.rows, ly->router.cols));
  }
  MOESHARD_ASSIGN_OR_RETURN(const WeightView* rb, View(R::kRouterBias, P::kValue, false));
  if (rb != nullptr) ly->router_bias = ToFloat(*rb);
  ly->routing = KernelRoutingParams(m, layer_);
  const bool hashed = ly->routing.kind == RoutingKind::kSqrtSoftplusHash;
  if (hashed) MOESHARD_RETURN_IF_ERROR(BindHashTable(ly));
  const RoutingKind kind = shape_.routing.kind;
  const bool needs_bias =
      m.has_correction_bias && !hashed &&
      (kind == RoutingKind::kSigmoidGroupedTopK || kind == RoutingKind::kSqrtSoftplusTopK);
  MOESHARD_ASSIGN_OR_RETURN(const WeightView* cb, View(R::kCorrectionBias, P::kValue, needs_bias));
  if (cb != nullptr) {
    if (cb->dtype != DType::kF32 || cb->shape != std::vector<int64_t>{E}) {
      return InvalidArgumentError(
          fmt::format("runtime: correction bias of layer {}: expected F32 [{}], got {} [{}]",
                      layer_, E, DTypeName(cb->dtype), fmt::join(cb->shape, ", ")));
    }
    ly->correction_bias = cb->as<float>();
  }
  return Status::Ok();
}

Status WeightBinder::BindLatent(LayerWeights* ly) {
  const int64_t H = shape_.hidden, L = shape_.routed_width;
  MOESHARD_ASSIGN_OR_RETURN(ly->latent_down, Dense(R::kLatentDown));
  MOESHARD_ASSIGN_OR_RETURN(ly->latent_up, Dense(R::kLatentUp));
  if (ly->latent_down.rows != L || ly->latent_down.cols != H || ly->latent_up.rows != H ||
      ly->latent_up.cols != L) {
    return InvalidArgumentError(fmt::format(
        "runtime: 'latent projections' of layer {}: expected [{}, {}] and [{}, {}], got [{}, "
        "{}] and [{}, {}] (--latent-proj sharded is not supported by the runtime)",
        layer_, L, H, H, L, ly->latent_down.rows, ly->latent_down.cols, ly->latent_up.rows,
        ly->latent_up.cols));
  }
  MOESHARD_ASSIGN_OR_RETURN(ly->latent_norm, NormVector(R::kLatentNorm, "latent norm", L,
                                                        plan_.model.latent_moe_use_norm));
  return Status::Ok();
}

Status WeightBinder::BindShared(LayerWeights* ly) {
  const int64_t H = shape_.hidden, S = shape_.shared_width_local;
  MOESHARD_ASSIGN_OR_RETURN(ly->shared_gate, Dense(R::kSharedGate));
  MOESHARD_ASSIGN_OR_RETURN(ly->shared_up, Dense(R::kSharedUp));
  MOESHARD_ASSIGN_OR_RETURN(ly->shared_down, Dense(R::kSharedDown));
  ly->has_shared = true;
  if (ly->shared_gate.rows != S || ly->shared_up.rows != S || ly->shared_down.cols != S ||
      ly->shared_gate.cols != H || ly->shared_down.rows != H) {
    return InvalidArgumentError(fmt::format(
        "runtime: 'shared experts' of layer {}: expected gate/up [{}, {}] and down [{}, {}]",
        layer_, S, H, H, S));
  }
  if (shape_.shared_gated) {
    MOESHARD_ASSIGN_OR_RETURN(ly->shared_out_gate, Dense(R::kSharedGateProj));
    if (ly->shared_out_gate.rows != 1 || ly->shared_out_gate.cols != H) {
      return InvalidArgumentError(
          fmt::format("runtime: shared expert gate of layer {}: expected [1, {}], got [{}, {}]",
                      layer_, H, ly->shared_out_gate.rows, ly->shared_out_gate.cols));
    }
  }
  return Status::Ok();
}

Status WeightBinder::BindExperts(LayerWeights* ly) {
  ExpertWeights& x = ly->experts;
  x.scheme = plan_.expert_scheme;
  x.num_experts_local = static_cast<int64_t>(rank_plan_.expert_slots.size());
  x.hidden = shape_.routed_width_padded;
  x.intermediate = plan_.intermediate.padded_local;
  x.gated = plan_.model.gated();
  x.gate_up_interleaved = plan_.experts.gate_up_interleaved;
  if (x.num_experts_local == 0) return Status::Ok();
  for (const R role : {R::kExpertsW13, R::kExpertsW2}) {
    const bool is_w13 = role == R::kExpertsW13;
    MOESHARD_ASSIGN_OR_RETURN(const WeightView* v, View(role, P::kWeight, true));
    (is_w13 ? x.w13 : x.w2) = v->data;
    if (x.scheme.quantized()) {
      MOESHARD_ASSIGN_OR_RETURN(const WeightView* sv, View(role, P::kScale, true));
      (is_w13 ? x.w13_scales : x.w2_scales) = sv->data;
      MOESHARD_RETURN_IF_ERROR(BindZerosAndGlobal(role, x.scheme, sv->shape,
                                                  is_w13 ? &x.w13_zeros : &x.w2_zeros,
                                                  is_w13 ? &x.w13_global : &x.w2_global, nullptr));
      if (x.scheme.act_order) {
        MOESHARD_ASSIGN_OR_RETURN((is_w13 ? x.w13_group_index : x.w2_group_index),
                                  GroupIndex(role, is_w13 ? x.hidden : x.intermediate, sv->shape));
        if (!is_w13) x.w2_scale_cols = sv->shape.back();
      }
    }
  }
  if (!plan_.experts.bias_suffix.empty()) {
    for (const R role : {R::kExpertsW13Bias, R::kExpertsW2Bias}) {
      MOESHARD_ASSIGN_OR_RETURN(const WeightView* v, View(role, P::kValue, true));
      (role == R::kExpertsW13Bias ? ly->w13_bias : ly->w2_bias) = ToFloat(*v);
    }
    x.w13_bias = ly->w13_bias.data();
    x.w2_bias = ly->w2_bias.data();
  }
  return ValidateExpertWeights(x, shape_.activation)
      .WithContext(fmt::format("runtime: routed experts of layer {}", layer_));
}

}  // namespace

int64_t LayerWeights::ConvertedBytes() const {
  return Bytes(router_bias) + Bytes(w13_bias) + Bytes(w2_bias) + Bytes(hash_table);
}

const TensorShard* FindShard(const RankPlan& rp, TensorRole role, TensorPart part, int64_t layer) {
  for (const TensorShard& t : rp.tensors) {
    if (t.role != role || t.part != part) continue;
    if (layer >= 0 && !t.layers.empty() &&
        !std::binary_search(t.layers.begin(), t.layers.end(), layer)) {
      continue;
    }
    return &t;
  }
  return nullptr;
}

Status BindLayerWeights(const ShardPlan& plan, const RankPlan& rank_plan, const LayerShape& shape,
                        const WeightViews& views, int64_t layer, LayerWeights* out) {
  WeightBinder binder(plan, rank_plan, shape, views, layer);
  out->layer = layer;
  MOESHARD_RETURN_IF_ERROR(binder.BindRouting(out));
  if (shape.latent) MOESHARD_RETURN_IF_ERROR(binder.BindLatent(out));
  if (plan.model.num_shared_experts > 0) MOESHARD_RETURN_IF_ERROR(binder.BindShared(out));
  return binder.BindExperts(out);
}

std::vector<int32_t> LocalExpertSlots(const RankPlan& rank_plan, int64_t num_experts) {
  std::vector<int32_t> slots(static_cast<size_t>(num_experts), -1);
  for (size_t s = 0; s < rank_plan.expert_slots.size(); ++s) {
    const int64_t e = rank_plan.expert_slots[s];
    if (e >= 0 && e < num_experts && slots[e] < 0) slots[e] = static_cast<int32_t>(s);
  }
  return slots;
}

}  // namespace moeshard::internal
