#include "moeshard/kernels/moe_forward.h"

#include <fmt/format.h>

#include "kernels/kernel_scratch.h"
#include "moeshard/kernels/kernel_context.h"
#include "moeshard/kernels/permute.h"

namespace moeshard {

Status MoeExpertsForward(KernelContext& ctx, const MoeExpertsParams& p) {
  if (p.weights == nullptr || (p.num_tokens > 0 && p.out == nullptr)) {
    return InvalidArgumentError("moe experts: 'weights/out': expected non-null");
  }
  const ExpertWeights& w = *p.weights;
  MOESHARD_RETURN_IF_ERROR(ValidateExpertWeights(w, p.activation));
  if (p.expert_global_to_local == nullptr && p.num_experts_global != w.num_experts_local) {
    return InvalidArgumentError(fmt::format(
        "moe experts: 'num_experts_global': without an expert map every expert is local, so "
        "expected the weights' {} experts, got {}",
        w.num_experts_local, p.num_experts_global));
  }
  internal::KernelScratch& s = ctx.scratch();
  PermuteParams pp;
  pp.topk_ids = p.topk_ids;
  pp.topk_weights = p.topk_weights;
  pp.num_tokens = p.num_tokens;
  pp.top_k = p.top_k;
  pp.num_experts_global = p.num_experts_global;
  pp.expert_global_to_local = p.expert_global_to_local;
  pp.num_experts_local = w.num_experts_local;
  MOESHARD_RETURN_IF_ERROR(PermuteTokens(pp, &s.perm).WithContext("moe experts"));
  // The grouped GEMM reads the tokens through the permutation (no sorted copy of the input).
  const int64_t rows = s.perm.num_rows();
  float* y_sorted = internal::KernelScratch::Grow(s.y_sorted, rows * w.hidden);
  GroupedGemmParams g;
  g.weights = &w;
  g.activation = p.activation;
  g.x_sorted = p.x;
  g.x_dtype = p.x_dtype;
  g.x_rows = s.perm.sorted_token_idx.data();
  g.expert_offsets = s.perm.expert_offsets.data();
  g.y_sorted = y_sorted;
  g.add_down_bias = p.add_down_bias;
  MOESHARD_RETURN_IF_ERROR(GroupedExpertGemm(ctx, g));
  return UnpermuteTokens(ctx, s.perm,
                         UnpermuteParams{.y_sorted = y_sorted, .hidden = w.hidden, .out = p.out});
}

Status MoeForward(KernelContext& ctx, const MoeForwardParams& p) {
  internal::KernelScratch& s = ctx.scratch();
  const int64_t n = p.num_tokens * p.routing.top_k;
  int32_t* ids = internal::KernelScratch::Grow(s.topk_ids, n);
  float* weights = internal::KernelScratch::Grow(s.topk_weights, n);
  MOESHARD_RETURN_IF_ERROR(Route(ctx, p.routing,
                                 RoutingArgs{.router_logits = p.router_logits,
                                             .num_tokens = p.num_tokens,
                                             .topk_ids = ids,
                                             .topk_weights = weights}));
  MoeExpertsParams e;
  e.topk_ids = ids;
  e.topk_weights = weights;
  e.num_tokens = p.num_tokens;
  e.top_k = p.routing.top_k;
  e.num_experts_global = p.routing.num_experts;
  e.expert_global_to_local = p.expert_global_to_local;
  e.x = p.x;
  e.x_dtype = p.x_dtype;
  e.weights = p.weights;
  e.activation = p.activation;
  e.add_down_bias = p.add_down_bias;
  e.out = p.out;
  return MoeExpertsForward(ctx, e);
}

}  // namespace moeshard
