// Verification of a sharded run against the single-rank reference, and the deterministic
// inputs both use.
//
// The reference is the same runtime on the 1-rank plan (tp = dp = pp = 1, same backend,
// padding and placement options) over the same layout-invariant dummy weights: the same logical
// model computed without any sharding. Because the MoE block is per token, each DP rank's
// reference is the 1-rank forward of exactly its tokens.
//
// Tolerance (bf16 accumulation, vLLM's MoE tests use atol 2e-2): a run passes when
//   max |out - ref| <= atol + rtol * max |ref|
// The relative term keeps the criterion meaningful when the residual stream grows large.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "moeshard/plan/shard_plan.h"

namespace moeshard {

struct Tolerance {
  double atol = 2e-2;
  double rtol = 1e-2;
};

struct ErrorStats {
  int64_t count = 0;          // elements compared
  double max_abs_err = 0;     // max |out - ref|
  double sum_abs_err = 0;     // sum |out - ref| (mean = sum / count)
  double max_abs_ref = 0;     // max |ref|
  int64_t worst_index = -1;   // flat index of max_abs_err (first), -1 when count == 0
  int64_t num_nonfinite = 0;  // elements of out that are NaN or infinite

  double mean_abs_err() const { return count > 0 ? sum_abs_err / static_cast<double>(count) : 0; }
  double limit(const Tolerance& tol) const { return tol.atol + tol.rtol * max_abs_ref; }
  bool Passes(const Tolerance& tol) const {
    return num_nonfinite == 0 && max_abs_err <= limit(tol);
  }
  // Folds another rank's (or block's) statistics in; worst_index kept from this one unless
  // the other is worse.
  void Merge(const ErrorStats& other);
  // "max 1.2e-06 mean 3.4e-08 (max |ref| 2.1, limit 4.1e-02): ok"
  std::string Summary(const Tolerance& tol) const;
};

// REQUIRES: out.size() == ref.size().
ErrorStats CompareOutputs(std::span<const float> out, std::span<const float> ref);

// Deterministic hidden states: element (token t, column h) of DP unit `unit` is a hash of
// (seed, unit, t, h) mapped to uniform [-1, 1). out: [num_tokens, hidden] fp32.
void DummyHiddenStates(uint64_t seed, int64_t unit, int64_t num_tokens, int64_t hidden, float* out);

// Deterministic token ids for models that route some layers by token id: token t of DP unit
// `unit` is a hash of (seed, unit, t) reduced to [0, vocab). out: [num_tokens] int32.
// REQUIRES: 1 <= vocab <= 2^31 - 1.
void DummyTokenIds(uint64_t seed, int64_t unit, int64_t num_tokens, int64_t vocab, int32_t* out);

// The plan options of the single-rank reference for `options`: the same backend, padding,
// placement, redundant experts and modes, with every parallel size 1.
PlanOptions SingleRankPlanOptions(const PlanOptions& options);

}  // namespace moeshard
