// moeshard sweep: every valid topology for some GPU counts, one row each with per-GPU weights,
// KV capacity, padding waste and fit; optional SVG plot of weights per GPU against GPU count.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "cli/plan_api.h"
#include "moeshard/base/units.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/plan/invariants.h"
#include "moeshard/plan/memory.h"

namespace moeshard::cli {
namespace {

struct SweepFlags {
  PlanFlags plan;
  MemoryFlags memory;
  SweepOptions sweep;
  std::string format = "table";
  std::string svg;
};

using Row = SweepRow;

std::string Svg(const std::vector<Row>& rows, const std::string& title, double budget_gib) {
  // Weight memory per GPU (GiB, y) against GPU count (log2, x); one polyline per strategy.
  const double W = 900, H = 520, left = 70, right = 230, top = 50, bottom = 60;
  std::map<std::string, std::vector<const Row*>> lines;
  int64_t gmin = INT64_MAX, gmax = 0;
  double ymax = budget_gib;
  for (const Row& r : rows) {
    lines[r.strategy].push_back(&r);
    gmin = std::min(gmin, r.gpus);
    gmax = std::max(gmax, r.gpus);
    ymax = std::max(ymax, r.weights / double(kGiB));
  }
  ymax *= 1.1;
  const double lx0 = std::log2(double(gmin)), lx1 = std::max(lx0 + 1, std::log2(double(gmax)));
  auto X = [&](int64_t g) {
    return left + (std::log2(double(g)) - lx0) / (lx1 - lx0) * (W - left - right);
  };
  auto Y = [&](double gib) { return H - bottom - gib / ymax * (H - top - bottom); };
  static const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                  "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939",
                                  "#8c6d31", "#843c39", "#7b4173", "#3182bd"};
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
      "fill=\"white\"/>\n<text x=\"{}\" y=\"25\" font-size=\"15\">{}</text>\n",
      W, H, left, title);
  // Axes, ticks and grid.
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", left,
                   H - bottom, W - right);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", left,
                   top, H - bottom);
  for (int64_t g = gmin; g <= gmax; g *= 2) {
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", X(g),
                     H - bottom + 18, g);
  }
  const double step = ymax > 400 ? 100 : ymax > 200 ? 50 : ymax > 80 ? 20 : 10;
  for (double y = 0; y <= ymax; y += step) {
    s += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n",
                     left, Y(y), W - right, Y(y));
    s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:g}</text>\n", left - 6,
                     Y(y) + 4, y);
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">GPUs</text>\n",
                   (left + W - right) / 2, H - 15);
  s += fmt::format(
      "<text transform=\"translate(18,{}) rotate(-90)\" text-anchor=\"middle\">weights "
      "per GPU (GiB)</text>\n",
      (top + H - bottom) / 2);
  if (budget_gib > 0) {
    s += fmt::format(
        "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"red\" "
        "stroke-dasharray=\"6,4\"/>\n<text x=\"{}\" y=\"{:.1f}\" fill=\"red\">GPU "
        "budget {:.0f} GiB</text>\n",
        left, Y(budget_gib), W - right, Y(budget_gib), left + 6, Y(budget_gib) - 5, budget_gib);
  }
  int i = 0;
  for (const auto& [name, pts] : lines) {
    const char* color = kColors[i % 16];
    std::string path;
    for (const Row* r : pts)
      path += fmt::format("{:.1f},{:.1f} ", X(r->gpus), Y(r->weights / double(kGiB)));
    s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n",
                     color, path);
    for (const Row* r : pts) {
      s += fmt::format(
          "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"><title>{}: {} GiB "
          "per GPU</title></circle>\n",
          X(r->gpus), Y(r->weights / double(kGiB)), color, r->label, FormatGiB(r->weights));
    }
    const double ly = top + 10 + 18 * i;
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"3\"/>"
        "<text x=\"{4}\" y=\"{5}\">{6}</text>\n",
        W - right + 15, ly, W - right + 40, color, W - right + 46, ly + 4, name);
    ++i;
  }
  return s + "</svg>\n";
}

