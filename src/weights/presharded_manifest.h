// The pre-sharded directory's manifest as JSON, and the writer (layout in
// include/moeshard/weights/presharded.h). Private: nlohmann::json stays out of the public API;
// the CLI's `shard` and `run` and the loader use these.
//
// Thread safety: functions are independent; do not write the same directory concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "moeshard/base/status.h"
#include "moeshard/weights/loader.h"
#include "moeshard/weights/presharded.h"

namespace moeshard {

// Reads and validates manifest.json (format, version, world, files).
Result<nlohmann::json> ReadPreshardedManifest(const std::string& dir);

struct WritePreshardedOptions {
  // Extra manifest fields, e.g. {"model": {...}, "topology_flags": {...}}.
  nlohmann::json extra = nlohmann::json::object();
  // Called after each rank's file is written.
  std::function<void(int64_t rank, const LoadStats& stats)> on_rank = {};
};

// Loads every rank through `loader` (one at a time) and writes the directory. REQUIRES: the
// loader builds every layer (LoadOptions::max_moe_layers < 0).
Status WritePreshardedCheckpoint(const WeightLoader& loader, const std::string& out_dir,
                                 const WritePreshardedOptions& options = {});

}  // namespace moeshard
