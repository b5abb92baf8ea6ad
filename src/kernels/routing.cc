#include "moeshard/kernels/routing.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/kernel_scratch.h"
#include "moeshard/kernels/kernel_context.h"

namespace moeshard {
namespace {

// Orders candidates by descending score, ascending index on ties (the tie rule of routing.h).
struct ScoreOrder {
  const float* score;
  bool operator()(int32_t a, int32_t b) const {
    return score[a] > score[b] || (score[a] == score[b] && a < b);
  }
};

// Writes the `k` best of `candidates` (reordered in place) into its first k entries, sorted.
void SelectTopK(const float* score, std::vector<int32_t>& candidates, int64_t k) {
  std::partial_sort(candidates.begin(), candidates.begin() + k, candidates.end(),
                    ScoreOrder{score});
}

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// sqrt(softplus(x)), softplus linear above 20 as torch.nn.functional.softplus.
float SqrtSoftplus(float x) { return std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x))); }

// ids[i] = cand[i], weights the score of each, divided by max(sum, 1e-20) when renormalising
// (vLLM's clamp), times the scaling factor.
void TakeClamped(const int32_t* cand, const float* score, int64_t k, bool renormalize, float scale,
                 int32_t* ids, float* weights) {
  float wsum = 0.0f;
  for (int64_t i = 0; i < k; ++i) {
    ids[i] = cand[i];
    weights[i] = score[cand[i]];
    wsum += weights[i];
  }
  const float norm = renormalize ? scale / std::max(wsum, 1e-20f) : scale;
  for (int64_t i = 0; i < k; ++i) weights[i] *= norm;
}

// s[e] = softmax(logits)[e] over the experts.
void Softmax(const float* logits, int64_t n, float* s) {
  const float max_logit = *std::max_element(logits, logits + n);
  float sum = 0.0f;
  for (int64_t e = 0; e < n; ++e) {
    s[e] = std::exp(logits[e] - max_logit);
    sum += s[e];
  }
  for (int64_t e = 0; e < n; ++e) s[e] /= sum;
}

// ids/weights of the first k candidates, each weight score[id], renormalised over the k (the
// sum plus `eps`) when asked, times the scaling factor.
void TakeTopK(const std::vector<int32_t>& cand, const float* score, int64_t k, bool renormalize,
              float eps, float scale, int32_t* ids, float* weights) {
  float wsum = 0.0f;
  for (int64_t i = 0; i < k; ++i) {
    ids[i] = cand[i];
    weights[i] = score[cand[i]];
    wsum += weights[i];
  }
  const float norm = renormalize ? scale / (wsum + eps) : scale;
  for (int64_t i = 0; i < k; ++i) weights[i] *= norm;
}

// The candidates of grouped routing: every expert of the `topk_group` best-scored groups, in
// ascending expert order (all experts when every group is kept).
void KeptGroupMembers(const float* group_score, int64_t num_groups, int64_t topk_group,
                      int64_t group_size, std::vector<int32_t>& groups,
                      std::vector<int32_t>& cand) {
  cand.clear();
  if (topk_group >= num_groups) {
    cand.resize(static_cast<size_t>(num_groups * group_size));
    std::iota(cand.begin(), cand.end(), 0);
    return;
  }
  groups.resize(static_cast<size_t>(num_groups));
  std::iota(groups.begin(), groups.end(), 0);
  SelectTopK(group_score, groups, topk_group);
  std::sort(groups.begin(), groups.begin() + topk_group);
  for (int64_t gi = 0; gi < topk_group; ++gi) {
    for (int64_t i = 0; i < group_size; ++i) {
      cand.push_back(static_cast<int32_t>(groups[gi] * group_size + i));
    }
  }
}

