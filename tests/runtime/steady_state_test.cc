// No allocation in the steady state: after a warm-up call, Forward allocates nothing on the
// rank threads, for the EP, TP and hybrid paths with shared experts and latent projections.
// Counted by replacing the global operator new in this executable; only allocations made
// while a rank thread has counting switched on (thread_local) are counted.
#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <string>

#include "moeshard/comm/local_comm.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/kernels/kernel_backend.h"
#include "moeshard/runtime/expert_dispatch.h"
#include "moeshard/runtime/moe_runtime.h"
#include "moeshard/runtime/verify.h"
#include "moeshard/weights/loader.h"

// This file replaces the global allocator with malloc/free, so GCC's pairing check (which
// sees `new` expressions ending in free) does not apply here.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
thread_local bool t_counting = false;
std::atomic<int64_t> g_runtime_allocations{0};  // made by the runtime layer's own code
std::atomic<int64_t> g_other_allocations{0};    // made inside calls into kernels, comm, std
std::mutex g_sites_mutex;
std::map<std::string, int64_t>* g_other_sites = nullptr;

// The runtime layer's functions (namespaces and classes of include/moeshard/runtime and
// src/runtime; the dense operations are the kernel backend's, counted as "other").
bool IsRuntimeFunction(const std::string& name) {
  for (const char* prefix : {"moeshard::MoeRuntime", "moeshard::ExpertDispatcher",
                             "moeshard::internal::LayerSteps", "moeshard::TokenChunk"}) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// Attributes an allocation to the innermost moeshard function on the stack (the executable is
// linked with exported symbols, so dladdr names its functions; inlined frames fold into their
// caller, which is the attribution wanted: an allocation inlined into runtime code is the
// runtime's).
void Attribute() {
  void* frames[24];
  const int depth = backtrace(frames, 24);
  for (int i = 2; i < depth; ++i) {
    Dl_info info;
    if (dladdr(frames[i], &info) == 0 || info.dli_sname == nullptr) continue;
    int status = 0;
    char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    const std::string name = status == 0 && demangled ? demangled : info.dli_sname;
    std::free(demangled);
    if (name.rfind("moeshard::", 0) != 0) continue;  // std::, fmt::, operator new itself
    if (IsRuntimeFunction(name)) {
      g_runtime_allocations.fetch_add(1);
    } else {
      g_other_allocations.fetch_add(1);
      std::lock_guard<std::mutex> lock(g_sites_mutex);
      if (g_other_sites != nullptr) ++(*g_other_sites)[name.substr(0, name.find('('))];
    }
    return;
  }
  g_other_allocations.fetch_add(1);
}
}  // namespace

