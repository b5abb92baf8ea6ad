// What `moeshard run` builds from its flags before it runs, without printing: the plan (the
// kernels' backend for `auto`, or a pre-sharded directory's own) and the weight source, shared
// by the CLI and the Python module's Runtime (python/src/module.cc), so both run the same ranks
// and give the same errors.
#pragma once

#include <optional>
#include <string>

#include "cli/cli_common.h"
#include "moeshard/base/status.h"
#include "moeshard/config/model_config.h"
#include "moeshard/plan/shard_plan.h"
#include "moeshard/weights/loader.h"

namespace moeshard::cli {

struct RunSetup {
  ModelConfig model;
  ShardPlan plan;
  LoadOptions load;  // source, checkpoint_dir, seed
  // The single-rank reference's weights for a pre-sharded source (its origin); unset: `load`.
  std::optional<LoadOptions> reference_load;
};

// --load-format / --checkpoint / --seed and the plan flags as `moeshard run` reads them. The
// reference load is resolved only when `verify` (a pre-sharded directory names its origin).
Result<RunSetup> PrepareRun(const PlanFlags& plan, const std::string& load_format,
                            const std::string& checkpoint, uint64_t seed, bool verify);

}  // namespace moeshard::cli
