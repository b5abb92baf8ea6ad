// Checkpoint: a unified name -> tensor view over one or many safetensors shards.
#include "moeshard/weights/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "moeshard/base/math.h"
#include "weights/weights_internal.h"

namespace moeshard {

using weights_internal::Printable;
namespace fs = std::filesystem;

namespace {

Status CheckpointError(std::string_view path, std::string_view message) {
  return DataLossError(fmt::format("checkpoint: '{}': {}", Printable(path), message));
}

std::string BaseName(std::string_view path) {
  const size_t slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

// "'a', 'b', 'c' and 4 more".
std::string ListNames(const std::vector<std::string>& names, size_t max_listed = 8) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < max_listed; ++i) {
    if (i > 0) out += ", ";
    out += "'" + Printable(names[i]) + "'";
  }
  if (names.size() > max_listed) out += fmt::format(" and {} more", names.size() - max_listed);
  return out;
}

bool IsRegularFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

}  // namespace

Result<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& path,
                                                     SafetensorsAccess access) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    return NotFoundError(
        fmt::format("checkpoint: '{}': expected a safetensors file, an index or a "
                    "directory, got nothing at that path",
                    Printable(path)));
  }
  fs::path dir;
  std::optional<std::string> index_path;
  std::vector<std::string> files;
  if (fs::is_directory(st)) {
    dir = path;
    if (IsRegularFile(dir / kCheckpointIndexFileName)) {
      index_path = (dir / kCheckpointIndexFileName).string();
    } else if (IsRegularFile(dir / kSingleCheckpointFileName)) {
      files.push_back((dir / kSingleCheckpointFileName).string());
    } else {
      for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
        if (e.path().extension() == ".safetensors" && IsRegularFile(e.path())) {
          files.push_back(e.path().string());
        }
      }
      if (ec) {
        return InvalidArgumentError(
            fmt::format("checkpoint: '{}': cannot list: {}", Printable(path), ec.message()));
      }
      std::sort(files.begin(), files.end());
      if (files.empty()) {
        return NotFoundError(fmt::format(
            "checkpoint: '{}': expected {} or *.safetensors files in the directory, got none",
            Printable(path), kCheckpointIndexFileName));
      }
    }
  } else if (fs::path(path).extension() == ".json") {
    index_path = path;
    dir = fs::path(path).parent_path();
  } else {
    files.push_back(path);
  }

  std::optional<CheckpointIndex> index;
  if (index_path) {
    MOESHARD_ASSIGN_OR_RETURN(const std::string text, weights_internal::ReadWholeFile(
                                                          *index_path, kCheckpointIndexMaxBytes));
    MOESHARD_ASSIGN_OR_RETURN(index, ParseCheckpointIndex(text, *index_path));
    std::vector<std::string> missing;
    for (const std::string& shard : index->ShardFiles()) {
      const fs::path p = dir / shard;
      if (IsRegularFile(p)) {
        files.push_back(p.string());
      } else {
        missing.push_back(shard);
      }
    }
    if (!missing.empty()) {
      return NotFoundError(fmt::format(
          "checkpoint: '{}': expected every shard the index names to exist, got {} missing: {} "
          "(incomplete download?)",
          Printable(*index_path), missing.size(), ListNames(missing)));
    }
  }

  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->path_ = path;
  for (const std::string& f : files) {
    MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                              SafetensorsFile::Open(f, access));
    ckpt->shards_.push_back(std::move(file));
  }
  MOESHARD_RETURN_IF_ERROR(ckpt->Build(std::move(index)));
  return ckpt;
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::FromFiles(
    std::string name, std::vector<std::unique_ptr<SafetensorsFile>> files,
    std::optional<CheckpointIndex> index) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->path_ = std::move(name);
  if (index) {
    std::vector<std::string> missing;
    for (const std::string& shard : index->ShardFiles()) {
      bool found = std::any_of(files.begin(), files.end(),
                               [&](const auto& f) { return BaseName(f->path()) == shard; });
      if (!found) missing.push_back(shard);
    }
    if (!missing.empty()) {
      return NotFoundError(fmt::format(
          "checkpoint: '{}': expected every shard the index names to exist, got {} missing: {}",
          Printable(ckpt->path_), missing.size(), ListNames(missing)));
    }
    // Like Open, use only the files the index references.
    const std::vector<std::string> wanted = index->ShardFiles();
    std::erase_if(files, [&](const auto& f) {
      return !std::binary_search(wanted.begin(), wanted.end(), BaseName(f->path()));
    });
  }
  ckpt->shards_ = std::move(files);
  MOESHARD_RETURN_IF_ERROR(ckpt->Build(std::move(index)));
  return ckpt;
}