void* operator new(size_t n) {
  if (t_counting) {
    t_counting = false;  // the bookkeeping below allocates
    Attribute();
    t_counting = true;
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace moeshard {
namespace {

struct Counts {
  int64_t runtime = -1;
  int64_t other = -1;
  std::map<std::string, int64_t> other_sites;
};

Counts CountForwardAllocations(const std::string& preset, Topology topology) {
  Counts counts;
  std::map<std::string, int64_t> sites;
  const int world = static_cast<int>(topology.tp * topology.dp);
  const Status s = RunLocalRanks(world, LocalCommOptions{}, [&](Communicator& w) -> Status {
    MOESHARD_ASSIGN_OR_RETURN(ModelConfig model, LoadModelConfig(preset));
    PlanOptions o;
    o.topology = topology;
    o.backend = "moeshard-cpu";
    MOESHARD_ASSIGN_OR_RETURN(ShardPlan plan, BuildShardPlan(model, o));
    LoadOptions lo;
    lo.seed = 7;
    lo.max_moe_layers = 2;
    lo.num_threads = 1;
    MOESHARD_ASSIGN_OR_RETURN(RankWeights weights, LoadRankWeights(plan, w.rank(), lo));
    MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<KernelBackend> kernels,
                              CreateKernelBackend({.name = "cpu", .num_threads = 1}));
    MOESHARD_RETURN_IF_ERROR(PrepareExpertWeights(*kernels, plan, &weights).status());
    const WeightViews views = ViewRankWeights(weights);
    const std::vector<int64_t> moe = MoeLayersOf(model, plan.ranks[w.rank()].layers);
    MoeRuntimeOptions ro;
    ro.max_tokens = 24;
    ro.layers = {moe.begin(), moe.begin() + 2};
    MOESHARD_ASSIGN_OR_RETURN(auto rt, MoeRuntime::Create(plan, views, w, *kernels, ro));
    const int64_t unit = plan.ranks[w.rank()].coords.group_rank / topology.tp;
    std::vector<float> x(24 * model.hidden_size), out(x.size());
    DummyHiddenStates(7, unit, 24, model.hidden_size, x.data());
    std::vector<double> seconds(2);
    ForwardArgs a{
        .x = x.data(), .num_tokens = 24, .out = out.data(), .layer_seconds = seconds.data()};
    MOESHARD_RETURN_IF_ERROR(rt->Forward(a));  // warm-up: kernel scratch grows here
    MOESHARD_RETURN_IF_ERROR(w.Barrier());
    if (w.rank() == 0) {
      g_runtime_allocations.store(0);
      g_other_allocations.store(0);
      g_other_sites = &sites;
    }
    MOESHARD_RETURN_IF_ERROR(w.Barrier());
    t_counting = true;
    Status st = rt->Forward(a);
    a.num_tokens = 11 + unit;  // a smaller, per-DP-rank different batch
    if (st.ok()) st = rt->Forward(a);
    t_counting = false;
    MOESHARD_RETURN_IF_ERROR(st);
    MOESHARD_RETURN_IF_ERROR(w.Barrier());
    if (w.rank() == 0) {
      counts.runtime = g_runtime_allocations.load();
      counts.other = g_other_allocations.load();
      g_other_sites = nullptr;
    }
    return Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  counts.other_sites = sites;
  // Allocations inside kernel and comm calls, named by call site when a test fails.
  for (const auto& [site, n] : counts.other_sites) {
    std::printf("  %s: %lld allocations in 2 steady-state calls x %d ranks\n", site.c_str(),
                static_cast<long long>(n), world);
  }
  return counts;
}

TEST(RuntimeSteadyStateTest, ExpertParallelForwardAllocatesNothing) {
  // Neither the runtime nor the kernels and communicators it calls allocate once warm.
  const auto counts =
      CountForwardAllocations("tiny-kimi-k3", {.tp = 2, .dp = 2, .enable_ep = true});
  EXPECT_EQ(counts.runtime, 0);
  EXPECT_EQ(counts.other, 0);
}

TEST(RuntimeSteadyStateTest, TensorParallelForwardAllocatesNothing) {
  // Neither the runtime nor the kernels and communicators it calls allocate once warm.
  const auto counts = CountForwardAllocations("tiny-deepseek-v3", {.tp = 2, .dp = 2});
  EXPECT_EQ(counts.runtime, 0);
  EXPECT_EQ(counts.other, 0);
}

TEST(RuntimeSteadyStateTest, HybridForwardAllocatesNothing) {
  // Neither the runtime nor the kernels and communicators it calls allocate once warm.
  const auto counts = CountForwardAllocations("tiny-gpt-oss", {.tp = 4, .moe_tp = 2, .moe_ep = 2});
  EXPECT_EQ(counts.runtime, 0);
  EXPECT_EQ(counts.other, 0);
}

TEST(RuntimeSteadyStateTest, AttributionSeesRuntimeAllocations) {
  // The instrument works: buffers a runtime constructor allocates are attributed to the runtime.
  const Status s = RunLocalRanks(1, LocalCommOptions{}, [](Communicator& w) -> Status {
    ExpertDispatcherOptions o{.num_experts = 2,
                              .top_k = 1,
                              .row_width = 4,
                              .out_width = 4,
                              .max_tokens = 4,
                              .max_received_rows = 4,
                              .owners = {{0}, {0}}};
    g_runtime_allocations.store(0);
    t_counting = true;
    auto d = ExpertDispatcher::Create(w, o);
    t_counting = false;
    return d.status();
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_GE(g_runtime_allocations.load(), 5);
}

}  // namespace
}  // namespace moeshard
