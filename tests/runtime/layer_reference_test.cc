// The single-rank layer against an independent scalar reference: the sharded tests compare N
// ranks with one rank, so they cannot see a mistake both share (a wrong norm, a missing shared
// expert, the latent projection applied on the wrong side). Here the 1-rank runtime is checked
// against a direct transcription of the layer's formula (moe_runtime.h) in double precision,
// with the experts from the kernels' scalar oracle (reference::MoeExpertsForward) and the
// routing from reference::Route.
#include <gtest/gtest.h>

#include <cmath>

#include "moeshard/base/numeric.h"
#include "moeshard/comm/local_comm.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/kernels/kernel_context.h"
#include "moeshard/kernels/reference.h"
#include "moeshard/runtime/moe_runtime.h"
#include "moeshard/runtime/verify.h"
#include "moeshard/weights/loader.h"

namespace moeshard {
namespace {

// W[r][c] of a dense weight held whole (bf16, or fp8 with 128x128 block scales).
struct Dense {
  const WeightView* w = nullptr;
  const WeightView* s = nullptr;
  double At(int64_t r, int64_t c) const {
    const int64_t cols = w->shape[1];
    if (w->dtype == DType::kBF16) return Bf16ToFloat(w->as<bf16_t>()[r * cols + c]);
    const int64_t sc = s->shape[1];
    return static_cast<double>(Fp8E4M3ToFloat(w->as<uint8_t>()[r * cols + c])) *
           s->as<float>()[(r / 128) * sc + c / 128];
  }
  std::vector<double> Apply(const std::vector<double>& x) const {
    std::vector<double> y(w->shape[0], 0.0);
    for (int64_t r = 0; r < w->shape[0]; ++r) {
      for (int64_t c = 0; c < w->shape[1]; ++c) y[r] += At(r, c) * x[c];
    }
    return y;
  }
};

Dense DenseOf(const WeightViews& v, const std::string& name) {
  Dense d;
  d.w = v.Find(name + ".weight");
  d.s = v.Find(name + ".weight_scale_inv");
  EXPECT_NE(d.w, nullptr) << name;
  return d;
}

std::vector<double> Norm(const std::vector<double>& x, const WeightView& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * Bf16ToFloat(w.as<bf16_t>()[i]);
  return y;
}

// `row_groups`: bf16 experts rewritten into the CPU row-group layout after loading.
void CheckPreset(const std::string& preset, bool row_groups = false) {
  SCOPED_TRACE(preset + (row_groups ? " row groups" : ""));
  auto model = LoadModelConfig(preset);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const ModelConfig& m = *model;
  PlanOptions o;
  o.backend = "moeshard-cpu";
  auto plan = BuildShardPlan(m, o);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  LoadOptions lo;
  lo.seed = 99;
  lo.max_moe_layers = 1;
  auto weights = LoadRankWeights(*plan, 0, lo);
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  if (row_groups) {
    Result<KernelContext> ctx = KernelContext::Create({.num_threads = 2});
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    const Result<int64_t> n = UseCpuRowGroupLayout(*ctx, *plan, &*weights);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    ASSERT_EQ(*n, 1) << "the loaded MoE layer's experts should be rewritten";
  }
  const WeightViews v = ViewRankWeights(*weights);
  const int64_t layer = MoeLayersOf(m, plan->ranks[0].layers).front();
  const int64_t T = 5, H = m.hidden_size, E = m.num_experts, k = m.num_experts_per_tok;
  std::vector<float> x(T * H), out(T * H);
  DummyHiddenStates(3, 0, T, H, x.data());

  const Status s = RunLocalRanks(1, {}, [&](Communicator& w) -> Status {
    MOESHARD_ASSIGN_OR_RETURN(KernelContext ctx, KernelContext::Create({.num_threads = 1}));
    MOESHARD_ASSIGN_OR_RETURN(
        auto rt, MoeRuntime::Create(*plan, v, w, ctx, {.max_tokens = T, .layers = {layer}}));
    return rt->Forward({.x = x.data(), .num_tokens = T, .out = out.data()});
  });
  ASSERT_TRUE(s.ok()) << s.ToString();

  // The formula of moe_runtime.h, token by token.
  const std::string p = fmt::format("model.layers.{}.", layer);
  const std::string gate = m.family == ModelFamily::kMixtral  ? p + "block_sparse_moe.gate"
                           : m.family == ModelFamily::kGptOss ? p + "mlp.router"
                                                              : p + "mlp.gate";
  const double eps = m.rms_norm_eps;
  const int64_t L = m.latent_moe ? m.routed_expert_hidden_size : H;
  std::vector<float> logits(T * E), z(T * L);
  std::vector<std::vector<double>> hs(T);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> xt(x.begin() + t * H, x.begin() + (t + 1) * H);
    hs[t] = Norm(xt, *v.Find(p + "post_attention_layernorm.weight"), eps);
    std::vector<double> lg = DenseOf(v, gate).Apply(hs[t]);
    const WeightView* rb = v.Find(gate + ".bias");
    for (int64_t e = 0; e < E; ++e) {
      logits[t * E + e] = static_cast<float>(lg[e] + (rb ? Bf16ToFloat(rb->as<bf16_t>()[e]) : 0));
    }
    std::vector<double> zt = hs[t];
    if (m.latent_moe) {
      zt = DenseOf(v, p + "mlp.latent_down_proj").Apply(hs[t]);
      if (m.latent_moe_use_norm) zt = Norm(zt, *v.Find(p + "mlp.latent_norm.weight"), eps);
    }
    for (int64_t i = 0; i < L; ++i) z[t * L + i] = static_cast<float>(zt[i]);
  }
  RoutingParams rp = KernelRoutingParams(m);
  if (const WeightView* cb = v.Find(gate + ".e_score_correction_bias")) {
    rp.e_score_correction_bias = cb->as<float>();
  }
  std::vector<int32_t> ids(T * k);
  std::vector<float> tw(T * k);
  ASSERT_TRUE(reference::Route(rp, {.router_logits = logits.data(),
                                    .num_tokens = T,
                                    .topk_ids = ids.data(),
                                    .topk_weights = tw.data()})
                  .ok());
  // Experts over the plan's fused tensors (1 rank: every expert, no padding with moeshard-cpu).
  ExpertWeights ew;
  ew.num_experts_local = E;
  ew.hidden = L;
  ew.intermediate = m.moe_intermediate_size;
  ew.gated = m.gated();
  ew.gate_up_interleaved = m.gate_up_fused;
  const std::string xp = p + "mlp.experts.";
  std::vector<float> b13, b2;
  switch (m.quant.method) {
    case QuantMethod::kNone:
      ew.format = WeightFormat::kBf16;
      ew.w13 = v.Find(xp + "w13_weight")->data;
      ew.w2 = v.Find(xp + "w2_weight")->data;
      ew.bf16_row_groups = v.Find(xp + "w13_weight")->bf16_row_groups;
      EXPECT_EQ(ew.bf16_row_groups, row_groups);
      break;
    case QuantMethod::kFp8Block:
      ew.format = WeightFormat::kFp8Block;
      ew.w13 = v.Find(xp + "w13_weight")->data;
      ew.w2 = v.Find(xp + "w2_weight")->data;
      ew.w13_scales = v.Find(xp + "w13_weight_scale_inv")->data;
      ew.w2_scales = v.Find(xp + "w2_weight_scale_inv")->data;
      break;
    case QuantMethod::kMxfp4:
    case QuantMethod::kInt4:
      ew.format =
          m.quant.method == QuantMethod::kMxfp4 ? WeightFormat::kMxfp4 : WeightFormat::kInt4;
      ew.w13 = v.Find(xp + "w13_weight_packed")->data;
      ew.w2 = v.Find(xp + "w2_weight_packed")->data;
      ew.w13_scales = v.Find(xp + "w13_weight_scale")->data;
      ew.w2_scales = v.Find(xp + "w2_weight_scale")->data;
      break;
  }
  if (m.expert_bias) {
    for (auto [name, dst] : {std::pair{"w13_bias", &b13}, std::pair{"w2_bias", &b2}}) {
      const WeightView* b = v.Find(xp + name);
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
    if (m.latent_moe) r = DenseOf(v, p + "mlp.latent_up_proj").Apply(r);
    std::vector<double> y(H, 0.0);
    if (m.num_shared_experts > 0) {
      const std::string sp = p + "mlp.shared_experts.";
      const std::vector<double> g = DenseOf(v, sp + "gate_proj").Apply(hs[t]);
      const std::vector<double> u = DenseOf(v, sp + "up_proj").Apply(hs[t]);
      std::vector<double> a(g.size());
      for (size_t i = 0; i < g.size(); ++i) {
        a[i] = ApplyActivation(mp.activation, static_cast<float>(g[i]), static_cast<float>(u[i]));
      }
      y = DenseOf(v, sp + "down_proj").Apply(a);
    }
    for (int64_t h = 0; h < H; ++h) ref[t * H + h] = static_cast<float>(x[t * H + h] + r[h] + y[h]);
  }
  const ErrorStats st = CompareOutputs(out, ref);
  EXPECT_TRUE(st.Passes(Tolerance{})) << st.Summary(Tolerance{});
  // The MoE block must matter at this tolerance, or the comparison proves nothing.
  const ErrorStats moved = CompareOutputs(out, x);
  EXPECT_GT(moved.max_abs_err, 10 * st.max_abs_err + 1e-3) << moved.Summary(Tolerance{});
}

TEST(RuntimeLayerReferenceTest, KimiK3) { CheckPreset("tiny-kimi-k3"); }
TEST(RuntimeLayerReferenceTest, DeepseekV3) { CheckPreset("tiny-deepseek-v3"); }
TEST(RuntimeLayerReferenceTest, Qwen3Moe) { CheckPreset("tiny-qwen3-moe"); }
TEST(RuntimeLayerReferenceTest, Qwen3MoeRowGroupLayout) { CheckPreset("tiny-qwen3-moe", true); }
TEST(RuntimeLayerReferenceTest, MixtralRowGroupLayout) { CheckPreset("tiny-mixtral", true); }
TEST(RuntimeLayerReferenceTest, Mixtral) { CheckPreset("tiny-mixtral"); }
TEST(RuntimeLayerReferenceTest, GptOss) { CheckPreset("tiny-gpt-oss"); }

}  // namespace
}  // namespace moeshard
