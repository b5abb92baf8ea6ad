// The scalar reference (see include/moeshard/kernels/reference.h): obvious loops, fp64 sums.
#include "moeshard/kernels/reference.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "moeshard/base/math.h"
#include "moeshard/base/numeric.h"
#include "moeshard/kernels/cpu_constraints.h"
#include "moeshard/kernels/kernel_context.h"

namespace moeshard::reference {
namespace {

// Indices [0, n) sorted by descending value, ties by ascending index (std::stable_sort keeps
// the ascending index order of equal values).
std::vector<int32_t> SortedDescending(const std::vector<double>& v) {
  std::vector<int32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
  return idx;
}

// softmax(logits) over n experts, in double.
std::vector<double> SoftmaxOf(const float* logits, int64_t n) {
  const double max_logit = *std::max_element(logits, logits + n);
  std::vector<double> prob(static_cast<size_t>(n));
  double sum = 0.0;
  for (int64_t e = 0; e < n; ++e) {
    prob[e] = std::exp(static_cast<double>(logits[e]) - max_logit);
    sum += prob[e];
  }
  for (double& v : prob) v /= sum;
  return prob;
}

// sqrt(softplus(x)) in double, softplus taken as x above 20 (torch's threshold).
std::vector<double> SqrtSoftplusOf(const float* logits, int64_t n) {
  std::vector<double> s(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) {
    const double x = logits[e];
    s[e] = std::sqrt(x > 20.0 ? x : std::log(1.0 + std::exp(x)));
  }
  return s;
}

int64_t LocalExpert(const int32_t* map, int32_t global) {
  return map == nullptr ? global : map[global];
}

// The weights of the chosen experts ids[0, k): score[ids[i]], divided by their sum when
// renormalising (`denominator` of the sum: each family's guard against zero), times the routed
// scaling factor. chosen_weight keeps the unscaled scores.
template <typename Denominator>
void WriteChosenWeights(const RoutingParams& p, const int32_t* ids,
                        const std::vector<double>& score, float* weights,
                        std::vector<double>& chosen_weight, Denominator denominator) {
  double wsum = 0.0;
  for (int64_t i = 0; i < p.top_k; ++i) {
    chosen_weight[i] = score[ids[i]];
    wsum += chosen_weight[i];
  }
  const double d = denominator(wsum);
  for (int64_t i = 0; i < p.top_k; ++i) {
    const double v = p.renormalize ? chosen_weight[i] / d : chosen_weight[i];
    weights[i] = static_cast<float>(v * p.routed_scaling_factor);
  }
}

// Softmax over every expert, then the top k (renormalised on request).
void RouteSoftmaxTopK(const RoutingParams& p, const RoutingArgs& a, int64_t t, const float* logits,
                      int32_t* ids, float* weights, std::vector<double>& chosen_weight) {
  const int64_t num_experts = p.num_experts;
  const std::vector<double> prob = SoftmaxOf(logits, num_experts);
  const std::vector<int32_t> order = SortedDescending(prob);
  for (int64_t i = 0; i < p.top_k; ++i) ids[i] = order[i];
  WriteChosenWeights(p, ids, prob, weights, chosen_weight, [](double w) { return w; });
}

// DeepSeek-V3: sigmoid scores plus the correction bias choose the best groups (by their top
// two), then the top k inside them; the weights are the unbiased scores.
void RouteSigmoidGroupedTopK(const RoutingParams& p, const RoutingArgs& a, int64_t t,
                             const float* logits, int32_t* ids, float* weights,
                             std::vector<double>& chosen_weight) {
  const int64_t num_experts = p.num_experts;
  std::vector<double> score(static_cast<size_t>(num_experts));
  std::vector<double> biased(static_cast<size_t>(num_experts));
  for (int64_t e = 0; e < num_experts; ++e) {
    score[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[e])));
    // The bias is added in fp32 precision by the model code; keep the sum in fp32 too.
    biased[e] = static_cast<double>(static_cast<float>(score[e]) + p.e_score_correction_bias[e]);
  }
  const int64_t group_size = num_experts / p.num_groups;
  std::vector<double> group_score(static_cast<size_t>(p.num_groups));
  for (int64_t g = 0; g < p.num_groups; ++g) {
    std::vector<double> members(biased.begin() + g * group_size,
                                biased.begin() + (g + 1) * group_size);
    std::sort(members.begin(), members.end(), std::greater<double>());
    group_score[g] = group_size >= 2 ? members[0] + members[1] : members[0];
  }
  const std::vector<int32_t> group_order = SortedDescending(group_score);
  std::vector<double> masked(static_cast<size_t>(num_experts), -INFINITY);
  for (int64_t gi = 0; gi < p.topk_group; ++gi) {
    const int64_t g = group_order[gi];
    for (int64_t i = 0; i < group_size; ++i) {
      masked[g * group_size + i] = biased[g * group_size + i];
    }
  }
  const std::vector<int32_t> order = SortedDescending(masked);
  for (int64_t i = 0; i < p.top_k; ++i) ids[i] = order[i];
  WriteChosenWeights(p, ids, score, weights, chosen_weight, [](double w) { return w + 1e-20; });
}

