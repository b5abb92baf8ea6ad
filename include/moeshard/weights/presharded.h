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

// The source the pre-sharded directory was made from (manifest "source": a safetensors
// checkpoint by absolute path, or dummy weights and their seed), as LoadOptions: what an
// independent check of the pre-sharded files loads (run --verify's single-rank reference).
// NotFound when that checkpoint is no longer there.
Result<LoadOptions> PreshardedOrigin(const std::string& dir);

// Reading the manifest and writing a directory: src/weights/presharded_manifest.h (they
// take nlohmann::json, which stays out of the public API).

}  // namespace moeshard
