#include "kernels/kernels_test_util.h"

#include <fmt/format.h>

#include <cmath>
#include <random>

#include "base/check.h"

namespace moeshard::testing {

std::vector<float> Randn(int64_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng) * scale;
  return v;
}

std::vector<CpuIsa> TestIsas() {
  // Every variant this CPU can run: the portable path, each Highway target (AVX2, AVX-512
  // without BF16, NEON, SVE) and the native AVX-512 BF16 kernels.
  return SupportedCpuIsas();
}

KernelContext MakeContext(CpuIsa isa, int num_threads) {
  KernelContextOptions o;
  o.isa = isa;
  o.num_threads = num_threads;
  auto r = KernelContext::Create(o);
  MOESHARD_CHECK(r.ok(), "{}", r.status().ToString());
  return std::move(r).value();
}

double MeanAbs(const std::vector<float>& v) {
  double s = 0.0;
  for (float x : v) s += std::abs(x);
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

::testing::AssertionResult Close(const std::vector<float>& got, const std::vector<float>& want,
                                 const Tolerance& tol, const std::string& what, uint64_t seed) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << what << " (seed " << seed << "): size " << got.size() << " vs " << want.size();
  }
  double sum_err = 0.0, max_err = 0.0;
  std::string first;
  int shown = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    sum_err += err;
    max_err = std::max(max_err, err);
    if ((err > tol.atol || std::isnan(got[i])) && shown < 8) {
      first += fmt::format("\n  [{}] got {:.6g} want {:.6g}", i, got[i], want[i]);
      ++shown;
    }
  }
  const double mean_want = MeanAbs(want);
  const double mean_rel =
      mean_want > 0 ? sum_err / static_cast<double>(got.size()) / mean_want : sum_err;
  if (shown > 0 || max_err > tol.atol || !(mean_rel <= tol.max_mean_rel)) {
    return ::testing::AssertionFailure() << fmt::format(
               "{} (seed {}): max abs err {:.3g} (atol {}), mean rel err {:.3g} "
               "(max {}), mean |want| {:.3g}; first mismatches:{}",
               what, seed, max_err, tol.atol, mean_rel, tol.max_mean_rel, mean_want, first);
  }
  return ::testing::AssertionSuccess();
}

std::vector<float> RunDotRows(const internal::CpuBackend& b, const internal::MatrixRef& m,
                              const std::vector<bf16_t>& x, int64_t tokens,
                              const std::vector<int32_t>& rows, bool int8) {
  const auto nr = static_cast<int64_t>(rows.size());
  std::vector<float> out(static_cast<size_t>(tokens * nr), -1.0f);
  std::vector<float> work(static_cast<size_t>(b.work_floats(tokens, m.cols)));
  b.dot_rows({.w = &m,
              .x = x.data(),
              .ldx = m.cols,
              .num_tokens = tokens,
              .row_idx = rows.data(),
              .num_rows = nr,
              .out = out.data(),
              .ldo = nr,
              .work = work.data(),
              .int8_inputs = int8});
  return out;
}

internal::MatrixRef Mxfp4Matrix(const std::vector<uint8_t>& codes,
                                const std::vector<uint8_t>& scales, int64_t rows, int64_t cols) {
  internal::MatrixRef m;
  m.format = WeightFormat::kMxfp4;
  m.data = codes.data();
  m.scales = scales.data();
  m.rows = rows;
  m.cols = cols;
  m.group = 32;
  m.row_bytes = cols / 2;
  return m;
}

}  // namespace moeshard::testing
