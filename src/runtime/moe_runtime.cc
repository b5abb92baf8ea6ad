#include "moeshard/runtime/moe_runtime.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

#include "moeshard/base/numeric.h"
#include "moeshard/kernels/moe_forward.h"
#include "moeshard/runtime/expert_dispatch.h"
#include "runtime/dense_ops.h"

namespace moeshard {

using internal::DenseWeight;

TokenRange TokenChunk(int64_t num_tokens, int64_t tp, int64_t tp_rank) {
  const int64_t base = num_tokens / tp, rem = num_tokens % tp;
  const int64_t begin = tp_rank * base + std::min(tp_rank, rem);
  return {begin, begin + base + (tp_rank < rem ? 1 : 0)};
}

Activation KernelActivation(ExpertActivation activation) {
  switch (activation) {
    case ExpertActivation::kSwiGlu: return Activation::kSwiGlu;
    case ExpertActivation::kSwiGluOai: return Activation::kSwiGluOai;
    case ExpertActivation::kSitu: return Activation::kSiTu;
    case ExpertActivation::kRelu2: return Activation::kReluSquared;
    case ExpertActivation::kGeluTanh: return Activation::kGeluTanhGated;
    case ExpertActivation::kSwiGluClamp: return Activation::kSwiGluClamp;
  }
  return Activation::kSwiGlu;
}

ActivationParams KernelActivationParams(const ModelConfig& m) {
  ActivationParams a;
  a.kind = KernelActivation(m.activation);
  a.swiglu_limit = static_cast<float>(m.swiglu_limit);
  a.swiglu_alpha = static_cast<float>(m.swiglu_alpha);
  a.situ_beta = static_cast<float>(m.situ_beta);
  a.situ_linear_beta = static_cast<float>(m.situ_linear_beta);
  return a;
}

RoutingParams KernelRoutingParams(const ModelConfig& m) {
  RoutingParams r;
  switch (m.routing) {
    case RoutingMethod::kSoftmaxTopK: r.kind = RoutingKind::kSoftmaxTopK; break;
    case RoutingMethod::kSigmoidGroupedTopK: r.kind = RoutingKind::kSigmoidGroupedTopK; break;
    case RoutingMethod::kTopKThenSoftmax: r.kind = RoutingKind::kTopKThenSoftmax; break;
    case RoutingMethod::kSoftmaxGroupedTopK: r.kind = RoutingKind::kSoftmaxGroupedTopK; break;
    case RoutingMethod::kTopKThenSigmoid: r.kind = RoutingKind::kTopKThenSigmoid; break;
    case RoutingMethod::kSqrtSoftplusTopK: r.kind = RoutingKind::kSqrtSoftplusTopK; break;
  }
  r.num_experts = m.num_experts;
  r.top_k = m.num_experts_per_tok;
  r.renormalize = m.norm_topk_prob;
  r.num_groups = std::max<int64_t>(1, m.n_group);
  r.topk_group = std::max<int64_t>(1, m.topk_group);
  r.routed_scaling_factor = static_cast<float>(m.routed_scaling_factor);
  return r;
}

RoutingParams KernelRoutingParams(const ModelConfig& m, int64_t layer) {
  RoutingParams r = KernelRoutingParams(m);
  if (layer >= 0 && layer < static_cast<int64_t>(m.layers.size()) &&
      m.layers[static_cast<size_t>(layer)].hash_routing) {
    r.kind = RoutingKind::kSqrtSoftplusHash;
    r.hash_vocab = m.vocab_size;
  }
  return r;
}

std::vector<int64_t> MoeLayersOf(const ModelConfig& model, const std::vector<int64_t>& layers) {
  std::vector<int64_t> out;
  for (int64_t l : layers) {
    if (l >= 0 && l < static_cast<int64_t>(model.layers.size()) && model.layers[l].moe) {
      out.push_back(l);
    }
  }
  return out;
}

namespace {

// The plan's tensor of `role` and `part` on this rank holding `layer` (nullptr when the rank
// holds none): the runtime finds weights by role, never by spelling a name.
const TensorShard* FindShard(const RankPlan& rp, TensorRole role, TensorPart part,
                             int64_t layer = -1) {
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

}  // namespace

struct MoeRuntime::Impl {
  struct Layer {
    int64_t layer = 0;
    const bf16_t* pre_norm = nullptr;        // [H]
    DenseWeight router;                      // [E, H]
    std::vector<float> router_bias;          // [E] or empty
    const float* correction_bias = nullptr;  // [E] or null
    RoutingParams routing;                   // this layer's (hash layers: by token id)
    std::vector<int32_t> hash_table;         // [vocab, k] (hash layers; empty otherwise)
    DenseWeight latent_down, latent_up;      // [L, H], [H, L]
    const bf16_t* latent_norm = nullptr;     // [L] or null
    bool has_shared = false;
    DenseWeight shared_gate, shared_up, shared_down;  // [S_local, H] x2, [H, S_local]
    DenseWeight shared_out_gate;  // [1, H]: sigmoid gate on the shared output, or empty
    ExpertWeights experts;
    std::vector<float> w13_bias, w2_bias;  // fp32 copies of the bf16 biases
  };

  const ShardPlan* plan = nullptr;
  const RankPlan* rank_plan = nullptr;
  RankCoords coords;
  Communicator* world = nullptr;
  KernelContext* ctx = nullptr;
  std::unique_ptr<Communicator> tp_comm, moe_tp_comm, ep_comm;
  std::optional<ExpertDispatcher> dispatcher;
  internal::DenseScratch scratch;
  RoutingParams routing;
  ActivationParams activation;

