#include "cli/run_api.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/weights/presharded.h"
#include "weights/presharded_manifest.h"

namespace moeshard::cli {

Result<RunSetup> PrepareRun(const PlanFlags& flags, const std::string& load_format,
                            const std::string& checkpoint, uint64_t seed, bool verify) {
  RunSetup s;
  MOESHARD_ASSIGN_OR_RETURN(s.model, LoadModelConfig(flags.model));
  Result<std::string> source = ParseLoadFormat(load_format, checkpoint);
  if (!source.ok()) return source.status().WithContext("run");
  PlanFlags pf = flags;
  if (pf.backend == "auto") {
    // The kernels this binary runs; a pre-sharded directory holds the layout of the backend it
    // was sharded for, so take that one.
    pf.backend = "moeshard-cpu";
    if (*source == LoadOptions::Source::kPresharded) {
      MOESHARD_ASSIGN_OR_RETURN(auto manifest, ReadPreshardedManifest(checkpoint));
      pf.backend = manifest["plan"].value("/backend/name"_json_pointer, pf.backend);
    }
  }
  MOESHARD_ASSIGN_OR_RETURN(PlanOptions options, ToPlanOptions(pf));
  MOESHARD_ASSIGN_OR_RETURN(s.plan, BuildShardPlan(s.model, options));
  s.load.source = *source;
  s.load.checkpoint_dir = checkpoint;
  s.load.seed = seed;
  if (*source == LoadOptions::Source::kPresharded && verify) {
    MOESHARD_ASSIGN_OR_RETURN(s.reference_load, PreshardedOrigin(checkpoint));
  }
  return s;
}

}  // namespace moeshard::cli
