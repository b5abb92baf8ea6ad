// Single-rank MoE layer forward: route -> permute -> grouped expert GEMM -> unpermute.
//
// A convenience composition of routing.h, permute.h and expert_gemm.h for tests, benchmarks and
// single-rank use. Intermediate buffers live in the context's scratch (no allocation in steady
// state). With an expert map only the local experts contribute (an EP rank's partial sum).
//
// Thread safety: one call at a time per KernelContext.
#pragma once

#include <cstdint>

#include "moeshard/base/dtype.h"
#include "moeshard/base/status.h"
#include "moeshard/kernels/expert_gemm.h"
#include "moeshard/kernels/routing.h"

namespace moeshard {

class KernelContext;

struct MoeExpertsParams {
  const int32_t* topk_ids = nullptr;    // [num_tokens, top_k] int32, global expert ids
  const float* topk_weights = nullptr;  // [num_tokens, top_k] fp32
  int64_t num_tokens = 0;
  int64_t top_k = 0;
  int64_t num_experts_global = 0;
  const int32_t* expert_global_to_local = nullptr;  // [num_experts_global] or null (identity)
  const void* x = nullptr;                          // [num_tokens, H] row-major, kF32 or kBF16
  DType x_dtype = DType::kF32;
  const ExpertWeights* weights = nullptr;
  ActivationParams activation;
  bool add_down_bias = true;
  float* out = nullptr;  // out: [num_tokens, H] fp32 = sum_k weight * expert_k(x)
};

// The expert part of the layer given routing results.
Status MoeExpertsForward(KernelContext& ctx, const MoeExpertsParams& params);

struct MoeForwardParams {
  RoutingParams routing;                 // routing.num_experts = number of global experts
  const float* router_logits = nullptr;  // [num_tokens, routing.num_experts] fp32
  int64_t num_tokens = 0;
  const int32_t* expert_global_to_local = nullptr;  // [routing.num_experts] or null
  const void* x = nullptr;                          // [num_tokens, H] row-major, kF32 or kBF16
  DType x_dtype = DType::kF32;
  const ExpertWeights* weights = nullptr;
  ActivationParams activation;
  bool add_down_bias = true;
  float* out = nullptr;  // out: [num_tokens, H] fp32
};

Status MoeForward(KernelContext& ctx, const MoeForwardParams& params);

}  // namespace moeshard
