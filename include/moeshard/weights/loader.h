// Per-rank weight loading: fills the RankWeights of one rank of a ShardPlan from layout-invariant
// dummy weights, a Hugging Face checkpoint, or a pre-sharded checkpoint written by `moeshard
// shard` -- each a TensorSource (src/weights/tensor_source.h), named by LoadOptions::source.
//
// Every rank tensor is filled through the same mapping (src/weights/checkpoint_map.h): a list
// of 2-D windows of checkpoint tensors, each copied into the rank's padded buffer at offsets
// computed from the unpadded (raw local) sizes. A checkpoint source reads exactly those windows
// (row slices of column-parallel weights, strided column slices of row-parallel ones, whole
// experts under EP, the rank's share of each scale tensor) and nothing else; the dummy source
// generates exactly those windows from a counter-based hash of (seed, checkpoint tensor name,
// flat storage index), so every topology holds the same logical model. Padding stays zero.
//
// Checkpoint names come from the family descriptor (config/family.h): non-routed plan tensors
// carry their checkpoint names (a tied lm_head reads its source, the embedding); routed
// experts are read from the descriptor's ExpertLayout (per expert, e.g. Kimi-K3's
// "language_model.model.layers.N.block_sparse_moe.experts.E.w1", or fused over experts as in
// gpt-oss) with the leaves of the weight-format table (base/weight_format.h).
//
// Errors name the rank, the tensor, what was expected and what was found:
//   [rank 3/8] load: 'model.layers.4.mlp.experts.17.down_proj.weight' in
//   ckpt/model-00002.safetensors: shape [7168, 2048] does not match config [7168, 3072] (wrong
//   config.json for this checkpoint?)
//
// Thread safety: a WeightLoader is immutable after Create; Load may run from several threads
// (each call uses its own thread pool unless LoadOptions::pool is shared, which serialises).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/base/thread_pool.h"
#include "moeshard/plan/shard_plan.h"
#include "moeshard/weights/checkpoint.h"
#include "moeshard/weights/dummy_weights.h"
#include "moeshard/weights/rank_weights.h"

