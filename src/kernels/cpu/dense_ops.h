// The CPU backend's dense operations (kernels/dense_ops.h): linear layers in every weight format,
// RMSNorm and the shared experts' gated MLP, parallel over a ThreadPool. Private to kernels/cpu.
//
// Thread safety: one call at a time per DenseScratch; parallel over the pool.
#pragma once

#include <cstdint>
#include <vector>

#include "moeshard/base/thread_pool.h"
#include "moeshard/kernels/dense_ops.h"

namespace moeshard::internal {

// Per-thread fp32 rows for dequantisation: [num_threads, max_cols]. Grows, never shrinks.
struct DenseScratch {
  int64_t max_cols = 0;
  std::vector<float> rows;
  void Reserve(int num_threads, int64_t cols);
};

// Dequantises row r of w into out[0, w.cols).
void DequantizeRow(const DenseWeight& w, int64_t r, float* out);

// Grow `scratch` for w.cols first (Reserve; it allocates only the first time a width is seen).
void Linear(ThreadPool& pool, DenseScratch& scratch, const LinearArgs& args);
void RmsNorm(const RmsNormArgs& args);
void GatedMlp(ThreadPool& pool, DenseScratch& scratch, const GatedMlpArgs& args);

}  // namespace moeshard::internal
