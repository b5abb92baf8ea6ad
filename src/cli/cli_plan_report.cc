#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <map>

#include "cli/plan_report.h"
#include "moeshard/base/units.h"
#include "moeshard/config/config_loader.h"
#include "moeshard/weights/checkpoint.h"

namespace moeshard::cli {

Result<PlanInputs> LoadPlanInputs(const PlanFlags& plan, const MemoryFlags& memory) {
  PlanInputs in;
  MOESHARD_ASSIGN_OR_RETURN(in.model, LoadModelConfig(plan.model));
  MOESHARD_ASSIGN_OR_RETURN(in.plan_options, ToPlanOptions(plan));
  MOESHARD_ASSIGN_OR_RETURN(in.memory_options, ToMemoryOptions(memory));
  FollowGpu(in.memory_options, &in.plan_options);
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(plan.model, ec)) {
    bool has_weights = fs::exists(fs::path(plan.model) / "model.safetensors.index.json", ec);
    for (const auto& e : fs::directory_iterator(plan.model, ec)) {
      has_weights = has_weights || e.path().extension() == ".safetensors";
    }
    if (has_weights) {
      // Headers only: a 1.5 TB checkpoint is sized from a few kilobytes per shard.
      const auto start = std::chrono::steady_clock::now();
      MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt,
                                Checkpoint::Open(plan.model, SafetensorsAccess::kHeaderOnly));
      auto tensors = std::make_shared<std::vector<CheckpointTensorInfo>>();
      for (const auto& [name, entry] : ckpt->tensors()) {
        tensors->push_back(CheckpointTensorInfo{name, entry.info->dtype, entry.info->shape,
                                                entry.info->num_bytes()});
      }
      in.checkpoint_tensors = tensors;
      in.checkpoint_shards = ckpt->num_shards();
      in.header_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      in.checkpoint = plan.model;
    }
  }
  return in;
}

void ApplyCheckpointSizing(const ShardPlan& plan, PlanInputs& in) {
  if (in.checkpoint.empty()) return;
  const CheckpointSizing sizing = SizeFromCheckpoint(plan, *in.checkpoint_tensors);
  in.unplaced_tensors = sizing.unplaced;
  in.mtp_tensors = sizing.mtp_tensors;
  in.mtp_bytes = sizing.mtp_bytes;
  in.mtp_layers = sizing.mtp_layers;
  // The memory model sizes every plan it evaluates (this one, and the advice search's) from
  // the same headers.
  in.memory_options.checkpoint_tensors = in.checkpoint_tensors;
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankPlan& r : plan.ranks) {
    // Exact checkpoint bytes of the slices the rank holds, plus the padding the plan adds.
    int64_t padding = 0;
    for (const TensorShard& s : r.tensors) padding += s.padding_bytes;
    const int64_t bytes = sizing.RankTotal(r.coords.rank) + padding;
    nlohmann::json cats;
    for (size_t c = 0; c < kNumCategories; ++c) {
      cats[TensorCategoryName(kAllCategories[c])] = sizing.rank_bytes[r.coords.rank][c];
    }
    ranks.push_back({{"rank", r.coords.rank},
                     {"weights_from_headers", bytes},
                     {"weights_from_config", r.WeightBytes()},
                     {"by_category", cats}});
  }
  in.checkpoint_json = {{"path", in.checkpoint},
                        {"shards", in.checkpoint_shards},
                        {"tensors", sizing.num_tensors},
                        {"bytes", sizing.total_bytes},
                        {"placed_bytes", sizing.placed_bytes},
                        {"header_seconds", in.header_seconds},
                        {"unplaced", sizing.unplaced},
                        {"mtp",
                         {{"layers", sizing.mtp_layers},
                          {"tensors", sizing.mtp_tensors},
                          {"bytes", sizing.mtp_bytes}}},
                        {"ranks", ranks}};
}

