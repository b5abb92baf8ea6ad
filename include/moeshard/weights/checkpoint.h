// Checkpoints: one safetensors file, or many shards tied together by
// `model.safetensors.index.json`, seen as a single name -> tensor map.
//
// Index file:
//   {"metadata": {"total_size": <bytes>, ...}, "weight_map": {"<tensor>": "<shard file>", ...}}
// ParseCheckpointIndex rejects duplicate keys at any level, a missing or non-object weight_map,
// non-string shard names, shard names that are not plain file names ('/', '\\', '..', absolute,
// empty, NUL), and a total_size that is not an integer in [0, 2^63). Unknown metadata keys and
// unknown top-level keys are allowed (real checkpoints carry e.g. "total_parameters").
//
// Checkpoint::Open(path) accepts
//   - a directory holding model.safetensors.index.json: exactly the shards the index names are
//     opened (other *.safetensors files are ignored); every one must exist (the error lists all
//     missing ones), hold each tensor the index assigns it, and hold no tensor the index omits;
//   - a directory without an index: model.safetensors if present, else every *.safetensors;
//   - an index file, or a single .safetensors file.
// In every case a tensor name present in two files is an error naming both. total_size is
// advisory: a mismatch with the tensors' bytes is reported in warnings(), not as an error.
// Tensors are read through the shard that holds them (Entry::file); with
// SafetensorsAccess::kHeaderOnly only the headers are read, which sizes a checkpoint of any size
// from a few kilobytes per shard.
//
// Thread safety: a Checkpoint is immutable after opening (except the shards' atomic byte
// counters); reads may run from many threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/weights/safetensors.h"

namespace moeshard {

inline constexpr std::string_view kCheckpointIndexFileName = "model.safetensors.index.json";
inline constexpr std::string_view kSingleCheckpointFileName = "model.safetensors";
// An index lists one line per tensor; 1M tensors of ~100 bytes is ~100 MB.
inline constexpr int64_t kCheckpointIndexMaxBytes = int64_t{256} << 20;

struct CheckpointIndex {
  std::optional<int64_t> total_size;              // advisory
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file name

  // The distinct shard file names, sorted.
  std::vector<std::string> ShardFiles() const;
};

// Pure: parses and validates index JSON. `file_name` appears in errors (kDataLoss).
Result<CheckpointIndex> ParseCheckpointIndex(std::string_view json, std::string_view file_name);
// OK when `shard` is a plain file name (no directories, no traversal, not absolute).
Status ValidateShardFileName(std::string_view shard, std::string_view index_name);
// The index as JSON (2-space indented, as Hugging Face writes it).
std::string SerializeCheckpointIndex(const CheckpointIndex& index);
// Writes the index atomically (temporary name, fsync, rename).
Status WriteCheckpointIndex(const std::string& path, const CheckpointIndex& index);

class Checkpoint {
 public:
  struct Entry {
    const SafetensorsFile* file = nullptr;  // the shard holding the tensor
    const TensorInfo* info = nullptr;       // its header entry in that shard
  };

  static Result<std::unique_ptr<Checkpoint>> Open(
      const std::string& path, SafetensorsAccess access = SafetensorsAccess::kMmap);
  // A checkpoint over files already open (e.g. in-memory fakes). With an index, the same checks
  // as Open apply, matching files by the last path component of SafetensorsFile::path().
  static Result<std::unique_ptr<Checkpoint>> FromFiles(
      std::string name, std::vector<std::unique_ptr<SafetensorsFile>> files,
      std::optional<CheckpointIndex> index = std::nullopt);

  const std::string& path() const { return path_; }
  const std::optional<CheckpointIndex>& index() const { return index_; }
  int num_shards() const { return static_cast<int>(shards_.size()); }
  const SafetensorsFile& shard(int shard_idx) const { return *shards_.at(shard_idx); }
  // Advisory findings, e.g. "total_size 100 differs from the tensors' 96 bytes".
  const std::vector<std::string>& warnings() const { return warnings_; }

  // All tensors, sorted by name.
  const std::map<std::string, Entry, std::less<>>& tensors() const { return tensors_; }
  const Entry* Find(std::string_view name) const;
  // kNotFound naming the checkpoint when absent.
  Result<Entry> Get(std::string_view name) const;
  // Sum of all tensors' bytes.
  int64_t total_tensor_bytes() const { return total_tensor_bytes_; }

  // Reads by name, delegating to the shard (see SafetensorsFile for the semantics).
  Status ReadTensor(std::string_view name, std::span<std::byte> dst) const;
  Status ReadRange(std::string_view name, int64_t offset, std::span<std::byte> dst) const;
  Status ReadSlice2D(std::string_view name, const Slice2D& slice, std::span<std::byte> dst) const;

  // Sum of the shards' bytes-read counters.
  int64_t bytes_read() const;
  void ResetBytesRead();

 private:
  Checkpoint() = default;
  Status Build(std::optional<CheckpointIndex> index);

  std::string path_;
  std::optional<CheckpointIndex> index_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, Entry, std::less<>> tensors_;
  std::vector<std::string> warnings_;
  int64_t total_tensor_bytes_ = 0;
};

}  // namespace moeshard