namespace moeshard {
namespace internal {
class TensorSource;  // src/weights/tensor_source.h
struct TensorSourceFormat;
}  // namespace internal

// A rank's weights come from one TensorSource, named as `--load-format` names it. The sources
// (each one class, listed in src/weights/tensor_source.cc; docs/backends.md):
//   "dummy"        layout-invariant hashed weights (no checkpoint)
//   "safetensors"  a Hugging Face safetensors checkpoint (single file, directory or index)
//   "presharded"   a directory written by `moeshard shard` (manifest.json + one file per rank)
struct LoadOptions {
  // The built-in sources' names, for code that picks one (LoadOptions{.source =
  // LoadOptions::Source::kCheckpoint}); ParseLoadFormat accepts every registered name.
  struct Source {
    static constexpr const char kDummy[] = "dummy";
    static constexpr const char kCheckpoint[] = "safetensors";
    static constexpr const char kPresharded[] = "presharded";
  };
  std::string source = Source::kDummy;
  uint64_t seed = 0;                // dummy
  std::string checkpoint_dir = {};  // sources that read a checkpoint (safetensors, presharded)
  // safetensors: an already open checkpoint (e.g. over in-memory files); used instead of
  // opening checkpoint_dir. Must outlive the loader.
  const Checkpoint* checkpoint = nullptr;
  // Build only the first N MoE layers of the rank's pipeline stage (and the dense layers
  // before them); -1: every layer. Non-layer tensors (embedding, head, final norm) are always
  // built. Lets one rank of a multi-terabyte model be built in a few GiB.
  int64_t max_moe_layers = -1;
  // false: allocate (zeroed) and map every buffer -- each checkpoint window checked against its
  // source and its buffer, the windows checked to cover exactly the unpadded bytes -- without
  // generating or reading values. Proves allocation == plan for full-size models in
  // milliseconds (`build --no-fill`); untouched zero pages cost no physical memory.
  bool fill = true;
  // Worker threads for filling (0: hardware concurrency). Ignored when `pool` is set.
  int num_threads = 0;
  ThreadPool* pool = nullptr;
  // Called with the number of bytes just filled (from worker threads; must be thread-safe).
  // The calls of one Load sum to the rank's allocated bytes (padding counts once allocated).
  std::function<void(int64_t bytes)> progress = {};
};

struct LoadStats {
  int64_t num_tensors = 0;         // rank buffers allocated
  int64_t bytes_allocated = 0;     // sum of the buffers' sizes (padded)
  int64_t bytes_filled = 0;        // bytes written from the source (unpadded data)
  int64_t bytes_read = 0;          // bytes read from checkpoint files (0 for dummy)
  int64_t num_source_tensors = 0;  // distinct checkpoint tensors touched
  std::map<TensorCategory, int64_t> bytes_by_category;  // allocated, per category
};

// The sources a command can take.
enum class LoadFormatScope {
  kAny,                // every registered source
  kCheckpointTensors,  // sources of whole checkpoint tensors, which can be sharded (`moeshard
                       // shard`'s input): not a pre-sharded directory, which holds one plan's ranks
};

// `--load-format`, the one parser every command uses: "auto" or "" (the source the --checkpoint
// value names: dummy without one, presharded for a directory with manifest.json, else
// safetensors) or a registered source's name (dummy, safetensors, presharded). Returns the
// source's name. Checks the combination with --checkpoint (`checkpoint`, "" when not given):
// refused are an unknown value, a source outside `scope`, a checkpoint given to a source that
// reads none and none given to one that does. Errors name the flag, the expected values and the
// fix: "'--load-format x': expected auto, dummy, safetensors, presharded".
Result<std::string> ParseLoadFormat(const std::string& load_format, const std::string& checkpoint,
                                    LoadFormatScope scope = LoadFormatScope::kAny);
// --load-format's help text for `scope`: the auto rule and every value.
std::string LoadFormatHelp(LoadFormatScope scope = LoadFormatScope::kAny);
// The source of `options` as a report names it: "dummy weights (seed 3)", "checkpoint DIR",
// "pre-sharded checkpoint DIR".
std::string DescribeLoadSource(const LoadOptions& options);

// How a checkpoint tensor's bytes become the rank layout's (base/weight_format.h QuantLayout).
enum class SourceEncoding {
  kDirect,         // as they are: the loader's windows copy stored bytes
  kAwqCodes,       // AWQ qweight I32 [in, out/8]          -> U8 [out, in/2]
  kAwqZeros,       // AWQ qzeros I32 [in/g, out/8]         -> U8 [out, in/g]
  kGptqCodes,      // GPTQ qweight I32 [in/8, out]         -> U8 [out, in/2]
  kGptqZeros,      // GPTQ qzeros I32 [in/g, out/8], z - 1 -> U8 [out, in/g]
  kGptqV2Zeros,    // GPTQ v2 qzeros, z as is             -> U8 [out, in/g]
  kTransposedF16,  // AWQ / GPTQ scales F16 [in/g, out]    -> F16 [out, in/g]
  kCtZeros,        // compressed-tensors weight_zero_point I32 [out/8, in/g] -> U8 [out, in/g]
  kBf16ToF16,      // compressed-tensors int4 scales in bf16 -> F16 (exact for normal fp16)
  kReciprocalF32,  // compressed-tensors NVFP4 weight_global_scale (a divisor) -> 1 / x
  kScalarF32,      // ModelOpt weight_scale_2 F32 [] (or [1]) -> F32 [1]
  kRowScale,       // per-channel fp8 weight_scale F32 [out, 1] -> F32 [out, blocks], repeated
  kTensorScale,    // per-tensor fp8 weight_scale F32 [] (or [1]) -> F32 [out, blocks], repeated
  kE8M0ToF32,      // DeepSeek-V4 fp8 block scales F8_E8M0 -> F32 (2^(e - 127), exact)
};
// Whether every element of a view row of `encoding` is the same value (kRowScale, kTensorScale).
bool RowUniformEncoding(SourceEncoding encoding);
const char* SourceEncodingName(SourceEncoding encoding);

// A checkpoint tensor the model consists of, as the family stores it.
struct SourceTensorSpec {
  SourceTensorSpec() = default;
  SourceTensorSpec(std::string n, DType d, std::vector<int64_t> s, DummyKind kind,
                   std::vector<int64_t> known = {})
      : name(std::move(n)),
        dtype(d),
        shape(std::move(s)),
        dummy_kind(kind),
        values(std::move(known)) {}

