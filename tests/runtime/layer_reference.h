// The single-rank MoE layer of a model checked against an independent double-precision
// transcription of its formula (moe_runtime.h), with the weights found by role in the plan and
// the formats read from the config (layer_reference_test.cc). Shared with the regression tests.
#pragma once

#include <string>

#include "moeshard/config/model_config.h"

namespace moeshard {

// Plans `model` on one rank (moeshard-cpu), loads dummy weights for its `moe_layer_index`-th
// MoE layer (0: the first), runs the runtime on five tokens (with token ids, for layers that
// route by them) and compares with the reference (gtest assertions).
// The runtime runs on the kernel backend `kernel_backend` (kernel_backend.h) with its weight
// preparation; `row_groups`: on "cpu" with expert-layout row-groups, so the bf16 experts are
// rewritten into the CPU row-group layout after loading (on any instruction set).
void CheckLayerAgainstReference(const ModelConfig& model, bool row_groups = false,
                                int64_t moe_layer_index = 0,
                                const std::string& kernel_backend = "cpu");

}  // namespace moeshard
