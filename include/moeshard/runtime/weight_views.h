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
class KernelBackend;

struct WeightView {
  const std::byte* data = nullptr;  // the padded tensor, row-major, padding zero
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;  // padded (allocated) shape
  size_t num_bytes = 0;

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

// Offers every MoE layer's routed-expert tensors of `weights` to `backend` for its in-place
// weight preparation (KernelBackend::PrepareExperts: the CPU backend rewrites bf16 experts into
// the row-group layout its AVX-512 kernels stream fastest, the same bytes, so the plan's memory
// is unchanged). Returns how many layers the backend rewrote. Call it right after loading,
// before making views or sharing the weights, and run the runtime on the same backend.
Result<int64_t> PrepareExpertWeights(KernelBackend& backend, const ShardPlan& plan,
                                     RankWeights* weights);
}  // namespace moeshard