// DeepSeek-V2: softmax, groups ranked by their best expert, then the top k inside the best.
void RouteSoftmaxGroupedTopK(const RoutingParams& p, const RoutingArgs& a, int64_t t,
                             const float* logits, int32_t* ids, float* weights,
                             std::vector<double>& chosen_weight) {
  const int64_t num_experts = p.num_experts;
  const std::vector<double> prob = SoftmaxOf(logits, num_experts);
  const int64_t group_size = num_experts / p.num_groups;
  std::vector<double> group_score(static_cast<size_t>(p.num_groups), -INFINITY);
  for (int64_t e = 0; e < num_experts; ++e) {
    group_score[e / group_size] = std::max(group_score[e / group_size], prob[e]);
  }
  const std::vector<int32_t> group_order = SortedDescending(group_score);
  std::vector<double> masked(static_cast<size_t>(num_experts), -INFINITY);
  for (int64_t gi = 0; gi < p.topk_group; ++gi) {
    const int64_t g = group_order[gi];
    for (int64_t i = 0; i < group_size; ++i) masked[g * group_size + i] = prob[g * group_size + i];
  }
  const std::vector<int32_t> order = SortedDescending(masked);
  for (int64_t i = 0; i < p.top_k; ++i) ids[i] = order[i];
  WriteChosenWeights(p, ids, prob, weights, chosen_weight, [](double w) { return w; });
}

// Top k of the logits, each weighted by its sigmoid (Llama-4).
void RouteTopKThenSigmoid(const RoutingParams& p, const RoutingArgs& a, int64_t t,
                          const float* logits, int32_t* ids, float* weights,
                          std::vector<double>& chosen_weight) {
  const int64_t num_experts = p.num_experts;
  std::vector<double> lv(logits, logits + num_experts);
  const std::vector<int32_t> order = SortedDescending(lv);
  for (int64_t i = 0; i < p.top_k; ++i) {
    ids[i] = order[i];
    weights[i] =
        static_cast<float>(1.0 / (1.0 + std::exp(-lv[order[i]])) * p.routed_scaling_factor);
  }
}

// sqrt(softplus) scores; experts chosen by the biased score, or named by the hash table.
void RouteSqrtSoftplus(const RoutingParams& p, const RoutingArgs& a, int64_t t, const float* logits,
                       int32_t* ids, float* weights, std::vector<double>& chosen_weight) {
  const int64_t num_experts = p.num_experts;
  const std::vector<double> score = SqrtSoftplusOf(logits, num_experts);
  if (p.kind == RoutingKind::kSqrtSoftplusHash) {
    // The table names the experts; no selection.
    for (int64_t i = 0; i < p.top_k; ++i) {
      ids[i] = p.hash_table[static_cast<int64_t>(a.token_ids[t]) * p.top_k + i];
    }
  } else {
    // Selection by the biased score, summed in fp32 as the model code does.
    std::vector<double> biased(score);
    if (p.e_score_correction_bias != nullptr) {
      for (int64_t e = 0; e < num_experts; ++e) {
        biased[e] =
            static_cast<double>(static_cast<float>(score[e]) + p.e_score_correction_bias[e]);
      }
    }
    const std::vector<int32_t> order = SortedDescending(biased);
    for (int64_t i = 0; i < p.top_k; ++i) ids[i] = order[i];
  }
  WriteChosenWeights(p, ids, score, weights, chosen_weight,
                     [](double w) { return std::max(w, 1e-20); });
}

