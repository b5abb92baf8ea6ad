#include "moeshard/kernels/permute.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/kernel_scratch.h"
#include "moeshard/base/numeric.h"
#include "moeshard/kernels/kernel_context.h"

namespace moeshard {

Status PermuteTokens(const PermuteParams& p, TokenPermutation* out) {
  MOESHARD_CHECK(out != nullptr, "PermuteTokens: null output");
  if (p.num_tokens < 0 || p.top_k < 1 || p.num_experts_global < 1) {
    return InvalidArgumentError(fmt::format(
        "permute: 'num_tokens/top_k/num_experts_global': expected >= 0 / >= 1 / >= 1, got {} / "
        "{} / {}",
        p.num_tokens, p.top_k, p.num_experts_global));
  }
  if (p.num_tokens > 0 && (p.topk_ids == nullptr || p.topk_weights == nullptr)) {
    return InvalidArgumentError("permute: 'topk_ids/topk_weights': expected non-null");
  }
  const int64_t num_local =
      p.expert_global_to_local == nullptr ? p.num_experts_global : p.num_experts_local;
  if (num_local < 0) {
    return InvalidArgumentError(
        fmt::format("permute: 'num_experts_local': expected >= 0, got {}", num_local));
  }
  if (p.expert_global_to_local != nullptr) {
    for (int64_t e = 0; e < p.num_experts_global; ++e) {
      const int32_t l = p.expert_global_to_local[e];
      if (l < -1 || l >= num_local) {
        return InvalidArgumentError(fmt::format(
            "permute: 'expert_global_to_local[{}]': expected -1..{}, got {}", e, num_local - 1, l));
      }
    }
  }
  const int64_t num_pairs = p.num_tokens * p.top_k;
  out->num_tokens = p.num_tokens;
  out->top_k = p.top_k;
  out->num_experts_local = num_local;
  out->expert_offsets.assign(static_cast<size_t>(num_local + 1), 0);
  out->slot_row.resize(static_cast<size_t>(num_pairs));
  // Counting sort by local expert, without extra buffers: count expert l at offsets[l + 2], so
  // that after the prefix sum offsets[l + 1] is the start of l and serves as its fill cursor;
  // filling in (token, slot) order keeps the sort stable and leaves offsets[l + 1] at the end
  // of l, i.e. the final offsets.
  std::vector<int64_t>& offsets = out->expert_offsets;
  for (int64_t i = 0; i < num_pairs; ++i) {
    const int32_t g = p.topk_ids[i];
    if (g < 0 || g >= p.num_experts_global) {
      return InvalidArgumentError(
          fmt::format("permute: 'topk_ids[{}]': expected an expert id in 0..{}, got {}", i,
                      p.num_experts_global - 1, g));
    }
    const int32_t l = p.expert_global_to_local == nullptr ? g : p.expert_global_to_local[g];
    if (l >= 0 && l + 2 <= num_local) ++offsets[static_cast<size_t>(l) + 2];
  }
  for (int64_t e = 1; e <= num_local; ++e) {
    offsets[static_cast<size_t>(e)] += offsets[static_cast<size_t>(e - 1)];
  }
  int64_t num_rows = 0;
  for (int64_t i = 0; i < num_pairs; ++i) {
    const int32_t g = p.topk_ids[i];
    const int32_t l = p.expert_global_to_local == nullptr ? g : p.expert_global_to_local[g];
    num_rows += l >= 0 ? 1 : 0;
  }
  out->sorted_token_idx.resize(static_cast<size_t>(num_rows));
  out->sorted_weights.resize(static_cast<size_t>(num_rows));
  for (int64_t i = 0; i < num_pairs; ++i) {
    const int32_t g = p.topk_ids[i];
    const int32_t l = p.expert_global_to_local == nullptr ? g : p.expert_global_to_local[g];
    if (l < 0) {
      out->slot_row[static_cast<size_t>(i)] = -1;
      continue;
    }
    const int64_t row = offsets[static_cast<size_t>(l) + 1]++;
    out->sorted_token_idx[static_cast<size_t>(row)] = static_cast<int32_t>(i / p.top_k);
    out->sorted_weights[static_cast<size_t>(row)] = p.topk_weights[i];
    out->slot_row[static_cast<size_t>(i)] = static_cast<int32_t>(row);
  }
  MOESHARD_CHECK_EQ(offsets.back(), num_rows);
  return Status::Ok();
}

Status GatherTokens(KernelContext& ctx, const TokenPermutation& perm, const GatherParams& p) {
  const bool in_ok = p.x_dtype == DType::kF32 || p.x_dtype == DType::kBF16;
  const bool out_ok = p.out_dtype == DType::kF32 || p.out_dtype == DType::kBF16;
  if (!in_ok || !out_ok) {
    return InvalidArgumentError(
        fmt::format("gather: 'x_dtype/out_dtype': expected F32 or BF16, got {} / {}",
                    DTypeName(p.x_dtype), DTypeName(p.out_dtype)));
  }
  if (p.hidden < 0 || (perm.num_rows() > 0 && (p.x == nullptr || p.x_sorted == nullptr))) {
    return InvalidArgumentError("gather: 'x/x_sorted/hidden': expected non-null, hidden >= 0");
  }
  const int64_t h = p.hidden;
  ctx.pool().ParallelFor(perm.num_rows(), 0, [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = perm.sorted_token_idx[static_cast<size_t>(r)];
      if (p.x_dtype == p.out_dtype) {
        const int64_t bytes = h * (p.x_dtype == DType::kF32 ? 4 : 2);
        std::memcpy(static_cast<char*>(p.x_sorted) + r * bytes,
                    static_cast<const char*>(p.x) + t * bytes, static_cast<size_t>(bytes));
      } else if (p.x_dtype == DType::kF32) {
        const float* src = static_cast<const float*>(p.x) + t * h;
        bf16_t* dst = static_cast<bf16_t*>(p.x_sorted) + r * h;
        for (int64_t i = 0; i < h; ++i) dst[i] = FloatToBf16(src[i]);
      } else {
        const bf16_t* src = static_cast<const bf16_t*>(p.x) + t * h;
        float* dst = static_cast<float*>(p.x_sorted) + r * h;
        for (int64_t i = 0; i < h; ++i) dst[i] = Bf16ToFloat(src[i]);
      }
    }
  });
  return Status::Ok();
}