namespace {

std::string Render(const Table& t, bool md) { return md ? t.Markdown() + "\n" : t.Text(); }

std::string Heading(const std::string& s, bool md) { return md ? "### " + s + "\n\n" : s + "\n"; }

// The title: model, topology, MoE group, backend, policies and parameter counts.
std::string RenderTitle(const ShardPlan& plan, bool md) {
  const ModelConfig& m = plan.model;
  const ResolvedTopology& t = plan.topology;
  std::string out;
  const ParamCounts params = CountParams(plan);
  out += fmt::format("{}{} ({}): {} on {} rank{}; MoE group {} = moe_tp {} x moe_ep {}\n",
                     md ? "## " : "", m.name, m.family_name(), t.Label(), t.world,
                     t.world == 1 ? "" : "s", t.group, t.moe_tp, t.moe_ep);
  out += fmt::format(
      "{}backend {} ({}{} experts), padding policy {}, placement {}, parameters {:.1f}B total / "
      "{:.1f}B active\n\n",
      md ? "\n" : "", plan.backend.name, WeightFormatName(plan.expert_scheme.format),
      plan.expert_scheme.act_order ? " act-order" : "", PaddingPolicyName(plan.options.padding),
      ExpertPlacementName(plan.options.placement), params.total / 1e9, params.active / 1e9);

  return out;
}

// The routed experts' dims (logical -> raw local -> padded local) and which experts each kind
// of rank holds.
std::string RenderExpertLayout(const ShardPlan& plan,
                               const std::vector<std::vector<int64_t>>& rank_kinds, bool md) {
  const ModelConfig& m = plan.model;
  std::string out;
  // Routed-expert layout: logical -> raw local -> padded local.
  out += Heading(
      fmt::format(
          "Routed experts: {} MoE layers x {} experts ({} slots), top-{}{}", m.num_moe_layers(),
          m.num_experts, plan.num_slots, m.num_experts_per_tok,
          m.latent_moe ? fmt::format(", latent width {}", m.routed_expert_hidden_size) : ""),
      md);
  Table dims(
      {"dimension", "logical", "split", "raw local", "floor", "align", "padded local", "padding"},
      {true});
  auto dim_row = [&](const char* name, const DimLayout& d) {
    dims.Row({name, std::to_string(d.logical), std::to_string(d.divisor),
              std::to_string(d.raw_local), d.floor ? std::to_string(d.floor) : "-",
              std::to_string(d.align), std::to_string(d.padded_local),
              std::to_string(d.padding())});
  };
  dim_row("intermediate (I)", plan.intermediate);
  dim_row(m.latent_moe ? "hidden (latent)" : "hidden (H)", plan.hidden);
  out += Render(dims, md);
  out += "\n";

  Table kinds({"ranks", "experts/rank", "expert ids (rank 1st of kind)", "routed bytes/rank",
               "padding bytes/rank"},
              {true, false, true});
  for (const auto& ranks : rank_kinds) {
    const RankPlan& r = plan.ranks[ranks.front()];
    std::vector<int64_t> ids = r.expert_slots;
    kinds.Row({FormatRanges(ranks), std::to_string(r.expert_slots.size()),
               ids.size() > 12 ? FormatRanges(ids).substr(0, 40) : FormatRanges(ids),
               FormatBytes(r.BytesOf(TensorCategory::kRoutedExperts)),
               FormatBytes(r.PaddingBytesOf(TensorCategory::kRoutedExperts))});
  }
  out += Render(kinds, md);
  out += "\n";

  return out;
}

// The tensors of the first rank of each kind (or of the requested rank / all tensors).
std::string RenderRankTensors(const ShardPlan& plan,
                              const std::vector<std::vector<int64_t>>& rank_kinds,
                              const ReportOptions& ro, bool md) {
  const ModelConfig& m = plan.model;
  std::string out;
  std::vector<int64_t> shown;
  if (ro.rank >= 0) {
    shown.push_back(ro.rank);
  } else {
    for (const auto& ranks : rank_kinds) shown.push_back(ranks.front());
  }
  for (int64_t rank : shown) {
    const RankPlan& r = plan.ranks[rank];
    out += Heading(
        fmt::format("Rank {} {} tensors (per layer; x{} layers)", rank,
                    ro.all_tensors || ro.rank >= 0 ? "all" : "routed-expert", m.num_moe_layers()),
        md);
    Table tt({"tensor", "dtype", "logical", "local (raw)", "padded", "bytes", "padding"},
             {true, true, true, true, true});
    for (const TensorShard& s : r.tensors) {
      if (!(ro.all_tensors || ro.rank >= 0) && s.category != TensorCategory::kRoutedExperts)
        continue;
      tt.Row({s.name, std::string(DTypeName(s.dtype)), FormatShape(s.logical_shape),
              FormatShape(s.local_shape), FormatShape(s.padded_shape),
              FormatBytes(s.bytes / s.count()), FormatBytes(s.padding_bytes / s.count())});
    }
    out += Render(tt, md);
    out += "\n";
  }

  return out;
}

// Memory per rank by category, KV cache and fit; identical ranks grouped.
std::string RenderMemory(const ShardPlan& plan, const MemoryPlan& mem, bool md) {
  std::string out;
  const MemoryOptions& mo = mem.options;
  out += Heading(
      fmt::format("Memory per GPU: {} ({} GiB, {}) x {} utilization = {} GiB; KV "
                  "cache {}, max_model_len {}, concurrent_seqs {} per DP rank",
                  mo.gpu.description, FormatGiB(mo.gpu.bytes), mo.gpu.nvlink ? "NVLink" : "PCIe",
                  FormatFraction(mo.gpu_memory_utilization),
                  FormatGiB(mem.ranks.empty() ? 0 : mem.ranks[0].budget),
                  mem.kv_dtype_bytes == 1 ? "fp8" : "bf16", FormatCount(mem.max_model_len),
                  mo.max_num_seqs),
      md);
  std::vector<std::string> header = {"ranks"};
  std::vector<TensorCategory> cats;
  for (TensorCategory c : kAllCategories) {
    bool any = false;
    for (const RankPlan& r : plan.ranks) any = any || r.BytesOf(c) > 0;
    if (any) {
      cats.push_back(c);
      header.emplace_back(TensorCategoryName(c));
    }
  }
  for (const char* h : {"weights", "activ.", "overhead", "KV cache", "KV tokens", "free", "fits"}) {
    header.emplace_back(h);
  }
  Table mt(header, {true});
  std::map<std::vector<std::string>, std::vector<int64_t>> groups;
  std::vector<std::vector<std::string>> order;
  for (const RankPlan& r : plan.ranks) {
    const RankMemory& rm = mem.ranks[r.coords.rank];
    std::vector<std::string> row;
    for (TensorCategory c : cats) row.push_back(FormatGiB(r.BytesOf(c)));
    row.push_back(FormatGiB(rm.weights));
    row.push_back(FormatGiB(rm.activations));
    row.push_back(FormatGiB(rm.overhead));
    row.push_back(FormatGiB(std::max<int64_t>(rm.kv_cache, 0)));
    row.push_back(FormatCount(rm.kv_tokens == INT64_MAX ? 0 : rm.kv_tokens));
    row.push_back(FormatGiB(rm.free));
    row.emplace_back(rm.fits ? "yes" : "NO");
    if (!groups.count(row)) order.push_back(row);
    groups[row].push_back(r.coords.rank);
  }
  for (const auto& row : order) {
    std::vector<std::string> full = {FormatRanges(groups[row])};
    full.insert(full.end(), row.begin(), row.end());
    mt.Row(full);
  }
  out += Render(mt, md);
  out +=
      fmt::format("{}(GiB; weights include quantization scales and padding)\n", md ? "\n" : "  ");
  out += RenderMemoryTerms(mem, md);
  return out;
}

// What the checkpoint's headers said: sizes, multi-token prediction layers, unplaced tensors.
std::string RenderCheckpoint(const PlanInputs& in) {
  std::string out;
  const nlohmann::json& c = in.checkpoint_json;
  out += fmt::format(
      "\ncheckpoint {}: {} tensors, {} in {} shard(s), headers read in {:.3f} s; per-rank "
      "weights above are exact from the headers (config formulas for rank 0: {})\n",
      in.checkpoint, c["tensors"].get<int64_t>(), FormatBytes(c["bytes"].get<int64_t>()),
      c["shards"].get<int64_t>(), in.header_seconds,
      FormatBytes(c["ranks"][0]["weights_from_config"].get<int64_t>()));
  if (in.mtp_tensors > 0) {
    out += fmt::format(
        "multi-token prediction layer{} {}: {} tensors, {} (engines load them only for "
        "speculative decoding; not planned)\n",
        in.mtp_layers.size() == 1 ? "" : "s", FormatRanges(in.mtp_layers), in.mtp_tensors,
        FormatBytes(in.mtp_bytes));
  }
  if (in.unplaced_tensors.empty()) {
    out += "every checkpoint tensor is placed\n";
  } else {
    out += fmt::format("warning: {} checkpoint tensor(s) have no place in this plan:\n",
                       in.unplaced_tensors.size());
    for (size_t i = 0; i < in.unplaced_tensors.size() && i < 20; ++i) {
      out += "  " + in.unplaced_tensors[i] + "\n";
    }
    if (in.unplaced_tensors.size() > 20) {
      out +=
          fmt::format("  ... and {} more (see --format json)\n", in.unplaced_tensors.size() - 20);
    }
  }
  return out;
}

}  // namespace

std::string RenderPlanReport(const ShardPlan& plan, const MemoryPlan& mem, const PlanInputs& in,
                             const ReportOptions& ro) {
  const bool md = ro.markdown;
  const MemoryOptions& mo = mem.options;
  std::string out = RenderTitle(plan, md);
  const std::vector<std::vector<int64_t>> rank_kinds = plan.RoutedRankKinds();
  out += RenderExpertLayout(plan, rank_kinds, md);
  out += RenderRankTensors(plan, rank_kinds, ro, md);
  out += RenderMemory(plan, mem, md);
  for (const std::string& n : plan.notes) out += fmt::format("note: {}\n", n);
  if (!in.checkpoint.empty()) out += RenderCheckpoint(in);
  if (mem.fits) {
    out += fmt::format("\nFITS: every rank holds its weights and {} x {} tokens of KV cache.\n",
                       mo.max_num_seqs, FormatCount(mem.max_model_len));
  } else {
    out += fmt::format("\nDOES NOT FIT: {}\n", mem.failure);
  }
  return out;
}

}  // namespace moeshard::cli