// Top k of the logits, then a softmax over those k (Mixtral).
void RouteTopKThenSoftmax(const RoutingParams& p, const RoutingArgs& a, int64_t t,
                          const float* logits, int32_t* ids, float* weights,
                          std::vector<double>& chosen_weight) {
  const int64_t num_experts = p.num_experts;
  std::vector<double> lv(logits, logits + num_experts);
  const std::vector<int32_t> order = SortedDescending(lv);
  double sum = 0.0;
  for (int64_t i = 0; i < p.top_k; ++i) {
    ids[i] = order[i];
    chosen_weight[i] = std::exp(lv[order[i]] - lv[order[0]]);
    sum += chosen_weight[i];
  }
  for (int64_t i = 0; i < p.top_k; ++i) {
    weights[i] = static_cast<float>(chosen_weight[i] / sum * p.routed_scaling_factor);
  }
}

}  // namespace

Status Route(const RoutingParams& p, const RoutingArgs& a) {
  MOESHARD_RETURN_IF_ERROR(ValidateRouting(p, a));
  const int64_t num_experts = p.num_experts;
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const float* logits = a.router_logits + t * num_experts;
    int32_t* ids = a.topk_ids + t * p.top_k;
    float* weights = a.topk_weights + t * p.top_k;
    std::vector<double> chosen_weight(static_cast<size_t>(p.top_k));
    switch (p.kind) {
      case RoutingKind::kSoftmaxTopK:
        RouteSoftmaxTopK(p, a, t, logits, ids, weights, chosen_weight);
        break;
      case RoutingKind::kSigmoidGroupedTopK:
        RouteSigmoidGroupedTopK(p, a, t, logits, ids, weights, chosen_weight);
        break;
      case RoutingKind::kSoftmaxGroupedTopK:
        RouteSoftmaxGroupedTopK(p, a, t, logits, ids, weights, chosen_weight);
        break;
      case RoutingKind::kTopKThenSigmoid:
        RouteTopKThenSigmoid(p, a, t, logits, ids, weights, chosen_weight);
        break;
      case RoutingKind::kSqrtSoftplusTopK:
      case RoutingKind::kSqrtSoftplusHash:
        RouteSqrtSoftplus(p, a, t, logits, ids, weights, chosen_weight);
        break;
      case RoutingKind::kTopKThenSoftmax:
        RouteTopKThenSoftmax(p, a, t, logits, ids, weights, chosen_weight);
        break;
    }
  }
  return Status::Ok();
}

Status PermuteTokens(const PermuteParams& p, TokenPermutation* out) {
  const int64_t num_local =
      p.expert_global_to_local == nullptr ? p.num_experts_global : p.num_experts_local;
  const int64_t num_pairs = p.num_tokens * p.top_k;
  for (int64_t i = 0; i < num_pairs; ++i) {
    if (p.topk_ids[i] < 0 || p.topk_ids[i] >= p.num_experts_global) {
      return InvalidArgumentError(
          fmt::format("permute: 'topk_ids[{}]': out of range: {}", i, p.topk_ids[i]));
    }
  }
  out->num_tokens = p.num_tokens;
  out->top_k = p.top_k;
  out->num_experts_local = num_local;
  out->expert_offsets.assign(1, 0);
  out->sorted_token_idx.clear();
  out->sorted_weights.clear();
  out->slot_row.assign(static_cast<size_t>(num_pairs), -1);
  for (int64_t l = 0; l < num_local; ++l) {
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      for (int64_t s = 0; s < p.top_k; ++s) {
        const int64_t i = t * p.top_k + s;
        if (LocalExpert(p.expert_global_to_local, p.topk_ids[i]) != l) continue;
        out->slot_row[i] = static_cast<int32_t>(out->sorted_token_idx.size());
        out->sorted_token_idx.push_back(static_cast<int32_t>(t));
        out->sorted_weights.push_back(p.topk_weights[i]);
      }
    }
    out->expert_offsets.push_back(static_cast<int64_t>(out->sorted_token_idx.size()));
  }
  return Status::Ok();
}

