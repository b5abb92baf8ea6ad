#include "moeshard/runtime/moe_runtime.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "moeshard/base/numeric.h"
#include "moeshard/plan/topology.h"
#include "runtime/comm_groups.h"
#include "runtime/layer_shape.h"
#include "runtime/layer_steps.h"
#include "runtime/layer_weights.h"
#include "runtime/workspace.h"

namespace moeshard {

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

// The plan against the world it runs on and the options: what the runtime cannot run.
Status CheckPlanAndOptions(const ShardPlan& p, const Communicator& world,
                           const MoeRuntimeOptions& o) {
  const ResolvedTopology& topo = p.topology;
  if (world.size() != topo.world || static_cast<int64_t>(p.ranks.size()) != topo.world) {
    return InvalidArgumentError(fmt::format(
        "runtime: 'world size': expected {} ranks for {}, got {} (start as many ranks as the "
        "plan has: mpirun -np {})",
        topo.world, topo.Label(), world.size(), topo.world));
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
  return Status::Ok();
}

// The MoE layers to run: `requested`, each checked to be a MoE layer of the rank's stage, or
// (empty) all of them.
Result<std::vector<int64_t>> SelectLayers(const ModelConfig& m, const RankPlan& rp,
                                          const std::vector<int64_t>& requested) {
  const std::vector<int64_t> stage_moe = MoeLayersOf(m, rp.layers);
  if (requested.empty()) return stage_moe;
  for (int64_t l : requested) {
    if (std::find(stage_moe.begin(), stage_moe.end(), l) == stage_moe.end()) {
      return InvalidArgumentError(
          fmt::format("runtime: 'layers': expected MoE layers of this stage ({}), got {}",
                      fmt::join(stage_moe, ", "), l));
    }
  }
  return requested;
}

template <typename T>
int64_t Bytes(const std::vector<T>& v) {
  return static_cast<int64_t>(v.size() * sizeof(T));
}

}  // namespace

// The runtime's parts (src/runtime/): the forward's shape, the weights bound by role, the
// communicator groups, the workspace; LayerSteps runs each layer over them.
struct MoeRuntime::Impl {
  const ShardPlan* plan = nullptr;
  const RankPlan* rank_plan = nullptr;
  KernelBackend* kernels = nullptr;
  internal::LayerShape shape;
  std::vector<int64_t> layer_ids;
  std::vector<internal::LayerWeights> layers;  // [layer_ids.size()]
  std::vector<int32_t> global_to_local;        // [E] local slot of each global expert, or -1
  internal::CommGroups groups;
  internal::Workspace workspace;

