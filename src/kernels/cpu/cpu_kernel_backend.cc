#include "kernels/cpu/cpu_kernel_backend.h"

#include <fmt/format.h>

#include <algorithm>

#include "kernels/kernel_backend_registry.h"
#include "kernels/kernel_scratch.h"

namespace moeshard::internal {

Result<std::unique_ptr<CpuKernelBackend>> CpuKernelBackend::Create(const KernelBackendOptions& o) {
  MOESHARD_RETURN_IF_ERROR(CheckSettingNames(o, {"isa", "expert-layout", "activations"}));
  KernelContextOptions co;
  co.num_threads = o.num_threads;
  co.cpus = o.cpus;
  if (auto it = o.settings.find("isa"); it != o.settings.end()) {
    MOESHARD_ASSIGN_OR_RETURN(co.isa, ParseCpuIsa(it->second));
  }
  MOESHARD_ASSIGN_OR_RETURN(co.int8_activations, Int8ActivationsSetting(o));
  ExpertLayout layout = ExpertLayout::kAuto;
  if (auto it = o.settings.find("expert-layout"); it != o.settings.end()) {
    if (it->second == "row-major") {
      layout = ExpertLayout::kRowMajor;
    } else if (it->second == "row-groups") {
      layout = ExpertLayout::kRowGroups;
    } else if (it->second != "auto") {
      return InvalidArgumentError(fmt::format(
          "kernel backend 'cpu': '--expert-layout {}': expected auto (bf16 experts in the "
          "row-group layout on avx512-bf16 when they fit), row-groups (on any instruction set) "
          "or row-major",
          it->second));
    }
  }
  MOESHARD_ASSIGN_OR_RETURN(KernelContext ctx, KernelContext::Create(co));
  // Pin the caller (the pool's thread 0) now, before the caller loads weights, so the pages it
  // first touches come from its own NUMA node's memory.
  if (!co.cpus.empty()) ctx.pool().ParallelFor(1, 1, [](int64_t, int64_t, int) {});
  return std::unique_ptr<CpuKernelBackend>(new CpuKernelBackend(std::move(ctx), layout));
}

std::string CpuKernelBackend::Describe() const {
  std::string int8;
  if (ctx_.int8_activations()) {
    int8 = ctx_.int8_isa() == ctx_.isa()
               ? ", int8 activations"
               : fmt::format(", int8 activations (on {})", CpuIsaName(ctx_.int8_isa()));
  }
  return fmt::format("cpu: {}, {} thread{}, expert layout {}{}", CpuIsaName(ctx_.isa()),
                     ctx_.num_threads(), ctx_.num_threads() == 1 ? "" : "s",
                     layout_ == ExpertLayout::kAuto        ? "auto"
                     : layout_ == ExpertLayout::kRowGroups ? "row-groups"
                                                           : "row-major",
                     int8);
}

Result<KernelBuffer> CpuKernelBackend::Allocate(int64_t bytes) {
  if (bytes < 0) {
    return InvalidArgumentError(fmt::format("kernel backend 'cpu': allocate {} bytes", bytes));
  }
  return AllocateHostBuffer(bytes);
}

int64_t CpuKernelBackend::ScratchBytes() const {
  return static_cast<int64_t>(dense_.rows.capacity() * sizeof(float)) + ctx_.scratch().Bytes();
}

Result<bool> CpuKernelBackend::PrepareExperts(const PrepareExpertsArgs& a) {
  for (const Prepared& p : prepared_) {
    if (p.Matches(a.weights)) return true;  // done before
  }
  if (a.weights.num_experts_local == 0 || a.weights.bf16_row_groups) return false;
  ExpertWeights w = a.weights;
  const Prepared shape{.w13 = a.w13,
                       .w2 = a.w2,
                       .input_perm = {},
                       .experts = w.num_experts_local,
                       .hidden = w.hidden,
                       .intermediate = w.intermediate,
                       .format = w.scheme.format};
  if (w.scheme.act_order) {  // sorted by group on every instruction set, or left as loaded
    Prepared p = shape;
    const ActOrderBuffers b{
        .w13 = a.w13, .w13_scales = a.w13_scales, .w13_zeros = a.w13_zeros, .w2 = a.w2};
    MOESHARD_ASSIGN_OR_RETURN(const bool sorted, SortActOrderExperts(ctx_, &w, b, &p.input_perm));
    if (sorted) prepared_.push_back(std::move(p));
    return sorted;
  }
  if (!RowGroupsWanted() || !CheckBf16RowGroupShape(w).ok()) return false;  // row-major
  MOESHARD_RETURN_IF_ERROR(RepackBf16RowGroups(ctx_, &w, a.w13, a.w2));
  prepared_.push_back(shape);
  return true;
}

bool CpuKernelBackend::RowGroupsWanted() const {
  return layout_ == ExpertLayout::kRowGroups ||
         (layout_ == ExpertLayout::kAuto && ctx_.isa() == CpuIsa::kAvx512Bf16);
}

std::string CpuKernelBackend::PreparedLayout() const {
  for (const Prepared& p : prepared_) {
    if (!p.input_perm.empty()) return "group order (act-order GPTQ, sorted by g_idx)";
  }
  return RowGroupsWanted() ? "bf16 row-group layout" : "";
}

const ExpertWeights* CpuKernelBackend::AsPrepared(const ExpertWeights* w,
                                                  ExpertWeights* storage) const {
  if (w == nullptr) return w;
  for (const Prepared& p : prepared_) {
    if (!p.Matches(*w)) continue;
    *storage = *w;
    if (p.input_perm.empty()) {
      storage->bf16_row_groups = true;
    } else {
      ViewSortedByGroup(storage, p.input_perm.data());
    }
    return storage;
  }
  return w;
}

Status CpuKernelBackend::Route(const RoutingParams& params, const RoutingArgs& args) {
  return moeshard::Route(ctx_, params, args);
}

Status CpuKernelBackend::Permute(const PermuteParams& params, TokenPermutation* out) {
  return PermuteTokens(params, out);
}

Status CpuKernelBackend::Gather(const TokenPermutation& perm, const GatherParams& params) {
  return GatherTokens(ctx_, perm, params);
}

Status CpuKernelBackend::ExpertGemm(const GroupedGemmParams& params) {
  ExpertWeights storage;
  GroupedGemmParams p = params;
  p.weights = AsPrepared(params.weights, &storage);
  return GroupedExpertGemm(ctx_, p);
}

Status CpuKernelBackend::Unpermute(const TokenPermutation& perm, const UnpermuteParams& params) {
  return UnpermuteTokens(ctx_, perm, params);
}

Status CpuKernelBackend::MoeExperts(const MoeExpertsParams& params) {
  ExpertWeights storage;
  MoeExpertsParams p = params;
  p.weights = AsPrepared(params.weights, &storage);
  return MoeExpertsForward(ctx_, p);
}

void CpuKernelBackend::Linear(const LinearArgs& args) {
  internal::Linear(ctx_.pool(), dense_, args);
}

void CpuKernelBackend::RmsNorm(const RmsNormArgs& args) { internal::RmsNorm(args); }

void CpuKernelBackend::GatedMlp(const GatedMlpArgs& args) {
  internal::GatedMlp(ctx_.pool(), dense_, args);
}

Result<std::unique_ptr<KernelBackend>> CreateCpuKernelBackend(const KernelBackendOptions& options) {
  MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<CpuKernelBackend> b, CpuKernelBackend::Create(options));
  return std::unique_ptr<KernelBackend>(std::move(b));
}

}  // namespace moeshard::internal
