// moeshard build: builds ranks' weights in memory exactly as the ShardPlan says -- from dummy
// weights, a Hugging Face checkpoint or a pre-sharded checkpoint -- and reports the measured
// allocation per category next to the plan's prediction. They must be equal: a mismatch is a
// moeshard bug and exits 5.
//
// Memory: one rank is resident at a time, except with --all-ranks when all of them fit in 80%
// of physical memory. --layers N builds only the first N MoE layers of each rank's stage (and
// the dense layers before them), so one rank of a multi-terabyte model fits in a few GiB; the
// plan's prediction is then restricted to the same layers.
//
// Exit status: 0 allocation equals the plan; 1 error (bad flags, checkpoint, out of memory);
// 5 allocation differs from the plan (a bug).
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/cli_common.h"
#include "cli/cli_progress.h"
#include "cli/command.h"
#include "moeshard/base/units.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/weights/loader.h"
#include "moeshard/weights/presharded.h"

namespace moeshard::cli {
namespace {

struct BuildFlags {
  PlanFlags plan;
  std::string checkpoint;
  std::string load_format = "auto";
  uint64_t seed = 0;
  int64_t rank = 0;
  bool all_ranks = false;
  int64_t layers = -1;
  int threads = 0;
  bool checksum = false;
  bool no_progress = false;
  bool no_fill = false;
  std::string format = "table";
};

// 64-bit digest of a rank's buffers (names, shapes and bytes), 8 bytes per step.
uint64_t Checksum(const RankWeights& w) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  auto mix = [&](uint64_t v) {
    h ^= v;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  };
  for (const TensorBuffer& t : w.tensors()) {
    for (char c : t.name) mix(static_cast<uint8_t>(c));
    for (int64_t d : t.shape) mix(static_cast<uint64_t>(d));
    const std::byte* p = t.data.data();
    const size_t n = t.data.size();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t v;
      std::memcpy(&v, p + i, 8);
      mix(v);
    }
    for (; i < n; ++i) mix(static_cast<uint8_t>(p[i]));
  }
  return h;
}

int64_t PhysicalMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<int64_t>(pages) * size : 0;
}

// One rank's allocation next to the plan's prediction: appends its text to `report` and
// returns its JSON; `*equal` says whether they agree.
nlohmann::json ReportRank(int64_t rank, int64_t world,
                          const std::map<TensorCategory, int64_t>& planned, const RankWeights& w,
                          const LoadStats& st, double secs, bool checksum, std::string* report,
                          bool* equal) {
  Table t({"category", "planned", "allocated", "bytes", "match"}, {true});
  nlohmann::json rj{{"rank", rank},
                    {"tensors", st.num_tensors},
                    {"seconds", secs},
                    {"bytes_read", st.bytes_read},
                    {"bytes_filled", st.bytes_filled}};
  int64_t plan_total = 0, alloc_total = 0;
  *equal = true;
  for (TensorCategory c : kAllCategories) {
    const int64_t p = planned.at(c), a = w.BytesOf(c);
    plan_total += p;
    alloc_total += a;
    if (p == 0 && a == 0) continue;
    *equal = *equal && p == a;
    t.Row({TensorCategoryName(c), FormatBytes(p), FormatBytes(a), FormatCount(a),
           p == a ? "ok" : "MISMATCH"});
    rj["categories"][TensorCategoryName(c)] = {{"planned", p}, {"allocated", a}};
  }
  *equal = *equal && plan_total == alloc_total && alloc_total == w.TotalBytes();
  t.Row({"total", FormatBytes(plan_total), FormatBytes(alloc_total), FormatCount(alloc_total),
         *equal ? "ok" : "MISMATCH"});
  rj["planned"] = plan_total;
  rj["allocated"] = alloc_total;
  rj["equal"] = *equal;
  *report += fmt::format(
      "\nrank {}/{}: {} tensors, {} allocated in {:.2f} s ({} filled, {} read "
      "from files)\n",
      rank, world, st.num_tensors, FormatBytes(alloc_total), secs, FormatBytes(st.bytes_filled),
      FormatBytes(st.bytes_read));
  if (checksum) {
    const std::string sum = fmt::format("{:016x}", Checksum(w));
    *report += fmt::format("  checksum {}\n", sum);
    rj["checksum"] = sum;
  }
  *report += t.Text();
  return rj;
}

// The source's tensors the plan does not place, and those not loaded (multi-token prediction).
void PrintSourceNotes(const WeightLoader& loader) {
  const std::vector<std::string>& unplaced = loader.unplaced_tensors();
  if (!unplaced.empty()) {
    std::fprintf(stderr,
                 "moeshard build: %zu checkpoint tensor%s not placed by the plan:", unplaced.size(),
                 unplaced.size() == 1 ? " is" : "s are");
    for (size_t i = 0; i < unplaced.size() && i < 20; ++i) {
      std::fprintf(stderr, "\n  %s", unplaced[i].c_str());
    }
    if (unplaced.size() > 20) std::fprintf(stderr, "\n  ... and %zu more", unplaced.size() - 20);
    std::fprintf(stderr, "\n");
  }
  if (const size_t mtp = loader.mtp_tensors().size(); mtp > 0) {
    std::fprintf(stderr,
                 "moeshard build: %zu multi-token-prediction tensor%s not loaded (engines load "
                 "them only for speculative decoding)\n",
                 mtp, mtp == 1 ? " is" : "s are");
  }
}

