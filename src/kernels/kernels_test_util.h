// Helpers shared by the kernels tests: seeded random data, backends to run, and comparisons
// that print the seed and the first mismatches.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "moeshard/base/numeric.h"
#include "moeshard/kernels/kernel_context.h"

namespace moeshard::testing {

// randn * scale from a seeded generator (vLLM's tests use randn / 10 for weights).
std::vector<float> Randn(int64_t n, uint64_t seed, float scale = 1.0f);

// The instruction sets to test on this machine: kPortable always, kAvx512Bf16 when supported.
std::vector<CpuIsa> TestIsas();

KernelContext MakeContext(CpuIsa isa, int num_threads = 2);

struct Tolerance {
  double atol = 2e-2;          // max |got - want|
  double max_mean_rel = 1e-2;  // mean |got - want| / mean |want|
};

// Compares got with want; on failure the message names `what`, the seed and the first 8
// mismatching indices with both values.
::testing::AssertionResult Close(const std::vector<float>& got, const std::vector<float>& want,
                                 const Tolerance& tol, const std::string& what, uint64_t seed);

double MeanAbs(const std::vector<float>& v);

// out[t * rows + r] = backend b's dot_rows of rows `rows` of m with `tokens` rows of x (m.cols
// apart), on int8 inputs with `int8`.
std::vector<float> RunDotRows(const internal::CpuBackend& b, const internal::MatrixRef& m,
                              const std::vector<bf16_t>& x, int64_t tokens,
                              const std::vector<int32_t>& rows, bool int8 = false);

// An MXFP4 matrix over caller-owned codes ([rows, cols / 2]) and E8M0 scales ([rows, cols / 32]).
internal::MatrixRef Mxfp4Matrix(const std::vector<uint8_t>& codes,
                                const std::vector<uint8_t>& scales, int64_t rows, int64_t cols);

}  // namespace moeshard::testing
