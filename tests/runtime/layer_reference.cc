// The single-rank layer against an independent scalar reference (see layer_reference.h and
// layer_reference_test.cc).
#include "tests/runtime/layer_reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "moeshard/base/numeric.h"
#include "moeshard/comm/local_comm.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/kernels/kernel_backend.h"
#include "moeshard/kernels/reference.h"
#include "moeshard/runtime/moe_runtime.h"
#include "moeshard/runtime/verify.h"
#include "moeshard/weights/loader.h"

namespace moeshard {
namespace {

// W[r][c] of a dense weight held whole: bf16, fp32, fp8 with the config's block scales, or
// 4-bit codes (two a byte, the even column low) as int4 with zero points, (code - zero) *
// fp16 scale, or NVFP4, e2m1 * e4m3 scale * global scale.
struct Dense {
  const WeightView* w = nullptr;
  const WeightView* s = nullptr;
  const WeightView* z = nullptr;               // int4-zp zero points, one byte per scale
  const WeightView* g = nullptr;               // nvfp4 global scale
  const WeightView* gidx = nullptr;            // act-order GPTQ: the group of each column
  int64_t block_rows = 128, block_cols = 128;  // fp8 `weight_block_size` from the config
  double At(int64_t r, int64_t c) const {
    const int64_t cols = w->shape[1];
    if (w->dtype == DType::kBF16) return Bf16ToFloat(w->as<bf16_t>()[r * cols + c]);
    if (w->dtype == DType::kF32) return w->as<float>()[r * cols + c];
    const int64_t sc = s->shape[1];
    if (w->dtype == DType::kU8) {
      const uint8_t byte = w->as<uint8_t>()[r * cols + c / 2];
      const int code = (c % 2 == 0) ? (byte & 0xf) : (byte >> 4);
      const int64_t gi = r * sc + (gidx != nullptr ? gidx->as<int32_t>()[c] : c / block_cols);
      if (z != nullptr) {
        return (code - static_cast<int>(z->as<uint8_t>()[gi])) *
               static_cast<double>(HalfToFloat(s->as<fp16_t>()[gi]));
      }
      return static_cast<double>(Fp4E2M1ToFloat(static_cast<uint8_t>(code))) *
             Fp8E4M3ToFloat(s->as<uint8_t>()[gi]) * g->as<float>()[0];
    }
    return static_cast<double>(Fp8E4M3ToFloat(w->as<uint8_t>()[r * cols + c])) *
           s->as<float>()[(r / block_rows) * sc + c / block_cols];
  }
  std::vector<double> Apply(const std::vector<double>& x) const {
    std::vector<double> y(w->shape[0], 0.0);
    const int64_t cols = w->dtype == DType::kU8 ? 2 * w->shape[1] : w->shape[1];
    for (int64_t r = 0; r < w->shape[0]; ++r) {
      for (int64_t c = 0; c < cols; ++c) y[r] += At(r, c) * x[c];
    }
    return y;
  }
};

// The view of rank 0's tensor of `role` / `part` at `layer` (nullptr when the plan has none).
const WeightView* ViewOf(const ShardPlan& plan, const WeightViews& v, TensorRole role,
                         TensorPart part, int64_t layer) {
  for (const TensorShard& s : plan.ranks[0].tensors) {
    if (s.role == role && s.part == part &&
        std::find(s.layers.begin(), s.layers.end(), layer) != s.layers.end()) {
      return v.Find(ExpandName(s.name, layer));
    }
  }
  return nullptr;
}

Dense DenseOf(const ShardPlan& plan, const WeightViews& v, TensorRole role, int64_t layer) {
  Dense d;
  d.w = ViewOf(plan, v, role, TensorPart::kWeight, layer);
  d.s = ViewOf(plan, v, role, TensorPart::kScale, layer);
  if (d.s != nullptr) {
    // The block size straight from the config's weight_block_size (or its group_size).
    d.block_rows = plan.model.quant.scheme.block_rows;
    d.block_cols = plan.model.quant.scheme.group;
    d.z = ViewOf(plan, v, role, TensorPart::kZeroPoint, layer);
    d.g = ViewOf(plan, v, role, TensorPart::kGlobalScale, layer);
    if (plan.model.quant.scheme.act_order) {
      d.gidx = ViewOf(plan, v, role, TensorPart::kGroupIndex, layer);
      EXPECT_NE(d.gidx, nullptr) << TensorRoleName(role);
    }
  }
  EXPECT_NE(d.w, nullptr) << TensorRoleName(role);
  return d;
}

// Rank 0's tensors of one layer, by role.
struct PlanRef {
  const ShardPlan& plan;
  const WeightViews& v;
  int64_t layer;
  const WeightView* View(TensorRole role, TensorPart part = TensorPart::kValue) const {
    const WeightView* w = ViewOf(plan, v, role, part, layer);
    if (w == nullptr && part == TensorPart::kValue) {
      w = ViewOf(plan, v, role, TensorPart::kWeight, layer);
    }
    return w;
  }
  struct Dense Dense(TensorRole role) const {
    return DenseOf(plan, v, role, layer);
  }
};

std::vector<double> Norm(const std::vector<double>& x, const WeightView& w, double eps,
                         double offset = 0.0) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = x[i] * inv * (offset + Bf16ToFloat(w.as<bf16_t>()[i]));
  return y;
}

}  // namespace

