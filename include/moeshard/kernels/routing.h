// Router: fp32 router logits -> top-k expert ids and weights per token.
//
// Five variants cover the supported families:
//   kSoftmaxTopK         softmax over all experts, top-k of the probabilities, optionally
//                        renormalised over the k (Qwen3 `norm_topk_prob`, Mixtral).
//   kSigmoidGroupedTopK  DeepSeek-V3 / Kimi `noaux_tc`: s = sigmoid(logit); selection uses
//                        s + e_score_correction_bias; each of `num_groups` contiguous groups is
//                        scored by the sum of its top-2 biased scores (top-1 when a group has a
//                        single expert); the best `topk_group` groups are kept; top-k of the
//                        biased scores inside kept groups. The weights are the UNBIASED s of
//                        the chosen experts, renormalised (denominator sum + 1e-20) when
//                        `renormalize`.
//   kSoftmaxGroupedTopK  DeepSeek-V2 `group_limited_greedy`: s = softmax(logits); each group
//                        is scored by its largest s; the best `topk_group` groups are kept; top-k
//                        of s inside them; weights s, renormalised when `renormalize`.
//                        (`greedy`, DeepSeek-V2-Lite's, is kSoftmaxTopK.)
//   kTopKThenSoftmax     gpt-oss: top-k of the raw logits, softmax over those k.
//   kTopKThenSigmoid     Llama-4: top-k of the raw logits, each weight sigmoid(logit), not
//                        renormalised (vLLM Llama4MoE.custom_routing_function).
//   kSqrtSoftplusTopK    DeepSeek-V4 `sqrtsoftplus`: s = sqrt(softplus(logit)) (softplus(x) =
//                        x above 20, as torch's); top-k of s + e_score_correction_bias (the bias
//                        optional: null means none); the weights are the UNBIASED s of the chosen
//                        experts, renormalised when `renormalize` (divided by max(sum, 1e-20)).
//   kSqrtSoftplusHash    DeepSeek-V4 hash layers: the k experts of token u are
//                        hash_table[token_ids[u], 0..k) (in the table's order, no selection,
//                        no bias); weights as kSqrtSoftplusTopK's, from the same s.
// (vLLM fused_topk_bias / _topk_softplus_sqrt_torch; DeepSeek's reference model.py Gate.)
// Every variant finally multiplies the weights by `routed_scaling_factor`.
//
// Ties are broken deterministically, lower expert (or group) index first, in every backend;
// the k ids of a token are ordered by descending selection score (ties: ascending index),
// except kSqrtSoftplusHash's, which keep the table's order.
//
// Thread safety: Route uses the context (one call at a time per context); RouteReference is a
// pure function.
#pragma once

#include <cstdint>

#include "moeshard/base/status.h"

namespace moeshard {

class KernelContext;

enum class RoutingKind {
  kSoftmaxTopK,
  kSigmoidGroupedTopK,
  kTopKThenSoftmax,
  kSoftmaxGroupedTopK,
  kTopKThenSigmoid,
  kSqrtSoftplusTopK,
  kSqrtSoftplusHash,
};

const char* RoutingKindName(RoutingKind kind);

struct RoutingParams {
  RoutingKind kind = RoutingKind::kSoftmaxTopK;
  int64_t num_experts = 0;  // E (global, logical experts)
  int64_t top_k = 0;        // k, 1 <= k <= E
  // kSoftmaxTopK, kSigmoidGroupedTopK and kSoftmaxGroupedTopK: renormalise the k weights to
  // sum to 1.
  bool renormalize = true;
  // The grouped kinds: E % num_groups == 0, 1 <= topk_group <= num_groups,
  // k <= topk_group * (E / num_groups).
  int64_t num_groups = 1;
  int64_t topk_group = 1;
  // kSigmoidGroupedTopK: [num_experts] fp32, required; kSqrtSoftplusTopK: optional.
  const float* e_score_correction_bias = nullptr;
  float routed_scaling_factor = 1.0f;
  // kSqrtSoftplusHash: [hash_vocab, top_k] int32 row-major, every entry in [0, num_experts).
  const int32_t* hash_table = nullptr;
  int64_t hash_vocab = 0;
};

struct RoutingArgs {
  const float* router_logits = nullptr;  // [num_tokens, num_experts] fp32, row-major
  int64_t num_tokens = 0;
  int32_t* topk_ids = nullptr;    // out: [num_tokens, top_k] int32, row-major
  float* topk_weights = nullptr;  // out: [num_tokens, top_k] fp32, row-major
  // kSqrtSoftplusHash: [num_tokens] int32 token ids in [0, hash_vocab), required.
  const int32_t* token_ids = nullptr;
};

// Validates params (InvalidArgument naming the field) and routes every token, multi-threaded
// over tokens on the context's pool.
Status Route(KernelContext& ctx, const RoutingParams& params, const RoutingArgs& args);

// Validation shared by all backends (for kSqrtSoftplusHash also every token id and the table
// entries it selects).
Status ValidateRouting(const RoutingParams& params, const RoutingArgs& args);

}  // namespace moeshard
