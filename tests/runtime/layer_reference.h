// The single-rank MoE layer of a model checked against an independent double-precision
// transcription of its formula (moe_runtime.h), with the weights found by role in the plan and
// the formats read from the config (layer_reference_test.cc). Shared with the regression tests.
#pragma once

#include "moeshard/config/model_config.h"

namespace moeshard {

// Plans `model` on one rank (moeshard-cpu), loads dummy weights for its `moe_layer_index`-th
// MoE layer (0: the first), runs the runtime on five tokens (with token ids, for layers that
// route by them) and compares with the reference (gtest assertions).
// `row_groups`: bf16 experts rewritten into the CPU row-group layout after loading.
void CheckLayerAgainstReference(const ModelConfig& model, bool row_groups = false,
                                int64_t moe_layer_index = 0);

}  // namespace moeshard