  std::string name;  // e.g. "model.layers.3.mlp.experts.17.up_proj.weight"
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;  // storage shape (packed: bytes along the input dim)
  // How the dummy source fills it (from the tensor's part and format, not its name).
  DummyKind dummy_kind = DummyKind::kWeight;
  // Non-empty: the tensor's values are known (compressed-tensors weight_shape: the logical
  // [out, in]); the dummy source writes them instead of hashed values.
  std::vector<int64_t> values;
  // Not kDirect: the stored tensor is converted, and the loader reads it as the rank-layout
  // view `view_dtype` `view_shape` (the dummy source generates that view directly).
  SourceEncoding encoding = SourceEncoding::kDirect;
  DType view_dtype = DType::kBF16;
  std::vector<int64_t> view_shape;
};

// Every checkpoint tensor the plan's model reads, over all ranks and layers, sorted by name.
Result<std::vector<SourceTensorSpec>> ExpectedCheckpointTensors(const ShardPlan& plan);

// The decoder layers LoadRankWeights builds for `rank_plan` with `max_moe_layers` (see
// LoadOptions), ascending.
std::vector<int64_t> LayersToBuild(const ShardPlan& plan, const RankPlan& rank_plan,
                                   int64_t max_moe_layers);

// The plan's prediction of a rank's bytes per category, restricted to `layers` (every layer
// tensor counts once per layer in the set; non-layer tensors always count). With all of the
// rank's layers this equals RankPlan::BytesOf.
std::map<TensorCategory, int64_t> PlannedBytesByCategory(const RankPlan& rank_plan,
                                                         const std::vector<int64_t>& layers);

class WeightLoader {
 public:
  // `plan` must outlive the loader.
  // Opens the source (checkpoint headers, or the pre-sharded manifest, which must hold this
  // very plan). Checkpoint tensors the plan cannot place are listed in unplaced_tensors().
  static Result<std::unique_ptr<WeightLoader>> Create(const ShardPlan& plan,
                                                      const LoadOptions& options);
  ~WeightLoader();

  // Allocates and fills the rank's tensors. REQUIRES: 0 <= rank < world.
  Result<RankWeights> Load(int64_t rank, LoadStats* stats = nullptr) const;

  // Checkpoint tensors no rank of the plan reads and the model does not explain, sorted.
  const std::vector<std::string>& unplaced_tensors() const;
  // Tensors of the multi-token-prediction layers (DeepSeek-V3 `model.layers.61.*`): not read,
  // because engines load them only for speculative decoding.
  const std::vector<std::string>& mtp_tensors() const;
  const ShardPlan& plan() const { return plan_; }
  const LoadOptions& options() const { return options_; }

 private:
  WeightLoader(const ShardPlan& plan, const LoadOptions& options,
               const internal::TensorSourceFormat& format);
  const ShardPlan& plan_;
  LoadOptions options_;
  const internal::TensorSourceFormat& format_;
  std::unique_ptr<internal::TensorSource> source_;
};

// One-shot convenience: WeightLoader::Create(plan, options) then Load(rank).
Result<RankWeights> LoadRankWeights(const ShardPlan& plan, int64_t rank, const LoadOptions& options,
                                    LoadStats* stats = nullptr);

}  // namespace moeshard