  int64_t world_size = 1, tp = 1, moe_tp = 1, moe_ep = 1;
  int64_t H = 0, L = 0, Lp = 0, E = 0, k = 0, S_local = 0;
  int64_t T_max = 0, C_max = 0, U_max = 0, R_max = 0;
  bool latent = false, shared_split = false;
  bool shared_gated = false;     // the shared output is scaled by sigmoid(shared_out_gate . x)
  bool weight_on_input = false;  // top-1 routing weight applied to the expert input
  std::vector<int64_t> layer_ids;
  std::vector<Layer> layers;
  std::vector<int32_t> global_to_local;  // [E]

  // Buffers (sizes: see Create).
  std::vector<int64_t> all_tokens;                  // [world]
  std::vector<size_t> mt_rows, mt_floats;           // [moe_tp]
  std::vector<size_t> tp_rows, tp_floats;           // [tp]
  std::vector<float> stream, xn;                    // [T_max, H]
  std::vector<float> logits;                        // [C_max, E]
  std::vector<int32_t> chunk_ids, union_ids;        // [C_max, k], [U_max, k]
  std::vector<float> chunk_w, union_w;              // [C_max, k], [U_max, k]
  std::vector<float> lat;                           // [C_max, L]
  std::vector<bf16_t> chunk_rows, union_rows;       // [C_max, Lp], [U_max, Lp]
  std::vector<float> union_out, chunk_out;          // [U_max, Lp], [C_max, Lp]
  std::vector<float> ones;                          // [R_max]
  std::vector<float> chunk_y;                       // [C_max, H]
  std::vector<float> gate_buf, up_buf;              // [T_max or C_max, S_local]
  std::vector<float> shared_partial, shared_chunk;  // [T_max, H], [C_max, H]
  std::vector<float> shared_gate_logit;             // [C_max]

