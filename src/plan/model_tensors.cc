#include "plan/model_tensors.h"

namespace moeshard::internal {

std::vector<int64_t> StageLayers(int64_t num_layers, int64_t pp, int64_t stage) {
  std::vector<int64_t> sizes(static_cast<size_t>(pp), num_layers / pp);
  const int64_t rem = num_layers % pp;
  for (int64_t i = 2; i < rem + 2; ++i) sizes[static_cast<size_t>(pp - i)] += 1;
  int64_t begin = 0;
  for (int64_t s = 0; s < stage; ++s) begin += sizes[static_cast<size_t>(s)];
  std::vector<int64_t> out;
  for (int64_t i = 0; i < sizes[static_cast<size_t>(stage)]; ++i) out.push_back(begin + i);
  return out;
}

std::vector<TensorDef> PlanTensors(const ModelConfig& m, const PlanOptions& options, int64_t pp) {
  std::vector<TensorDef> out;
  for (TensorDef& t : m.family->tensors(m)) {
    // A tied head shares the embedding unless the last stage is another rank.
    if (!t.tied_source.empty() && pp == 1) continue;
    switch (t.role) {
      case TensorRole::kSharedGate:
      case TensorRole::kSharedUp:
      case TensorRole::kSharedDown:
        if (options.shared_experts == SharedExpertsMode::kReplicated) {
          t.split = TpSplit::kReplicated;
        }
        break;
      case TensorRole::kLatentDown:
        if (options.latent_proj == LatentProjMode::kSharded) t.split = TpSplit::kColumn;
        break;
      case TensorRole::kLatentUp:
        if (options.latent_proj == LatentProjMode::kSharded) t.split = TpSplit::kRow;
        break;
      case TensorRole::kOther:
      case TensorRole::kPreMoeNorm:
      case TensorRole::kRouter:
      case TensorRole::kRouterBias:
      case TensorRole::kCorrectionBias:
      case TensorRole::kHashTable:
      case TensorRole::kSharedGateProj:
      case TensorRole::kLatentNorm:
      case TensorRole::kExpertsW13:
      case TensorRole::kExpertsW2:
      case TensorRole::kExpertsW13Bias:
      case TensorRole::kExpertsW2Bias: break;
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace moeshard::internal
