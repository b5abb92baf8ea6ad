// model.safetensors.index.json: parsing, validation and writing.
#include <fmt/format.h>

#include <set>

#include "moeshard/weights/checkpoint.h"
#include "moeshard/weights/safetensors_writer.h"
#include "weights/json_strict.h"
#include "weights/weights_internal.h"

namespace moeshard {

using weights_internal::JsonKind;
using weights_internal::Printable;

namespace {

// Index files nest 3 deep ({"weight_map": {...}}); metadata may carry small nested values.
constexpr int kIndexMaxDepth = 32;

Status IndexError(std::string_view file_name, std::string_view message) {
  return DataLossError(fmt::format("checkpoint index: '{}': {}", Printable(file_name), message));
}

}  // namespace

std::vector<std::string> CheckpointIndex::ShardFiles() const {
  std::set<std::string> files;
  for (const auto& [tensor, file] : weight_map) files.insert(file);
  return {files.begin(), files.end()};
}

Status ValidateShardFileName(std::string_view shard, std::string_view index_name) {
  std::string_view problem;
  if (shard.empty()) {
    problem = "an empty name";
  } else if (shard.find('/') != std::string_view::npos) {
    problem = shard.front() == '/' ? "an absolute path" : "a path with '/'";
  } else if (shard.find('\\') != std::string_view::npos) {
    problem = "a path with '\\'";
  } else if (shard.find("..") != std::string_view::npos || shard == ".") {
    problem = "a name with '..' or '.'";
  } else {
    for (char c : shard) {
      if (static_cast<unsigned char>(c) < 0x20) problem = "a control character";
    }
  }
  if (problem.empty()) return Status::Ok();
  return IndexError(index_name,
                    fmt::format("shard '{}': expected a plain file name in the checkpoint "
                                "directory, got {} (refusing to leave the directory)",
                                Printable(shard), problem));
}

Result<CheckpointIndex> ParseCheckpointIndex(std::string_view text, std::string_view file_name) {
  MOESHARD_ASSIGN_OR_RETURN(
      const nlohmann::json doc,
      weights_internal::ParseStrictJson(
          text, fmt::format("checkpoint index: '{}'", Printable(file_name)), kIndexMaxDepth));
  if (!doc.is_object()) {
    return IndexError(file_name, fmt::format("expected a JSON object, got {}", JsonKind(doc)));
  }
  CheckpointIndex index;
  auto metadata = doc.find("metadata");
  if (metadata != doc.end()) {
    if (!metadata->is_object()) {
      return IndexError(file_name,
                        fmt::format("metadata: expected an object, got {}", JsonKind(*metadata)));
    }
    auto total = metadata->find("total_size");
    if (total != metadata->end()) {
      if (!total->is_number_unsigned() ||
          total->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        return IndexError(file_name, fmt::format("metadata.total_size: expected an integer in "
                                                 "[0, 2^63), got {}",
                                                 JsonKind(*total)));
      }
      index.total_size = static_cast<int64_t>(total->get<uint64_t>());
    }
  }
  auto map = doc.find("weight_map");
  if (map == doc.end()) {
    return IndexError(file_name, "expected a 'weight_map' object, got none");
  }
  if (!map->is_object()) {
    return IndexError(file_name,
                      fmt::format("weight_map: expected an object, got {}", JsonKind(*map)));
  }
  for (const auto& [tensor, shard] : map->items()) {
    if (!shard.is_string()) {
      return IndexError(file_name,
                        fmt::format("weight_map '{}': expected a shard file name, got {}",
                                    Printable(tensor), JsonKind(shard)));
    }
    const auto& name = shard.get_ref<const std::string&>();
    MOESHARD_RETURN_IF_ERROR(ValidateShardFileName(name, file_name));
    index.weight_map.emplace(tensor, name);
  }
  return index;
}

std::string SerializeCheckpointIndex(const CheckpointIndex& index) {
  nlohmann::ordered_json doc;
  doc["metadata"] = nlohmann::ordered_json::object();
  if (index.total_size) doc["metadata"]["total_size"] = *index.total_size;
  doc["weight_map"] = nlohmann::ordered_json::object();
  for (const auto& [tensor, shard] : index.weight_map) doc["weight_map"][tensor] = shard;
  return doc.dump(2) + "\n";
}

Status WriteCheckpointIndex(const std::string& path, const CheckpointIndex& index) {
  for (const auto& [tensor, shard] : index.weight_map) {
    MOESHARD_RETURN_IF_ERROR(ValidateShardFileName(shard, path));
    if (weights_internal::FirstInvalidUtf8(tensor) != tensor.size() ||
        weights_internal::FirstInvalidUtf8(shard) != shard.size()) {
      return InvalidArgumentError(
          fmt::format("write index: '{}': tensor '{}': expected UTF-8 "
                      "names",
                      Printable(path), Printable(tensor)));
    }
  }
  return WriteFileAtomically(path, SerializeCheckpointIndex(index));
}

}  // namespace moeshard
