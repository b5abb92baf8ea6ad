// Pre-sharded checkpoints: what `moeshard shard` writes and `moeshard build` loads directly.
//
// Directory layout:
//   manifest.json                          {"format": "moeshard-presharded", "version": 1,
//                                           "world": W, "files": [...], "plan": <ShardPlanToJson
//                                           with tensors>, plus the caller's fields (model
//                                           config source, topology flags)}
//   rank-00000-of-0000W.safetensors        one per rank: the RankWeights buffers, named as
//   ...                                    RankWeights names them, in padded shapes (padding
//                                           zero), so loading is one whole-tensor read each
//
// Writing is atomic for the directory: everything goes to "<out>.tmp.<pid>" (each file itself
// written by SafetensorsWriter's temp+fsync+rename, the manifest last) and the directory is
// renamed to <out> at the end; an interrupted run leaves no <out>. <out> must not exist or be
// an empty directory.
//
// A pre-sharded checkpoint serves exactly the plan it was made for: loading it with another plan
// (model, topology, backend, padding, placement) is an error naming both topologies.
//
// Thread safety: functions are independent; do not write the same directory concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "moeshard/base/status.h"
#include "moeshard/weights/loader.h"

namespace moeshard {

inline constexpr std::string_view kPreshardedManifestName = "manifest.json";
inline constexpr std::string_view kPreshardedFormat = "moeshard-presharded";

// "rank-00003-of-00008.safetensors"
std::string PreshardedRankFileName(int64_t rank, int64_t world);

// True when `dir` holds a manifest.json (it may still be invalid).
bool IsPreshardedDir(const std::string& dir);

// Reads and validates manifest.json (format, version, world, files).
Result<nlohmann::json> ReadPreshardedManifest(const std::string& dir);

struct WritePreshardedOptions {
  // Extra manifest fields, e.g. {"model": {...}, "topology_flags": {...}}.
  nlohmann::json extra = nlohmann::json::object();
  // Called after each rank's file is written.
  std::function<void(int64_t rank, const LoadStats& stats)> on_rank = {};
};

// The source the pre-sharded directory was made from (manifest "source": a safetensors
// checkpoint by absolute path, or dummy weights and their seed), as LoadOptions: what an
// independent check of the pre-sharded files loads (run --verify's single-rank reference).
// NotFound when that checkpoint is no longer there.
Result<LoadOptions> PreshardedOrigin(const std::string& dir);

// Loads every rank through `loader` (one at a time) and writes the directory. REQUIRES: the
// loader builds every layer (LoadOptions::max_moe_layers < 0).
Status WritePreshardedCheckpoint(const WeightLoader& loader, const std::string& out_dir,
                                 const WritePreshardedOptions& options = {});

}  // namespace moeshard