void RouteToken(const RoutingParams& p, const float* logits, int32_t token_id, int32_t* ids,
                float* weights, internal::LineVector<float>& score, std::vector<int32_t>& cand,
                std::vector<int32_t>& groups) {
  const int64_t num_experts = p.num_experts;
  const int64_t k = p.top_k;
  score.resize(static_cast<size_t>(2 * num_experts));
  float* s = score.data();
  float* biased = s + num_experts;
  switch (p.kind) {
    case RoutingKind::kSoftmaxTopK: {
      Softmax(logits, num_experts, s);
      cand.resize(static_cast<size_t>(num_experts));
      std::iota(cand.begin(), cand.end(), 0);
      SelectTopK(s, cand, k);
      TakeTopK(cand, s, k, p.renormalize, 0.0f, p.routed_scaling_factor, ids, weights);
      return;
    }
    case RoutingKind::kSoftmaxGroupedTopK: {
      score.resize(static_cast<size_t>(num_experts + p.num_groups));
      s = score.data();
      float* group_score = s + num_experts;
      Softmax(logits, num_experts, s);
      const int64_t group_size = num_experts / p.num_groups;
      for (int64_t g = 0; g < p.num_groups; ++g) {
        group_score[g] = *std::max_element(s + g * group_size, s + (g + 1) * group_size);
      }
      KeptGroupMembers(group_score, p.num_groups, p.topk_group, group_size, groups, cand);
      SelectTopK(s, cand, k);
      TakeTopK(cand, s, k, p.renormalize, 0.0f, p.routed_scaling_factor, ids, weights);
      return;
    }
    case RoutingKind::kTopKThenSigmoid: {
      cand.resize(static_cast<size_t>(num_experts));
      std::iota(cand.begin(), cand.end(), 0);
      SelectTopK(logits, cand, k);
      for (int64_t i = 0; i < k; ++i) {
        ids[i] = cand[i];
        weights[i] = Sigmoid(logits[cand[i]]) * p.routed_scaling_factor;
      }
      return;
    }
    case RoutingKind::kSigmoidGroupedTopK: {
      score.resize(static_cast<size_t>(2 * num_experts + p.num_groups));
      s = score.data();
      biased = s + num_experts;
      float* group_score = biased + num_experts;
      for (int64_t e = 0; e < num_experts; ++e) {
        s[e] = Sigmoid(logits[e]);
        biased[e] = s[e] + p.e_score_correction_bias[e];
      }
      const int64_t group_size = num_experts / p.num_groups;
      if (p.topk_group < p.num_groups) {
        // Group score: sum of the group's top-2 biased scores (top-1 for single-expert groups).
        for (int64_t g = 0; g < p.num_groups; ++g) {
          const float* b = biased + g * group_size;
          float top1 = -INFINITY, top2 = -INFINITY;
          for (int64_t i = 0; i < group_size; ++i) {
            if (b[i] > top1) {
              top2 = top1;
              top1 = b[i];
            } else if (b[i] > top2) {
              top2 = b[i];
            }
          }
          group_score[g] = group_size >= 2 ? top1 + top2 : top1;
        }
      }
      KeptGroupMembers(group_score, p.num_groups, p.topk_group, group_size, groups, cand);
      SelectTopK(biased, cand, k);
      TakeTopK(cand, s, k, p.renormalize, 1e-20f, p.routed_scaling_factor, ids, weights);
      return;
    }
    case RoutingKind::kSqrtSoftplusTopK: {
      for (int64_t e = 0; e < num_experts; ++e) {
        s[e] = SqrtSoftplus(logits[e]);
        biased[e] = p.e_score_correction_bias ? s[e] + p.e_score_correction_bias[e] : s[e];
      }
      cand.resize(static_cast<size_t>(num_experts));
      std::iota(cand.begin(), cand.end(), 0);
      SelectTopK(biased, cand, k);
      TakeClamped(cand.data(), s, k, p.renormalize, p.routed_scaling_factor, ids, weights);
      return;
    }
    case RoutingKind::kSqrtSoftplusHash: {
      for (int64_t e = 0; e < num_experts; ++e) s[e] = SqrtSoftplus(logits[e]);
      TakeClamped(p.hash_table + static_cast<int64_t>(token_id) * k, s, k, p.renormalize,
                  p.routed_scaling_factor, ids, weights);
      return;
    }
    case RoutingKind::kTopKThenSoftmax: {
      cand.resize(static_cast<size_t>(num_experts));
      std::iota(cand.begin(), cand.end(), 0);
      SelectTopK(logits, cand, k);
      const float max_logit = logits[cand[0]];
      float sum = 0.0f;
      for (int64_t i = 0; i < k; ++i) {
        ids[i] = cand[i];
        weights[i] = std::exp(logits[cand[i]] - max_logit);
        sum += weights[i];
      }
      for (int64_t i = 0; i < k; ++i) weights[i] = weights[i] / sum * p.routed_scaling_factor;
      return;
    }
  }
}

}  // namespace

const char* RoutingKindName(RoutingKind kind) {
  switch (kind) {
    case RoutingKind::kSoftmaxTopK: return "softmax_topk";
    case RoutingKind::kSigmoidGroupedTopK: return "sigmoid_grouped_topk";
    case RoutingKind::kTopKThenSoftmax: return "topk_softmax";
    case RoutingKind::kSoftmaxGroupedTopK: return "softmax_grouped_topk";
    case RoutingKind::kTopKThenSigmoid: return "topk_sigmoid";
    case RoutingKind::kSqrtSoftplusTopK: return "sqrtsoftplus_topk";
    case RoutingKind::kSqrtSoftplusHash: return "sqrtsoftplus_hash";
  }
  return "?";
}

