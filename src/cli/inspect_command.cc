// moeshard inspect FILE|DIR: validates a safetensors file or sharded checkpoint from its headers
// alone, lists its tensors, and summarises the structure their names reveal (layers, routed
// experts per layer, fused experts, quantization scheme, bytes per dtype).
//
// Only headers are read (SafetensorsAccess::kHeaderOnly), so a multi-terabyte checkpoint is
// inspected in the time it takes to read a few kilobytes per shard. Exit status: 0 when every
// file is valid, 1 with the first violation otherwise.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "moeshard/base/units.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/plan/checkpoint_sizing.h"
#include "moeshard/weights/checkpoint.h"
#include "moeshard/weights/tensor_names.h"

namespace moeshard::cli {
namespace {

struct InspectFlags {
  std::string path;
  std::string format = "table";
  bool summary_only = false;
};

// Natural order: "layers.2" < "layers.10".
bool NaturalLess(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const bool da = a[i] >= '0' && a[i] <= '9';
    const bool db = b[j] >= '0' && b[j] <= '9';
    if (da && db) {
      size_t ie = i, je = j;
      while (ie < a.size() && a[ie] >= '0' && a[ie] <= '9') ++ie;
      while (je < b.size() && b[je] >= '0' && b[je] <= '9') ++je;
      // Compare by value: strip leading zeros, then length, then digits.
      std::string_view na = a.substr(i, ie - i), nb = b.substr(j, je - j);
      while (na.size() > 1 && na[0] == '0') na.remove_prefix(1);
      while (nb.size() > 1 && nb[0] == '0') nb.remove_prefix(1);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ie, j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "0-2,5,7-9" for sorted distinct values.
std::string Ranges(const std::vector<int64_t>& values) {
  std::string out;
  for (size_t i = 0; i < values.size();) {
    size_t k = i;
    while (k + 1 < values.size() && values[k + 1] == values[k] + 1) ++k;
    if (!out.empty()) out += ',';
    out += k == i ? fmt::format("{}", values[i]) : fmt::format("{}-{}", values[i], values[k]);
    i = k + 1;
  }
  return out;
}

// layer groups by expert count: {256: [3..60]}.
std::map<int64_t, std::vector<int64_t>> LayersByExpertCount(const CheckpointStructure& s) {
  std::map<int64_t, std::vector<int64_t>> groups;
  for (const auto& [layer, n] : s.experts_per_layer) groups[n].push_back(layer);
  return groups;
}

nlohmann::json StructureJson(const CheckpointStructure& s) {
  nlohmann::json j;
  j["num_tensors"] = s.num_tensors;
  j["total_bytes"] = s.total_bytes;
  j["num_layers"] = s.num_layers;
  j["max_layer_idx"] = s.max_layer_idx ? nlohmann::json(*s.max_layer_idx) : nlohmann::json();
  j["num_moe_layers"] = s.num_moe_layers();
  j["experts_per_layer"] = nlohmann::json::object();
  for (const auto& [layer, n] : s.experts_per_layer)
    j["experts_per_layer"][fmt::format("{}", layer)] = n;
  j["fused_experts"] = s.fused_experts;
  j["gate_up_fused"] = s.gate_up_fused;
  j["shared_experts"] = s.shared_experts;
  j["quantization"] = nlohmann::json::array();
  for (ExpertQuantization q : s.quantization)
    j["quantization"].push_back(ExpertQuantizationName(q));
  j["bytes_by_dtype"] = nlohmann::json::object();
  for (const auto& [d, b] : s.bytes_by_dtype) {
    j["bytes_by_dtype"][std::string(DTypeName(d))] = {{"tensors", s.tensors_by_dtype.at(d)},
                                                      {"bytes", b}};
  }
  return j;
}

// With a config.json beside the checkpoint: every tensor matched against the family
// descriptor's names, dtypes' bytes charged by category on one rank (the whole model).
struct FamilyMatch {
  bool present = false;
  std::string family;
  std::string error;  // config or plan error
  CheckpointSizing sizing;
};

FamilyMatch MatchFamily(const std::string& path, const Checkpoint& ckpt) {
  FamilyMatch out;
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  if (!fs::exists(dir / "config.json", ec)) return out;
  out.present = true;
  Result<ModelConfig> model = LoadModelConfigFile((dir / "config.json").string());
  if (!model.ok()) {
    out.error = model.status().message();
    return out;
  }
  out.family = std::string(model->family_name());
  PlanOptions o;
  o.backend = "moeshard-cpu";  // one rank, no backend padding: the checkpoint as stored
  Result<ShardPlan> plan = BuildShardPlan(*model, o);
  if (!plan.ok()) {
    out.error = plan.status().message();
    return out;
  }
  std::vector<CheckpointTensorInfo> tensors;
  for (const auto& [name, e] : ckpt.tensors()) {
    tensors.push_back({name, e.info->dtype, e.info->shape, e.info->num_bytes()});
  }
  out.sizing = SizeFromCheckpoint(*plan, tensors);
  return out;
}

std::string FamilyText(const FamilyMatch& m) {
  if (!m.present) return "";
  if (!m.error.empty()) return fmt::format("\nfamily: config.json does not plan: {}\n", m.error);
  const CheckpointSizing& s = m.sizing;
  std::string out = fmt::format(
      "\nfamily {} (config.json): {} of {} tensors placed by the descriptor, {} of {}\n", m.family,
      FormatCount(s.num_tensors - static_cast<int64_t>(s.unplaced.size()) - s.mtp_tensors),
      FormatCount(s.num_tensors), FormatBytes(s.placed_bytes), FormatBytes(s.total_bytes));
  Table t({"category", "bytes", ""}, {true});
  for (size_t c = 0; c < kNumCategories; ++c) {
    const int64_t b = s.rank_bytes[0][c];
    if (b > 0) t.Row({TensorCategoryName(kAllCategories[c]), FormatCount(b), FormatBytes(b)});
  }
  out += t.Text();
  if (s.mtp_tensors > 0) {
    out += fmt::format(
        "  multi-token prediction layer(s) {}: {} tensors, {} (loaded only for speculative "
        "decoding)\n",
        Ranges(s.mtp_layers), s.mtp_tensors, FormatBytes(s.mtp_bytes));
  }
  for (size_t i = 0; i < s.unplaced.size() && i < 20; ++i) {
    out += fmt::format("  not in the {} descriptor: {}\n", m.family, s.unplaced[i]);
  }
  if (s.unplaced.size() > 20) out += fmt::format("  ... and {} more\n", s.unplaced.size() - 20);
  return out;
}

int RunInspect(const InspectFlags& f) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "moeshard inspect: error: %s\n", s.message().c_str());
    return 1;
  };
  if (f.format != "table" && f.format != "json") {
    return fail(InvalidArgumentError(
        fmt::format("inspect: '--format {}': expected table or json", f.format)));
  }
  Result<std::unique_ptr<Checkpoint>> opened =
      Checkpoint::Open(f.path, SafetensorsAccess::kHeaderOnly);
  if (!opened.ok()) return fail(opened.status());
  const Checkpoint& ckpt = **opened;