void DequantizeMatrixRow(const WeightScheme& q, const void* data, const void* scales, int64_t rows,
                         int64_t cols, int64_t row, float* out, const uint8_t* zeros, float global,
                         const int32_t* group_index, int64_t scale_cols) {
  switch (q.format) {
    case WeightFormat::kBf16: {
      const bf16_t* p = static_cast<const bf16_t*>(data) + row * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = Bf16ToFloat(p[c]);
      return;
    }
    case WeightFormat::kFp8Block: {
      const uint8_t* p = static_cast<const uint8_t*>(data) + row * cols;
      const float* s = static_cast<const float*>(scales) + (row / q.block_rows) * q.ScaleCols(cols);
      for (int64_t c = 0; c < cols; ++c) out[c] = Fp8E4M3ToFloat(p[c]) * s[c / q.group];
      return;
    }
    case WeightFormat::kMxfp4: {
      const uint8_t* p = static_cast<const uint8_t*>(data) + row * q.WeightRowBytes(cols);
      const uint8_t* s = static_cast<const uint8_t*>(scales) + row * q.ScaleCols(cols);
      for (int64_t c = 0; c < cols; ++c) {
        const uint8_t code = (c & 1) ? (p[c / 2] >> 4) : (p[c / 2] & 0xf);
        out[c] = Fp4E2M1ToFloat(code) * E8M0ToFloat(s[c / q.group]);
      }
      return;
    }
    case WeightFormat::kInt4: {
      const uint8_t* p = static_cast<const uint8_t*>(data) + row * q.WeightRowBytes(cols);
      const bf16_t* s = static_cast<const bf16_t*>(scales) + row * q.ScaleCols(cols);
      for (int64_t c = 0; c < cols; ++c) {
        const int code = (c & 1) ? (p[c / 2] >> 4) : (p[c / 2] & 0xf);
        out[c] = static_cast<float>(code - 8) * Bf16ToFloat(s[c / q.group]);
      }
      return;
    }
    case WeightFormat::kInt4Zp: {
      const int64_t groups = scale_cols > 0 ? scale_cols : q.ScaleCols(cols);
      const uint8_t* p = static_cast<const uint8_t*>(data) + row * q.WeightRowBytes(cols);
      const fp16_t* s = static_cast<const fp16_t*>(scales) + row * groups;
      const uint8_t* z = zeros + row * groups;
      for (int64_t c = 0; c < cols; ++c) {
        const int code = (c & 1) ? (p[c / 2] >> 4) : (p[c / 2] & 0xf);
        const int64_t g = group_index != nullptr ? group_index[c] : c / q.group;
        out[c] = static_cast<float>(code - z[g]) * HalfToFloat(s[g]);
      }
      return;
    }
    case WeightFormat::kNvfp4: {
      const uint8_t* p = static_cast<const uint8_t*>(data) + row * q.WeightRowBytes(cols);
      const uint8_t* s = static_cast<const uint8_t*>(scales) + row * q.ScaleCols(cols);
      for (int64_t c = 0; c < cols; ++c) {
        const uint8_t code = (c & 1) ? (p[c / 2] >> 4) : (p[c / 2] & 0xf);
        out[c] = Fp4E2M1ToFloat(code) * Fp8E4M3ToFloat(s[c / q.group]) * global;
      }
      return;
    }
  }
  (void)rows;
}

