// Weight sources behind one interface (private to the weights layer): where the values of a
// rank's buffers come from -- what `--load-format` names.
//
//   WeightLoader::Create  -> TensorSourceFormat::open(plan, options)   once: headers, manifest,
//                            every check against the plan
//   WeightLoader::Load    -> maps and allocates the rank's buffers (zeroed), then
//                            TensorSource::Fill(rank)                  per rank
//
// A source declares its layout: kCheckpointTensors sources hold whole, unsharded checkpoint
// tensors; the loader maps each rank buffer to 2-D windows of them (checkpoint_map.h) and a
// WindowSource only produces window rows (dummy: generated; safetensors: read, converted where
// the format needs it). kRankTensors sources hold the rank's buffers themselves, in the plan's
// padded shapes (pre-sharded), and are read whole.
//
// Every source is listed once, in TensorSourceFormats() (tensor_source.cc), with its
// `--load-format` name, whether it reads `--checkpoint`, and when `auto` picks it; ParseLoadFormat
// and the help text come from that list. Adding a source (e.g. GGUF) is one class (a WindowSource
// when it holds whole tensors) in its own file with its XxxSourceFormat(), declared below and
// listed in that list (docs/backends.md, "Weight sources").
//
// Thread safety: a source is immutable after open; Fill may run concurrently for different ranks
// (WeightLoader::Load may be called from several threads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/base/thread_pool.h"
#include "moeshard/plan/shard_plan.h"
#include "moeshard/weights/loader.h"
#include "moeshard/weights/safetensors.h"
#include "weights/checkpoint_map.h"

namespace moeshard::internal {

// How a source's tensors relate to a rank's buffers (see the top of this file).
enum class SourceLayout {
  kCheckpointTensors,  // whole checkpoint tensors; rank buffers are windows of them
  kRankTensors,        // the rank buffers themselves, padded (a pre-sharded directory)
};

// One rank's buffers, allocated and zeroed by the loader, for a source to fill.
struct RankFill {
  const ShardPlan* plan = nullptr;
  int64_t rank = 0;
  // The rank's tensors, with their pieces when the source's layout is kCheckpointTensors.
  const std::vector<MappedTensor>* tensors = nullptr;
  // dst[i]: the buffer of tensors[i], tensors[i].buffer_bytes long, zeroed.
  std::vector<std::byte*> dst = {};
  // Every layer of the rank is built (LoadOptions::max_moe_layers < 0).
  bool all_layers = true;
  ThreadPool* pool = nullptr;
  // Called with the number of bytes just written, from worker threads.
  std::function<void(int64_t bytes)> report = {};
};

// What a Fill read, for LoadStats.
struct FillStats {
  int64_t bytes_read = 0;          // from files (0 for generated values)
  int64_t num_source_tensors = 0;  // distinct source tensors touched
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;

  // Fills every buffer of `fill`. Errors name the rank, the tensor and the file.
  virtual Result<FillStats> Fill(const RankFill& fill) const = 0;

  // Source tensors that no rank of the plan reads and the model does not explain, sorted;
  // multi-token-prediction tensors (not loaded). Empty for sources without names of their own.
  const std::vector<std::string>& unplaced_tensors() const { return unplaced_; }
  const std::vector<std::string>& mtp_tensors() const { return mtp_; }

 protected:
  std::vector<std::string> unplaced_;
  std::vector<std::string> mtp_;
};

// The rows of one rank's checkpoint tensors, resolved once per Fill by a WindowSource.
class WindowReader {
 public:
  virtual ~WindowReader() = default;
  // Window rows [a, b) of piece `p` of tensor `tensor_idx` (its source p.source_idx) into
  // `out`, window row r at out + (r - a) * stride (p.cols() bytes each).
  // REQUIRES: p.window.row_begin <= a <= b <= p.window.row_end. Called from worker threads.
  virtual Status ReadRows(size_t tensor_idx, const Piece& p, int64_t a, int64_t b, std::byte* out,
                          int64_t stride) const = 0;
  // Bytes read from files since OpenRank.
  virtual int64_t bytes_read() const { return 0; }
};

// A kCheckpointTensors source: Fill splits the rank's pieces into work items of at most 4 MiB,
// runs them on the pool, transposes the pieces that say so, and reports progress; the source
// only resolves the rank's checkpoint tensors (OpenRank) and produces window rows.
class WindowSource : public TensorSource {
 public:
  Result<FillStats> Fill(const RankFill& fill) const final;

 protected:
  // Resolves every source tensor of fill.tensors (checks they exist, as expected).
  virtual Result<std::unique_ptr<WindowReader>> OpenRank(const RankFill& fill) const = 0;
};

// A source as `--load-format` names it: what ParseLoadFormat, the help text and
// WeightLoader::Create need before any source is opened.
struct TensorSourceFormat {
  const char* name = "";  // the --load-format value, e.g. "safetensors"
  SourceLayout layout = SourceLayout::kCheckpointTensors;
  // It reads --checkpoint (LoadOptions::checkpoint_dir or ::checkpoint); when false, giving
  // one is an error.
  bool reads_checkpoint = false;
  // When `--load-format auto` picks it: when it claims the --checkpoint value ("" when none is
  // given). The first claiming source in registry order wins; a fallback source (safetensors:
  // any path) only when no other one claims the value.
  bool (*auto_claims)(const std::string& checkpoint) = nullptr;
  bool auto_fallback = false;
  // That rule for --load-format's help: "dummy without --checkpoint"; a fallback's, its name.
  const char* auto_help = "";
  // The source as build reports it: "dummy weights (seed 3)", "checkpoint DIR".
  std::string (*describe)(const LoadOptions& options) = nullptr;
  // Opens the source and checks it against `plan` (which outlives the source).
  Result<std::unique_ptr<TensorSource>> (*open)(const ShardPlan& plan,
                                                const LoadOptions& options) = nullptr;
};

// Every source, in the order messages and help list them (the registry, tensor_source.cc).
const std::vector<TensorSourceFormat>& TensorSourceFormats();
// The format named `name`, or null.
const TensorSourceFormat* FindTensorSourceFormat(std::string_view name);
// The formats `scope` admits, in registry order.
std::vector<const TensorSourceFormat*> TensorSourceFormatsIn(LoadFormatScope scope);

// "dummy or safetensors", "dummy, safetensors or presharded".
std::string FormatNames(const std::vector<const TensorSourceFormat*>& formats);

// Each source's entry, defined beside its class.
TensorSourceFormat DummySourceFormat();       // dummy_source.cc
TensorSourceFormat CheckpointSourceFormat();  // checkpoint_source.cc
TensorSourceFormat PreshardedSourceFormat();  // presharded_source.cc

// The one compatibility check of a stored checkpoint tensor against the tensor the model
// expects: the same dtype and shape, or one of the byte-identical spellings real checkpoints
// use (E8M0 scales as U8 or F8_E8M0; packed 4-bit as U8 [.., n] or I32 [.., n / 4]; one value as
// [] or [1]). The error names the tensor, the file, what was found and what the config implies.
// `rank_tag` ("[rank 3/8]") prefixes it when the check is made for one rank.
Status CheckCheckpointTensor(const SourceTensorSpec& want, const TensorInfo& got,
                             std::string_view file, std::string_view rank_tag = {});

// "[rank 3/8]"
std::string RankTag(const ShardPlan& plan, int64_t rank);

// Runs fn(i) for i in [0, n) on the pool, stopping at the first error (exceptions become
// Internal errors).
Status ParallelForStatus(ThreadPool& pool, int64_t n, const std::function<Status(int64_t)>& fn);

}  // namespace moeshard::internal
