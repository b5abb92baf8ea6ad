// The pre-sharded source (`--load-format presharded`): a directory written by `moeshard shard`
// (presharded.h), holding each rank's buffers in their padded shapes, so a rank is one
// whole-tensor read per buffer. It serves exactly the plan it was made for.
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "moeshard/weights/presharded.h"
#include "plan/plan_json.h"
#include "weights/presharded_manifest.h"
#include "weights/tensor_source.h"
#include "weights/weights_internal.h"

namespace moeshard::internal {
namespace {

using weights_internal::FormatDims;

// Reads are chunks of at most this many bytes, so one large buffer spreads over the threads.
constexpr int64_t kChunkBytes = int64_t{4} << 20;

// OK when the manifest's plan is `plan`; else names the first part that differs, in the order a
// user would fix it, and the fix.
Status CheckManifestPlan(const ShardPlan& plan, const nlohmann::json& manifest,
                         const std::string& dir) {
  const nlohmann::json want = ShardPlanToJson(plan, true);
  const nlohmann::json& got = manifest["plan"];
  if (got == want) return Status::Ok();
  for (const char* key :
       {"model", "topology", "backend", "padding_policy", "routed_experts", "ranks", "notes"}) {
    const nlohmann::json a = want.value(key, nlohmann::json()),
                         b = got.value(key, nlohmann::json());
    if (a == b) continue;
    std::string fix = "pass the model and flags it was sharded with; see its manifest.json";
    if (std::string_view(key) == "backend") {
      fix = fmt::format("pass --moe-backend {}, or shard it again for {}",
                        b.value("name", std::string("?")), plan.backend.name);
    }
    auto brief = [](const nlohmann::json& j) {
      std::string t = j.dump();
      return t.size() > 160 ? t.substr(0, 157) + "..." : t;
    };
    return InvalidArgumentError(fmt::format(
        "load: pre-sharded checkpoint '{}' was made for a different plan: '{}': expected {} "
        "(this plan: {} {}), got {} ({})",
        dir, key, brief(a), plan.model.name, plan.topology.Label(), brief(b), fix));
  }
  return InvalidArgumentError(
      fmt::format("load: pre-sharded checkpoint '{}': made for a different plan than {} {} (see "
                  "its manifest.json)",
                  dir, plan.model.name, plan.topology.Label()));
}

class PreshardedSource final : public TensorSource {
 public:
  static Result<std::unique_ptr<TensorSource>> Open(const ShardPlan& plan,
                                                    const LoadOptions& options) {
    MOESHARD_ASSIGN_OR_RETURN(nlohmann::json manifest,
                              ReadPreshardedManifest(options.checkpoint_dir));
    MOESHARD_RETURN_IF_ERROR(CheckManifestPlan(plan, manifest, options.checkpoint_dir));
    return std::unique_ptr<TensorSource>(new PreshardedSource(options.checkpoint_dir));
  }

  Result<FillStats> Fill(const RankFill& fill) const override {
    const ShardPlan& plan = *fill.plan;
    const std::vector<MappedTensor>& tensors = *fill.tensors;
    const std::string path =
        (std::filesystem::path(dir_) / PreshardedRankFileName(fill.rank, plan.topology.world))
            .string();
    MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
    MOESHARD_RETURN_IF_ERROR(CheckRankFile(fill, *file, path));
    // Whole tensors, in chunks of kChunkBytes.
    std::vector<std::pair<int, int64_t>> chunks;
    for (size_t i = 0; i < tensors.size(); ++i) {
      for (int64_t off = 0; off < tensors[i].buffer_bytes; off += kChunkBytes) {
        chunks.emplace_back(static_cast<int>(i), off);
      }
    }
    MOESHARD_RETURN_IF_ERROR(ParallelForStatus(
        *fill.pool, static_cast<int64_t>(chunks.size()), [&](int64_t c) -> Status {
          const auto [i, off] = chunks[static_cast<size_t>(c)];
          const MappedTensor& t = tensors[static_cast<size_t>(i)];
          const int64_t n = std::min(kChunkBytes, t.buffer_bytes - off);
          MOESHARD_RETURN_IF_ERROR(
              file->ReadRange(*file->Find(t.name), off,
                              std::span<std::byte>(fill.dst[static_cast<size_t>(i)] + off,
                                                   static_cast<size_t>(n))));
          fill.report(n);
          return Status::Ok();
        }));
    return FillStats{.bytes_read = file->bytes_read(),
                     .num_source_tensors = static_cast<int64_t>(tensors.size())};
  }

 private:
  explicit PreshardedSource(std::string dir) : dir_(std::move(dir)) {}

  // Every buffer of the rank is in its file as the plan shapes it (and, when every layer is
  // built, nothing else is).
  static Status CheckRankFile(const RankFill& fill, const SafetensorsFile& file,
                              const std::string& path) {
    const std::string tag = RankTag(*fill.plan, fill.rank);
    for (const MappedTensor& t : *fill.tensors) {
      const TensorInfo* info = file.Find(t.name);
      if (info == nullptr) {
        return NotFoundError(fmt::format(
            "{} load: '{}' in {}: missing (a pre-sharded file of another plan, or a damaged one)",
            tag, t.name, path));
      }
      if (info->dtype != t.shard->dtype || info->shape != t.shard->padded_shape) {
        return DataLossError(
            fmt::format("{} load: '{}' in {}: {} {} does not match the plan's {} {}", tag, t.name,
                        path, DTypeName(info->dtype), FormatDims(info->shape),
                        DTypeName(t.shard->dtype), FormatDims(t.shard->padded_shape)));
      }
    }
    if (fill.all_layers && file.tensors().size() != fill.tensors->size()) {
      return DataLossError(fmt::format("{} load: {}: expected {} tensors, got {}", tag, path,
                                       fill.tensors->size(), file.tensors().size()));
    }
    return Status::Ok();
  }

  std::string dir_;
};

}  // namespace

TensorSourceFormat PreshardedSourceFormat() {
  return {
      .name = LoadOptions::Source::kPresharded,
      .layout = SourceLayout::kRankTensors,
      .reads_checkpoint = true,
      .auto_claims = [](const std::string& dir) { return !dir.empty() && IsPreshardedDir(dir); },
      .auto_help = "presharded for a directory written by `moeshard shard`",
      .describe =
          [](const LoadOptions& o) {
            return fmt::format("pre-sharded checkpoint {}", o.checkpoint_dir);
          },
      .open = PreshardedSource::Open,
  };
}

}  // namespace moeshard::internal
