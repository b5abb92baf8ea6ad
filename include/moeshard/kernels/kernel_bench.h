// The CPU MoE kernel benchmark suite behind `moeshard bench kernels` and bench/kernels_bench.cc.
//
// Measures, in one run, the machine's read bandwidth and bf16 dot-product peak (roofline.h),
// then the expert computation of MoE layer shapes (gate_up, activation, down, unpermute: the
// MoeExpertsForward call; routing timed separately) and reports each case as a fraction of its
// roofline:
//   memory time  = bytes of the distinct experts' weights touched / read bandwidth
//   compute time = FLOPs (2 * rows * 3 * H * I for gated experts) / bf16 dot peak
//   fraction     = max(memory time, compute time) / measured time
// Routing is random with a fixed seed and changes between repetitions, so repeated runs do not
// find the same experts' weights in the last-level cache.
//
// The roofline of each case is measured right before and right after its repetitions (the
// better of the two): on a VM whose memory bandwidth is shared with other tenants, the
// bandwidth drifts by tens of percent within a run, and a kernel is fairly compared only with
// what the machine delivered at that moment. Every result also carries its fraction of the
// run-wide best roofline (the best of all measurements of the run), the strictest yardstick.
//
// Thread safety: one run at a time per KernelContext.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/kernels/expert_gemm.h"

namespace moeshard {

class KernelContext;
class ReadBuffer;

struct KernelBenchShape {
  std::string name;
  int64_t hidden = 0;        // H (or the latent width of latent MoE)
  int64_t intermediate = 0;  // I
  int64_t num_experts = 0;   // experts resident on the rank
  int64_t top_k = 0;
};

// qwen3-30b-a3b (H 2048, I 768, 128 experts, top-8), kimi-k2-32e (H 7168, I 2048, 32 experts
// resident, top-8), kimi-k3-latent-64e (latent 3584, I 3072, 64 experts resident, top-16).
std::vector<KernelBenchShape> DefaultKernelBenchShapes();

struct Roofline {
  double read_bytes_per_s = 0.0;
  double peak_flops_per_s = 0.0;  // of the instruction the context's kernels use (roofline.h)
};

// Measures both limits (best of `repetitions`), reading `read` (roofline.h).
Result<Roofline> MeasureRoofline(KernelContext& ctx, const ReadBuffer& read, int repetitions);

struct KernelBenchOptions {
  std::vector<int64_t> tokens = {1, 8, 32, 128, 512, 2048};
  std::vector<KernelBenchShape> shapes = DefaultKernelBenchShapes();
  std::vector<WeightFormat> formats = {WeightFormat::kBf16, WeightFormat::kMxfp4};
  // The layouts bf16 weights are measured in, in this order: false row-major, true the row-group
  // layout (RepackBf16RowGroups; one set of weights, repacked in place between the two).
  std::vector<bool> bf16_row_groups = {false, true};
  // A/B mode: every repetition also runs the same case (same weights, inputs and routing) on
  // this second context, alternating which goes first, and the result reports its median time
  // and the median of the per-pair time ratios (robust to the host's bandwidth drifting between
  // minutes). Null: off.
  KernelContext* versus = nullptr;
  double min_seconds = 0.5;  // per case: repeat until this much time and >= min_repetitions
  int min_repetitions = 3;
  uint64_t seed = 1;
};

struct KernelBenchResult {
  std::string shape;
  WeightFormat format = WeightFormat::kBf16;
  bool row_groups = false;  // bf16 in the row-group layout
  int64_t num_tokens = 0;
  int repetitions = 0;
  double experts_touched = 0.0;  // mean distinct experts per repetition
  double weight_bytes = 0.0;     // mean distinct expert weight bytes (data + scales)
  double flops = 0.0;
  double seconds = 0.0;               // median time of the expert computation
  double routing_seconds = 0.0;       // median time of Route (softmax top-k) for the same tokens
  double memory_seconds = 0.0;        // weight_bytes / bandwidth
  double compute_seconds = 0.0;       // flops / bf16 peak
  double fraction = 0.0;              // max(memory, compute) / seconds
  const char* bound = "";             // "memory" or "compute"
  Roofline roofline;                  // measured around this case (best of before and after)
  double fraction_of_run_best = 0.0;  // the same fraction against the run-wide best roofline
  // A/B mode (KernelBenchOptions::versus): the other variant's median time, and the median of
  // its time / this time over alternating pairs (> 1: this variant is faster).
  double versus_seconds = 0.0;
  double versus_ratio = 0.0;
};

// "bf16-rg" for bf16 in the row-group layout, else WeightFormatName.
std::string KernelBenchFormatName(const KernelBenchResult& r);

// Recomputes memory/compute seconds, bound and fraction of `results` against each result's own
// roofline (or `run_best` where a result has none), and fraction_of_run_best against `run_best`.
void ApplyRoofline(const Roofline& run_best, std::vector<KernelBenchResult>* results);

// The better of two measurements in each dimension.
Roofline BestOf(const Roofline& a, const Roofline& b);

// Runs every (shape, format, tokens) case, measuring the roofline around each on `read` (made
// for ctx); `on_result` is called after each (for progress).
Result<std::vector<KernelBenchResult>> RunKernelBench(
    KernelContext& ctx, const KernelBenchOptions& options, const ReadBuffer& read,
    const Roofline& roofline, const std::function<void(const KernelBenchResult&)>& on_result = {});

}  // namespace moeshard
