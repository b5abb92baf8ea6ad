// Planner speed: `moeshard sweep` over every preset and GPU counts up to 64 (with pipeline
// parallelism and hybrids) must take well under a second. Run:
//   build/bench/plan_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include "moeshard/config/config_loader.h"
#include "moeshard/plan/invariants.h"
#include "moeshard/plan/memory.h"

namespace moeshard {
namespace {

std::vector<ModelConfig> Presets() {
  std::vector<ModelConfig> out;
  for (const PresetInfo& p : ModelPresets()) {
    if (p.name.rfind("tiny-", 0) == 0) continue;
    out.push_back(*LoadModelConfig(p.name));
  }
  return out;
}

// One full sweep: every strategy x GPU count {1..64} x every preset, with the memory plan.
void BM_SweepAllPresets(benchmark::State& state) {
  const std::vector<ModelConfig> models = Presets();
  MemoryOptions mo;
  mo.gpu = *FindGpu("h200");
  int64_t plans = 0;
  for (auto _ : state) {
    plans = 0;
    for (const ModelConfig& m : models) {
      GridOptions g;
      g.include_pp = true;
      for (const GridPoint& p : BuildGrid(m, g)) {
        benchmark::DoNotOptimize(PlanMemory(p.plan, mo).fits);
        ++plans;
      }
    }
  }
  state.counters["plans"] = static_cast<double>(plans);
  state.counters["models"] = static_cast<double>(models.size());
}
BENCHMARK(BM_SweepAllPresets)->Unit(benchmark::kMillisecond);

// `moeshard check` over every preset: the grid plus every invariant.
void BM_CheckAllPresets(benchmark::State& state) {
  const std::vector<ModelConfig> models = Presets();
  int64_t violations = 0;
  for (auto _ : state) {
    violations = 0;
    for (const ModelConfig& m : models) {
      GridOptions g;
      g.include_pp = true;
      violations += static_cast<int64_t>(CheckGrid(m, BuildGrid(m, g)).size());
    }
  }
  state.counters["violations"] = static_cast<double>(violations);
}
BENCHMARK(BM_CheckAllPresets)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace moeshard

BENCHMARK_MAIN();