void CheckLayerAgainstReference(const ModelConfig& m, bool row_groups, int64_t moe_layer_index,
                                const std::string& kernel_backend) {
  PlanOptions o;
  o.backend = "moeshard-cpu";
  auto plan = BuildShardPlan(m, o);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  LoadOptions lo;
  lo.seed = 99;
  lo.max_moe_layers = moe_layer_index + 1;
  auto weights = LoadRankWeights(*plan, 0, lo);
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  KernelBackendOptions ko{.name = row_groups ? "cpu" : kernel_backend, .num_threads = 1};
  // The reference below reads the experts' bytes: row-major unless row groups are asked for.
  if (ko.name == "cpu") ko.settings["expert-layout"] = row_groups ? "row-groups" : "row-major";
  Result<std::unique_ptr<KernelBackend>> kernels = CreateKernelBackend(ko);
  ASSERT_TRUE(kernels.ok()) << kernels.status().ToString();
  const Result<int64_t> n = PrepareExpertWeights(**kernels, *plan, &*weights);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  if (row_groups) {
    ASSERT_EQ(*n, 1) << "the loaded MoE layer's experts should be rewritten";
  }
  // The cpu backend sorts act-order GPTQ experts by group in place; the reference below reads
  // them as loaded, from a second copy.
  const bool act_order = m.expert_scheme().act_order;
  if (act_order && ko.name == "cpu") {
    EXPECT_EQ(*n, 1) << "the act-order experts should be sorted by group";
  }
  Result<RankWeights> as_loaded = act_order
                                      ? LoadRankWeights(*plan, 0, lo)
                                      : Result<RankWeights>(InvalidArgumentError("not act-order"));
  ASSERT_TRUE(!act_order || as_loaded.ok()) << as_loaded.status().ToString();
  const WeightViews v = ViewRankWeights(*weights);
  const WeightViews v_loaded = act_order ? ViewRankWeights(*as_loaded) : WeightViews();
  const std::vector<int64_t> moe_layers = MoeLayersOf(m, plan->ranks[0].layers);
  ASSERT_LT(moe_layer_index, static_cast<int64_t>(moe_layers.size()));
  const int64_t layer = moe_layers[static_cast<size_t>(moe_layer_index)];
  const int64_t T = 5, H = m.hidden_size, E = m.num_experts, k = m.num_experts_per_tok;
  std::vector<float> x(T * H), out(T * H);
  DummyHiddenStates(3, 0, T, H, x.data());
  // Token ids for layers that route by them (hash routing).
  std::vector<int32_t> tokens(T);
  DummyTokenIds(3, 0, T, m.vocab_size, tokens.data());

  const Status s = RunLocalRanks(1, {}, [&](Communicator& w) -> Status {
    MOESHARD_ASSIGN_OR_RETURN(
        auto rt, MoeRuntime::Create(*plan, v, w, **kernels, {.max_tokens = T, .layers = {layer}}));
    return rt->Forward(
        {.x = x.data(), .num_tokens = T, .token_ids = tokens.data(), .out = out.data()});
  });
  ASSERT_TRUE(s.ok()) << s.ToString();

  // The formula of moe_runtime.h, token by token.
  using R = TensorRole;
  const PlanRef P{*plan, v, layer};
  const double eps = m.rms_norm_eps;
  const int64_t L = m.latent_moe ? m.routed_expert_hidden_size : H;
  std::vector<float> logits(T * E), z(T * L);
  std::vector<std::vector<double>> hs(T);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> xt(x.begin() + t * H, x.begin() + (t + 1) * H);
    // Qwen3-Next's Gemma-style norm scales by (1 + w).
    hs[t] = Norm(xt, *P.View(R::kPreMoeNorm), eps, m.norm_plus_one ? 1.0 : 0.0);
    std::vector<double> lg = P.Dense(R::kRouter).Apply(hs[t]);
    const WeightView* rb = P.View(R::kRouterBias);
    for (int64_t e = 0; e < E; ++e) {
      logits[t * E + e] = static_cast<float>(lg[e] + (rb ? Bf16ToFloat(rb->as<bf16_t>()[e]) : 0));
    }
    std::vector<double> zt = hs[t];
    if (m.latent_moe) {
      zt = P.Dense(R::kLatentDown).Apply(hs[t]);
      if (m.latent_moe_use_norm) zt = Norm(zt, *P.View(R::kLatentNorm), eps);
    }
    for (int64_t i = 0; i < L; ++i) z[t * L + i] = static_cast<float>(zt[i]);
  }
  RoutingParams rp = KernelRoutingParams(m, layer);
  if (const WeightView* cb = P.View(R::kCorrectionBias)) {
    rp.e_score_correction_bias = cb->as<float>();
  }
  const bool hashed = m.layers[static_cast<size_t>(layer)].hash_routing;
  EXPECT_EQ(hashed, rp.kind == RoutingKind::kSqrtSoftplusHash);
  std::vector<int32_t> table32;
  if (hashed) {
    // DeepSeek-V4: the token's experts from the layer's table (I64 as released), no correction
    // bias there.
    const WeightView* table = P.View(R::kHashTable);
    ASSERT_NE(table, nullptr);
    EXPECT_EQ(P.View(R::kCorrectionBias), nullptr);
    ASSERT_EQ(table->dtype, DType::kI64);
    for (size_t i = 0; i < table->num_bytes / 8; ++i) {
      table32.push_back(static_cast<int32_t>(table->as<int64_t>()[i]));
    }
    rp.hash_table = table32.data();
  }
  std::vector<int32_t> ids(T * k);
  std::vector<float> tw(T * k);
  ASSERT_TRUE(reference::Route(rp, {.router_logits = logits.data(),
                                    .num_tokens = T,
                                    .topk_ids = ids.data(),
                                    .topk_weights = tw.data(),
                                    .token_ids = tokens.data()})
                  .ok());
  if (m.router_weight_on_input) {
    // Llama-4: the expert's input is x * w (top-1) and its output is taken whole. The runtime
    // rounds the scaled row to bf16, as it does every expert input.
    ASSERT_EQ(k, 1);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < L; ++i) z[t * L + i] *= tw[t];
      tw[t] = 1.0f;
    }
  }
  // Experts over the plan's fused tensors (1 rank: every expert, no padding with moeshard-cpu),
  // in the format the config declares.
  const PlanRef PE{*plan, act_order ? v_loaded : v, layer};
  ExpertWeights ew;
  ew.scheme = m.expert_scheme();
  ew.num_experts_local = E;
  ew.hidden = L;
  ew.intermediate = m.moe_intermediate_size;
  ew.gated = m.gated();
  ew.gate_up_interleaved = plan->experts.gate_up_interleaved;
  std::vector<float> b13, b2;
  const WeightView* w13 = PE.View(R::kExpertsW13);
  ew.w13 = w13->data;
  ew.w2 = PE.View(R::kExpertsW2)->data;
  ew.bf16_row_groups = row_groups && *n == 1;  // the reference reads the prepared bytes
  if (m.expert_scheme().quantized()) {
    ew.w13_scales = PE.View(R::kExpertsW13, TensorPart::kScale)->data;
    ew.w2_scales = PE.View(R::kExpertsW2, TensorPart::kScale)->data;
    if (const WeightView* z13 = PE.View(R::kExpertsW13, TensorPart::kZeroPoint)) {
      ew.w13_zeros = z13->as<uint8_t>();
      ew.w2_zeros = PE.View(R::kExpertsW2, TensorPart::kZeroPoint)->as<uint8_t>();
    }
    if (ew.scheme.act_order) {  // the checkpoint's g_idx: w13 [E, 2, H], w2 [E, I]
      ew.w13_group_index = PE.View(R::kExpertsW13, TensorPart::kGroupIndex)->as<int32_t>();
      ew.w2_group_index = PE.View(R::kExpertsW2, TensorPart::kGroupIndex)->as<int32_t>();
    }
    if (const WeightView* g13 = PE.View(R::kExpertsW13, TensorPart::kGlobalScale)) {
      ew.w13_global = g13->as<float>();
      ew.w2_global = PE.View(R::kExpertsW2, TensorPart::kGlobalScale)->as<float>();
    }
  }
  if (m.expert_bias) {
    for (auto [role, dst] :
         {std::pair{R::kExpertsW13Bias, &b13}, std::pair{R::kExpertsW2Bias, &b2}}) {
      const WeightView* b = P.View(role);
      for (size_t i = 0; i < b->num_bytes / 2; ++i) dst->push_back(Bf16ToFloat(b->as<bf16_t>()[i]));
    }
    ew.w13_bias = b13.data();
    ew.w2_bias = b2.data();
  }
  std::vector<float> routed(T * L);
  MoeExpertsParams mp;
  mp.topk_ids = ids.data();
  mp.topk_weights = tw.data();
  mp.num_tokens = T;
  mp.top_k = k;
  mp.num_experts_global = E;
  mp.x = z.data();
  mp.x_dtype = DType::kF32;
  mp.weights = &ew;
  mp.activation = KernelActivationParams(m);
  mp.out = routed.data();
  ASSERT_TRUE(reference::MoeExpertsForward(mp).ok());

  std::vector<float> ref(T * H);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> r(routed.begin() + t * L, routed.begin() + (t + 1) * L);
    if (m.latent_moe) r = P.Dense(R::kLatentUp).Apply(r);
    std::vector<double> y(H, 0.0);
    if (m.num_shared_experts > 0) {
      const std::vector<double> g = P.Dense(R::kSharedGate).Apply(hs[t]);
      const std::vector<double> u = P.Dense(R::kSharedUp).Apply(hs[t]);
      std::vector<double> a(g.size());
      for (size_t i = 0; i < g.size(); ++i) {
        a[i] = ApplyActivation(mp.activation, static_cast<float>(g[i]), static_cast<float>(u[i]));
      }
      y = P.Dense(R::kSharedDown).Apply(a);
      if (m.shared_expert_gate) {
        // Qwen2-MoE: sigmoid(shared_expert_gate . x) scales the shared output per token.
        const double g1 = P.Dense(R::kSharedGateProj).Apply(hs[t])[0];
        for (double& v : y) v /= 1.0 + std::exp(-g1);
      }
    }
    for (int64_t h = 0; h < H; ++h) ref[t * H + h] = static_cast<float>(x[t * H + h] + r[h] + y[h]);
  }
  const ErrorStats st = CompareOutputs(out, ref);
  EXPECT_TRUE(st.Passes(Tolerance{})) << st.Summary(Tolerance{});
  // The MoE block must matter at this tolerance, or the comparison proves nothing.
  const ErrorStats moved = CompareOutputs(out, x);
  EXPECT_GT(moved.max_abs_err, 10 * st.max_abs_err + 1e-3) << moved.Summary(Tolerance{});
}

}  // namespace moeshard
