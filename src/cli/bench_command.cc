// `moeshard bench`: performance measurements, reported as fractions of the machine's limits.
//
//   moeshard bench kernels   CPU MoE kernels vs read bandwidth / bf16 dot-product peak
//
// `bench` is a CLI11 subcommand holding one sub-subcommand per suite. A suite is one Setup*
// function below that adds its sub-app and returns its runner; adding a suite (e.g. `bench run`
// for the sharded runtime) is one more function and one more line in kSuites.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/command.h"
#include "moeshard/base/cpu_info.h"
#include "moeshard/base/units.h"
#include "moeshard/kernels/kernel_bench.h"
#include "moeshard/kernels/kernel_context.h"
#include "moeshard/kernels/roofline.h"

namespace moeshard::cli {
namespace {

// ---- bench kernels ----------------------------------------------------------------------------

struct KernelsFlags {
  std::vector<int64_t> tokens;
  std::vector<std::string> shapes;
  std::vector<std::string> formats = {"bf16", "bf16-rg", "mxfp4"};
  int threads = 0;
  std::string isa = "auto";
  std::string versus;             // A/B: a second variant, run alternately on every case
  bool int8_activations = false;  // KernelContextOptions::int8_activations (both variants)
  std::string json;
  bool quick = false;
  double min_time = 0.5;
};

std::string ReadFirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

Result<WeightFormat> ParseFormat(const std::string& s) {
  static const std::map<std::string, WeightFormat> kFormats = {
      {"bf16", WeightFormat::kBf16},    {"bf16-rg", WeightFormat::kBf16},
      {"fp8", WeightFormat::kFp8Block}, {"mxfp4", WeightFormat::kMxfp4},
      {"int4", WeightFormat::kInt4},    {"int4-zp", WeightFormat::kInt4Zp},
      {"nvfp4", WeightFormat::kNvfp4}};
  auto it = kFormats.find(s);
  if (it == kFormats.end()) {
    return InvalidArgumentError(fmt::format(
        "bench kernels: '--formats': expected bf16, bf16-rg, fp8, mxfp4, int4, int4-zp or nvfp4, "
        "got '{}'",
        s));
  }
  return it->second;
}

// The benchmark's cases from the flags: tokens, shapes, formats and bf16 layouts.
Result<KernelBenchOptions> KernelBenchOptionsOf(const KernelsFlags& f) {
  KernelBenchOptions o;
  if (f.quick) {
    o.tokens = {1, 8, 512};
    o.min_seconds = 0.05;
    o.min_repetitions = 2;
  }
  if (!f.tokens.empty()) o.tokens = f.tokens;
  o.min_seconds = f.quick ? o.min_seconds : f.min_time;
  for (int64_t t : o.tokens) {
    if (t < 1) {
      return InvalidArgumentError(
          fmt::format("bench kernels: '--tokens': expected positive counts, got {}", t));
    }
  }
  if (!f.shapes.empty()) {
    std::vector<KernelBenchShape> chosen;
    for (const std::string& name : f.shapes) {
      const auto all = DefaultKernelBenchShapes();
      auto it = std::find_if(all.begin(), all.end(),
                             [&](const KernelBenchShape& s) { return s.name == name; });
      if (it == all.end()) {
        std::string names;
        for (const auto& s : all) names += (names.empty() ? "" : ", ") + s.name;
        return InvalidArgumentError(
            fmt::format("bench kernels: '--shapes': unknown shape '{}' (known: {})", name, names));
      }
      chosen.push_back(*it);
    }
    o.shapes = chosen;
  }
  o.formats.clear();
  o.bf16_row_groups.clear();
  for (const std::string& s : f.formats) {
    MOESHARD_ASSIGN_OR_RETURN(WeightFormat fmt_, ParseFormat(s));
    if (std::find(o.formats.begin(), o.formats.end(), fmt_) == o.formats.end()) {
      o.formats.push_back(fmt_);
    }
  }
  // bf16 layouts: row-major first (the weights are repacked in place for row groups).
  for (const char* s : {"bf16", "bf16-rg"}) {
    if (std::find(f.formats.begin(), f.formats.end(), s) != f.formats.end()) {
      o.bf16_row_groups.push_back(std::string(s) == "bf16-rg");
    }
  }
  return o;
}

// One `bench kernels` run: its cases' results and the machine around them.
struct KernelRun {
  const char* peak = nullptr;  // the peak instruction's name
  std::string load_before, load_after;
  Roofline before, after, roof;  // roof: the run-wide best
  std::vector<KernelBenchResult> results;
};

// The A/B table (with --versus) and the results table, markdown.
void PrintKernelTables(const KernelRun& run, const KernelContext& ctx,
                       const std::optional<KernelContext>& versus) {
  const std::vector<KernelBenchResult>& results = run.results;
  if (versus) {
    fmt::print(
        "| shape | format | tokens | {} ms | {} ms | {} / {} (median of pairs) |\n"
        "|---|---|--:|--:|--:|--:|\n",
        CpuIsaName(ctx.isa()), CpuIsaName(versus->isa()), CpuIsaName(versus->isa()),
        CpuIsaName(ctx.isa()));
    for (const KernelBenchResult& r : results) {
      fmt::print("| {} | {} | {} | {:.3f} | {:.3f} | {:.2f} |\n", r.shape, KernelBenchFormatName(r),
                 r.num_tokens, r.seconds * 1e3, r.versus_seconds * 1e3, r.versus_ratio);
    }
    fmt::print("\n");
  }
  fmt::print(
      "| shape | format | tokens | experts | weights MB | time ms | route ms | GB/s | GFLOP/s "
      "| roofline ms | bound | of roofline | of run-best |\n"
      "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|\n");
  for (const KernelBenchResult& r : results) {
    fmt::print(
        "| {} | {} | {} | {:.1f} | {:.1f} | {:.3f} | {:.3f} | {:.1f} | {:.0f} | {:.3f} | {} | "
        "{:.1f}% | {:.1f}% |\n",
        r.shape, KernelBenchFormatName(r), r.num_tokens, r.experts_touched, r.weight_bytes / 1e6,
        r.seconds * 1e3, r.routing_seconds * 1e3, r.roofline.read_bytes_per_s / 1e9,
        r.roofline.peak_flops_per_s / 1e9, std::max(r.memory_seconds, r.compute_seconds) * 1e3,
        r.bound, r.fraction * 100, r.fraction_of_run_best * 100);
  }
}

// The run as JSON at `path` (written to path.tmp, then renamed).
Status WriteKernelJson(const std::string& path, const KernelRun& run, const KernelContext& ctx,
                       const std::optional<KernelContext>& versus) {
  const char* peak = run.peak;
  const std::string& load_before = run.load_before;
  const std::string& load_after = run.load_after;
  const Roofline& before = run.before;
  const Roofline& after = run.after;
  const Roofline& roof = run.roof;
  const std::vector<KernelBenchResult>& results = run.results;
  nlohmann::json j;
  j["machine"] = {{"cpu", CpuDescription()},
                  {"threads", ctx.num_threads()},
                  {"isa", CpuIsaName(ctx.isa())},
                  {"int8_activations", ctx.int8_activations()},
                  {"int8_isa", ctx.int8_activations() ? CpuIsaName(ctx.int8_isa()) : ""},
                  {"peak_instruction", peak},
                  {"loadavg_before", load_before},
                  {"loadavg_after", load_after}};
  j["roofline"] = {{"read_bytes_per_s", roof.read_bytes_per_s},
                   {"peak_flops_per_s", roof.peak_flops_per_s},
                   {"before",
                    {{"read_bytes_per_s", before.read_bytes_per_s},
                     {"peak_flops_per_s", before.peak_flops_per_s}}},
                   {"after",
                    {{"read_bytes_per_s", after.read_bytes_per_s},
                     {"peak_flops_per_s", after.peak_flops_per_s}}}};
  j["results"] = nlohmann::json::array();
  for (const KernelBenchResult& r : results) {
    j["results"].push_back({{"shape", r.shape},
                            {"format", KernelBenchFormatName(r)},
                            {"tokens", r.num_tokens},
                            {"repetitions", r.repetitions},
                            {"experts_touched", r.experts_touched},
                            {"weight_bytes", r.weight_bytes},
                            {"flops", r.flops},
                            {"seconds", r.seconds},
                            {"routing_seconds", r.routing_seconds},
                            {"memory_seconds", r.memory_seconds},
                            {"compute_seconds", r.compute_seconds},
                            {"bound", r.bound},
                            {"roofline_read_bytes_per_s", r.roofline.read_bytes_per_s},
                            {"roofline_peak_flops_per_s", r.roofline.peak_flops_per_s},
                            {"fraction_of_roofline", r.fraction},
                            {"fraction_of_run_best_roofline", r.fraction_of_run_best}});
    if (versus) {
      j["results"].back()["versus"] = {{"isa", CpuIsaName(versus->isa())},
                                       {"seconds", r.versus_seconds},
                                       {"ratio", r.versus_ratio}};
    }
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) {
      return InvalidArgumentError(fmt::format("bench kernels: '--json': cannot write '{}'", path));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return InvalidArgumentError(fmt::format("bench kernels: '--json': cannot write '{}'", path));
  }
  fmt::print("wrote {}\n", path);
  return Status::Ok();
}

Status RunKernels(const KernelsFlags& f) {
  MOESHARD_ASSIGN_OR_RETURN(KernelBenchOptions o, KernelBenchOptionsOf(f));
  KernelContextOptions co;
  co.num_threads = f.threads;
  MOESHARD_ASSIGN_OR_RETURN(co.isa, ParseCpuIsa(f.isa));
  co.int8_activations = f.int8_activations;
  MOESHARD_ASSIGN_OR_RETURN(KernelContext ctx, KernelContext::Create(co));
  std::optional<KernelContext> versus;
  if (!f.versus.empty()) {
    KernelContextOptions vo = co;
    MOESHARD_ASSIGN_OR_RETURN(vo.isa, ParseCpuIsa(f.versus));
    MOESHARD_ASSIGN_OR_RETURN(KernelContext v, KernelContext::Create(vo));
    versus.emplace(std::move(v));
    o.versus = &*versus;
    fmt::print("A/B: every case also runs on {} alternately; ratio = its time / {}'s\n",
               CpuIsaName(versus->isa()), CpuIsaName(ctx.isa()));
  }

  const std::string load_before = ReadFirstLine("/proc/loadavg");
  const char* peak = ComputePeakInstruction(ctx);
  std::string int8;
  if (ctx.int8_activations()) {
    int8 = ctx.int8_isa() == ctx.isa()
               ? " with int8 activations"
               : fmt::format(" (MXFP4, int4 and NVFP4 experts with int8 activations on {})",
                             CpuIsaName(ctx.int8_isa()));
  }
  fmt::print(
      "machine: {}, {} threads, kernel variant {}{} (peak instruction {}), load average {}\n",
      CpuDescription(), ctx.num_threads(), CpuIsaName(ctx.isa()), int8, peak, load_before);
  // One read buffer for every roofline measurement of the run.
  MOESHARD_ASSIGN_OR_RETURN(const ReadBuffer read, ReadBuffer::Create(ctx, kGiB));
  MOESHARD_ASSIGN_OR_RETURN(const Roofline before, MeasureRoofline(ctx, read, 3));
  fmt::print("roofline before: read {:.2f} GB/s, {} peak {:.1f} GFLOP/s\n",
             before.read_bytes_per_s / 1e9, peak, before.peak_flops_per_s / 1e9);
  auto progress = [](const KernelBenchResult& r) {
    fmt::print("  {} {} tokens {}: {:.3f} ms\n", r.shape, KernelBenchFormatName(r), r.num_tokens,
               r.seconds * 1e3);
    std::fflush(stdout);
  };
  MOESHARD_ASSIGN_OR_RETURN(std::vector<KernelBenchResult> results,
                            RunKernelBench(ctx, o, read, before, progress));
  MOESHARD_ASSIGN_OR_RETURN(const Roofline after, MeasureRoofline(ctx, read, 3));
  fmt::print("roofline after:  read {:.2f} GB/s, {} peak {:.1f} GFLOP/s\n",
             after.read_bytes_per_s / 1e9, peak, after.peak_flops_per_s / 1e9);
  // The run-wide best: the best of every measurement (before, after and around each case).
  Roofline roof = BestOf(before, after);
  for (const KernelBenchResult& r : results) roof = BestOf(roof, r.roofline);
  ApplyRoofline(roof, &results);
  const std::string load_after = ReadFirstLine("/proc/loadavg");
  fmt::print(
      "\nroofline: measured around each case (GB/s, GFLOP/s columns); run-wide best: read "
      "bandwidth {:.2f} GB/s (1 GiB buffer), peak {:.1f} GFLOP/s ({} on registers); load "
      "average after: {}\n\n",
      roof.read_bytes_per_s / 1e9, roof.peak_flops_per_s / 1e9, peak, load_after);
  const KernelRun run{.peak = peak,
                      .load_before = load_before,
                      .load_after = load_after,
                      .before = before,
                      .after = after,
                      .roof = roof,
                      .results = std::move(results)};
  PrintKernelTables(run, ctx, versus);
  if (!f.json.empty()) MOESHARD_RETURN_IF_ERROR(WriteKernelJson(f.json, run, ctx, versus));
  return Status::Ok();
}

CommandRunner SetupKernels(CLI::App* bench) {
  CLI::App* sub = bench->add_subcommand(
      "kernels",
      "CPU MoE kernels (expert GEMMs, activation, unpermute; routing separately) as fractions of "
      "the measured read bandwidth and bf16 dot-product peak");
  auto f = std::make_shared<KernelsFlags>();
  sub->add_option("--tokens", f->tokens, "token counts (default 1 8 32 128 512 2048)")
      ->delimiter(',');
  sub->add_option("--shapes", f->shapes,
                  "qwen3-30b-a3b, kimi-k2-32e, kimi-k3-latent-64e (default: all)")
      ->delimiter(',');
  sub->add_option("--formats", f->formats,
                  "bf16, bf16-rg (bf16 in the row-group layout), fp8, mxfp4, int4, int4-zp "
                  "(AWQ/GPTQ, group 128), nvfp4 (default bf16 bf16-rg mxfp4)")
      ->delimiter(',');
  sub->add_option("--threads", f->threads, "threads including the caller (0: all cores)");
  sub->add_option("--isa", f->isa,
                  "auto (default; or MOESHARD_CPU_ISA), avx512-bf16, avx512-vnni, avx512, "
                  "avx2-vnni, avx2, neon, sve or "
                  "portable: the kernel variant to measure");
  sub->add_option("--versus", f->versus,
                  "A/B mode: also run every case on this variant, alternately, and report the "
                  "median of the per-pair time ratios");
  sub->add_flag("--int8-activations", f->int8_activations,
                "quantize the inputs of MXFP4, int4 and NVFP4 experts to int8 per scale group "
                "(llama.cpp's q8_0 scale; opt-in, error up to max|x| / 254 per input)");
  sub->add_option("--min-time", f->min_time, "seconds per case (at least 3 repetitions)");
  sub->add_option("--json", f->json, "also write the results as JSON to this file");
  sub->add_flag("--quick", f->quick, "tokens 1, 8, 512 and short timing (a smoke run)");
  return [sub, f]() -> int {
    if (!sub->parsed()) return -1;
    const Status s = RunKernels(*f);
    if (!s.ok()) {
      std::fprintf(stderr, "moeshard bench kernels: error: %s\n", s.ToString().c_str());
      return 1;
    }
    return 0;
  };
}

// ---- registration -----------------------------------------------------------------------------

// Each suite adds its sub-app to `bench` and returns a runner that returns -1 when its sub-app
// was not selected.
using SuiteSetup = CommandRunner (*)(CLI::App* bench);
}  // namespace
// `bench run` (sharded runtime overhead) lives with `moeshard run` in run_command.cc.
CommandRunner SetupBenchRun(CLI::App* bench);
namespace {
constexpr SuiteSetup kSuites[] = {SetupKernels, SetupBenchRun};

MOESHARD_REGISTER_COMMAND(
    bench,
    CommandSpec{.name = "bench",
                .description = "measure kernels and layers as fractions of the machine's limits",
                .order = 80,
                .setup = [](CLI::App* bench) -> CommandRunner {
                  bench->require_subcommand(1);
                  auto runners = std::make_shared<std::vector<CommandRunner>>();
                  for (SuiteSetup setup : kSuites) runners->push_back(setup(bench));
                  return [runners]() -> int {
                    for (const CommandRunner& run : *runners) {
                      const int rc = run();
                      if (rc >= 0) return rc;
                    }
                    return 2;
                  };
                }});

}  // namespace
}  // namespace moeshard::cli