// What build makes: the ranks, their layers and the plan's prediction for them.
struct BuildTargets {
  std::vector<int64_t> ranks;
  std::vector<std::vector<int64_t>> layers;                // per rank
  std::vector<std::map<TensorCategory, int64_t>> planned;  // per rank
  int64_t total = 0, largest = 0;                          // planned bytes
};

Result<BuildTargets> Targets(const BuildFlags& f, const ShardPlan& plan) {
  const int64_t world = plan.topology.world;
  if (!f.all_ranks && (f.rank < 0 || f.rank >= world)) {
    return InvalidArgumentError(
        fmt::format("'--rank {}': expected a rank in [0, {}) (world size of {})", f.rank, world,
                    plan.topology.Label()));
  }
  if (f.layers == 0 || f.layers < -1) {
    return InvalidArgumentError(
        fmt::format("'--layers {}': expected a positive number of MoE layers", f.layers));
  }
  BuildTargets t;
  if (f.all_ranks) {
    for (int64_t r = 0; r < world; ++r) t.ranks.push_back(r);
  } else {
    t.ranks.push_back(f.rank);
  }
  for (int64_t r : t.ranks) {
    const RankPlan& rp = plan.ranks[static_cast<size_t>(r)];
    t.layers.push_back(LayersToBuild(plan, rp, f.layers));
    t.planned.push_back(PlannedBytesByCategory(rp, t.layers.back()));
    int64_t bytes = 0;
    for (const auto& [c, b] : t.planned.back()) bytes += b;
    t.total += bytes;
    t.largest = std::max(t.largest, bytes);
  }
  return t;
}

// "<model> (<family>): <topology> on N ranks; building ... from <source>", and what is left out.
void PrintBuildHeader(std::FILE* text, const BuildFlags& f, const ModelConfig& model,
                      const ShardPlan& plan, const BuildTargets& targets, bool resident,
                      const LoadOptions& o) {
  const int64_t world = plan.topology.world;
  std::fprintf(text, "%s (%s): %s on %lld rank%s; building %s from %s\n", model.name.c_str(),
               std::string(model.family_name()).c_str(), plan.topology.Label().c_str(),
               static_cast<long long>(world), world == 1 ? "" : "s",
               f.all_ranks ? fmt::format("all {} ranks{}", world,
                                         resident ? " (resident together)" : " (one at a time)")
                                 .c_str()
                           : fmt::format("rank {}", f.rank).c_str(),
               DescribeLoadSource(o).c_str());
  if (f.no_fill) {
    std::fprintf(text,
                 "--no-fill: buffers allocated and every checkpoint window mapped and "
                 "checked, no values generated or read\n");
  }
  if (f.layers > 0) {
    std::fprintf(text,
                 "only the first %lld MoE layer%s of each rank's stage and the dense layers "
                 "before them (layers %s of rank %lld); the plan's prediction is restricted to "
                 "the same layers\n",
                 static_cast<long long>(f.layers), f.layers == 1 ? "" : "s",
                 FormatRanges(targets.layers.front()).c_str(),
                 static_cast<long long>(targets.ranks.front()));
  }
}

