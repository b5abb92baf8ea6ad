// moeshard shard: writes a pre-sharded checkpoint -- one safetensors file per rank holding the
// rank's buffers in their padded shapes, plus manifest.json with the plan, the model config
// and the topology flags -- that `moeshard build --checkpoint OUT` loads with one whole-tensor
// read per buffer. Ranks are built one at a time; the output directory appears only when every
// file is written (temp directory, then rename).
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli_common.h"
#include "cli/cli_progress.h"
#include "cli/command.h"
#include "moeshard/base/units.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/weights/loader.h"
#include "moeshard/weights/presharded.h"
#include "weights/presharded_manifest.h"

namespace moeshard::cli {
namespace {

struct ShardFlags {
  PlanFlags plan;
  std::string checkpoint;
  std::string load_format = "auto";
  uint64_t seed = 0;
  std::string out;
  int threads = 0;
  bool no_progress = false;
};

// The config.json text the model came from: the embedded preset, or the file.
nlohmann::json ModelConfigJson(const std::string& spec, const ModelConfig& m) {
  std::string text;
  for (const PresetInfo& p : ModelPresets()) {
    if (p.name == spec) text = std::string(p.json);
  }
  if (text.empty()) {
    std::ifstream in(m.source);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? nlohmann::json(text) : j;
}

int RunShard(const ShardFlags& f) {
  const char* cmd = "shard";
  // A pre-sharded directory holds one plan's ranks: it is not sharded again.
  Result<std::string> parsed =
      ParseLoadFormat(f.load_format, f.checkpoint, LoadFormatScope::kCheckpointTensors);
  if (!parsed.ok()) return ReportError(cmd, parsed.status());
  const std::string source = *parsed;
  Result<ModelConfig> model = LoadModelConfig(f.plan.model);
  if (!model.ok()) return ReportError(cmd, model.status());
  Result<PlanOptions> plan_options = ToPlanOptions(f.plan);
  if (!plan_options.ok()) return ReportError(cmd, plan_options.status());
  Result<ShardPlan> plan = BuildShardPlan(*model, *plan_options);
  if (!plan.ok()) return ReportError(cmd, plan.status());
  int64_t total = 0;
  for (const RankPlan& rp : plan->ranks) total += rp.WeightBytes();

  ProgressBar bar("sharding", total, stderr, !f.no_progress);
  LoadOptions o;
  o.source = source;
  o.seed = f.seed;
  o.checkpoint_dir = f.checkpoint;
  o.num_threads = f.threads;
  o.progress = [&bar](int64_t n) { bar.Add(n); };
  Result<std::unique_ptr<WeightLoader>> loader = WeightLoader::Create(*plan, o);
  if (!loader.ok()) return ReportError(cmd, loader.status());

  const PlanFlags& p = f.plan;
  WritePreshardedOptions wo;
  wo.extra["model"] = {{"spec", p.model},
                       {"name", model->name},
                       {"source", model->source},
                       {"config", ModelConfigJson(p.model, *model)}};
  wo.extra["topology_flags"] = {{"tensor_parallel_size", p.tp},
                                {"data_parallel_size", p.dp},
                                {"pipeline_parallel_size", p.pp},
                                {"pcp", p.pcp},
                                {"enable_expert_parallel", p.ep},
                                {"moe_tp", p.moe_tp},
                                {"moe_ep", p.moe_ep},
                                {"moe_backend", p.backend},
                                {"padding_policy", p.padding},
                                {"expert_placement", p.placement},
                                {"num_redundant_experts", p.num_redundant_experts},
                                {"shared_experts", p.shared_experts},
                                {"latent_proj", p.latent_proj}};
  // Where the weights came from, absolute, so `run --verify` can check the shards against it.
  std::error_code ec;
  wo.extra["source"] = {
      {"load_format", source},
      {"checkpoint",
       f.checkpoint.empty() ? std::string() : std::filesystem::absolute(f.checkpoint, ec).string()},
      {"seed", f.seed}};
  wo.extra["unplaced_tensors"] = (*loader)->unplaced_tensors();
  int64_t written = 0;
  wo.on_rank = [&](int64_t rank, const LoadStats& st) {
    written += st.bytes_allocated;
    bar.SetStage(fmt::format("rank {}/{}", rank + 1, plan->topology.world));
  };
  bar.SetStage(fmt::format("rank 0/{}", plan->topology.world));
  const Status s = WritePreshardedCheckpoint(**loader, f.out, wo);
  bar.Finish();
  if (!s.ok()) return ReportError(cmd, s);
  std::printf("wrote %s: %lld rank files (%s of weights, %s) and %s for %s %s\n", f.out.c_str(),
              static_cast<long long>(plan->topology.world), FormatBytes(written).c_str(),
              PreshardedRankFileName(0, plan->topology.world).c_str(),
              std::string(kPreshardedManifestName).c_str(), model->name.c_str(),
              plan->topology.Label().c_str());
  std::printf(
      "load it with: moeshard build --model %s [the same topology flags] --checkpoint %s "
      "--all-ranks\n",
      p.model.c_str(), f.out.c_str());
  const auto& unplaced = (*loader)->unplaced_tensors();
  if (!unplaced.empty()) {
    std::fprintf(stderr,
                 "moeshard shard: %zu checkpoint tensor%s not placed by the plan "
                 "(listed in the manifest), e.g. %s\n",
                 unplaced.size(), unplaced.size() == 1 ? " is" : "s are", unplaced[0].c_str());
  }
  return 0;
}

MOESHARD_REGISTER_COMMAND(
    shard,
    CommandSpec{
        .name = "shard",
        .description = "write a pre-sharded checkpoint (one safetensors file per rank + manifest) "
                       "that `moeshard build` loads directly",
        .order = 80,
        .setup = [](CLI::App* sub) -> CommandRunner {
          auto f = std::make_shared<ShardFlags>();
          AddPlanFlags(sub, &f->plan);
          sub->add_option("--checkpoint", f->checkpoint,
                          "the Hugging Face checkpoint to shard (directory, index or file)");
          sub->add_option("--load-format", f->load_format,
                          LoadFormatHelp(LoadFormatScope::kCheckpointTensors));
          sub->add_option("--seed", f->seed, "dummy weights seed");
          sub->add_option("--out", f->out, "output directory (must not exist or be empty)")
              ->required();
          sub->add_option("--threads", f->threads, "loader threads (default: all cores)");
          sub->add_flag("--no-progress", f->no_progress, "no progress bar");
          return [f] { return RunShard(*f); };
        }});

}  // namespace
}  // namespace moeshard::cli
