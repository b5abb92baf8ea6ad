// The "reference" kernel backend (kernel_backend.h): the scalar oracle of kernels/reference.h
// behind the interface, serial, with host memory. It exists so that the runtime's multi-rank
// suite can run through a second backend (tests/runtime parametrize over KernelBackendNames()):
// the interface, not the CPU backend, is what the runtime depends on. Dense operations
// accumulate in fp64 (one dot product per output element in a fixed order, so results do not
// depend on rows or tokens per call, as dense_ops.h requires); the composition MoeExperts runs
// this backend's own Permute, ExpertGemm and Unpermute.
//
// Thread safety: as KernelBackend (one call at a time).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "kernels/host_glue.h"
#include "kernels/kernel_backend_registry.h"
#include "moeshard/kernels/reference.h"

namespace moeshard::internal {
namespace {

class ReferenceKernelBackend final : public KernelBackend {
 public:
  const std::string& name() const override { return name_; }
  explicit ReferenceKernelBackend(bool int8_activations) : int8_(int8_activations) {}
  std::string Describe() const override {
    return int8_ ? "reference: scalar oracle, 1 thread, int8 activations"
                 : "reference: scalar oracle, 1 thread";
  }
  int num_threads() const override { return 1; }
  Result<KernelBuffer> Allocate(int64_t bytes) override {
    if (bytes < 0) {
      return InvalidArgumentError(
          fmt::format("kernel backend 'reference': allocate {} bytes", bytes));
    }
    return AllocateHostBuffer(bytes);
  }
  int64_t ScratchBytes() const override {
    return static_cast<int64_t>((row_.capacity() + y_sorted_.capacity()) * sizeof(float));
  }
  Result<bool> PrepareExperts(const PrepareExpertsArgs& /*args*/) override { return false; }
  std::string PreparedLayout() const override { return ""; }

  Status Route(const RoutingParams& params, const RoutingArgs& args) override {
    return reference::Route(params, args);
  }
  Status Permute(const PermuteParams& params, TokenPermutation* out) override {
    return reference::PermuteTokens(params, out);
  }
  Status Gather(const TokenPermutation& perm, const GatherParams& params) override;
  Status ExpertGemm(const GroupedGemmParams& params) override {
    return reference::GroupedExpertGemm(params, int8_);
  }
  Status Unpermute(const TokenPermutation& perm, const UnpermuteParams& params) override;
  Status MoeExperts(const MoeExpertsParams& params) override;

  void Linear(const LinearArgs& args) override;
  void RmsNorm(const RmsNormArgs& args) override;
  void GatedMlp(const GatedMlpArgs& args) override;

  void ToExpertRows(const ExpertRowsArgs& args) override { HostToExpertRows(args); }
  void AddRows(const AddRowsArgs& args) override { HostAddRows(args); }
  void CopyRows(const CopyRowsArgs& args) override { HostCopyRows(args); }
  void Convert(const ConvertArgs& args) override { HostConvert(args); }

