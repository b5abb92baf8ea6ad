#include "tests/runtime/runtime_cases.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <tuple>

#include "moeshard/config/config_loader.h"
#include "moeshard/kernels/kernel_backend.h"
#include "moeshard/runtime/expert_dispatch.h"
#include "moeshard/runtime/moe_runtime.h"
#include "moeshard/runtime/verify.h"
#include "moeshard/runtime/weight_views.h"
#include "moeshard/weights/loader.h"

namespace moeshard::runtime_test {
namespace {

constexpr uint64_t kSeed = 1234;

enum Expect : unsigned {
  kPadded = 1,         // some routed dim padded beyond its raw local size
  kUnpadded = 2,       // no routed padding
  kUnevenExperts = 4,  // ranks hold different numbers of experts
  kEmptyDpRank = 8,    // some DP rank holds no tokens
  kHiddenPadded = 16,  // the experts' hidden (or latent) width padded
  kRedundant = 32,     // some expert held by two EP ranks (EPLB)
};

struct EquivSpec {
  std::string model;
  Topology topology;
  std::string backend = "moeshard-cpu";
  std::vector<int64_t> tokens = {13};  // per DP rank, cycled
  int64_t layers = 2;
  unsigned expect = kUnpadded;
  SharedExpertsMode shared = SharedExpertsMode::kSharded;
  ExpertPlacement placement = ExpertPlacement::kLinear;
  int64_t redundant_experts = 0;
  // Widens the tolerance below. Only for DeepSeek-V4 (3 layers of MXFP4 experts): the SIMD
  // backend's 4-bit path multiplies on 16-bit inputs up to 4 tokens per expert call and on fp32
  // strips from 5, and a layout that gives an expert its tokens in other calls than one rank does
  // (EP dispatch) switches paths; the two differ by up to ~4e-4 of the output per layer
  // (GroupedGemm.TokensIndependentOfTheirBatch), 1.1e-2 at |ref| 5.9 after V4's three layers
  // against 7.9e-3 allowed. A known defect of the kernels' batch invariance, not of the layout.
  double tolerance_scale = 1.0;
};

Status Fail(const std::string& what) { return InternalError(what); }

Result<ShardPlan> PlanOf(const EquivSpec& c, const Topology& topology) {
  MOESHARD_ASSIGN_OR_RETURN(ModelConfig model, LoadModelConfig(c.model));
  PlanOptions o;
  o.topology = topology;
  o.backend = c.backend;
  o.shared_experts = c.shared;
  o.placement = c.placement;
  o.num_redundant_experts = c.redundant_experts;
  return BuildShardPlan(model, o);
}

Status CheckExpectations(const EquivSpec& c, const ShardPlan& plan) {
  const bool i_pad = plan.intermediate.padded_local > plan.intermediate.raw_local;
  const bool h_pad = plan.hidden.padded_local > plan.hidden.raw_local;
  if ((c.expect & kPadded) && !i_pad && !h_pad) return Fail("case expects padding, plan has none");
  if ((c.expect & kHiddenPadded) && !h_pad) return Fail("case expects hidden padding");
  if ((c.expect & kUnpadded) && (i_pad || h_pad)) return Fail("case expects no padding");
  if (c.expect & kUnevenExperts) {
    std::set<size_t> sizes;
    for (const RankPlan& r : plan.ranks) sizes.insert(r.expert_slots.size());
    if (sizes.size() < 2) return Fail("case expects uneven expert division, plan is even");
  }
  if (c.expect & kRedundant) {
    std::map<int64_t, std::set<int64_t>> holders;
    for (const RankPlan& r : plan.ranks) {
      for (int64_t e : r.expert_slots) holders[e].insert(r.coords.moe_ep_rank);
    }
    bool twice = false;
    for (const auto& [e, ranks] : holders) twice |= ranks.size() > 1;
    if (!twice) return Fail("case expects an expert on two EP ranks");
  }
  if (c.expect & kEmptyDpRank) {
    const int64_t units = plan.topology.dp * plan.topology.pcp;
    bool empty = false;
    for (int64_t u = 0; u < units; ++u) empty |= c.tokens[u % c.tokens.size()] == 0;
    if (!empty) return Fail("case expects a DP rank without tokens");
  }
  return Status::Ok();
}

// Runs `plan`'s layers on `comm` for one unit's tokens; out: [T, H].
Status RunOn(const ShardPlan& plan, Communicator& comm, const std::string& backend, int64_t layers,
             int64_t max_tokens, const std::vector<float>& x, const std::vector<int32_t>& tokens,
             int64_t T, std::vector<float>* out) {
  LoadOptions lo;
  lo.source = LoadOptions::Source::kDummy;
  lo.seed = kSeed;
  lo.max_moe_layers = layers;
  lo.num_threads = 1;
  MOESHARD_ASSIGN_OR_RETURN(RankWeights weights, LoadRankWeights(plan, comm.rank(), lo));
  MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<KernelBackend> kernels, TestKernelBackend(backend));
  MOESHARD_RETURN_IF_ERROR(PrepareExpertWeights(*kernels, plan, &weights).status());
  const WeightViews views = ViewRankWeights(weights);
  MoeRuntimeOptions ro;
  ro.max_tokens = max_tokens;
  const std::vector<int64_t> moe = MoeLayersOf(plan.model, plan.ranks[comm.rank()].layers);
  ro.layers.assign(moe.begin(), moe.begin() + std::min<int64_t>(layers, moe.size()));
  MOESHARD_ASSIGN_OR_RETURN(auto rt, MoeRuntime::Create(plan, views, comm, *kernels, ro));
  out->assign(x.size(), 0.0f);
  ForwardArgs a;
  a.x = x.data();
  a.x_dtype = DType::kF32;
  a.num_tokens = T;
  a.token_ids = tokens.data();
  a.out = out->data();
  return rt->Forward(a);
}

Status EquivalenceBody(const EquivSpec& c, Communicator& world, const std::string& backend) {
  MOESHARD_ASSIGN_OR_RETURN(ShardPlan plan, PlanOf(c, c.topology));
  MOESHARD_RETURN_IF_ERROR(CheckExpectations(c, plan));
  const RankCoords& rc = plan.ranks[world.rank()].coords;
  const int64_t unit = rc.group_rank / plan.topology.tp;
  const int64_t T = c.tokens[unit % c.tokens.size()];
  const int64_t H = plan.model.hidden_size;
  const int64_t max_tokens = *std::max_element(c.tokens.begin(), c.tokens.end());
  std::vector<float> x(T * H);
  DummyHiddenStates(kSeed, unit, T, H, x.data());
  // Token ids: the input of hash-routed layers (DeepSeek-V4), ignored by the others.
  std::vector<int32_t> tokens(T);
  DummyTokenIds(kSeed, unit, T, plan.model.vocab_size, tokens.data());
  std::vector<float> out, ref;
  MOESHARD_RETURN_IF_ERROR(RunOn(plan, world, backend, c.layers, max_tokens, x, tokens, T, &out));

  // The single-rank reference of the same tokens, on a communicator of this rank alone.
  MOESHARD_ASSIGN_OR_RETURN(auto solo, world.Split(world.rank(), 0));
  MOESHARD_ASSIGN_OR_RETURN(ShardPlan plan1, PlanOf(c, Topology{}));
  MOESHARD_RETURN_IF_ERROR(RunOn(plan1, *solo, backend, c.layers, max_tokens, x, tokens, T, &ref));

  const ErrorStats stats = CompareOutputs(out, ref);
  // Tighter than the CLI's bf16 default (verify.h): both sides round the same values to bf16
  // and differ only in fp32 summation order (observed max errors ~2e-7), so 2e-3 still leaves
  // room for a rare bf16 rounding flip of an expert input in a later layer while catching,
  // e.g., a bias added on two moe_tp ranks (~2e-2).
  const Tolerance tol{.atol = 2e-3 * c.tolerance_scale, .rtol = 1e-3 * c.tolerance_scale};
  if (!stats.Passes(tol)) {
    const int64_t t = stats.worst_index / H, h = stats.worst_index % H;
    return Fail(fmt::format("{} vs 1 rank: {}; worst at token {} column {}: {} vs {}",
                            plan.topology.Label(), stats.Summary(tol), t, h, out[stats.worst_index],
                            ref[stats.worst_index]));
  }
  if (std::getenv("MOESHARD_TEST_VERBOSE") != nullptr) {
    std::fprintf(stderr, "[rank %d] %s: %s\n", world.rank(), plan.topology.Label().c_str(),
                 stats.Summary(tol).c_str());
  }
  // The layers must have done something: the MoE block changes every non-empty output.
  double moved = 0;
  for (int64_t i = 0; i < T * H; ++i) moved = std::max<double>(moved, std::fabs(out[i] - x[i]));
  if (T > 0 && moved < 1e-3) {
    return Fail(fmt::format("the layers left the input unchanged (max change {})", moved));
  }
  return Status::Ok();
}

// ---- dispatch ---------------------------------------------------------------------------------

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct DispatchSetup {
  int64_t E = 0, k = 3, width = 8;
  std::vector<std::vector<int>> owners;
  std::vector<int64_t> tokens;  // per rank
  // topk of (rank, token): k distinct experts.
  std::vector<int32_t> TopK(int r, int64_t u) const {
    std::vector<int32_t> ids;
    uint64_t h = Mix(static_cast<uint64_t>(r) * 1000003 + static_cast<uint64_t>(u));
    while (static_cast<int64_t>(ids.size()) < k) {
      h = Mix(h);
      const int32_t e = static_cast<int32_t>(h % static_cast<uint64_t>(E));
      if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
    }
    return ids;
  }
};

DispatchSetup MakeDispatchSetup(int n) {
  DispatchSetup s;
  s.E = 2 * n + 1;  // uneven: the first rank gets one more
  s.owners.assign(s.E, {});
  for (int p = 0; p < n; ++p) {
    for (int64_t e : ExpertSlotsOf(s.E, s.E, n, p, ExpertPlacement::kLinear)) {
      s.owners[e].push_back(p);
    }
  }
  if (n > 1) s.owners[s.E - 1].push_back(0);  // a redundant copy (EPLB): two owners
  for (int p = 0; p < n; ++p) s.tokens.push_back(p == 1 ? 0 : 5 + 3 * p);  // rank 1: none
  return s;
}

Status DispatchBody(Communicator& world) {
  const int n = world.size(), me = world.rank();
  const DispatchSetup s = MakeDispatchSetup(n);
  const int64_t max_tokens = *std::max_element(s.tokens.begin(), s.tokens.end());
  ExpertDispatcherOptions o;
  o.num_experts = s.E;
  o.top_k = s.k;
  o.row_width = s.width;
  o.out_width = 4;
  o.max_tokens = max_tokens;
  o.max_received_rows = n * max_tokens * s.k;
  o.owners = s.owners;
  MOESHARD_ASSIGN_OR_RETURN(ExpertDispatcher d, ExpertDispatcher::Create(world, o));

  // Payload: [source rank, token, token * 3 + rank, 7, ...] exactly representable in bf16.
  const int64_t U = s.tokens[me];
  std::vector<bf16_t> rows(U * s.width);
  std::vector<int32_t> ids(U * s.k);
  std::vector<float> weights(U * s.k);
  for (int64_t u = 0; u < U; ++u) {
    for (int64_t j = 0; j < s.width; ++j) {
      const float v = j == 0 ? me : j == 1 ? static_cast<float>(u) : j == 2 ? u * 3 + me : 7;
      rows[u * s.width + j] = FloatToBf16(v);
    }
    const std::vector<int32_t> t = s.TopK(me, u);
    for (int64_t j = 0; j < s.k; ++j) {
      ids[u * s.k + j] = t[j];
      weights[u * s.k + j] = static_cast<float>(j + 1);
    }
  }
  for (int round = 0; round < 2; ++round) {  // twice: buffers are reused
    MOESHARD_RETURN_IF_ERROR(d.Dispatch(rows.data(), ids.data(), U));
    // Every pair that should arrive here, as (source, token, expert).
    std::multiset<std::tuple<int, int64_t, int32_t>> expected, got;
    for (int p = 0; p < n; ++p) {
      for (int64_t u = 0; u < s.tokens[p]; ++u) {
        for (int32_t e : s.TopK(p, u)) {
          const auto& ow = s.owners[e];
          if (ow[static_cast<size_t>(u) % ow.size()] == me) expected.insert({p, u, e});
        }
      }
    }
    for (int64_t i = 0; i < d.num_received(); ++i) {
      const bf16_t* row = d.received_rows() + i * s.width;
      const int src = static_cast<int>(Bf16ToFloat(row[0]));
      const int64_t u = static_cast<int64_t>(Bf16ToFloat(row[1]));
      const int32_t e = d.received_expert_ids()[i];
      if (src != d.received_source_ranks()[i] || Bf16ToFloat(row[2]) != u * 3 + src) {
        return Fail(fmt::format("rank {}: row {} payload ({}, {}, {}) disagrees with source {}", me,
                                i, src, u, Bf16ToFloat(row[2]), d.received_source_ranks()[i]));
      }
      for (int64_t j = 3; j < s.width; ++j) {
        if (Bf16ToFloat(row[j]) != 7)
          return Fail(fmt::format("rank {}: row {} tail corrupt", me, i));
      }
      got.insert({src, u, e});
      float* y = d.received_outputs() + i * 4;
      y[0] = static_cast<float>(src);
      y[1] = static_cast<float>(u);
      y[2] = static_cast<float>(e);
      y[3] = static_cast<float>(me);
    }
    if (got != expected) {
      return Fail(fmt::format("rank {}: received {} pairs, expected {} (or different ones)", me,
                              got.size(), expected.size()));
    }
    std::vector<float> out(U * 4, -1.0f);
    MOESHARD_RETURN_IF_ERROR(d.Combine(weights.data(), out.data(), 4, false));
    for (int64_t u = 0; u < U; ++u) {
      float sum_e = 0;
      for (int64_t j = 0; j < s.k; ++j) {
        const int32_t e = ids[u * s.k + j];
        const auto& ow = s.owners[e];
        const float* y = d.CombinedRow(u, j);
        const float want[4] = {static_cast<float>(me), static_cast<float>(u), static_cast<float>(e),
                               static_cast<float>(ow[static_cast<size_t>(u) % ow.size()])};
        for (int h = 0; h < 4; ++h) {
          if (y[h] != want[h]) {
            return Fail(fmt::format("rank {}: combined (token {}, slot {})[{}] = {}, want {}", me,
                                    u, j, h, y[h], want[h]));
          }
        }
        sum_e += static_cast<float>(j + 1) * static_cast<float>(e);
      }
      if (out[u * 4 + 2] != sum_e) {
        return Fail(fmt::format("rank {}: weighted sum of token {}: {} want {}", me, u,
                                out[u * 4 + 2], sum_e));
      }
    }
  }
  return Status::Ok();
}

// ---- the case list ----------------------------------------------------------------------------

Topology Topo(int64_t tp, int64_t dp = 1, bool ep = false, int64_t moe_tp = 0, int64_t moe_ep = 0) {
  Topology t;
  t.tp = tp;
  t.dp = dp;
  t.enable_ep = ep;
  t.moe_tp = moe_tp;
  t.moe_ep = moe_ep;
  return t;
}

struct Family {
  std::string preset;
  std::string tag;
  std::string padded_backend;  // a backend that pads this family's routed dims ("" = none)
  int64_t layers;
};

std::vector<RuntimeCase> BuildCases() {
  std::vector<RuntimeCase> cases;
  auto add = [&](const std::string& name, EquivSpec spec) {
    const int world = static_cast<int>(spec.topology.tp * spec.topology.dp);
    cases.push_back({name, world, [spec](Communicator& w, const std::string& backend) {
                       return EquivalenceBody(spec, w, backend);
                     }});
  };
  const std::vector<Family> families = {
      {"tiny-kimi-k3", "kimi", "marlin", 2},
      {"tiny-deepseek-v3", "deepseek", "", 2},
      {"tiny-qwen3-moe", "qwen", "triton", 2},
      {"tiny-mixtral", "mixtral", "aiter-ck", 2},
      {"tiny-gpt-oss", "gptoss", "marlin", 2},
      {"tiny-olmoe", "olmoe", "triton", 2},
      {"tiny-deepseek-v2", "deepseekv2", "", 2},
      {"tiny-qwen2-moe", "qwen2", "triton", 2},
      {"tiny-glm4-moe", "glm4", "", 2},
      {"tiny-minimax-m2", "minimax", "triton", 2},
      {"tiny-llama4", "llama4", "", 4},
      {"tiny-qwen3-next", "qwen3next", "triton", 4},
      {"tiny-qwen3.5-moe", "qwen35", "triton", 4},
      // Quantized layouts (int4 with zero points, NVFP4): the loader converts each into the
      // rank layout and the runtime binds zero points and global scales.
      {"tiny-qwen2-moe-awq", "qwen2awq", "", 2},
      {"tiny-qwen2-moe-gptq", "qwen2gptq", "", 2},
      // Act-order GPTQ: shuffled g_idx; under MoE TP each rank keeps every group's w2 scales.
      {"tiny-qwen2-moe-gptq-act", "qwen2gptqact", "", 2},
      {"tiny-qwen2-moe-w4a16-asym", "qwen2ctasym", "", 2},
      {"tiny-qwen2-moe-nvfp4", "qwen2nvfp4", "", 2},
      {"tiny-qwen2-moe-modelopt-nvfp4", "qwen2modelopt", "", 2},
      {"tiny-qwen2-moe-fp8-dynamic", "qwen2fp8channel", "", 2},
      {"tiny-qwen2-moe-modelopt-fp8", "qwen2fp8tensor", "", 2},
      // Layers 0-1 hash-routed by token id, 2 by sqrt(softplus) + bias; MXFP4 experts beside
      // fp8 shared experts. No backend pads its sizes (H 256, I 1024 are aligned for all).
      {"tiny-deepseek-v4", "deepseekv4", "", 3},
  };
  const std::vector<int64_t> uneven = {7, 0, 12, 3};  // per DP rank: uneven, one empty
  for (const Family& f : families) {
    auto spec = [&](Topology t) {
      EquivSpec s;
      s.model = f.preset;
      s.topology = t;
      s.layers = f.layers;
      if (f.preset == "tiny-deepseek-v4") s.tolerance_scale = 2.0;
      return s;
    };
    add(f.tag + "_1rank", spec(Topo(1)));
    for (int64_t n : {2, 4, 8}) {
      add(fmt::format("{}_tp{}", f.tag, n), spec(Topo(n)));              // TP only
      add(fmt::format("{}_tp{}_ep", f.tag, n), spec(Topo(n, 1, true)));  // EP only
      const int64_t dp = n == 2 ? 2 : n / 2, tp = n / dp;
      EquivSpec dpep = spec(Topo(tp, dp, true));  // DP x EP
      dpep.tokens = uneven;
      dpep.expect |= kEmptyDpRank;
      add(fmt::format("{}_dp{}_tp{}_ep", f.tag, dp, tp), dpep);
      EquivSpec dptp = spec(Topo(n / 2, 2));  // DP x TP, no EP
      dptp.tokens = uneven;
      dptp.expect |= kEmptyDpRank;
      add(fmt::format("{}_dp2_tp{}", f.tag, n / 2), dptp);
      if (n >= 4) {  // hybrid
        add(fmt::format("{}_tp{}_moetp2_moeep{}", f.tag, n, n / 2),
            spec(Topo(n, 1, false, 2, n / 2)));
      }
    }
    if (!f.padded_backend.empty()) {
      EquivSpec p = spec(Topo(4));
      p.backend = f.padded_backend;
      p.expect = kPadded;
      add(f.tag + "_tp4_padded", p);
      EquivSpec q = spec(Topo(4, 1, false, 2, 2));
      q.backend = f.padded_backend;
      q.expect = kPadded;
      add(f.tag + "_tp4_moetp2_moeep2_padded", q);
    }
  }
  // Padded int4 experts with zero points: Marlin's 128 alignment pads I 64 -> 128 at TP4 (the
  // padding's codes, scales and zero points stay zero and add nothing).
  {
    EquivSpec s;
    s.model = "tiny-qwen2-moe-awq";
    s.topology = Topo(4);
    s.backend = "marlin";
    s.expect = kPadded;
    add("qwen2awq_tp4_padded", s);
  }
  // Uneven expert division: 12 experts over 8 EP ranks.
  {
    EquivSpec s;
    s.model = "tiny-qwen3-moe";
    s.topology = Topo(8, 1, true);
    s.expect = kUnpadded | kUnevenExperts;
    add("qwen_tp8_ep_uneven_experts", s);
    s.topology = Topo(4, 2, true);
    s.tokens = {5, 9};
    add("qwen_dp2_tp4_ep_uneven_experts", s);
  }
  // Padded hidden (latent) width: Kimi's latent 128 -> 256 with Marlin, under EP.
  {
    EquivSpec s;
    s.model = "tiny-kimi-k3";
    s.topology = Topo(4, 1, true);
    s.backend = "marlin";
    s.expect = kPadded | kHiddenPadded;
    add("kimi_tp4_ep_hidden_padded", s);
  }
  // Round-robin placement, and EPLB redundant slots (an expert on two ranks: the dispatcher
  // picks one owner per token).
  {
    EquivSpec s;
    s.model = "tiny-kimi-k3";
    s.topology = Topo(4, 1, true);
    s.placement = ExpertPlacement::kRoundRobin;
    add("kimi_tp4_ep_round_robin", s);
    s.model = "tiny-mixtral";
    s.placement = ExpertPlacement::kLinear;
    s.redundant_experts = 4;
    s.expect = kUnpadded | kRedundant;
    add("mixtral_tp4_ep_redundant_experts", s);
  }
  // Replicated shared experts.
  {
    EquivSpec s;
    s.model = "tiny-deepseek-v3";
    s.topology = Topo(4);
    s.shared = SharedExpertsMode::kReplicated;
    add("deepseek_tp4_shared_replicated", s);
  }
  for (int n : {1, 2, 4, 8}) {
    cases.push_back({fmt::format("dispatch_{}ranks", n), n,
                     [](Communicator& w, const std::string&) { return DispatchBody(w); },
                     /*uses_kernels=*/false});
  }
  return cases;
}

}  // namespace

