// Pre-sharded checkpoints: see moeshard/weights/presharded.h.
#include "moeshard/weights/presharded.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "base/check.h"
#include "moeshard/weights/safetensors_writer.h"
#include "plan/plan_json.h"
#include "weights/json_strict.h"
#include "weights/presharded_manifest.h"
#include "weights/tensor_source.h"
#include "weights/weights_internal.h"

namespace moeshard {
namespace fs = std::filesystem;
namespace {

constexpr int kManifestVersion = 1;
constexpr int64_t kManifestMaxBytes = int64_t{1} << 30;

// fsync a directory so a rename into it survives a crash.
void SyncDir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

std::string PreshardedRankFileName(int64_t rank, int64_t world) {
  return fmt::format("rank-{:05d}-of-{:05d}.safetensors", rank, world);
}

bool IsPreshardedDir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kPreshardedManifestName, ec);
}

Result<nlohmann::json> ReadPreshardedManifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kPreshardedManifestName).string();
  MOESHARD_ASSIGN_OR_RETURN(std::string text,
                            weights_internal::ReadWholeFile(path, kManifestMaxBytes));
  MOESHARD_ASSIGN_OR_RETURN(nlohmann::json j, weights_internal::ParseStrictJson(
                                                  text, "pre-sharded manifest '" + path + "'", 64));
  auto bad = [&](const std::string& what) {
    return DataLossError(fmt::format("pre-sharded manifest '{}': {}", path, what));
  };
  if (!j.is_object() || j.value("format", "") != kPreshardedFormat) {
    return bad(fmt::format("expected \"format\": \"{}\"", kPreshardedFormat));
  }
  if (!j.contains("version") || !j["version"].is_number_integer() ||
      j["version"].get<int>() != kManifestVersion) {
    return bad(fmt::format("expected version {}", kManifestVersion));
  }
  if (!j.contains("world") || !j["world"].is_number_integer() || j["world"].get<int64_t>() < 1) {
    return bad("expected a positive integer \"world\"");
  }
  if (!j.contains("plan") || !j["plan"].is_object()) return bad("expected a \"plan\" object");
  const int64_t world = j["world"].get<int64_t>();
  if (!j.contains("files") || !j["files"].is_array() ||
      static_cast<int64_t>(j["files"].size()) != world) {
    return bad(fmt::format("expected \"files\" to list {} rank files", world));
  }
  for (int64_t r = 0; r < world; ++r) {
    const nlohmann::json& f = j["files"][static_cast<size_t>(r)];
    if (!f.is_string() || f.get<std::string>() != PreshardedRankFileName(r, world)) {
      return bad(fmt::format("files[{}]: expected \"{}\", got {}", r,
                             PreshardedRankFileName(r, world), f.dump()));
    }
    std::error_code ec;
    if (!fs::is_regular_file(fs::path(dir) / f.get<std::string>(), ec)) {
      return NotFoundError(fmt::format("pre-sharded checkpoint '{}': rank file '{}' is missing",
                                       dir, f.get<std::string>()));
    }
  }
  return j;
}

Result<LoadOptions> PreshardedOrigin(const std::string& dir) {
  MOESHARD_ASSIGN_OR_RETURN(nlohmann::json j, ReadPreshardedManifest(dir));
  const std::string path = (fs::path(dir) / kPreshardedManifestName).string();
  const nlohmann::json src = j.value("source", nlohmann::json::object());
  if (!src.is_object() || !src.contains("load_format") || !src["load_format"].is_string()) {
    return DataLossError(fmt::format(
        "pre-sharded manifest '{}': 'source': expected the load format it was made from, got "
        "{} (written by an older moeshard shard? shard it again)",
        path, src.dump()));
  }
  // The source it was made from, through the registry (a source of whole checkpoint tensors).
  const std::string name = src["load_format"].get<std::string>();
  const internal::TensorSourceFormat* format = internal::FindTensorSourceFormat(name);
  const std::vector<const internal::TensorSourceFormat*> origins =
      internal::TensorSourceFormatsIn(LoadFormatScope::kCheckpointTensors);
  if (std::find(origins.begin(), origins.end(), format) == origins.end()) {
    return DataLossError(
        fmt::format("pre-sharded manifest '{}': 'source.load_format': expected {}, got \"{}\"",
                    path, internal::FormatNames(origins), name));
  }
  LoadOptions o;
  o.source = format->name;
  o.seed = src.value("seed", uint64_t{0});
  if (!format->reads_checkpoint) return o;
  o.checkpoint_dir = src.value("checkpoint", std::string());
  std::error_code ec;
  if (o.checkpoint_dir.empty() || !fs::exists(o.checkpoint_dir, ec)) {
    return NotFoundError(fmt::format(
        "pre-sharded checkpoint '{}': made from checkpoint '{}', which is not there (an "
        "independent check reads the original; --verify needs it)",
        dir, o.checkpoint_dir));
  }
  return o;
}

