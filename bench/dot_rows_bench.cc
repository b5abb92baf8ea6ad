// One CPU backend's dot_rows (the decode kernels) on 4-bit and fp8 weights, without the
// grouped-GEMM driver: in L2 (a 384 x 2048 matrix, the size of a one-token gate/up task) and cold
// (a 450 MB run of 1536 x 2048 matrices, each read once per iteration), one thread. The two
// separate a kernel's instruction rate from its memory behaviour (docs/PERFORMANCE.md, "Int8
// activations": the SIMD and the AVX-512 BF16 kernels have about the same rate in L2 but not
// from memory).
//
//   build/bench/dot_rows_bench --benchmark_filter='cold'
#include <benchmark/benchmark.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "moeshard/base/numeric.h"
#include "moeshard/kernels/quantize.h"

namespace moeshard {
namespace {

// The backend of `isa` (avx512-bf16: the native kernels), or null where this CPU lacks it.
const internal::CpuBackend* BackendOf(CpuIsa isa) {
  if (!CpuSupportsIsa(isa)) return nullptr;
  return &internal::CpuBackendFor(isa);
}

struct Matrices {
  std::vector<uint8_t> bytes;  // every copy: data then scales
  std::vector<internal::MatrixRef> refs;
};

// `copies` copies of one expert's w13 ([rows, 2048]; 4-bit: group 32, fp8: its 128 x 128 blocks)
// in `format`.
Matrices MakeMatrices(WeightFormat format, int64_t rows, int copies) {
  constexpr int64_t kCols = 2048;
  WeightScheme q = WeightScheme::Default(format);
  if (format != WeightFormat::kFp8Block) q.group = 32;
  const ExpertWeightsShape s{
      .scheme = q, .num_experts_local = 1, .hidden = kCols, .intermediate = rows, .gated = false};
  std::vector<float> w13(static_cast<size_t>(rows * kCols)), w2(w13.size());
  for (size_t i = 0; i < w13.size(); ++i) {
    w13[i] = static_cast<float>((i * 2654435761u) % 1000) / 5000.0f - 0.1f;
  }
  const OwnedExpertWeights ow = EncodeExpertWeights(s, w13.data(), w2.data(), nullptr, nullptr);
  const internal::MatrixRef m0 = internal::ExpertMatrix(ow.view, true, 0);
  const auto data = static_cast<size_t>(m0.rows * m0.row_bytes);
  const auto scales = static_cast<size_t>(q.ScaleBytes(rows, kCols));
  Matrices m;
  m.bytes.resize((data + scales) * static_cast<size_t>(copies));
  for (int c = 0; c < copies; ++c) {
    uint8_t* d = m.bytes.data() + (data + scales) * static_cast<size_t>(c);
    std::memcpy(d, m0.data, data);
    std::memcpy(d + data, m0.scales, scales);
    internal::MatrixRef r = m0;
    r.data = d;
    r.scales = d + data;
    m.refs.push_back(r);
  }
  return m;
}

// Args: cold (0: in L2), tokens, int8 inputs.
void BM_DotRows(benchmark::State& state, CpuIsa isa, WeightFormat format) {
  const internal::CpuBackend* b = BackendOf(isa);
  const bool cold = state.range(0) != 0;
  const int64_t tokens = state.range(1);
  const bool int8 = state.range(2) != 0;
  if (b == nullptr) return state.SkipWithError("this CPU cannot run the variant");
  const Matrices m = MakeMatrices(format, cold ? 1536 : 384, cold ? 144 : 1);
  const int64_t cols = m.refs[0].cols;
  const int64_t rows = m.refs[0].rows;
  std::vector<int32_t> idx(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) idx[static_cast<size_t>(r)] = static_cast<int32_t>(r);
  std::vector<bf16_t> x(static_cast<size_t>(tokens * cols));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = FloatToBf16(static_cast<float>((i * 7919) % 100) / 50.0f - 1.0f);
  }
  std::vector<float> out(static_cast<size_t>(tokens * rows));
  std::vector<float> work(static_cast<size_t>(b->work_floats(tokens, cols)));
  for (auto _ : state) {
    for (const internal::MatrixRef& r : m.refs) {
      b->dot_rows({.w = &r,
                   .x = x.data(),
                   .ldx = cols,
                   .num_tokens = tokens,
                   .row_idx = idx.data(),
                   .num_rows = rows,
                   .out = out.data(),
                   .ldo = rows,
                   .work = work.data(),
                   .int8_inputs = int8});
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(m.bytes.size()));
}

void Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"cold", "tokens", "int8"});
  for (int64_t cold : {0, 1}) {
    for (int64_t tokens : {1, 2, 3, 4, 8}) {
      for (int64_t int8 : {0, 1}) b->Args({cold, tokens, int8});
    }
  }
}

BENCHMARK_CAPTURE(BM_DotRows, avx512_bf16_int4, CpuIsa::kAvx512Bf16, WeightFormat::kInt4)
    ->Apply(Args);
BENCHMARK_CAPTURE(BM_DotRows, avx512_int4, CpuIsa::kAvx512, WeightFormat::kInt4)->Apply(Args);
BENCHMARK_CAPTURE(BM_DotRows, avx2_int4, CpuIsa::kAvx2, WeightFormat::kInt4)->Apply(Args);
BENCHMARK_CAPTURE(BM_DotRows, avx2_mxfp4, CpuIsa::kAvx2, WeightFormat::kMxfp4)->Apply(Args);
// fp8 has no int8-input route: 16-bit inputs only.
BENCHMARK_CAPTURE(BM_DotRows, avx2_fp8, CpuIsa::kAvx2, WeightFormat::kFp8Block)
    ->ArgNames({"cold", "tokens", "int8"})
    ->ArgsProduct({{0, 1}, {1, 2, 8}, {0}});

}  // namespace
}  // namespace moeshard

BENCHMARK_MAIN();