  Status Init(const ShardPlan& p, const WeightViews& w, Communicator& wc, KernelContext& kc,
              const MoeRuntimeOptions& o);
  Status LoadLayer(const WeightViews& w, int64_t layer, Layer* out);
  Result<DenseWeight> Dense(const WeightViews& w, TensorRole role, int64_t layer);
  // The zero points (int4-zp) and global scales (nvfp4) of a quantized weight whose scales have
  // `scale_shape`: `globals` takes the tensor's values, `global` its first one.
  Status BindZerosAndGlobal(const WeightViews& w, TensorRole role, int64_t layer,
                            const WeightScheme& q, const std::vector<int64_t>& scale_shape,
                            const uint8_t** zeros, const float** globals, float* global);
  Result<const WeightView*> View(const WeightViews& w, TensorRole role, TensorPart part,
                                 int64_t layer, bool required);
  Status RunLayer(const Layer& ly, int64_t T, TokenRange chunk, const int32_t* given_ids,
                  const float* given_w, const int32_t* token_ids);
  // chunk_y += shared_chunk, each token's row scaled by its shared-expert gate when gated.
  void AddSharedOutput(const Layer& ly, const float* xc, int64_t C);
  int64_t WorkspaceBytes() const;
};

Result<const WeightView*> MoeRuntime::Impl::View(const WeightViews& w, TensorRole role,
                                                 TensorPart part, int64_t layer, bool required) {
  const TensorShard* t = FindShard(*rank_plan, role, part, layer);
  if (t == nullptr) {
    if (!required) return static_cast<const WeightView*>(nullptr);
    return NotFoundError(fmt::format(
        "runtime: layer {}: expected a {} tensor in the plan of rank {} (a model without it "
        "cannot run here)",
        layer, TensorRoleName(role), coords.rank));
  }
  return w.Get(ExpandName(t->name, layer), t->dtype, t->padded_shape);
}

Result<DenseWeight> MoeRuntime::Impl::Dense(const WeightViews& w, TensorRole role, int64_t layer) {
  MOESHARD_ASSIGN_OR_RETURN(const WeightView* v, View(w, role, TensorPart::kWeight, layer, true));
  MOESHARD_ASSIGN_OR_RETURN(const WeightView* sv, View(w, role, TensorPart::kScale, layer, false));
  DenseWeight d;
  d.rows = v->shape[0];
  d.data = v->data;
  if (sv == nullptr) {
    if (v->dtype != DType::kBF16 && v->dtype != DType::kF32) {
      return InvalidArgumentError(fmt::format(
          "runtime: {} of layer {}: expected an unquantized BF16 or F32 weight, got {} without "
          "scales",
          TensorRoleName(role), layer, DTypeName(v->dtype)));
    }
    d.f32 = v->dtype == DType::kF32;
    d.cols = v->shape[1];
    return d;
  }
  // Quantized: the model's scheme (block and group sizes from its config).
  d.scheme = plan->model.quant.scheme;
  d.scales = sv->data;
  d.cols = d.scheme.packed() ? v->shape[1] * 2 : v->shape[1];
  if (d.scheme.WeightDType() != v->dtype || d.scheme.ScaleShape(d.rows, d.cols) != sv->shape) {
    return InvalidArgumentError(fmt::format(
        "runtime: {} of layer {}: expected {} storage with scales [{}], got {} [{}] with scales "
        "[{}]",
        TensorRoleName(role), layer, WeightFormatName(d.scheme.format),
        fmt::join(d.scheme.ScaleShape(d.rows, d.cols), ", "), DTypeName(v->dtype),
        fmt::join(v->shape, ", "), fmt::join(sv->shape, ", ")));
  }
  MOESHARD_RETURN_IF_ERROR(BindZerosAndGlobal(w, role, layer, d.scheme, sv->shape, &d.zeros,
                                              nullptr, &d.global));
  return d;
}

Status MoeRuntime::Impl::BindZerosAndGlobal(const WeightViews& w, TensorRole role, int64_t layer,
                                            const WeightScheme& q,
                                            const std::vector<int64_t>& scale_shape,
                                            const uint8_t** zeros, const float** globals,
                                            float* global) {
  if (q.has_zero_points()) {
    MOESHARD_ASSIGN_OR_RETURN(const WeightView* z,
                              View(w, role, TensorPart::kZeroPoint, layer, true));
    if (z->dtype != DType::kU8 || z->shape != scale_shape) {
      return InvalidArgumentError(fmt::format(
          "runtime: {} of layer {}: expected U8 zero points [{}] beside the scales, got {} [{}]",
          TensorRoleName(role), layer, fmt::join(scale_shape, ", "), DTypeName(z->dtype),
          fmt::join(z->shape, ", ")));
    }
    *zeros = z->as<uint8_t>();
  }
  if (q.has_global_scale()) {
    MOESHARD_ASSIGN_OR_RETURN(const WeightView* gs,
                              View(w, role, TensorPart::kGlobalScale, layer, true));
    if (gs->dtype != DType::kF32) {
      return InvalidArgumentError(fmt::format(
          "runtime: {} of layer {}: expected an F32 global scale, got {}", TensorRoleName(role),
          layer, DTypeName(gs->dtype)));
    }
    if (globals != nullptr) *globals = gs->as<float>();
    if (global != nullptr) *global = *gs->as<float>();
  }
  return Status::Ok();
}

Status MoeRuntime::Impl::LoadLayer(const WeightViews& w, int64_t layer, Layer* ly) {
  const ModelConfig& m = plan->model;
  const RankPlan& rp = *rank_plan;
  ly->layer = layer;
  using R = TensorRole;
  using P = TensorPart;
  {
    MOESHARD_ASSIGN_OR_RETURN(const WeightView* v, View(w, R::kPreMoeNorm, P::kValue, layer, true));
    if (v->dtype != DType::kBF16 || v->shape != std::vector<int64_t>{H}) {
      return InvalidArgumentError(
          fmt::format("runtime: pre-MoE norm of layer {}: expected BF16 [{}], got {} [{}]", layer,
                      H, DTypeName(v->dtype), fmt::join(v->shape, ", ")));
    }
    ly->pre_norm = v->as<bf16_t>();
  }
  MOESHARD_ASSIGN_OR_RETURN(ly->router, Dense(w, R::kRouter, layer));
  if (ly->router.rows != E || ly->router.cols != H) {
    return InvalidArgumentError(
        fmt::format("runtime: router of layer {}: expected [{}, {}], got [{}, {}]", layer, E, H,
                    ly->router.rows, ly->router.cols));
  }
  MOESHARD_ASSIGN_OR_RETURN(const WeightView* rb, View(w, R::kRouterBias, P::kValue, layer, false));
  if (rb != nullptr) ly->router_bias = ToFloat(*rb);
  ly->routing = KernelRoutingParams(m, layer);
  const bool hashed = ly->routing.kind == RoutingKind::kSqrtSoftplusHash;
  if (hashed) {
    MOESHARD_ASSIGN_OR_RETURN(const WeightView* ht, View(w, R::kHashTable, P::kValue, layer, true));
    if ((ht->dtype != DType::kI32 && ht->dtype != DType::kI64) ||
        ht->shape != std::vector<int64_t>{m.vocab_size, k}) {
      return InvalidArgumentError(fmt::format(
          "runtime: hash table of layer {}: expected I64 or I32 [{}, {}] (vocab, top-k), got {} "
          "[{}]",
          layer, m.vocab_size, k, DTypeName(ht->dtype), fmt::join(ht->shape, ", ")));
    }
    // The router reads int32 expert ids; every entry is checked once, here.
    ly->hash_table.resize(static_cast<size_t>(m.vocab_size * k));
    for (int64_t i = 0; i < m.vocab_size * k; ++i) {
      const int64_t e = ht->dtype == DType::kI64 ? ht->as<int64_t>()[i] : ht->as<int32_t>()[i];
      if (e < 0 || e >= E) {
        return InvalidArgumentError(fmt::format(
            "runtime: hash table of layer {}: entry [{}, {}] is {}, expected an expert in [0, {})",
            layer, i / k, i % k, e, E));
      }
      ly->hash_table[static_cast<size_t>(i)] = static_cast<int32_t>(e);
    }
    ly->routing.hash_table = ly->hash_table.data();
  }
  const bool needs_bias = m.has_correction_bias && !hashed &&
                          (routing.kind == RoutingKind::kSigmoidGroupedTopK ||
                           routing.kind == RoutingKind::kSqrtSoftplusTopK);
  MOESHARD_ASSIGN_OR_RETURN(const WeightView* cb,
                            View(w, R::kCorrectionBias, P::kValue, layer, needs_bias));
  if (cb != nullptr) {
    if (cb->dtype != DType::kF32 || cb->shape != std::vector<int64_t>{E}) {
      return InvalidArgumentError(
          fmt::format("runtime: correction bias of layer {}: expected F32 [{}], got {} [{}]", layer,
                      E, DTypeName(cb->dtype), fmt::join(cb->shape, ", ")));
    }
    ly->correction_bias = cb->as<float>();
  }
  if (latent) {
    MOESHARD_ASSIGN_OR_RETURN(ly->latent_down, Dense(w, R::kLatentDown, layer));
    MOESHARD_ASSIGN_OR_RETURN(ly->latent_up, Dense(w, R::kLatentUp, layer));
    if (ly->latent_down.rows != L || ly->latent_down.cols != H || ly->latent_up.rows != H ||
        ly->latent_up.cols != L) {
      return InvalidArgumentError(fmt::format(
          "runtime: 'latent projections' of layer {}: expected [{}, {}] and [{}, {}], got [{}, "
          "{}] and [{}, {}] (--latent-proj sharded is not supported by the runtime)",
          layer, L, H, H, L, ly->latent_down.rows, ly->latent_down.cols, ly->latent_up.rows,
          ly->latent_up.cols));
    }
    MOESHARD_ASSIGN_OR_RETURN(const WeightView* n,
                              View(w, R::kLatentNorm, P::kValue, layer, m.latent_moe_use_norm));
    if (n != nullptr) {
      if (n->dtype != DType::kBF16 || n->shape != std::vector<int64_t>{L}) {
        return InvalidArgumentError(
            fmt::format("runtime: latent norm of layer {}: expected BF16 [{}], got {} [{}]", layer,
                        L, DTypeName(n->dtype), fmt::join(n->shape, ", ")));
      }
      ly->latent_norm = n->as<bf16_t>();
    }
  }
  if (m.num_shared_experts > 0) {
    MOESHARD_ASSIGN_OR_RETURN(ly->shared_gate, Dense(w, R::kSharedGate, layer));
    MOESHARD_ASSIGN_OR_RETURN(ly->shared_up, Dense(w, R::kSharedUp, layer));
    MOESHARD_ASSIGN_OR_RETURN(ly->shared_down, Dense(w, R::kSharedDown, layer));
    ly->has_shared = true;
    if (ly->shared_gate.rows != S_local || ly->shared_up.rows != S_local ||
        ly->shared_down.cols != S_local || ly->shared_gate.cols != H || ly->shared_down.rows != H) {
      return InvalidArgumentError(fmt::format(
          "runtime: 'shared experts' of layer {}: expected gate/up [{}, {}] and down [{}, {}]",
          layer, S_local, H, H, S_local));
    }
    if (shared_gated) {
      MOESHARD_ASSIGN_OR_RETURN(ly->shared_out_gate, Dense(w, R::kSharedGateProj, layer));
      if (ly->shared_out_gate.rows != 1 || ly->shared_out_gate.cols != H) {
        return InvalidArgumentError(
            fmt::format("runtime: shared expert gate of layer {}: expected [1, {}], got [{}, {}]",
                        layer, H, ly->shared_out_gate.rows, ly->shared_out_gate.cols));
      }
    }
  }

  // Routed experts in the plan's fused layout.
  ExpertWeights& x = ly->experts;
  x.scheme = plan->expert_scheme;
  x.num_experts_local = static_cast<int64_t>(rp.expert_slots.size());
  x.hidden = Lp;
  x.intermediate = plan->intermediate.padded_local;
  x.gated = m.gated();
  x.gate_up_interleaved = plan->experts.gate_up_interleaved;
  if (x.num_experts_local == 0) return Status::Ok();
  for (const R role : {R::kExpertsW13, R::kExpertsW2}) {
    const bool is_w13 = role == R::kExpertsW13;
    MOESHARD_ASSIGN_OR_RETURN(const WeightView* v, View(w, role, P::kWeight, layer, true));
    (is_w13 ? x.w13 : x.w2) = v->data;
    if (is_w13) {
      x.bf16_row_groups = v->bf16_row_groups;
    } else if (v->bf16_row_groups != x.bf16_row_groups) {
      return InvalidArgumentError(fmt::format(
          "runtime: routed experts of layer {}: expected w2 in the layout of w13 ({}), got {} "
          "(rewrite both or neither)",
          layer, x.bf16_row_groups ? "row groups" : "row-major",
          v->bf16_row_groups ? "row groups" : "row-major"));
    }
    if (x.scheme.quantized()) {
      MOESHARD_ASSIGN_OR_RETURN(const WeightView* sv, View(w, role, P::kScale, layer, true));
      (is_w13 ? x.w13_scales : x.w2_scales) = sv->data;
      MOESHARD_RETURN_IF_ERROR(BindZerosAndGlobal(w, role, layer, x.scheme, sv->shape,
                                                  is_w13 ? &x.w13_zeros : &x.w2_zeros,
                                                  is_w13 ? &x.w13_global : &x.w2_global, nullptr));
    }
  }
  if (!plan->experts.bias_suffix.empty()) {
    for (const R role : {R::kExpertsW13Bias, R::kExpertsW2Bias}) {
      MOESHARD_ASSIGN_OR_RETURN(const WeightView* v, View(w, role, P::kValue, layer, true));
      (role == R::kExpertsW13Bias ? ly->w13_bias : ly->w2_bias) = ToFloat(*v);
    }
    x.w13_bias = ly->w13_bias.data();
    x.w2_bias = ly->w2_bias.data();
  }
  return ValidateExpertWeights(x, activation)
      .WithContext(fmt::format("runtime: routed experts of layer {}", layer));
}

Status MoeRuntime::Impl::Init(const ShardPlan& p, const WeightViews& w, Communicator& wc,
                              KernelContext& kc, const MoeRuntimeOptions& o) {
  plan = &p;
  world = &wc;
  ctx = &kc;
  const ModelConfig& m = p.model;
  const ResolvedTopology& topo = p.topology;
  if (wc.size() != topo.world || static_cast<int64_t>(p.ranks.size()) != topo.world) {
    return InvalidArgumentError(fmt::format(
        "runtime: 'world size': expected {} ranks for {}, got {} (start as many ranks as the "
        "plan has: mpirun -np {})",
        topo.world, topo.Label(), wc.size(), topo.world));
  }
  if (topo.pp > 1) {
    return UnimplementedError(fmt::format(
        "runtime: '-pp {}': the sharded runtime runs one pipeline stage (use -pp 1; `moeshard "
        "plan` sizes pipelines)",
        topo.pp));
  }
  if (o.max_tokens < 0) {
    return InvalidArgumentError(
        fmt::format("runtime: 'max_tokens': expected >= 0, got {}", o.max_tokens));
  }
  rank_plan = &p.ranks[wc.rank()];
  coords = rank_plan->coords;
  world_size = topo.world;
  tp = topo.tp;
  moe_tp = topo.moe_tp;
  moe_ep = topo.moe_ep;
  H = m.hidden_size;
  latent = m.latent_moe;
  L = p.hidden.logical;
  Lp = p.hidden.padded_local;
  E = m.num_experts;
  k = m.num_experts_per_tok;
  routing = KernelRoutingParams(m);
  activation = KernelActivationParams(m);
  if (!latent && L != H) {
    return InternalError(fmt::format("runtime: routed hidden {} != hidden_size {}", L, H));
  }
  if (latent && p.options.latent_proj == LatentProjMode::kSharded && tp > 1) {
    return UnimplementedError(
        "runtime: '--latent-proj sharded': the runtime runs replicated latent projections only "
        "(drop the flag)");
  }
  if (m.num_shared_experts > 0) {
    const TensorShard* t = FindShard(*rank_plan, TensorRole::kSharedGate, TensorPart::kWeight);
    S_local = t != nullptr ? t->local_shape[0] : 0;
    shared_split = p.options.shared_experts == SharedExpertsMode::kSharded && tp > 1;
    shared_gated = m.shared_expert_gate;
  }
  weight_on_input = m.router_weight_on_input;
  if (weight_on_input && k != 1) {
    return InvalidArgumentError(
        fmt::format("runtime: routing weights on the expert input need top-1 routing (as vLLM's "
                    "apply_router_weight_on_input), got num_experts_per_tok {}",
                    k));
  }

  // Layers.
  const std::vector<int64_t> stage_moe = MoeLayersOf(m, rank_plan->layers);
  if (o.layers.empty()) {
    layer_ids = stage_moe;
  } else {
    for (int64_t l : o.layers) {
      if (std::find(stage_moe.begin(), stage_moe.end(), l) == stage_moe.end()) {
        return InvalidArgumentError(
            fmt::format("runtime: 'layers': expected MoE layers of this stage ({}), got {}",
                        fmt::join(stage_moe, ", "), l));
      }
    }
    layer_ids = o.layers;
  }
  global_to_local.assign(E, -1);
  for (size_t s = 0; s < rank_plan->expert_slots.size(); ++s) {
    const int64_t e = rank_plan->expert_slots[s];
    if (e >= 0 && e < E && global_to_local[e] < 0) global_to_local[e] = static_cast<int32_t>(s);
  }
  scratch.Reserve(kc.num_threads(), std::max({H, L, S_local, int64_t{1}}));
  layers.resize(layer_ids.size());
  for (size_t i = 0; i < layer_ids.size(); ++i) {
    MOESHARD_RETURN_IF_ERROR(LoadLayer(w, layer_ids[i], &layers[i]));
  }

  // Sub-communicators (world rank = group rank for pp == 1).
  const int r = wc.rank();
  MOESHARD_ASSIGN_OR_RETURN(tp_comm,
                            wc.Split(static_cast<int>(r / tp), static_cast<int>(coords.tp_rank)));
  MOESHARD_ASSIGN_OR_RETURN(moe_tp_comm, wc.Split(static_cast<int>(coords.moe_ep_rank),
                                                  static_cast<int>(coords.moe_tp_rank)));
  MOESHARD_ASSIGN_OR_RETURN(ep_comm, wc.Split(static_cast<int>(coords.moe_tp_rank),
                                              static_cast<int>(coords.moe_ep_rank)));

  // Buffers.
  T_max = o.max_tokens;
  C_max = (T_max + tp - 1) / tp;
  U_max = moe_tp * C_max;
  int64_t max_slots = 0;
  for (const RankPlan& q : p.ranks) {
    max_slots = std::max<int64_t>(max_slots, static_cast<int64_t>(q.expert_slots.size()));
  }
  R_max = moe_ep > 1 ? moe_ep * U_max * std::min(k, max_slots) : 0;
  all_tokens.assign(world_size, 0);
  mt_rows.assign(moe_tp, 0);
  mt_floats.assign(moe_tp, 0);
  tp_rows.assign(tp, 0);
  tp_floats.assign(tp, 0);
  stream.assign(T_max * H, 0.0f);
  xn.assign(T_max * H, 0.0f);
  logits.assign(C_max * E, 0.0f);
  chunk_ids.assign(C_max * k, 0);
  chunk_w.assign(C_max * k, 0.0f);
  if (latent) lat.assign(C_max * L, 0.0f);
  chunk_rows.assign(C_max * Lp, bf16_t{});
  if (moe_tp > 1) {
    union_ids.assign(U_max * k, 0);
    union_w.assign(U_max * k, 0.0f);
    union_rows.assign(U_max * Lp, bf16_t{});
    chunk_out.assign(C_max * Lp, 0.0f);
  }
  union_out.assign(U_max * Lp, 0.0f);
  chunk_y.assign(C_max * H, 0.0f);
  if (S_local > 0) {
    const int64_t rows = shared_split ? T_max : C_max;
    gate_buf.assign(rows * S_local, 0.0f);
    up_buf.assign(rows * S_local, 0.0f);
    if (shared_split) shared_partial.assign(T_max * H, 0.0f);
    if (shared_split || shared_gated) shared_chunk.assign(C_max * H, 0.0f);
    if (shared_gated) shared_gate_logit.assign(C_max, 0.0f);
  }
  if (moe_ep > 1) {
    ones.assign(R_max, 1.0f);
    ExpertDispatcherOptions d;
    d.num_experts = E;
    d.top_k = k;
    d.row_width = Lp;
    d.out_width = Lp;
    d.max_tokens = U_max;
    d.max_received_rows = R_max;
    d.owners.assign(E, {});
    for (const RankPlan& q : p.ranks) {
      if (q.coords.moe_tp_rank != coords.moe_tp_rank) continue;
      for (int64_t e : q.expert_slots) {
        auto& list = d.owners[e];
        const int owner = static_cast<int>(q.coords.moe_ep_rank);
        if (std::find(list.begin(), list.end(), owner) == list.end()) list.push_back(owner);
      }
    }
    MOESHARD_ASSIGN_OR_RETURN(ExpertDispatcher disp, ExpertDispatcher::Create(*ep_comm, d));
    dispatcher.emplace(std::move(disp));
  }
  return Status::Ok();
}

int64_t MoeRuntime::Impl::WorkspaceBytes() const {
  int64_t b = Bytes(all_tokens) + Bytes(mt_rows) + Bytes(mt_floats) + Bytes(tp_rows) +
              Bytes(tp_floats) + Bytes(stream) + Bytes(xn) + Bytes(logits) + Bytes(chunk_ids) +
              Bytes(union_ids) + Bytes(chunk_w) + Bytes(union_w) + Bytes(lat) + Bytes(chunk_rows) +
              Bytes(union_rows) + Bytes(union_out) + Bytes(chunk_out) + Bytes(ones) +
              Bytes(chunk_y) + Bytes(gate_buf) + Bytes(up_buf) + Bytes(shared_partial) +
              Bytes(shared_chunk) + Bytes(shared_gate_logit) + Bytes(global_to_local) +
              Bytes(scratch.rows);
  for (const Layer& l : layers) {
    b += Bytes(l.router_bias) + Bytes(l.w13_bias) + Bytes(l.w2_bias) + Bytes(l.hash_table);
  }
  if (dispatcher) b += dispatcher->WorkspaceBytes();
  return b;
}

void MoeRuntime::Impl::AddSharedOutput(const Layer& ly, const float* xc, int64_t C) {
  if (!shared_gated) {
    for (int64_t i = 0; i < C * H; ++i) chunk_y[i] += shared_chunk[i];
    return;
  }
  if (C == 0) return;
  internal::Linear(*ctx, scratch,
                   internal::LinearArgs{.w = &ly.shared_out_gate,
                                        .x = xc,
                                        .x_stride = H,
                                        .num_tokens = C,
                                        .y = shared_gate_logit.data(),
                                        .y_stride = 1});
  for (int64_t c = 0; c < C; ++c) {
    const float g = 1.0f / (1.0f + std::exp(-shared_gate_logit[c]));
    for (int64_t i = 0; i < H; ++i) chunk_y[c * H + i] += g * shared_chunk[c * H + i];
  }
}

Status MoeRuntime::Impl::RunLayer(const Layer& ly, int64_t T, TokenRange chunk,
                                  const int32_t* given_ids, const float* given_w,
                                  const int32_t* token_ids) {
  KernelContext& kc = *ctx;
  const int64_t C = chunk.size();
  const float eps = static_cast<float>(plan->model.rms_norm_eps);
  // 1. Pre-MoE norm: the chunk, or all T tokens when TP-sharded shared experts need them.
  const TokenRange norm_range = shared_split ? TokenRange{0, T} : chunk;
  internal::RmsNorm(stream.data() + norm_range.begin * H, H, norm_range.size(), H, ly.pre_norm, eps,
                    xn.data() + norm_range.begin * H, H, plan->model.norm_plus_one ? 1.0f : 0.0f);
  const float* xc = xn.data() + chunk.begin * H;  // [C, H]

  // 2. Routing of the chunk.
  if (given_ids != nullptr) {
    std::memcpy(chunk_ids.data(), given_ids + chunk.begin * k, C * k * sizeof(int32_t));
    std::memcpy(chunk_w.data(), given_w + chunk.begin * k, C * k * sizeof(float));
  } else if (C > 0) {
    internal::Linear(
        kc, scratch,
        internal::LinearArgs{.w = &ly.router,
                             .x = xc,
                             .x_stride = H,
                             .num_tokens = C,
                             .y = logits.data(),
                             .y_stride = E,
                             .bias = ly.router_bias.empty() ? nullptr : ly.router_bias.data()});
    RoutingParams rp = ly.routing;
    rp.e_score_correction_bias = ly.correction_bias;
    MOESHARD_RETURN_IF_ERROR(
        Route(kc, rp,
              RoutingArgs{.router_logits = logits.data(),
                          .num_tokens = C,
                          .topk_ids = chunk_ids.data(),
                          .topk_weights = chunk_w.data(),
                          .token_ids = token_ids != nullptr ? token_ids + chunk.begin : nullptr}));
  }

  // 3. The experts' input rows: bf16 [C, Lp], zero beyond the logical width.
  const float* zsrc = xc;
  int64_t zstride = H;
  if (latent && C > 0) {
    internal::Linear(kc, scratch,
                     internal::LinearArgs{.w = &ly.latent_down,
                                          .x = xc,
                                          .x_stride = H,
                                          .num_tokens = C,
                                          .y = lat.data(),
                                          .y_stride = L});
    if (ly.latent_norm != nullptr) {
      internal::RmsNorm(lat.data(), L, C, L, ly.latent_norm, eps, lat.data(), L);
    }
    zsrc = lat.data();
    zstride = L;
  }
  for (int64_t c = 0; c < C; ++c) {
    bf16_t* row = chunk_rows.data() + c * Lp;
    if (weight_on_input) {
      // Llama-4: the expert sees x * w (top-1), and its output is taken with weight 1.
      const float wt = chunk_w[c];
      for (int64_t i = 0; i < L; ++i) row[i] = FloatToBf16(zsrc[c * zstride + i] * wt);
      chunk_w[c] = 1.0f;
    } else {
      for (int64_t i = 0; i < L; ++i) row[i] = FloatToBf16(zsrc[c * zstride + i]);
    }
    std::fill(row + L, row + Lp, bf16_t{});
  }

  // 4. Gather the chunks of this moe_ep rank's moe_tp peers.
  const bf16_t* urows = chunk_rows.data();
  const int32_t* uids = chunk_ids.data();
  const float* uw = chunk_w.data();
  int64_t U = C;
  if (moe_tp > 1) {
    U = 0;
    for (int64_t i = 0; i < moe_tp; ++i) U += static_cast<int64_t>(mt_rows[i]);
    MOESHARD_RETURN_IF_ERROR(moe_tp_comm->AllGatherV(chunk_rows.data(), C, union_rows.data(),
                                                     mt_rows, {}, Lp * sizeof(bf16_t)));
    MOESHARD_RETURN_IF_ERROR(moe_tp_comm->AllGatherV(chunk_ids.data(), C, union_ids.data(), mt_rows,
                                                     {}, k * sizeof(int32_t)));
    MOESHARD_RETURN_IF_ERROR(
        moe_tp_comm->AllGatherV(chunk_w.data(), C, union_w.data(), mt_rows, {}, k * sizeof(float)));
    urows = union_rows.data();
    uids = union_ids.data();
    uw = union_w.data();
  }

  // 5. Routed experts: this rank's I slice of its experts' outputs, weighted, [U, Lp] fp32.
  const ExpertWeights& xw = ly.experts;
  const bool add_bias = coords.moe_tp_rank == 0;
  if (moe_ep == 1) {
    if (U > 0) {
      MoeExpertsParams mp;
      mp.topk_ids = uids;
      mp.topk_weights = uw;
      mp.num_tokens = U;
      mp.top_k = k;
      mp.num_experts_global = E;
      mp.expert_global_to_local = global_to_local.data();
      mp.x = urows;
      mp.x_dtype = DType::kBF16;
      mp.weights = &xw;
      mp.activation = activation;
      mp.add_down_bias = add_bias;
      mp.out = union_out.data();
      MOESHARD_RETURN_IF_ERROR(MoeExpertsForward(kc, mp));
    }
  } else {
    MOESHARD_RETURN_IF_ERROR(dispatcher->Dispatch(urows, uids, U));
    const int64_t R = dispatcher->num_received();
    if (R > 0) {
      if (xw.num_experts_local == 0) {
        return InternalError("runtime: rows dispatched to a rank without experts");
      }
      MoeExpertsParams mp;
      mp.topk_ids = dispatcher->received_expert_ids();
      mp.topk_weights = ones.data();
      mp.num_tokens = R;
      mp.top_k = 1;
      mp.num_experts_global = E;
      mp.expert_global_to_local = global_to_local.data();
      mp.x = dispatcher->received_rows();
      mp.x_dtype = DType::kBF16;
      mp.weights = &xw;
      mp.activation = activation;
      mp.add_down_bias = add_bias;
      mp.out = dispatcher->received_outputs();
      MOESHARD_RETURN_IF_ERROR(MoeExpertsForward(kc, mp));
    }
    MOESHARD_RETURN_IF_ERROR(dispatcher->Combine(uw, union_out.data(), Lp, false));
  }

  // 6. Sum the moe_tp partials into this rank's chunk: [C, Lp].
  const float* routed = union_out.data();
  if (moe_tp > 1) {
    MOESHARD_RETURN_IF_ERROR(
        moe_tp_comm->ReduceScatterSumV(union_out.data(), chunk_out.data(), mt_floats));
    routed = chunk_out.data();
  }

  // 7. Back to the hidden width, plus the residual.
  if (latent) {
    if (C > 0) {
      internal::Linear(kc, scratch,
                       internal::LinearArgs{.w = &ly.latent_up,
                                            .x = routed,
                                            .x_stride = Lp,
                                            .num_tokens = C,
                                            .y = chunk_y.data(),
                                            .y_stride = H});
    }
  } else {
    for (int64_t c = 0; c < C; ++c) {
      std::memcpy(chunk_y.data() + c * H, routed + c * Lp, H * sizeof(float));
    }
  }

  // 8. Shared experts.
  if (ly.has_shared) {
    if (shared_split) {
      internal::GatedMlp(kc, scratch,
                         internal::GatedMlpArgs{.gate = &ly.shared_gate,
                                                .up = &ly.shared_up,
                                                .down = &ly.shared_down,
                                                .activation = activation,
                                                .x = xn.data(),
                                                .x_stride = H,
                                                .num_tokens = T,
                                                .gate_buf = gate_buf.data(),
                                                .up_buf = up_buf.data(),
                                                .y = shared_partial.data(),
                                                .y_stride = H});
      MOESHARD_RETURN_IF_ERROR(
          tp_comm->ReduceScatterSumV(shared_partial.data(), shared_chunk.data(), tp_floats));
      AddSharedOutput(ly, xc, C);
    } else if (C > 0) {
      // Ungated: straight into chunk_y; gated: into shared_chunk, then scaled per token.
      internal::GatedMlp(
          kc, scratch,
          internal::GatedMlpArgs{.gate = &ly.shared_gate,
                                 .up = &ly.shared_up,
                                 .down = &ly.shared_down,
                                 .activation = activation,
                                 .x = xc,
                                 .x_stride = H,
                                 .num_tokens = C,
                                 .gate_buf = gate_buf.data(),
                                 .up_buf = up_buf.data(),
                                 .y = shared_gated ? shared_chunk.data() : chunk_y.data(),
                                 .y_stride = H,
                                 .accumulate = !shared_gated});
      if (shared_gated) AddSharedOutput(ly, xc, C);
    }
  }
  const float* res = stream.data() + chunk.begin * H;
  for (int64_t i = 0; i < C * H; ++i) chunk_y[i] += res[i];

  // 9. Every rank of the unit gets the unit's new hidden states.
  if (tp > 1) {
    return tp_comm->AllGatherV(chunk_y.data(), C, stream.data(), tp_rows, {}, H * sizeof(float));
  }
  std::memcpy(stream.data(), chunk_y.data(), C * H * sizeof(float));
  return Status::Ok();
}

MoeRuntime::MoeRuntime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MoeRuntime::~MoeRuntime() = default;

Result<std::unique_ptr<MoeRuntime>> MoeRuntime::Create(const ShardPlan& plan,
                                                       const WeightViews& weights,
                                                       Communicator& world, KernelContext& kernels,
                                                       const MoeRuntimeOptions& options) {
  auto impl = std::make_unique<Impl>();
  MOESHARD_RETURN_IF_ERROR(impl->Init(plan, weights, world, kernels, options));
  return std::unique_ptr<MoeRuntime>(new MoeRuntime(std::move(impl)));
}

const std::vector<int64_t>& MoeRuntime::layers() const { return impl_->layer_ids; }
int64_t MoeRuntime::hidden_size() const { return impl_->H; }
int64_t MoeRuntime::top_k() const { return impl_->k; }
int64_t MoeRuntime::WorkspaceBytes() const { return impl_->WorkspaceBytes(); }

Status MoeRuntime::Forward(const ForwardArgs& a) {
  Impl& s = *impl_;
  const int64_t T = a.num_tokens;
  const int64_t H = s.H;
  if (T < 0 || T > s.T_max) {
    return InvalidArgumentError(fmt::format(
        "forward: 'num_tokens': expected 0 <= T <= {} (max_tokens the runtime was built for), "
        "got {}",
        s.T_max, T));
  }
  if (a.x_dtype != DType::kF32 && a.x_dtype != DType::kBF16) {
    return InvalidArgumentError(
        fmt::format("forward: 'x_dtype': expected F32 or BF16, got {}", DTypeName(a.x_dtype)));
  }
  if (T > 0 && (a.x == nullptr || a.out == nullptr)) {
    return InvalidArgumentError("forward: 'x/out': expected non-null pointers for T > 0");
  }
  if ((a.topk_ids == nullptr) != (a.topk_weights == nullptr)) {
    return InvalidArgumentError(
        "forward: 'topk_ids/topk_weights': expected both or neither (routing bypass)");
  }
  if (a.topk_ids != nullptr) {
    for (int64_t i = 0; i < T * s.k; ++i) {
      if (a.topk_ids[i] < 0 || a.topk_ids[i] >= s.E) {
        return InvalidArgumentError(
            fmt::format("forward: 'topk_ids[{}, {}]': expected an expert in [0, {}), got {}",
                        i / s.k, i % s.k, s.E, a.topk_ids[i]));
      }
    }
  }
  if (a.topk_ids == nullptr && T > 0) {
    for (const Impl::Layer& ly : s.layers) {
      if (ly.hash_table.empty()) continue;
      if (a.token_ids == nullptr) {
        return InvalidArgumentError(fmt::format(
            "forward: 'token_ids': expected [num_tokens] int32 token ids, got none (layer {} "
            "routes by token id; pass them, e.g. `run --input` with a token_ids tensor)",
            ly.layer));
      }
      const int64_t vocab = s.plan->model.vocab_size;
      for (int64_t i = 0; i < T; ++i) {
        if (a.token_ids[i] < 0 || a.token_ids[i] >= vocab) {
          return InvalidArgumentError(
              fmt::format("forward: 'token_ids[{}]': expected a token id in [0, {}), got {}", i,
                          vocab, a.token_ids[i]));
        }
      }
      break;
    }
  }
  // Every rank's T: the chunk sizes of every collective below follow from it.
  int64_t my_t = T;
  MOESHARD_RETURN_IF_ERROR(s.world->AllGather(&my_t, s.all_tokens.data(), sizeof(int64_t)));
  for (int64_t r = 0; r < s.world_size; ++r) {
    const int64_t first = (r / s.tp) * s.tp;
    if (s.all_tokens[r] != s.all_tokens[first]) {
      return InvalidArgumentError(fmt::format(
          "forward: 'num_tokens': expected the attention-TP ranks {}..{} of one DP rank to hold "
          "the same tokens, got T = {} on rank {} and T = {} on rank {}",
          first, first + s.tp - 1, s.all_tokens[first], first, s.all_tokens[r], r));
    }
  }
  const TokenRange chunk = TokenChunk(T, s.tp, s.coords.tp_rank);
  for (int64_t j = 0; j < s.tp; ++j) {
    s.tp_rows[j] = static_cast<size_t>(TokenChunk(T, s.tp, j).size());
    s.tp_floats[j] = s.tp_rows[j] * static_cast<size_t>(H);
  }
  for (int64_t mt = 0; mt < s.moe_tp; ++mt) {
    const int64_t q = s.coords.moe_ep_rank * s.moe_tp + mt;  // group rank of the peer
    s.mt_rows[mt] = static_cast<size_t>(TokenChunk(s.all_tokens[q], s.tp, q % s.tp).size());
    s.mt_floats[mt] = s.mt_rows[mt] * static_cast<size_t>(s.Lp);
  }

  for (int64_t i = 0; i < T * H; ++i) {
    s.stream[i] = a.x_dtype == DType::kF32 ? static_cast<const float*>(a.x)[i]
                                           : Bf16ToFloat(static_cast<const bf16_t*>(a.x)[i]);
  }
  for (size_t li = 0; li < s.layers.size(); ++li) {
    const auto start = std::chrono::steady_clock::now();
    const Status st = s.RunLayer(s.layers[li], T, chunk, a.topk_ids, a.topk_weights, a.token_ids);
    if (!st.ok()) return st.WithContext(fmt::format("layer {}", s.layers[li].layer));
    if (a.layer_outputs != nullptr) {
      std::memcpy(a.layer_outputs + li * T * H, s.stream.data(), T * H * sizeof(float));
    }
    if (a.layer_seconds != nullptr) {
      a.layer_seconds[li] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  }
  for (int64_t i = 0; i < T * H; ++i) {
    if (a.x_dtype == DType::kF32) {
      static_cast<float*>(a.out)[i] = s.stream[i];
    } else {
      static_cast<bf16_t*>(a.out)[i] = FloatToBf16(s.stream[i]);
    }
  }
  return Status::Ok();
}

}  // namespace moeshard
