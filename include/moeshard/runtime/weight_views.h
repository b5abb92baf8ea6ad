// WeightViews: read-only views of the tensors one rank holds, by concrete name.
//
// The runtime executes a ShardPlan over weights it does not own: a RankWeights from the loader
// (ViewRankWeights), or any other storage that holds the plan's tensors with the plan's padded
// shapes (a test fixture, an mmap of a pre-sharded file). Views are non-owning: the storage
// must outlive every MoeRuntime built over it.
//
// Thread safety: plain values; immutable once built, share freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "moeshard/base/dtype.h"
#include "moeshard/base/status.h"

namespace moeshard {

class RankWeights;
struct ShardPlan;
class KernelContext;

struct WeightView {
  const std::byte* data =
      nullptr;  // the padded tensor, row-major (see bf16_row_groups), padding zero
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;  // padded (allocated) shape
  size_t num_bytes = 0;
  // Routed-expert bf16 matrices in the CPU kernels' row-group layout (kernels/expert_gemm.h)
  // instead of row-major; the runtime hands this on to the kernels.
  bool bf16_row_groups = false;

  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data);
  }
};

class WeightViews {
 public:
  // Adds (or replaces) the view of `name` ("model.layers.3.mlp.experts.w13_weight").
  void Add(std::string name, WeightView view) { views_[std::move(name)] = std::move(view); }
  // nullptr when absent.
  const WeightView* Find(std::string_view name) const;
  // The view of `name` with the expected dtype and shape; NotFound / InvalidArgument otherwise:
  // "runtime: 'model.layers.1.mlp.gate.weight': expected BF16 [16, 256], got F32 [16, 256]".
  Result<const WeightView*> Get(std::string_view name, DType dtype,
                                const std::vector<int64_t>& shape) const;
  size_t size() const { return views_.size(); }

 private:
  std::map<std::string, WeightView, std::less<>> views_;
};

// Views of every tensor of `weights` (which must outlive the views).
WeightViews ViewRankWeights(const RankWeights& weights);

// Rewrites the routed experts' bf16 w13/w2 tensors of `weights` in place into the row-group
// layout the AVX-512 kernels stream fastest (kernels/expert_gemm.h: the same bytes, so the
// plan's memory is unchanged) and marks them. Layers whose expert shape the layout cannot hold
// (H or I not a multiple of 16, interleaved gate/up) stay row-major. Returns how many layers
// were rewritten (in parallel over `ctx`'s pool). Call it right after loading, before making
// views or sharing the weights.
Result<int64_t> UseCpuRowGroupLayout(KernelContext& ctx, const ShardPlan& plan,
                                     RankWeights* weights);

}  // namespace moeshard