 private:
  std::string name_ = "reference";
  bool int8_ = false;       // the "activations" setting: int8
  std::vector<float> row_;  // one dequantised weight row
  TokenPermutation perm_;
  std::vector<float> y_sorted_;
};

float LoadElement(const void* x, DType dtype, int64_t i) {
  return dtype == DType::kF32 ? static_cast<const float*>(x)[i]
                              : Bf16ToFloat(static_cast<const bf16_t*>(x)[i]);
}

Status ReferenceKernelBackend::Gather(const TokenPermutation& perm, const GatherParams& p) {
  const bool dtypes_ok = (p.x_dtype == DType::kF32 || p.x_dtype == DType::kBF16) &&
                         (p.out_dtype == DType::kF32 || p.out_dtype == DType::kBF16);
  if (!dtypes_ok || p.hidden < 0 || (perm.num_rows() > 0 && (p.x == nullptr || !p.x_sorted))) {
    return InvalidArgumentError(
        "gather: 'x/x_sorted/hidden/dtypes': expected non-null, hidden >= 0, F32 or BF16");
  }
  for (int64_t r = 0; r < perm.num_rows(); ++r) {
    const int64_t t = perm.sorted_token_idx[static_cast<size_t>(r)];
    for (int64_t i = 0; i < p.hidden; ++i) {
      const float v = LoadElement(p.x, p.x_dtype, t * p.hidden + i);
      if (p.out_dtype == DType::kF32) {
        static_cast<float*>(p.x_sorted)[r * p.hidden + i] = v;
      } else {
        static_cast<bf16_t*>(p.x_sorted)[r * p.hidden + i] = FloatToBf16(v);
      }
    }
  }
  return Status::Ok();
}

Status ReferenceKernelBackend::Unpermute(const TokenPermutation& perm, const UnpermuteParams& p) {
  if (p.hidden < 0 || (perm.num_tokens > 0 && p.out == nullptr) ||
      (perm.num_rows() > 0 && p.y_sorted == nullptr)) {
    return InvalidArgumentError("unpermute: 'y_sorted/out/hidden': expected non-null, hidden >= 0");
  }
  for (int64_t t = 0; t < perm.num_tokens; ++t) {
    for (int64_t i = 0; i < p.hidden; ++i) {
      double acc = p.accumulate ? p.out[t * p.hidden + i] : 0.0;
      for (int64_t s = 0; s < perm.top_k; ++s) {
        const int32_t row = perm.slot_row[static_cast<size_t>(t * perm.top_k + s)];
        if (row < 0) continue;
        acc += static_cast<double>(perm.sorted_weights[static_cast<size_t>(row)]) *
               p.y_sorted[row * p.hidden + i];
      }
      p.out[t * p.hidden + i] = static_cast<float>(acc);
    }
  }
  return Status::Ok();
}

Status ReferenceKernelBackend::MoeExperts(const MoeExpertsParams& p) {
  if (p.weights == nullptr || (p.num_tokens > 0 && p.out == nullptr)) {
    return InvalidArgumentError("moe experts: 'weights/out': expected non-null");
  }
  const ExpertWeights& w = *p.weights;
  MOESHARD_RETURN_IF_ERROR(ValidateExpertWeights(w, p.activation));
  MOESHARD_RETURN_IF_ERROR(Permute(PermuteParams{.topk_ids = p.topk_ids,
                                                 .topk_weights = p.topk_weights,
                                                 .num_tokens = p.num_tokens,
                                                 .top_k = p.top_k,
                                                 .num_experts_global = p.num_experts_global,
                                                 .expert_global_to_local = p.expert_global_to_local,
                                                 .num_experts_local = w.num_experts_local},
                                   &perm_)
                               .WithContext("moe experts"));
  y_sorted_.assign(static_cast<size_t>(perm_.num_rows() * w.hidden), 0.0f);
  GroupedGemmParams g;
  g.weights = &w;
  g.activation = p.activation;
  g.x_sorted = p.x;
  g.x_dtype = p.x_dtype;
  g.x_rows = perm_.sorted_token_idx.data();
  g.expert_offsets = perm_.expert_offsets.data();
  g.y_sorted = y_sorted_.data();
  g.add_down_bias = p.add_down_bias;
  MOESHARD_RETURN_IF_ERROR(ExpertGemm(g));
  return Unpermute(perm_,
                   UnpermuteParams{.y_sorted = y_sorted_.data(), .hidden = w.hidden, .out = p.out});
}

void ReferenceKernelBackend::Linear(const LinearArgs& a) {
  MOESHARD_CHECK(a.w != nullptr, "reference Linear: null weight");
  const DenseWeight& w = *a.w;
  row_.resize(static_cast<size_t>(std::max<int64_t>(w.cols, 1)));
  for (int64_t r = 0; r < w.rows; ++r) {
    if (w.f32) {
      std::memcpy(row_.data(), static_cast<const float*>(w.data) + r * w.cols,
                  static_cast<size_t>(w.cols) * sizeof(float));
    } else {
      reference::DequantizeMatrixRow(w.scheme, w.data, w.scales, w.rows, w.cols, r, row_.data(),
                                     w.zeros, w.global, w.group_index, w.scale_cols);
    }
    for (int64_t t = 0; t < a.num_tokens; ++t) {
      double acc = a.bias != nullptr ? a.bias[r] : 0.0;
      for (int64_t c = 0; c < w.cols; ++c) {
        acc += static_cast<double>(a.x[t * a.x_stride + c]) * row_[static_cast<size_t>(c)];
      }
      float& y = a.y[t * a.y_stride + r];
      y = a.accumulate ? y + static_cast<float>(acc) : static_cast<float>(acc);
    }
  }
}

void ReferenceKernelBackend::RmsNorm(const RmsNormArgs& a) {
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const float* x = a.x + t * a.x_stride;
    double sum = 0.0;
    for (int64_t i = 0; i < a.n; ++i) sum += static_cast<double>(x[i]) * x[i];
    const double inv = 1.0 / std::sqrt(sum / static_cast<double>(a.n) + a.eps);
    float* y = a.y + t * a.y_stride;
    for (int64_t i = 0; i < a.n; ++i) {
      y[i] = static_cast<float>(x[i] * inv * (a.weight_offset + Bf16ToFloat(a.weight[i])));
    }
  }
}

void ReferenceKernelBackend::GatedMlp(const GatedMlpArgs& a) {
  const int64_t s = a.gate->rows;
  Linear({.w = a.gate,
          .x = a.x,
          .x_stride = a.x_stride,
          .num_tokens = a.num_tokens,
          .y = a.gate_buf,
          .y_stride = s});
  Linear({.w = a.up,
          .x = a.x,
          .x_stride = a.x_stride,
          .num_tokens = a.num_tokens,
          .y = a.up_buf,
          .y_stride = s});
  for (int64_t i = 0; i < a.num_tokens * s; ++i) {
    a.gate_buf[i] = ApplyActivation(a.activation, a.gate_buf[i], a.up_buf[i]);
  }
  Linear({.w = a.down,
          .x = a.gate_buf,
          .x_stride = s,
          .num_tokens = a.num_tokens,
          .y = a.y,
          .y_stride = a.y_stride,
          .accumulate = a.accumulate});
}

}  // namespace

Result<std::unique_ptr<KernelBackend>> CreateReferenceKernelBackend(
    const KernelBackendOptions& options) {
  MOESHARD_RETURN_IF_ERROR(CheckSettingNames(options, {"activations"}));
  MOESHARD_ASSIGN_OR_RETURN(const bool int8, Int8ActivationsSetting(options));
  return std::unique_ptr<KernelBackend>(new ReferenceKernelBackend(int8));
}

}  // namespace moeshard::internal