Status Checkpoint::Build(std::optional<CheckpointIndex> index) {
  for (const auto& shard : shards_) {
    for (const TensorInfo& t : shard->tensors()) {
      auto [it, inserted] = tensors_.emplace(t.name, Entry{shard.get(), &t});
      if (!inserted) {
        return CheckpointError(
            path_, fmt::format("tensor '{}': expected it in exactly one shard, got it in '{}' and "
                               "'{}'",
                               Printable(t.name), Printable(it->second.file->path()),
                               Printable(shard->path())));
      }
      std::optional<int64_t> sum = CheckedAdd(total_tensor_bytes_, t.num_bytes());
      if (!sum) return CheckpointError(path_, "total tensor bytes overflow 64 bits");
      total_tensor_bytes_ = *sum;
    }
  }
  if (index) {
    for (const auto& [name, shard] : index->weight_map) {
      auto it = tensors_.find(name);
      if (it == tensors_.end() || BaseName(it->second.file->path()) != shard) {
        return CheckpointError(
            path_,
            fmt::format("tensor '{}': the index places it in '{}', got {}", Printable(name),
                        Printable(shard),
                        it == tensors_.end()
                            ? std::string("no shard holding it")
                            : fmt::format("it in '{}'", Printable(it->second.file->path()))));
      }
    }
    for (const auto& [name, entry] : tensors_) {
      if (index->weight_map.count(name) == 0) {
        return CheckpointError(
            path_, fmt::format("tensor '{}': expected the index to list every tensor of its "
                               "shards, got '{}' holding it unlisted (stale index?)",
                               Printable(name), Printable(entry.file->path())));
      }
    }
    if (index->total_size && *index->total_size != total_tensor_bytes_) {
      warnings_.push_back(
          fmt::format("index metadata.total_size is {} bytes, the tensors hold {} "
                      "(advisory only)",
                      *index->total_size, total_tensor_bytes_));
    }
  }
  index_ = std::move(index);
  return Status::Ok();
}

const Checkpoint::Entry* Checkpoint::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Result<Checkpoint::Entry> Checkpoint::Get(std::string_view name) const {
  const Entry* e = Find(name);
  if (e == nullptr) {
    return NotFoundError(fmt::format("checkpoint: '{}': expected a tensor '{}', got none",
                                     Printable(path_), Printable(name)));
  }
  return *e;
}

Status Checkpoint::ReadTensor(std::string_view name, std::span<std::byte> dst) const {
  MOESHARD_ASSIGN_OR_RETURN(const Entry e, Get(name));
  return e.file->ReadTensor(*e.info, dst);
}

Status Checkpoint::ReadRange(std::string_view name, int64_t offset,
                             std::span<std::byte> dst) const {
  MOESHARD_ASSIGN_OR_RETURN(const Entry e, Get(name));
  return e.file->ReadRange(*e.info, offset, dst);
}

Status Checkpoint::ReadSlice2D(std::string_view name, const Slice2D& slice,
                               std::span<std::byte> dst) const {
  MOESHARD_ASSIGN_OR_RETURN(const Entry e, Get(name));
  return e.file->ReadSlice2D(*e.info, slice, dst);
}

int64_t Checkpoint::bytes_read() const {
  int64_t total = 0;
  for (const auto& s : shards_) total += s->bytes_read();
  return total;
}

void Checkpoint::ResetBytesRead() {
  for (const auto& s : shards_) s->ResetBytesRead();
}

}  // namespace moeshard
