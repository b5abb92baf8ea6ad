// libFuzzer target: the model.safetensors.index.json parser.
//
// Every accepted index must serialize and re-parse to the same index, and every shard name it
// accepted must be a plain file name.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "moeshard/weights/checkpoint.h"

namespace {

void Check(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moeshard;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Result<CheckpointIndex> index = ParseCheckpointIndex(text, "fuzz.index.json");
  if (!index.ok()) {
    Check(!index.status().message().empty(), "an error has a message");
    return 0;
  }
  for (const std::string& shard : index->ShardFiles()) {
    Check(!shard.empty() && shard.find('/') == std::string::npos &&
              shard.find("..") == std::string::npos,
          "accepted shard names are plain file names");
  }
  const std::string json = SerializeCheckpointIndex(*index);
  Result<CheckpointIndex> again = ParseCheckpointIndex(json, "reserialized");
  Check(again.ok(), "serialized index parses");
  Check(again->weight_map == index->weight_map, "weight_map round-trips");
  Check(again->total_size == index->total_size, "total_size round-trips");
  return 0;
}