float DequantizeWeight(const ExpertWeights& w, Projection proj, int64_t expert, int64_t row,
                       int64_t col) {
  const bool is_w13 = proj == Projection::kW13;
  const int64_t rows = is_w13 ? w.w13_rows() : w.hidden;
  const int64_t cols = is_w13 ? w.hidden : w.intermediate;
  const void* data = is_w13 ? w.w13 : w.w2;
  const void* scales = is_w13 ? w.w13_scales : w.w2_scales;
  const int64_t elem = (expert * rows + row) * cols + col;  // element index in [E, rows, cols]
  const WeightScheme& q = w.scheme;
  switch (q.format) {
    case WeightFormat::kBf16: {
      const int64_t i =
          w.bf16_row_groups ? expert * rows * cols + Bf16RowGroupsIndex(row, col, cols) : elem;
      return Bf16ToFloat(static_cast<const bf16_t*>(data)[i]);
    }
    case WeightFormat::kFp8Block: {
      const int64_t sr = q.ScaleRows(rows), sc = q.ScaleCols(cols);
      const float scale = static_cast<const float*>(
          scales)[(expert * sr + row / q.block_rows) * sc + col / q.group];
      return Fp8E4M3ToFloat(static_cast<const uint8_t*>(data)[elem]) * scale;
    }
    case WeightFormat::kMxfp4: {
      const uint8_t byte = static_cast<const uint8_t*>(data)[elem / 2];
      const uint8_t code = (col % 2 == 0) ? (byte & 0xf) : (byte >> 4);
      const int64_t groups = q.ScaleCols(cols);
      const uint8_t e =
          static_cast<const uint8_t*>(scales)[(expert * rows + row) * groups + col / q.group];
      return Fp4E2M1ToFloat(code) * E8M0ToFloat(e);
    }
    case WeightFormat::kInt4: {
      const uint8_t byte = static_cast<const uint8_t*>(data)[elem / 2];
      const int nibble = (col % 2 == 0) ? (byte & 0xf) : (byte >> 4);
      const int64_t groups = q.ScaleCols(cols);
      const bf16_t s =
          static_cast<const bf16_t*>(scales)[(expert * rows + row) * groups + col / q.group];
      return static_cast<float>(nibble - 8) * Bf16ToFloat(s);
    }
    case WeightFormat::kInt4Zp: {
      const uint8_t byte = static_cast<const uint8_t*>(data)[elem / 2];
      const int nibble = (col % 2 == 0) ? (byte & 0xf) : (byte >> 4);
      const int64_t groups = w.ScaleCols(is_w13);
      // Act-order: the column's group is its g_idx entry, not col / group.
      const int64_t group = q.act_order ? w.GroupIndex(is_w13, expert, row)[col] : col / q.group;
      const int64_t g = (expert * rows + row) * groups + group;
      const uint8_t* zeros = is_w13 ? w.w13_zeros : w.w2_zeros;
      return static_cast<float>(nibble - zeros[g]) *
             HalfToFloat(static_cast<const fp16_t*>(scales)[g]);
    }
    case WeightFormat::kNvfp4: {
      const uint8_t byte = static_cast<const uint8_t*>(data)[elem / 2];
      const uint8_t code = (col % 2 == 0) ? (byte & 0xf) : (byte >> 4);
      const int64_t groups = q.ScaleCols(cols);
      const uint8_t s =
          static_cast<const uint8_t*>(scales)[(expert * rows + row) * groups + col / q.group];
      const float global = is_w13 ? w.W13Global(expert, row) : w.w2_global[expert];
      return Fp4E2M1ToFloat(code) * Fp8E4M3ToFloat(s) * global;
    }
  }
  return 0.0f;
}