  Status Init(const ShardPlan& p, const WeightViews& w, Communicator& world, KernelBackend& kb,
              const MoeRuntimeOptions& o);
  Status CheckArgs(const ForwardArgs& a) const;
  // COLLECTIVE over the world: every rank's T, checked to agree within each unit, and the row
  // counts of this call's collectives.
  Status LayOutChunks(int64_t num_tokens);
  int64_t WorkspaceBytes() const;
};

Status MoeRuntime::Impl::Init(const ShardPlan& p, const WeightViews& w, Communicator& world,
                              KernelBackend& kb, const MoeRuntimeOptions& o) {
  plan = &p;
  kernels = &kb;
  MOESHARD_RETURN_IF_ERROR(CheckPlanAndOptions(p, world, o));
  rank_plan = &p.ranks[world.rank()];
  MOESHARD_ASSIGN_OR_RETURN(shape, internal::ResolveLayerShape(p, *rank_plan));
  MOESHARD_ASSIGN_OR_RETURN(layer_ids, SelectLayers(p.model, *rank_plan, o.layers));
  global_to_local = internal::LocalExpertSlots(*rank_plan, shape.num_experts);
  layers.resize(layer_ids.size());
  for (size_t i = 0; i < layer_ids.size(); ++i) {
    MOESHARD_RETURN_IF_ERROR(
        internal::BindLayerWeights(p, *rank_plan, shape, w, layer_ids[i], &layers[i]));
  }
  int64_t max_slots = 0;
  for (const RankPlan& q : p.ranks) {
    max_slots = std::max<int64_t>(max_slots, static_cast<int64_t>(q.expert_slots.size()));
  }
  const internal::WorkspaceSizes sizes =
      internal::SizeWorkspace(shape, p.topology, o.max_tokens, max_slots);
  MOESHARD_ASSIGN_OR_RETURN(groups, internal::CreateCommGroups(p, shape, sizes, world));
  MOESHARD_ASSIGN_OR_RETURN(workspace, internal::Workspace::Create(kb, shape, p.topology, sizes));
  return Status::Ok();
}

Status MoeRuntime::Impl::CheckArgs(const ForwardArgs& a) const {
  const int64_t T = a.num_tokens, k = shape.top_k, E = shape.num_experts;
  if (T < 0 || T > workspace.sizes.max_tokens) {
    return InvalidArgumentError(fmt::format(
        "forward: 'num_tokens': expected 0 <= T <= {} (max_tokens the runtime was built for), "
        "got {}",
        workspace.sizes.max_tokens, T));
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
    for (int64_t i = 0; i < T * k; ++i) {
      if (a.topk_ids[i] < 0 || a.topk_ids[i] >= E) {
        return InvalidArgumentError(
            fmt::format("forward: 'topk_ids[{}, {}]': expected an expert in [0, {}), got {}", i / k,
                        i % k, E, a.topk_ids[i]));
      }
    }
  }
  if (a.topk_ids != nullptr || T == 0) return Status::Ok();
  for (const internal::LayerWeights& ly : layers) {
    if (ly.hash_table.empty()) continue;
    if (a.token_ids == nullptr) {
      return InvalidArgumentError(fmt::format(
          "forward: 'token_ids': expected [num_tokens] int32 token ids, got none (layer {} "
          "routes by token id; pass them, e.g. `run --input` with a token_ids tensor)",
          ly.layer));
    }
    const int64_t vocab = plan->model.vocab_size;
    for (int64_t i = 0; i < T; ++i) {
      if (a.token_ids[i] < 0 || a.token_ids[i] >= vocab) {
        return InvalidArgumentError(
            fmt::format("forward: 'token_ids[{}]': expected a token id in [0, {}), got {}", i,
                        vocab, a.token_ids[i]));
      }
    }
    break;
  }
  return Status::Ok();
}

Status MoeRuntime::Impl::LayOutChunks(int64_t T) {
  const ResolvedTopology& topo = plan->topology;
  internal::Workspace& ws = workspace;
  // Every rank's T: the chunk sizes of every collective of the call follow from it.
  int64_t my_t = T;
  MOESHARD_RETURN_IF_ERROR(groups.world->AllGather(&my_t, ws.all_tokens.data(), sizeof(int64_t)));
  for (int64_t r = 0; r < topo.world; ++r) {
    const int64_t first = PeerRank(topo, RankGroup::kTp, r, 0);
    if (ws.all_tokens[r] != ws.all_tokens[first]) {
      return InvalidArgumentError(fmt::format(
          "forward: 'num_tokens': expected the attention-TP ranks {}..{} of one DP rank to hold "
          "the same tokens, got T = {} on rank {} and T = {} on rank {}",
          first, PeerRank(topo, RankGroup::kTp, r, topo.tp - 1), ws.all_tokens[first], first,
          ws.all_tokens[r], r));
    }
  }
  for (int64_t j = 0; j < topo.tp; ++j) {
    ws.tp_rows[j] = static_cast<size_t>(TokenChunk(T, topo.tp, j).size());
    ws.tp_floats[j] = ws.tp_rows[j] * static_cast<size_t>(shape.hidden);
  }
  for (int64_t mt = 0; mt < topo.moe_tp; ++mt) {
    const int64_t q = groups.moe_tp_peers[mt];  // world rank of the peer
    const TokenRange chunk =
        TokenChunk(ws.all_tokens[q], topo.tp, RankInGroup(topo, RankGroup::kTp, q));
    ws.mt_rows[mt] = static_cast<size_t>(chunk.size());
    ws.mt_floats[mt] = ws.mt_rows[mt] * static_cast<size_t>(shape.routed_width_padded);
  }
  return Status::Ok();
}

int64_t MoeRuntime::Impl::WorkspaceBytes() const {
  int64_t b = workspace.Bytes() + Bytes(global_to_local) + kernels->ScratchBytes();
  for (const internal::LayerWeights& l : layers) b += l.ConvertedBytes();
  if (groups.dispatcher) b += groups.dispatcher->WorkspaceBytes();
  return b;
}

MoeRuntime::MoeRuntime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MoeRuntime::~MoeRuntime() = default;

Result<std::unique_ptr<MoeRuntime>> MoeRuntime::Create(const ShardPlan& plan,
                                                       const WeightViews& weights,
                                                       Communicator& world, KernelBackend& kernels,
                                                       const MoeRuntimeOptions& options) {
  auto impl = std::make_unique<Impl>();
  MOESHARD_RETURN_IF_ERROR(impl->Init(plan, weights, world, kernels, options));
  return std::unique_ptr<MoeRuntime>(new MoeRuntime(std::move(impl)));
}

const std::vector<int64_t>& MoeRuntime::layers() const { return impl_->layer_ids; }
int64_t MoeRuntime::hidden_size() const { return impl_->shape.hidden; }
int64_t MoeRuntime::top_k() const { return impl_->shape.top_k; }
int64_t MoeRuntime::num_experts() const { return impl_->shape.num_experts; }
int64_t MoeRuntime::num_expert_slots() const {
  return static_cast<int64_t>(impl_->rank_plan->expert_slots.size());
}
int64_t MoeRuntime::WorkspaceBytes() const { return impl_->WorkspaceBytes(); }

Status MoeRuntime::Forward(const ForwardArgs& a) {
  Impl& s = *impl_;
  MOESHARD_RETURN_IF_ERROR(s.CheckArgs(a));
  const int64_t T = a.num_tokens, H = s.shape.hidden;
  MOESHARD_RETURN_IF_ERROR(s.LayOutChunks(T));
  const internal::BackendArray<float>& stream = s.workspace.stream;
  s.kernels->Convert({.src = a.x,
                      .src_dtype = a.x_dtype,
                      .dst = stream.data(),
                      .dst_dtype = DType::kF32,
                      .n = T * H});
  internal::LayerSteps steps({.kernels = s.kernels,
                              .shape = &s.shape,
                              .topology = &s.plan->topology,
                              .coords = &s.rank_plan->coords,
                              .global_to_local = s.global_to_local.data(),
                              .groups = &s.groups,
                              .workspace = &s.workspace});
  const internal::LayerInput in{
      .num_tokens = T,
      .chunk = TokenChunk(T, s.plan->topology.tp, s.rank_plan->coords.tp_rank),
      .given_ids = a.topk_ids,
      .given_weights = a.topk_weights,
      .token_ids = a.token_ids};
  const int64_t E = s.shape.num_experts, S = num_expert_slots();
  for (size_t li = 0; li < s.layers.size(); ++li) {
    const auto start = std::chrono::steady_clock::now();
    const internal::LayerCounts counts{
        .experts = a.expert_counts != nullptr ? a.expert_counts + li * E : nullptr,
        .slots = a.slot_counts != nullptr ? a.slot_counts + li * S : nullptr,
        .num_slots = S};
    const Status st = steps.Run(s.layers[li], in, counts);
    if (!st.ok()) return st.WithContext(fmt::format("layer {}", s.layers[li].layer));
    if (a.layer_outputs != nullptr) {
      s.kernels->Convert({.src = stream.data(),
                          .src_dtype = DType::kF32,
                          .dst = a.layer_outputs + li * T * H,
                          .dst_dtype = DType::kF32,
                          .n = T * H});
    }
    if (a.layer_seconds != nullptr) {
      a.layer_seconds[li] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  }
  s.kernels->Convert({.src = stream.data(),
                      .src_dtype = DType::kF32,
                      .dst = a.out,
                      .dst_dtype = a.x_dtype,
                      .n = T * H});
  return Status::Ok();
}

}  // namespace moeshard