Status WritePreshardedCheckpoint(const WeightLoader& loader, const std::string& out_dir,
                                 const WritePreshardedOptions& options) {
  const ShardPlan& plan = loader.plan();
  MOESHARD_CHECK(loader.options().max_moe_layers < 0, "pre-sharding a subset of the layers");
  const fs::path out(out_dir);
  std::error_code ec;
  if (fs::exists(out, ec)) {
    if (!fs::is_directory(out, ec) || !fs::is_empty(out, ec)) {
      return FailedPreconditionError(fmt::format(
          "shard: '--out {}': expected a new or empty directory, got an existing {} (remove it "
          "or choose another path)",
          out_dir, fs::is_directory(out, ec) ? "non-empty directory" : "file"));
    }
  }
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec)) {
    return NotFoundError(fmt::format("shard: '--out {}': parent directory '{}' does not exist",
                                     out_dir, parent.string()));
  }
  const fs::path tmp = fs::path(out.string() + fmt::format(".tmp.{}", ::getpid()));
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec)) {
    return FailedPreconditionError(
        fmt::format("shard: cannot create '{}': {}", tmp.string(), ec.message()));
  }
  // Removes the temporary directory unless everything succeeded.
  struct Cleanup {
    fs::path dir;
    bool keep = false;
    ~Cleanup() {
      std::error_code e;
      if (!keep) fs::remove_all(dir, e);
    }
  } cleanup{tmp};

  const int64_t world = plan.topology.world;
  nlohmann::json files = nlohmann::json::array();
  for (int64_t rank = 0; rank < world; ++rank) {
    LoadStats stats;
    MOESHARD_ASSIGN_OR_RETURN(RankWeights w, loader.Load(rank, &stats));
    SafetensorsWriter writer;
    writer.SetMetadata({{"format", std::string(kPreshardedFormat)},
                        {"rank", std::to_string(rank)},
                        {"world", std::to_string(world)},
                        {"model", plan.model.name}});
    for (const TensorBuffer& t : w.tensors()) {
      MOESHARD_RETURN_IF_ERROR(writer.Add(
          t.name, t.dtype, t.shape, std::span<const std::byte>(t.data.data(), t.data.size())));
    }
    const std::string name = PreshardedRankFileName(rank, world);
    MOESHARD_RETURN_IF_ERROR(writer.Finish((tmp / name).string()));
    files.push_back(name);
    if (options.on_rank) options.on_rank(rank, stats);
  }
  nlohmann::json manifest = options.extra.is_object() ? options.extra : nlohmann::json::object();
  manifest["format"] = kPreshardedFormat;
  manifest["version"] = kManifestVersion;
  manifest["world"] = world;
  manifest["files"] = files;
  manifest["plan"] = ShardPlanToJson(plan, true);
  MOESHARD_RETURN_IF_ERROR(
      WriteFileAtomically((tmp / kPreshardedManifestName).string(), manifest.dump(1) + "\n"));
  if (fs::exists(out, ec)) fs::remove(out, ec);  // the empty directory checked above
  fs::rename(tmp, out, ec);
  if (ec) {
    return FailedPreconditionError(
        fmt::format("shard: renaming '{}' to '{}': {}", tmp.string(), out_dir, ec.message()));
  }
  cleanup.keep = true;
  SyncDir(parent);
  return Status::Ok();
}

}  // namespace moeshard
