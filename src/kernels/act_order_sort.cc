// SortActOrderExperts (expert_gemm.h): act-order GPTQ experts put in group order at load time,
// so the native int4-zp kernels read them as weights without act-order.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "base/check.h"
#include "moeshard/kernels/expert_gemm.h"
#include "moeshard/kernels/kernel_context.h"

namespace moeshard {
namespace {

// perm[c] = the original column at sorted position c: the columns ordered by their group, stably.
// False unless every group of `cols / group` holds exactly `group` columns (then sorted column c
// lies in group c / group, as without act-order).
bool SortByGroup(const int32_t* gidx, int64_t cols, int64_t group, int32_t* perm) {
  if (group <= 0 || cols % group != 0) return false;
  const int64_t groups = cols / group;
  std::vector<int64_t> next(static_cast<size_t>(groups), 0);
  for (int64_t c = 0; c < cols; ++c) {
    if (gidx[c] < 0 || gidx[c] >= groups) return false;
    ++next[static_cast<size_t>(gidx[c])];
  }
  for (int64_t g = 0; g < groups; ++g) {
    if (next[static_cast<size_t>(g)] != group) return false;
    next[static_cast<size_t>(g)] = g * group;  // the group's first sorted column
  }
  for (int64_t c = 0; c < cols; ++c) {
    perm[next[static_cast<size_t>(gidx[c])]++] = static_cast<int32_t>(c);
  }
  return true;
}

// A packed int4 row (low nibble = even column) with its columns in `perm` order.
void PermuteNibbles(const uint8_t* src, const int32_t* perm, int64_t cols, uint8_t* dst) {
  auto nibble = [&](int64_t c) {
    const int32_t s = perm[c];
    return static_cast<unsigned>(src[s / 2] >> ((s % 2) * 4)) & 0xFu;
  };
  for (int64_t c = 0; c < cols; c += 2) {
    dst[c / 2] = static_cast<uint8_t>(nibble(c) | (nibble(c + 1) << 4));
  }
}

// The original w13 row at sorted row r: the gate and up halves (or the interleaved pairs) each
// in w2's sorted column order `p2`.
int64_t W13SourceRow(const ExpertWeights& w, const int32_t* p2, int64_t r) {
  const int64_t inter = w.intermediate;
  if (!w.gated) return p2[r];
  if (w.gate_up_interleaved) return 2 * int64_t{p2[r / 2]} + r % 2;
  return r < inter ? p2[r] : inter + p2[r - inter];
}

// Whether the layer's act-order experts can be sorted into whole groups (SortActOrderExperts'
// rules other than the per-expert group counts).
bool SortableLayer(const ExpertWeights& w, const ActOrderBuffers& b) {
  const int64_t g = w.scheme.group;
  return w.scheme.format == WeightFormat::kInt4Zp && w.scheme.act_order && !w.bf16_row_groups &&
         w.num_experts_local > 0 && g > 0 && g % 32 == 0 && w.hidden % g == 0 &&
         w.intermediate % g == 0 &&
         (w.w2_scale_cols == 0 || w.w2_scale_cols * g == w.intermediate) &&
         w.w13_group_index != nullptr && w.w2_group_index != nullptr && w.w13_bias == nullptr &&
         w.w2_bias == nullptr && b.w13 == w.w13 && b.w2 == w.w2 && b.w13_scales == w.w13_scales &&
         b.w13_zeros == w.w13_zeros && b.w13_scales != nullptr && b.w13_zeros != nullptr;
}

// Expert e's input order (into p13, [H]) and w2 column order (p2, [I]); false when a group is not
// whole or, gated, gate and up disagree.
bool ExpertOrders(const ExpertWeights& w, int64_t e, int32_t* p13, int32_t* p2) {
  const int64_t H = w.hidden;
  const int32_t* gate = w.GroupIndex(true, e, 0);
  if (w.gated) {
    const int32_t* up = w.GroupIndex(true, e, w.gate_up_interleaved ? 1 : w.intermediate);
    if (!std::equal(gate, gate + H, up)) return false;
  }
  return SortByGroup(gate, H, w.scheme.group, p13) &&
         SortByGroup(w.GroupIndex(false, e, 0), w.intermediate, w.scheme.group, p2);
}

// Rewrites expert e in place through `tmp` (one expert's w13 bytes at least).
void SortExpert(const ExpertWeights& w, const ActOrderBuffers& b, int64_t e, const int32_t* p13,
                const int32_t* p2, uint8_t* tmp) {
  const int64_t H = w.hidden, I = w.intermediate, rows13 = w.w13_rows();
  const int64_t row13 = H / 2, row2 = I / 2, groups13 = H / w.scheme.group;
  uint8_t* w13 = static_cast<uint8_t*>(b.w13) + e * rows13 * row13;
  std::memcpy(tmp, w13, static_cast<size_t>(rows13 * row13));
  for (int64_t r = 0; r < rows13; ++r) {
    PermuteNibbles(tmp + W13SourceRow(w, p2, r) * row13, p13, H, w13 + r * row13);
  }
  // The scales (fp16) and zero points (bytes) of w13 move with their rows.
  auto move_rows = [&](uint8_t* base, int64_t row_bytes) {
    uint8_t* m = base + e * rows13 * row_bytes;
    std::memcpy(tmp, m, static_cast<size_t>(rows13 * row_bytes));
    for (int64_t r = 0; r < rows13; ++r) {
      std::memcpy(m + r * row_bytes, tmp + W13SourceRow(w, p2, r) * row_bytes,
                  static_cast<size_t>(row_bytes));
    }
  };
  move_rows(static_cast<uint8_t*>(b.w13_scales), groups13 * 2);
  move_rows(b.w13_zeros, groups13);
  uint8_t* w2 = static_cast<uint8_t*>(b.w2) + e * H * row2;
  for (int64_t r = 0; r < H; ++r) {
    std::memcpy(tmp, w2 + r * row2, static_cast<size_t>(row2));
    PermuteNibbles(tmp, p2, I, w2 + r * row2);
  }
}

}  // namespace

Result<bool> SortActOrderExperts(KernelContext& ctx, ExpertWeights* weights,
                                 const ActOrderBuffers& buffers, std::vector<int32_t>* input_perm) {
  MOESHARD_CHECK(weights != nullptr && input_perm != nullptr, "SortActOrderExperts: null output");
  ExpertWeights& w = *weights;
  if (!SortableLayer(w, buffers)) return false;
  const int64_t E = w.num_experts_local, H = w.hidden, I = w.intermediate;
  // Every expert's orders first: nothing is rewritten unless all of them make whole groups.
  std::vector<int32_t> p13(static_cast<size_t>(E * H)), p2(static_cast<size_t>(E * I));
  bool whole = true;
  for (int64_t e = 0; e < E && whole; ++e) {
    whole = ExpertOrders(w, e, p13.data() + e * H, p2.data() + e * I);
  }
  if (!whole) return false;
  // One scratch matrix per worker, allocated before anything is rewritten (an allocation that
  // fails inside the pool could not be reported, and would leave the layer half sorted).
  const int64_t workers = std::min<int64_t>(ctx.num_threads(), E);
  const int64_t tmp_bytes = std::max(w.w13_rows() * H / 2, I / 2);
  std::vector<std::unique_ptr<uint8_t[]>> tmp(static_cast<size_t>(workers));
  try {
    for (auto& t : tmp) t = std::make_unique_for_overwrite<uint8_t[]>(tmp_bytes);
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(fmt::format(
        "act-order sort: cannot allocate {} scratch matrices of {} bytes (one per thread); "
        "run with fewer kernel threads",
        workers, tmp_bytes));
  }
  ctx.pool().ParallelFor(workers, 1, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t e = t * E / workers; e < (t + 1) * E / workers; ++e) {
        SortExpert(w, buffers, e, p13.data() + e * H, p2.data() + e * I,
                   tmp[static_cast<size_t>(t)].get());
      }
    }
  });
  *input_perm = std::move(p13);
  ViewSortedByGroup(&w, input_perm->data());
  return true;
}

void ViewSortedByGroup(ExpertWeights* weights, const int32_t* input_perm) {
  weights->scheme.act_order = false;
  weights->w13_group_index = nullptr;
  weights->w2_group_index = nullptr;
  weights->w2_scale_cols = 0;
  weights->w13_input_perm = input_perm;
}

}  // namespace moeshard