  std::vector<const Checkpoint::Entry*> entries;
  std::vector<const TensorInfo*> infos;
  for (const auto& [name, e] : ckpt.tensors()) entries.push_back(&e);
  std::sort(entries.begin(), entries.end(),
            [](const auto* a, const auto* b) { return NaturalLess(a->info->name, b->info->name); });
  for (const auto* e : entries) infos.push_back(e->info);
  const CheckpointStructure s = SummarizeCheckpoint(infos);
  const FamilyMatch family = MatchFamily(f.path, ckpt);

  if (f.format == "json") {
    nlohmann::json j;
    j["path"] = ckpt.path();
    j["valid"] = true;
    j["indexed"] = ckpt.index().has_value();
    j["shards"] = nlohmann::json::array();
    for (int i = 0; i < ckpt.num_shards(); ++i) {
      const SafetensorsFile& shard = ckpt.shard(i);
      j["shards"].push_back({{"path", shard.path()},
                             {"file_bytes", shard.header().file_size()},
                             {"header_bytes", shard.header().header_bytes},
                             {"num_tensors", shard.tensors().size()},
                             {"metadata", shard.header().metadata}});
    }
    if (!f.summary_only) {
      j["tensors"] = nlohmann::json::array();
      for (const auto* e : entries) {
        j["tensors"].push_back({{"name", e->info->name},
                                {"dtype", std::string(DTypeName(e->info->dtype))},
                                {"shape", e->info->shape},
                                {"bytes", e->info->num_bytes()},
                                {"shard", BaseName(e->file->path())}});
      }
    }
    j["structure"] = StructureJson(s);
    if (family.present) {
      nlohmann::json fj{{"family", family.family}, {"error", family.error}};
      if (family.error.empty()) {
        fj["placed_bytes"] = family.sizing.placed_bytes;
        fj["unplaced"] = family.sizing.unplaced;
        fj["mtp_tensors"] = family.sizing.mtp_tensors;
        for (size_t c = 0; c < kNumCategories; ++c) {
          fj["bytes"][TensorCategoryName(kAllCategories[c])] = family.sizing.rank_bytes[0][c];
        }
      }
      j["family"] = fj;
    }
    j["warnings"] = ckpt.warnings();
    // Names may hold any UTF-8 (validated when parsed), so dumping cannot throw; replace anyway.
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }

  std::string out = fmt::format("{}: valid safetensors checkpoint, {} shard{}{}, {} tensors, {}\n",
                                ckpt.path(), ckpt.num_shards(), ckpt.num_shards() == 1 ? "" : "s",
                                ckpt.index() ? " (indexed)" : "", FormatCount(s.num_tensors),
                                FormatBytes(s.total_bytes));
  if (!f.summary_only && !entries.empty()) {
    const bool many_shards = ckpt.num_shards() > 1;
    std::vector<std::string> header = {"tensor", "dtype", "shape", "bytes"};
    if (many_shards) header.emplace_back("shard");
    Table table(header, {true, true, true, false, true});
    for (const auto* e : entries) {
      std::vector<std::string> row = {e->info->name, std::string(DTypeName(e->info->dtype)),
                                      ShapeText(e->info->shape), FormatCount(e->info->num_bytes())};
      if (many_shards) row.push_back(BaseName(e->file->path()));
      table.Row(std::move(row));
    }
    out += "\n" + table.Text();
  }

  out += "\nstructure:\n";
  if (s.num_layers > 0) {
    out += fmt::format("  layers            {} (model.layers.N, max index {})\n", s.num_layers,
                       *s.max_layer_idx);
  } else {
    out += "  layers            none found (no 'layers.N' in tensor names)\n";
  }
  if (s.experts_per_layer.empty()) {
    out += "  routed experts    none found (no 'experts.N' or fused experts tensors)\n";
  } else {
    for (const auto& [n, layers] : LayersByExpertCount(s)) {
      out += fmt::format("  routed experts    {} per layer in {} layer{} ({})\n", n, layers.size(),
                         layers.size() == 1 ? "" : "s", Ranges(layers));
    }
  }
  out += fmt::format("  fused experts     {}{}\n", s.fused_experts ? "yes" : "no",
                     s.gate_up_fused ? " (gate_up_proj fused)" : "");
  out += fmt::format("  shared experts    {}\n", s.shared_experts ? "yes" : "no");
  std::vector<std::string> quant;
  for (ExpertQuantization q : s.quantization) quant.emplace_back(ExpertQuantizationName(q));
  out += fmt::format("  quantization      {}\n",
                     quant.empty() ? "none recognised" : fmt::format("{}", fmt::join(quant, ", ")));
  out += "\n";
  Table dtypes({"dtype", "tensors", "bytes", ""}, {true});
  for (const auto& [d, b] : s.bytes_by_dtype) {
    dtypes.Row({std::string(DTypeName(d)), FormatCount(s.tensors_by_dtype.at(d)), FormatCount(b),
                FormatBytes(b)});
  }
  out += dtypes.Text();
  out += FamilyText(family);
  for (const std::string& w : ckpt.warnings()) out += fmt::format("\nwarning: {}\n", w);
  std::fputs(out.c_str(), stdout);
  return 0;
}

MOESHARD_REGISTER_COMMAND(
    inspect,
    CommandSpec{
        .name = "inspect",
        .description = "validate a safetensors file or checkpoint directory and list its tensors",
        .order = 40,
        .setup = [](CLI::App* sub) -> CommandRunner {
          auto f = std::make_shared<InspectFlags>();
          sub->add_option("path", f->path,
                          "a .safetensors file, an index .json, or a checkpoint directory")
              ->required();
          sub->add_option("--format", f->format, "table (default) or json");
          sub->add_flag("--summary", f->summary_only, "omit the per-tensor listing");
          return [f] { return RunInspect(*f); };
        }});

}  // namespace
}  // namespace moeshard::cli
