// The architecture formulas: every logical tensor of a model (name, shape, dtype, how it is
// split over attention TP, which layers carry it), before any rank is chosen. Routed experts
// are not listed here; shard_plan.cc lays them out from the padding contract.
//
// Quantized linear weights are listed once with `quant` set; the per-rank expansion adds the
// scale tensor whose shape follows from the local weight shape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moeshard/config/model_config.h"
#include "moeshard/plan/shard_plan.h"

namespace moeshard::internal {

enum class Split {
  kReplicated,  // every rank of the stage holds all of it
  kColumn,      // dim 0 split over attention TP (column-parallel linear, vocab-parallel embedding)
  kRow,         // dim 1 split over attention TP (row-parallel linear)
  kKvColumn,    // dim 0 split over TP in units of head_dim; replicated when kv heads < TP
};

enum class Where { kLayers, kFirstStage, kLastStage };

struct LogicalTensor {
  std::string name;  // "{layer}" placeholder for per-layer tensors
  TensorCategory category = TensorCategory::kAttention;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;  // [out, in] for linear weights
  Split split = Split::kReplicated;
  int64_t unit = 1;  // split granularity along the split dim (kKvColumn: head_dim)
  QuantMethod quant = QuantMethod::kNone;  // linear weight quantized with this method
  Where where = Where::kLayers;
  std::vector<int64_t> layers;  // for kLayers
};

// Every non-routed tensor of the model. `options` decides shared-expert and latent-projection
// splits.
std::vector<LogicalTensor> EnumerateTensors(const ModelConfig& model, const PlanOptions& options,
                                            int64_t pp);

// Quantized storage of a linear weight [out, in]: the weight tensor and its scale tensor.
struct QuantStorage {
  DType weight_dtype;
  std::vector<int64_t> weight_shape;
  DType scale_dtype;
  std::vector<int64_t> scale_shape;  // empty: no scale tensor
  std::string scale_suffix;          // "weight_scale_inv", "weight_scale"
  std::string weight_suffix;         // "weight", "weight_packed"
};
QuantStorage QuantizedLinear(QuantMethod method, const QuantizationConfig& quant,
                             const std::vector<int64_t>& shape, DType model_dtype);

// Layers of pipeline stage `stage` (vLLM get_pp_indices: even split, the remainder going to
// the stages before the last).
std::vector<int64_t> StageLayers(int64_t num_layers, int64_t pp, int64_t stage);

}  // namespace moeshard::internal