const std::vector<RuntimeCase>& AllRuntimeCases() {
  static const std::vector<RuntimeCase> cases = BuildCases();
  return cases;
}

Status BadRankBody(Communicator& world, int bad_rank) {
  EquivSpec c;
  c.model = "tiny-mixtral";
  c.topology = Topo(world.size(), 1, true);
  MOESHARD_ASSIGN_OR_RETURN(ShardPlan plan, PlanOf(c, c.topology));
  LoadOptions lo;
  lo.seed = kSeed;
  lo.max_moe_layers = 1;
  lo.num_threads = 1;
  MOESHARD_ASSIGN_OR_RETURN(RankWeights weights, LoadRankWeights(plan, world.rank(), lo));
  const WeightViews views = ViewRankWeights(weights);
  MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<KernelBackend> kernels, TestKernelBackend("cpu"));
  const std::vector<int64_t> moe = MoeLayersOf(plan.model, plan.ranks[world.rank()].layers);
  MOESHARD_ASSIGN_OR_RETURN(
      auto rt, MoeRuntime::Create(plan, views, world, *kernels,
                                  MoeRuntimeOptions{.max_tokens = 8, .layers = {moe.front()}}));
  const int64_t T = world.rank() == bad_rank ? 9 : 8;
  std::vector<float> x(9 * plan.model.hidden_size, 0.5f), out(x.size());
  ForwardArgs a;
  a.x = x.data();
  a.num_tokens = T;
  a.out = out.data();
  return rt->Forward(a);
}

std::vector<CaseRun> AllCaseRuns(int world) {
  std::vector<CaseRun> runs;
  for (const RuntimeCase& c : AllRuntimeCases()) {
    if (world > 0 && c.world != world) continue;
    const std::vector<std::string> backends =
        c.uses_kernels ? KernelBackendNames() : std::vector<std::string>{"cpu"};
    for (const std::string& b : backends) runs.push_back({c.name + "_" + b, &c, b});
  }
  return runs;
}

Result<std::unique_ptr<KernelBackend>> TestKernelBackend(const std::string& name) {
  return CreateKernelBackend({.name = name, .num_threads = 1});
}

}  // namespace moeshard::runtime_test
