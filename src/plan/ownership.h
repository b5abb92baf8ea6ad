// The ownership map and the engine-dump diff (docs/ownership.md has both schemas).
//
// OwnershipMapJson: for every rank and tensor of a ShardPlan, the checkpoint slice it holds,
// its logical, local and padded shapes, dtype and padding (`moeshard plan --ownership FILE`).
//
// CheckOwnership: compares an engine's per-rank parameter list (an EngineDump: name, shape,
// dtype and optionally the slices loaded and the padded tail, per rank, written by
// scripts/dump_named_parameters.py) with the plan, rule by rule (`moeshard check --against`):
//   world     the dump's world and ranks equal the plan's
//   missing   a routed-expert tensor the plan puts on a rank is absent from that rank's dump
//   dtype     the dtype equals the plan's
//   shape     the allocated shape equals the plan's padded shape
//   padding   the declared padded tail equals the plan's (a padded tail held as data is wrong)
//   slice     a declared checkpoint slice equals the plan's
//   data      a declared slice fills exactly the unpadded part of the tensor
//   coverage  across ranks, each checkpoint row of a split tensor is held as often as the plan
//             holds it: exactly once per replica group
// Routed experts match by vLLM's fused names (`...experts.w13_weight`, `...experts.w2_bias`,
// any prefix: the plan names them so); every other tensor by its checkpoint name. Dump names the
// plan does not know, and non-expert plan tensors absent from the dump, are listed, not failed
// (engines fuse and rename those: vLLM's qkv_proj).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/plan/shard_plan.h"

namespace moeshard {

// The ownership map as JSON text (schema "moeshard-ownership", version 1).
std::string OwnershipMapJson(const ShardPlan& plan);

// One checkpoint slice a parameter holds along `dim`: [begin, end) in the logical tensor's
// coordinates, or for dim 0 of routed experts the global expert ids (`experts` non-empty).
struct DumpSlice {
  int dim = 0;
  int64_t begin = 0;
  int64_t end = 0;
  std::vector<int64_t> experts;
};

struct DumpParam {
  std::string name;  // the engine's parameter name, e.g. "model.layers.3.mlp.experts.w13_weight"
  std::vector<int64_t> shape;  // as allocated
  std::string dtype;           // "bfloat16", "torch.bfloat16" or "BF16"
  bool has_slices = false;     // the engine declared what it loaded
  std::vector<DumpSlice> slices;
  bool has_padding = false;      // the engine declared its padded tails
  std::vector<int64_t> padding;  // per dim, entries of padding (per section for gated w13)
};

struct DumpRank {
  int64_t rank = -1;
  std::vector<DumpParam> params;
};

struct EngineDump {
  int64_t world = 0;
  std::string engine;  // free text ("vllm 0.11.2")
  std::vector<DumpRank> ranks;
};

// Parses one file of the dump format into `dump` (appending ranks): a whole dump
// {"world", "ranks": [...]}, one rank record {"world", "rank", "params"}, or JSON lines of rank
// records. `source` names the file in errors.
Status ParseEngineDump(const std::string& text, const std::string& source, EngineDump& dump);

struct OwnershipDiff {
  std::string rule;    // world, missing, dtype, shape, padding, slice, data, coverage
  std::string tensor;  // plan name ("{layer}" kept) plus the layers it concerns
  std::string ranks;   // "3", "0-15"
  std::string expected;
  std::string actual;
};

struct OwnershipReport {
  std::vector<OwnershipDiff> diffs;
  int64_t params_matched = 0;
  int64_t coverage_checked = 0;             // concrete tensors whose coverage was compared
  int64_t coverage_undeclared = 0;          // split tensors skipped: some rank declared no slices
  std::vector<std::string> unknown_params;  // dump names the plan does not know ("rank r: name")
  std::vector<std::string> absent_tensors;  // non-expert plan tensors the dump lacks
};

OwnershipReport CheckOwnership(const ShardPlan& plan, const EngineDump& dump);

}  // namespace moeshard