int RunBuild(const BuildFlags& f) {
  const char* cmd = "build";
  if (f.format != "table" && f.format != "json") {
    return ReportError(
        cmd, InvalidArgumentError(fmt::format("'--format {}': expected table or json", f.format)));
  }
  Result<std::string> source = ParseLoadFormat(f.load_format, f.checkpoint);
  if (!source.ok()) return ReportError(cmd, source.status());
  Result<ModelConfig> model = LoadModelConfig(f.plan.model);
  if (!model.ok()) return ReportError(cmd, model.status());
  Result<PlanOptions> plan_options = ToPlanOptions(f.plan);
  if (!plan_options.ok()) return ReportError(cmd, plan_options.status());
  Result<ShardPlan> plan = BuildShardPlan(*model, *plan_options);
  if (!plan.ok()) return ReportError(cmd, plan.status());
  const int64_t world = plan->topology.world;
  Result<BuildTargets> targets = Targets(f, *plan);
  if (!targets.ok()) return ReportError(cmd, targets.status());
  const std::vector<int64_t>& ranks = targets->ranks;

  // Whether they fit in memory.
  const int64_t phys = PhysicalMemoryBytes();
  if (!f.no_fill && phys > 0 && targets->largest > phys * 9 / 10) {
    return ReportError(cmd, ResourceExhaustedError(fmt::format(
                                "one rank needs {} of weights{}, this machine has {} of memory "
                                "(build fewer layers with --layers N, e.g. --layers 1)",
                                FormatBytes(targets->largest),
                                f.layers > 0 ? fmt::format(" for {} MoE layers", f.layers) : "",
                                FormatBytes(phys))));
  }
  const bool resident = f.all_ranks && !f.no_fill && phys > 0 && targets->total <= phys * 8 / 10;

  ProgressBar bar("loading", targets->total, stderr, !f.no_progress && !f.no_fill);
  LoadOptions o;
  o.source = *source;
  o.seed = f.seed;
  o.checkpoint_dir = f.checkpoint;
  o.max_moe_layers = f.layers;
  o.num_threads = f.threads;
  o.fill = !f.no_fill;
  o.progress = [&bar](int64_t n) { bar.Add(n); };

  const bool json = f.format == "json";
  PrintBuildHeader(json ? stderr : stdout, f, *model, *plan, *targets, resident, o);

  Result<std::unique_ptr<WeightLoader>> loader = WeightLoader::Create(*plan, o);
  if (!loader.ok()) {
    bar.Finish();
    return ReportError(cmd, loader.status());
  }

  nlohmann::json out_json;
  out_json["model"] = model->name;
  out_json["topology"] = plan->topology.Label();
  out_json["source"] = DescribeLoadSource(o);
  out_json["layers_restricted_to"] = f.layers;
  out_json["unplaced_tensors"] = (*loader)->unplaced_tensors();
  out_json["mtp_tensors"] = (*loader)->mtp_tensors().size();
  out_json["ranks"] = nlohmann::json::array();
  bool all_equal = true;
  std::vector<RankWeights> kept;
  std::string report;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int64_t r = ranks[i];
    bar.SetStage(fmt::format("rank {}/{}", r, world));
    LoadStats st;
    const auto t0 = std::chrono::steady_clock::now();
    Result<RankWeights> w = (*loader)->Load(r, &st);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!w.ok()) {
      bar.Finish();
      return ReportError(cmd, w.status());
    }
    bool equal = true;
    out_json["ranks"].push_back(
        ReportRank(r, world, targets->planned[i], *w, st, secs, f.checksum, &report, &equal));
    all_equal = all_equal && equal;
    if (resident) kept.push_back(std::move(w).value());
  }
  bar.Finish();
  out_json["equal"] = all_equal;
  if (json) {
    std::printf("%s\n", out_json.dump(2).c_str());
  } else {
    std::fputs(report.c_str(), stdout);
    if (resident) {
      int64_t bytes = 0;
      for (const RankWeights& w : kept) bytes += w.TotalBytes();
      std::printf("\nall %lld ranks resident together: %s\n", static_cast<long long>(world),
                  FormatBytes(bytes).c_str());
    }
  }
  PrintSourceNotes(**loader);
  if (!all_equal) {
    std::fprintf(stderr,
                 "moeshard build: error: allocated bytes differ from the plan's prediction "
                 "(a moeshard bug: please report it with this command line)\n");
    return 5;
  }
  return 0;
}

MOESHARD_REGISTER_COMMAND(
    build,
    CommandSpec{
        .name = "build",
        .description = "build ranks' weights in memory (dummy, checkpoint or pre-sharded) and "
                       "check the allocation against the plan",
        .order = 50,
        .setup = [](CLI::App* sub) -> CommandRunner {
          auto f = std::make_shared<BuildFlags>();
          AddPlanFlags(sub, &f->plan);
          sub->add_option("--checkpoint", f->checkpoint,
                          "Hugging Face checkpoint (directory, index or .safetensors file), or a "
                          "pre-sharded directory written by `moeshard shard` (detected by its "
                          "manifest.json)");
          sub->add_option("--load-format", f->load_format, LoadFormatHelp());
          sub->add_option("--seed", f->seed, "dummy weights seed (default 0)");
          auto* rank = sub->add_option("--rank", f->rank, "the rank to build (default 0)");
          sub->add_flag("--all-ranks", f->all_ranks, "build every rank")->excludes(rank);
          sub->add_option("--layers", f->layers,
                          "build only the first N MoE layers of each rank's stage (and the dense "
                          "layers before them), to fit in memory");
          sub->add_option("--threads", f->threads, "loader threads (default: all cores)");
          sub->add_flag("--checksum", f->checksum,
                        "print a digest of each rank's buffers (equal digests: equal weights)");
          sub->add_flag("--no-progress", f->no_progress, "no progress bar");
          sub->add_flag(
              "--no-fill", f->no_fill,
              "allocate and map every buffer without generating or reading values (checks "
              "allocation == plan for any model in seconds; untouched pages cost no RAM)");
          sub->add_option("--format", f->format, "table (default) or json");
          return [f] { return RunBuild(*f); };
        }});

}  // namespace
}  // namespace moeshard::cli