int RunSweep(const SweepFlags& f) {
  Result<SweepSetup> setup = PrepareSweep(f.plan, f.memory, f.sweep);
  if (!setup.ok()) return ReportError("sweep", setup.status());
  if (f.format != "table" && f.format != "json" && f.format != "markdown" && f.format != "csv") {
    return ReportError("sweep",
                       InvalidArgumentError(fmt::format(
                           "'--format {}': expected table, json, markdown or csv", f.format)));
  }
  const ModelConfig* model = &setup->model;
  const MemoryOptions* mem = &setup->memory;
  const std::vector<Row> rows = ComputeSweepRows(*setup, f.sweep);

  if (f.format == "json") {
    std::printf("%s\n", SweepRowsToJson(rows).dump(2).c_str());
  } else {
    Table t({"GPUs", "topology", "strategy", "I raw->padded", "weights/GPU", "routed/GPU",
             "padding/GPU", "KV tokens", "fits"},
            {false, true, true});
    for (const Row& r : rows) {
      t.Row({std::to_string(r.gpus), r.label, r.strategy,
             fmt::format("{}->{}", r.i_raw, r.i_padded), FormatBytes(r.weights),
             FormatBytes(r.routed), FormatBytes(r.waste), FormatCount(r.kv_tokens),
             r.fits ? "yes" : "no"});
    }
    if (f.format == "csv") {
      std::printf(
          "gpus,topology,strategy,i_raw,i_padded,weights_per_gpu,routed_per_gpu,padding_per_gpu,kv_"
          "tokens,fits\n");
      for (const Row& r : rows) {
        std::printf("%lld,%s,%s,%lld,%lld,%lld,%lld,%lld,%lld,%d\n", (long long)r.gpus,
                    r.label.c_str(), r.strategy.c_str(), (long long)r.i_raw, (long long)r.i_padded,
                    (long long)r.weights, (long long)r.routed, (long long)r.waste,
                    (long long)r.kv_tokens, r.fits ? 1 : 0);
      }
    } else {
      // SGLang's default fraction depends on the topology: each row takes its own.
      const std::string fraction =
          mem->gpu_memory_utilization > 0
              ? fmt::format("{:g}% utilization", mem->gpu_memory_utilization * 100)
              : "the engine's default fraction for each topology";
      std::printf("%s%s on %s: %zu topologies (GPU counts %s; KV tokens at %s KV cache, %s)\n\n",
                  f.format == "markdown" ? "### " : "", model->name.c_str(),
                  mem->gpu.description.c_str(), rows.size(), f.sweep.gpus.c_str(),
                  f.memory.kv_cache_dtype.c_str(), fraction.c_str());
      std::fputs(f.format == "markdown" ? t.Markdown().c_str() : t.Text().c_str(), stdout);
    }
  }
  if (!f.svg.empty()) {
    const double budget = mem->gpu.bytes * mem->gpu_memory_utilization / double(kGiB);
    const std::string title =
        fmt::format("{}: weight memory per GPU ({}, {})", model->name,
                    WeightFormatName(model->quant.scheme.format), mem->gpu.description);
    Status s = WriteFileAtomic(f.svg, Svg(rows, title, budget));
    if (!s.ok()) return ReportError("sweep", s);
    std::fprintf(stderr, "wrote %s\n", f.svg.c_str());
  }
  return 0;
}

MOESHARD_REGISTER_COMMAND(
    sweep,
    CommandSpec{
        .name = "sweep",
        .description = "every valid topology for some GPU counts: weights, KV tokens, padding, fit",
        .order = 20,
        .setup = [](CLI::App* sub) -> CommandRunner {
          auto f = std::make_shared<SweepFlags>();
          AddPlanFlags(sub, &f->plan);
          AddMemoryFlags(sub, &f->memory);
          sub->add_option("--gpus", f->sweep.gpus,
                          "GPU counts, comma-separated (default 8,16,32,64)");
          sub->add_flag("--with-pp", f->sweep.pp, "include pipeline-parallel topologies");
          sub->add_flag("--fits-only", f->sweep.fits_only, "only topologies that fit");
          sub->add_option("--strategy", f->sweep.strategy,
                          "only strategies whose name contains this");
          sub->add_option("--sort", f->sweep.sort, "gpus (default), weights, kv or waste");
          sub->add_option("--format", f->format, "table (default), json, markdown or csv");
          sub->add_option("--svg", f->svg,
                          "write a plot of weight memory per GPU to this SVG file");
          return [f] { return RunSweep(*f); };
        }});

}  // namespace
}  // namespace moeshard::cli