namespace {

// One expert, dequantised once into fp32 (the reference may; optimised kernels may not).
struct DenseExpert {
  std::vector<float> w13;  // [R13, H]
  std::vector<float> w2;   // [H, I]
};

DenseExpert Dequantize(const ExpertWeights& w, int64_t e) {
  DenseExpert d;
  const int64_t r13 = w.w13_rows();
  d.w13.resize(static_cast<size_t>(r13 * w.hidden));
  d.w2.resize(static_cast<size_t>(w.hidden * w.intermediate));
  for (int64_t r = 0; r < r13; ++r) {
    for (int64_t c = 0; c < w.hidden; ++c) {
      d.w13[r * w.hidden + c] = DequantizeWeight(w, Projection::kW13, e, r, c);
    }
  }
  for (int64_t r = 0; r < w.hidden; ++r) {
    for (int64_t c = 0; c < w.intermediate; ++c) {
      d.w2[r * w.intermediate + c] = DequantizeWeight(w, Projection::kW2, e, r, c);
    }
  }
  return d;
}

// y[o] = expert e applied to x (H values), fp64 sums; `int8`: through Int8Inputs (the caller
// checked Int8ActivationScheme).
void ExpertOutput(const ExpertWeights& w, const DenseExpert& d, const ActivationParams& act,
                  int64_t e, const float* x_in, bool add_down_bias, double* y, bool int8 = false) {
  const int64_t hidden = w.hidden;
  const int64_t inter = w.intermediate;
  std::vector<float> a(static_cast<size_t>(inter));
  std::vector<double> x(x_in, x_in + hidden);
  if (int8) Int8Inputs(x_in, hidden, w.scheme.group, x.data());
  auto row_dot = [&](int64_t row) {
    double acc = 0.0;
    for (int64_t c = 0; c < hidden; ++c) acc += x[c] * d.w13[row * hidden + c];
    if (w.w13_bias != nullptr) acc += w.w13_bias[e * w.w13_rows() + row];
    return static_cast<float>(acc);
  };
  for (int64_t j = 0; j < inter; ++j) {
    if (!w.gated) {
      a[j] = ApplyActivation(act, 0.0f, row_dot(j));
    } else if (w.gate_up_interleaved) {
      a[j] = ApplyActivation(act, row_dot(2 * j), row_dot(2 * j + 1));
    } else {
      a[j] = ApplyActivation(act, row_dot(j), row_dot(inter + j));
    }
  }
  std::vector<double> h(a.begin(), a.end());
  if (int8) {  // the kernels quantize the activations as they store them: bf16
    for (float& v : a) v = Bf16ToFloat(FloatToBf16(v));
    Int8Inputs(a.data(), inter, w.scheme.group, h.data());
  }
  for (int64_t o = 0; o < hidden; ++o) {
    double acc = 0.0;
    for (int64_t j = 0; j < inter; ++j) acc += h[j] * d.w2[o * inter + j];
    if (add_down_bias && w.w2_bias != nullptr) acc += w.w2_bias[e * hidden + o];
    y[o] = acc;
  }
}

std::vector<float> RowAsFloat(const void* x, DType dtype, int64_t row, int64_t hidden) {
  std::vector<float> v(static_cast<size_t>(hidden));
  for (int64_t c = 0; c < hidden; ++c) {
    v[c] = dtype == DType::kF32 ? static_cast<const float*>(x)[row * hidden + c]
                                : Bf16ToFloat(static_cast<const bf16_t*>(x)[row * hidden + c]);
  }
  return v;
}

// The oracle reads weights as loaded: a view SortActOrderExperts sorted by group (its inputs
// gathered through w13_input_perm) is the cpu backend's own and would be read wrongly here.
Status RejectSortedView(const ExpertWeights& w) {
  if (w.w13_input_perm == nullptr) return Status::Ok();
  return InvalidArgumentError(
      "reference: 'w13_input_perm': expected null (the reference reads act-order experts as "
      "loaded, with their g_idx), got a view sorted by group; pass the weights before "
      "SortActOrderExperts");
}

}  // namespace

void Int8Inputs(const float* x, int64_t n, int64_t group, double* out) {
  for (int64_t g0 = 0; g0 < n; g0 += group) {
    const int64_t g1 = std::min(n, g0 + group);
    float amax = 0.0f;
    bool special = false;
    for (int64_t c = g0; c < g1; ++c) {
      special = special || !std::isfinite(x[c]);
      amax = std::max(amax, std::fabs(x[c]));
    }
    if (special || amax == 0.0f) {
      std::fill(out + g0, out + g1, special ? std::nan("") : 0.0);
      continue;
    }
    int e;
    std::frexp(amax, &e);
    const float f1 = std::ldexp(1.0f, (-e) / 2), f2 = std::ldexp(1.0f, -e - (-e) / 2);
    const float m = amax * f1 * f2;  // in [0.5, 1), exact
    const float inv = 127.0f / m;
    const double d = std::ldexp(static_cast<double>(m) / 127.0, e);
    for (int64_t c = g0; c < g1; ++c) {
      const float v = x[c] * f1 * f2 * inv;  // fp32 steps, as the kernels
      out[c] = static_cast<double>(std::nearbyint(v)) * d;
    }
  }
}

