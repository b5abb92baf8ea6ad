// Token permutation for the grouped expert GEMM: (token, slot) pairs sorted by local expert.
//
// Given the router's top-k ids, PermuteTokens keeps the pairs whose expert is local to this
// rank (a global -> local expert map; experts not local are skipped, which is how an EP rank
// computes only its experts), and orders them by local expert, stable by token then slot:
//
//   sorted row:   0 1 2 | 3 | 4 5 ...      expert_offsets = [0, 3, 3, 4, ...]
//   local expert: 0 0 0 | 2 | 3 3 ...      (expert 1 received no tokens: an empty range)
//
// GatherTokens copies x's rows into that order; UnpermuteTokens sums the expert outputs back
// per token, weighted by the routing weights, in slot order (deterministic).
//
// Thread safety: one call at a time per KernelContext; a TokenPermutation is a plain value.
#pragma once

#include <cstdint>
#include <vector>

#include "moeshard/base/dtype.h"
#include "moeshard/base/status.h"

namespace moeshard {

class KernelContext;

struct TokenPermutation {
  int64_t num_tokens = 0;
  int64_t top_k = 0;
  int64_t num_experts_local = 0;
  std::vector<int64_t> expert_offsets;    // [num_experts_local + 1], expert_offsets[0] = 0
  std::vector<int32_t> sorted_token_idx;  // [num_rows] token of each sorted row
  std::vector<float> sorted_weights;      // [num_rows] routing weight of each sorted row
  std::vector<int32_t> slot_row;          // [num_tokens, top_k] sorted row of each (token,
                                          // slot), -1 when that expert is not local

  int64_t num_rows() const { return expert_offsets.empty() ? 0 : expert_offsets.back(); }
};

struct PermuteParams {
  const int32_t* topk_ids = nullptr;    // [num_tokens, top_k] int32, global expert ids
  const float* topk_weights = nullptr;  // [num_tokens, top_k] fp32
  int64_t num_tokens = 0;
  int64_t top_k = 0;
  int64_t num_experts_global = 0;
  // [num_experts_global] int32: local index of each global expert, or -1 when not on this rank.
  // Null: every expert is local with local index = global index.
  const int32_t* expert_global_to_local = nullptr;
  int64_t num_experts_local = 0;  // ignored (= num_experts_global) when the map is null
};

// Fills `out` (reusing its capacity). InvalidArgument for ids outside [0, num_experts_global)
// or map entries outside [-1, num_experts_local).
Status PermuteTokens(const PermuteParams& params, TokenPermutation* out);

struct GatherParams {
  const void* x = nullptr;  // [num_tokens, hidden] row-major, dtype x_dtype (kF32 or kBF16)
  DType x_dtype = DType::kF32;
  int64_t hidden = 0;
  void* x_sorted = nullptr;        // out: [perm.num_rows(), hidden] row-major, dtype out_dtype
  DType out_dtype = DType::kBF16;  // kF32 or kBF16 (fp32 -> bf16 rounds to nearest even)
};

Status GatherTokens(KernelContext& ctx, const TokenPermutation& perm, const GatherParams& params);

struct UnpermuteParams {
  const float* y_sorted = nullptr;  // [perm.num_rows(), hidden] fp32 expert outputs (unweighted)
  int64_t hidden = 0;
  float* out = nullptr;  // [num_tokens, hidden] fp32
  // false: out = sum; true: out += sum (e.g. adding to a shared expert's output).
  bool accumulate = false;
};

// out[t, :] (+)= sum over local slots s of topk_weights[t, s] * y_sorted[slot_row[t, s], :].
// Tokens with no local expert get 0 (or are left unchanged with accumulate).
Status UnpermuteTokens(KernelContext& ctx, const TokenPermutation& perm,
                       const UnpermuteParams& params);

}  // namespace moeshard