Status ValidateRouting(const RoutingParams& p, const RoutingArgs& a) {
  if (p.num_experts < 1) {
    return InvalidArgumentError(
        fmt::format("route: 'num_experts': expected >= 1, got {}", p.num_experts));
  }
  if (p.top_k < 1 || p.top_k > p.num_experts) {
    return InvalidArgumentError(fmt::format("route: 'top_k': expected 1..num_experts ({}), got {}",
                                            p.num_experts, p.top_k));
  }
  if (a.num_tokens < 0) {
    return InvalidArgumentError(
        fmt::format("route: 'num_tokens': expected >= 0, got {}", a.num_tokens));
  }
  if (a.num_tokens > 0 &&
      (a.router_logits == nullptr || a.topk_ids == nullptr || a.topk_weights == nullptr)) {
    return InvalidArgumentError("route: 'router_logits/topk_ids/topk_weights': expected non-null");
  }
  if (p.kind == RoutingKind::kSigmoidGroupedTopK && p.e_score_correction_bias == nullptr) {
    return InvalidArgumentError(
        "route: 'e_score_correction_bias': expected [num_experts] fp32 for noaux_tc routing, "
        "got null");
  }
  if (p.kind == RoutingKind::kSqrtSoftplusHash) {
    if (p.hash_table == nullptr || p.hash_vocab < 1) {
      return InvalidArgumentError(fmt::format(
          "route: 'hash_table': expected [vocab, top_k] int32 for hash routing, got {} with "
          "vocab {}",
          p.hash_table == nullptr ? "null" : "a table", p.hash_vocab));
    }
    if (a.num_tokens > 0 && a.token_ids == nullptr) {
      return InvalidArgumentError(
          "route: 'token_ids': expected [num_tokens] int32 token ids for hash routing (the "
          "layer routes by token id), got null");
    }
    for (int64_t t = 0; t < a.num_tokens; ++t) {
      const int32_t id = a.token_ids[t];
      if (id < 0 || id >= p.hash_vocab) {
        return InvalidArgumentError(fmt::format(
            "route: 'token_ids[{}]': expected a token id in [0, {}), got {}", t, p.hash_vocab, id));
      }
      for (int64_t j = 0; j < p.top_k; ++j) {
        const int32_t e = p.hash_table[static_cast<int64_t>(id) * p.top_k + j];
        if (e < 0 || e >= p.num_experts) {
          return InvalidArgumentError(
              fmt::format("route: 'hash_table[{}, {}]': expected an expert in [0, {}), got {}", id,
                          j, p.num_experts, e));
        }
      }
    }
  }
  if (p.kind == RoutingKind::kSigmoidGroupedTopK || p.kind == RoutingKind::kSoftmaxGroupedTopK) {
    if (p.num_groups < 1 || p.num_experts % p.num_groups != 0) {
      return InvalidArgumentError(
          fmt::format("route: 'num_groups': expected a divisor of num_experts ({}), got {}",
                      p.num_experts, p.num_groups));
    }
    if (p.topk_group < 1 || p.topk_group > p.num_groups) {
      return InvalidArgumentError(fmt::format(
          "route: 'topk_group': expected 1..num_groups ({}), got {}", p.num_groups, p.topk_group));
    }
    const int64_t selectable = p.topk_group * (p.num_experts / p.num_groups);
    if (p.top_k > selectable) {
      return InvalidArgumentError(
          fmt::format("route: 'top_k': expected <= topk_group * experts per group ({}), got {}",
                      selectable, p.top_k));
    }
  }
  return Status::Ok();
}

Status Route(KernelContext& ctx, const RoutingParams& p, const RoutingArgs& a) {
  MOESHARD_RETURN_IF_ERROR(ValidateRouting(p, a));
  auto& scratch = ctx.scratch();
  ctx.pool().ParallelFor(a.num_tokens, 0, [&](int64_t begin, int64_t end, int tid) {
    auto& pt = scratch.per_thread[static_cast<size_t>(tid)];
    for (int64_t t = begin; t < end; ++t) {
      RouteToken(p, a.router_logits + t * p.num_experts,
                 a.token_ids != nullptr ? a.token_ids[t] : 0, a.topk_ids + t * p.top_k,
                 a.topk_weights + t * p.top_k, pt.work, pt.rows, pt.aux);
    }
  });
  return Status::Ok();
}

}  // namespace moeshard
