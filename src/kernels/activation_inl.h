// The activations' scalar formulas (ActivationParams), inlined per kind: ApplyActivation picks
// the kind for one value; the backends' epilogues pick it once per row (VisitActivation) so the
// loop over a row has no call and no switch per value. One definition, so every caller computes
// the same bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "moeshard/kernels/expert_gemm.h"

namespace moeshard::internal {

template <Activation kKind>
inline float ActivationOf(const ActivationParams& a, float gate, float up) {
  const auto sigmoid = [](float v) { return 1.0f / (1.0f + std::exp(-v)); };
  if constexpr (kKind == Activation::kSwiGlu) {
    return gate * sigmoid(gate) * up;
  } else if constexpr (kKind == Activation::kSwiGluOai) {
    const float g = std::min(gate, a.swiglu_limit);
    const float u = std::clamp(up, -a.swiglu_limit, a.swiglu_limit);
    return (u + 1.0f) * g * sigmoid(a.swiglu_alpha * g);
  } else if constexpr (kKind == Activation::kSiTu) {
    const float g = a.situ_beta * std::tanh(gate / a.situ_beta) * sigmoid(gate);
    const float u = a.situ_linear_beta * std::tanh(up / a.situ_linear_beta);
    return g * u;
  } else if constexpr (kKind == Activation::kReluSquared) {
    const float r = std::max(up, 0.0f);
    return r * r;
  } else if constexpr (kKind == Activation::kGeluTanhGated) {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    const float inner = kSqrt2OverPi * (gate + 0.044715f * gate * gate * gate);
    return 0.5f * gate * (1.0f + std::tanh(inner)) * up;
  } else {
    static_assert(kKind == Activation::kSwiGluClamp);
    const float g = std::min(gate, a.swiglu_limit);
    const float u = std::clamp(up, -a.swiglu_limit, a.swiglu_limit);
    return g * sigmoid(g) * u;
  }
}

// f(std::integral_constant<Activation, kind>{}) for the runtime `kind`.
template <typename F>
inline auto VisitActivation(Activation kind, F&& f) {
  using A = Activation;
  switch (kind) {
    case A::kSwiGlu: return f(std::integral_constant<A, A::kSwiGlu>{});
    case A::kSwiGluOai: return f(std::integral_constant<A, A::kSwiGluOai>{});
    case A::kSiTu: return f(std::integral_constant<A, A::kSiTu>{});
    case A::kReluSquared: return f(std::integral_constant<A, A::kReluSquared>{});
    case A::kGeluTanhGated: return f(std::integral_constant<A, A::kGeluTanhGated>{});
    case A::kSwiGluClamp: break;
  }
  return f(std::integral_constant<A, A::kSwiGluClamp>{});
}

}  // namespace moeshard::internal