Status GroupedExpertGemm(const GroupedGemmParams& p, bool int8_activations) {
  if (p.weights == nullptr || p.expert_offsets == nullptr) {
    return InvalidArgumentError("reference grouped gemm: 'weights/expert_offsets': null");
  }
  const ExpertWeights& w = *p.weights;
  MOESHARD_RETURN_IF_ERROR(ValidateExpertWeights(w, p.activation));
  MOESHARD_RETURN_IF_ERROR(RejectSortedView(w));
  const bool int8 = int8_activations && Int8ActivationScheme(w.scheme);
  std::vector<double> y(static_cast<size_t>(w.hidden));
  for (int64_t e = 0; e < w.num_experts_local; ++e) {
    if (p.expert_offsets[e + 1] == p.expert_offsets[e]) continue;
    const DenseExpert d = Dequantize(w, e);
    for (int64_t r = p.expert_offsets[e]; r < p.expert_offsets[e + 1]; ++r) {
      const int64_t src = p.x_rows == nullptr ? r : p.x_rows[r];
      const std::vector<float> x = RowAsFloat(p.x_sorted, p.x_dtype, src, w.hidden);
      ExpertOutput(w, d, p.activation, e, x.data(), p.add_down_bias, y.data(), int8);
      for (int64_t o = 0; o < w.hidden; ++o)
        p.y_sorted[r * w.hidden + o] = static_cast<float>(y[o]);
    }
  }
  return Status::Ok();
}

Status MoeExpertsForward(const MoeExpertsParams& p, bool int8_activations) {
  if (p.weights == nullptr) return InvalidArgumentError("reference moe: 'weights': null");
  const ExpertWeights& w = *p.weights;
  const bool int8 = int8_activations && Int8ActivationScheme(w.scheme);
  MOESHARD_RETURN_IF_ERROR(ValidateExpertWeights(w, p.activation));
  MOESHARD_RETURN_IF_ERROR(RejectSortedView(w));
  std::vector<DenseExpert> dense(static_cast<size_t>(w.num_experts_local));
  std::vector<bool> have(static_cast<size_t>(w.num_experts_local), false);
  std::vector<double> y(static_cast<size_t>(w.hidden));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const std::vector<float> x = RowAsFloat(p.x, p.x_dtype, t, w.hidden);
    std::vector<double> sum(static_cast<size_t>(w.hidden), 0.0);
    for (int64_t s = 0; s < p.top_k; ++s) {
      const int32_t g = p.topk_ids[t * p.top_k + s];
      if (g < 0 || g >= p.num_experts_global) {
        return InvalidArgumentError(fmt::format("reference moe: expert id {} out of range", g));
      }
      const int64_t l = LocalExpert(p.expert_global_to_local, g);
      if (l < 0) continue;
      if (!have[l]) {
        dense[l] = Dequantize(w, l);
        have[l] = true;
      }
      ExpertOutput(w, dense[l], p.activation, l, x.data(), p.add_down_bias, y.data(), int8);
      for (int64_t o = 0; o < w.hidden; ++o) sum[o] += p.topk_weights[t * p.top_k + s] * y[o];
    }
    for (int64_t o = 0; o < w.hidden; ++o) p.out[t * w.hidden + o] = static_cast<float>(sum[o]);
  }
  return Status::Ok();
}

Status MoeForward(const MoeForwardParams& p) {
  const int64_t k = p.routing.top_k;
  std::vector<int32_t> ids(static_cast<size_t>(std::max<int64_t>(0, p.num_tokens * k)));
  std::vector<float> weights(ids.size());
  MOESHARD_RETURN_IF_ERROR(Route(p.routing, RoutingArgs{.router_logits = p.router_logits,
                                                        .num_tokens = p.num_tokens,
                                                        .topk_ids = ids.data(),
                                                        .topk_weights = weights.data()}));
  MoeExpertsParams e;
  e.topk_ids = ids.data();
  e.topk_weights = weights.data();
  e.num_tokens = p.num_tokens;
  e.top_k = k;
  e.num_experts_global = p.routing.num_experts;
  e.expert_global_to_local = p.expert_global_to_local;
  e.x = p.x;
  e.x_dtype = p.x_dtype;
  e.weights = p.weights;
  e.activation = p.activation;
  e.add_down_bias = p.add_down_bias;
  e.out = p.out;
  return MoeExpertsForward(e);
}

}  // namespace moeshard::reference