Status UnpermuteTokens(KernelContext& ctx, const TokenPermutation& perm, const UnpermuteParams& p) {
  if (p.hidden < 0 || (perm.num_tokens > 0 && p.out == nullptr) ||
      (perm.num_rows() > 0 && p.y_sorted == nullptr)) {
    return InvalidArgumentError("unpermute: 'y_sorted/out/hidden': expected non-null, hidden >= 0");
  }
  const int64_t h = p.hidden;
  const int64_t k = perm.top_k;
  const internal::CpuBackend& be = internal::CpuBackendFor(ctx.isa());
  ctx.pool().ParallelFor(perm.num_tokens, 0, [&](int64_t begin, int64_t end, int) {
    // Each token's local slots in order, summed into its output row in one pass per batch of
    // kBatch slots (all of them for every top-k in use; no allocation in the forward).
    constexpr int64_t kBatch = 16;
    const float* rows[kBatch];
    float weights[kBatch];
    for (int64_t t = begin; t < end; ++t) {
      float* o = p.out + t * h;
      bool accumulate = p.accumulate;
      int64_t n = 0;
      for (int64_t s = 0; s < k; ++s) {
        const int32_t row = perm.slot_row[static_cast<size_t>(t * k + s)];
        if (row >= 0) {
          weights[n] = perm.sorted_weights[static_cast<size_t>(row)];
          rows[n++] = p.y_sorted + row * h;
        }
        if (n == kBatch || (s + 1 == k && (n > 0 || !accumulate))) {
          be.weighted_sum(rows, weights, n, h, o, accumulate);
          accumulate = true;
          n = 0;
        }
      }
    }
  });
  return Status::Ok();
}

}  // namespace moeshard
