// CpuKernelBackend: the "cpu" kernel backend (kernel_backend.h) over a KernelContext: the
// optimised CPU kernels (routing.cc, permute.cc, expert_gemm.cc with its instruction-set
// variants in this folder) and the dense operations of dense_ops.h.
//
// Its weight preparation is the bf16 row-group layout (expert_gemm.h): with expert-layout auto
// and the avx512-bf16 instruction set (or expert-layout row-groups), PrepareExperts rewrites a
// layer's bf16 experts in place when their shape fits and records the tensors' addresses;
// ExpertGemm and MoeExperts on those tensors then run the row-group kernels. Nothing above the
// kernels sees the layout.
//
// Thread safety: as KernelBackend (one call at a time).
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/dense_ops.h"
#include "kernels/host_glue.h"
#include "moeshard/kernels/kernel_backend.h"
#include "moeshard/kernels/kernel_context.h"

namespace moeshard::internal {

class CpuKernelBackend final : public KernelBackend {
 public:
  // kAuto: row groups on avx512-bf16 (where they are fastest); kRowGroups: on every instruction
  // set (each reads them; for tests); kRowMajor: never.
  enum class ExpertLayout { kAuto, kRowGroups, kRowMajor };

  // Settings "isa" and "expert-layout" (kernel_backend.h).
  static Result<std::unique_ptr<CpuKernelBackend>> Create(const KernelBackendOptions& options);

  const std::string& name() const override { return name_; }
  std::string Describe() const override;
  int num_threads() const override { return ctx_.num_threads(); }
  Result<KernelBuffer> Allocate(int64_t bytes) override;
  int64_t ScratchBytes() const override;
  Result<bool> PrepareExperts(const PrepareExpertsArgs& args) override;
  std::string PreparedLayout() const override;

  Status Route(const RoutingParams& params, const RoutingArgs& args) override;
  Status Permute(const PermuteParams& params, TokenPermutation* out) override;
  Status Gather(const TokenPermutation& perm, const GatherParams& params) override;
  Status ExpertGemm(const GroupedGemmParams& params) override;
  Status Unpermute(const TokenPermutation& perm, const UnpermuteParams& params) override;
  Status MoeExperts(const MoeExpertsParams& params) override;

  void Linear(const LinearArgs& args) override;
  void RmsNorm(const RmsNormArgs& args) override;
  void GatedMlp(const GatedMlpArgs& args) override;

  void ToExpertRows(const ExpertRowsArgs& args) override { HostToExpertRows(args); }
  void AddRows(const AddRowsArgs& args) override { HostAddRows(args); }
  void CopyRows(const CopyRowsArgs& args) override { HostCopyRows(args); }
  void Convert(const ConvertArgs& args) override { HostConvert(args); }

  KernelContext& context() { return ctx_; }

 private:
  CpuKernelBackend(KernelContext ctx, ExpertLayout layout)
      : ctx_(std::move(ctx)), layout_(layout) {}
  // `w` as the kernels must read it: with bf16_row_groups set, or sorted by group (act-order),
  // when PrepareExperts rewrote its tensors (a copy in `storage`), else `w` itself.
  const ExpertWeights* AsPrepared(const ExpertWeights* w, ExpertWeights* storage) const;
  // Whether bf16 experts go into row groups (the expert-layout setting and the instruction set).
  bool RowGroupsWanted() const;

  // One layer's experts PrepareExperts rewrote: into row groups, or (input_perm not empty) the
  // act-order experts sorted by group, with their input order.
  struct Prepared {
    const void* w13 = nullptr;
    const void* w2 = nullptr;
    std::vector<int32_t> input_perm;
    // The view's shape when prepared: a view of other experts at a reused address is not taken
    // for this layer.
    int64_t experts = 0, hidden = 0, intermediate = 0;
    WeightFormat format = WeightFormat::kBf16;
    bool Matches(const ExpertWeights& w) const {
      return w13 == w.w13 && w2 == w.w2 && experts == w.num_experts_local && hidden == w.hidden &&
             intermediate == w.intermediate && format == w.scheme.format;
    }
  };

  std::string name_ = "cpu";
  KernelContext ctx_;
  ExpertLayout layout_ = ExpertLayout::kAuto;
  DenseScratch dense_;
  // The tensors PrepareExperts rewrote, one entry per layer (in a deque: input_perm stays put).
  std::deque<Prepared> prepared_;
};

}  // namespace moeshard::internal
