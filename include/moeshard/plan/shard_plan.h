// ShardPlan: for every rank, every tensor: logical shape, the slice it holds, raw local shape,
// padded physical shape, dtype and bytes. A pure, deterministic function of (model config,
// topology, backend, quantization, padding policy, placement). The planner prints it, the
// loader allocates exactly it, the runtime executes it.
//
// Routed experts use the fused per-rank layout engines allocate (vLLM FusedMoE):
//   w13 (gate_up) [num_slots_local, 2 * I_padded, H_padded]   gate rows [0, I), up rows [I, 2I)
//                 (gpt-oss: gate and up interleaved, row 2j = gate j, 2j+1 = up j)
//   w2  (down)    [num_slots_local, H_padded, I_padded]
// with quantized storage as the weight-format table says (base/weight_format.h: mxfp4 / int4
// weights U8 with two values per byte along the input dim, their scales per group; fp8 F8_E4M3
// with F32 block scales [.., out/block_rows, in/group]). H is the latent width for latent MoE
// (Kimi-K3: 3584, not 7168). Tensor names: the family's ExpertLayout::rank_prefix + "w13_" +
// the format's leaf ("w13_weight_packed", "w13_weight_scale", "w2_bias", "w13_weight_shape").
// Every other tensor carries its checkpoint name (family descriptor, config/family.h).
//
// Thread safety: value types; BuildShardPlan is a pure function.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moeshard/base/dtype.h"
#include "moeshard/base/status.h"
#include "moeshard/config/family.h"
#include "moeshard/config/model_config.h"
#include "moeshard/plan/backend.h"
#include "moeshard/plan/eplb.h"
#include "moeshard/plan/topology.h"

namespace moeshard {

enum class PaddingPolicy {
  kBackend,     // backend alignment and quantization group only (default)
  kModelFloor,  // also the model's min_moe_intermediate_per_partition when moe_tp > 1
  kLegacyTp,    // pre-fix engines: pad I to floor * tp_size even under EP (for diagnosis)
};

enum class ExpertPlacement {
  kLinear,      // rank r holds a contiguous block of slots
  kRoundRobin,  // rank r holds slots r, r + ep, r + 2ep, ...
  // Slots given by DeepSeek's EPLB from a measured expert load (PlanOptions::expert_load, one
  // placement for all MoE layers from their summed load; plan/eplb.h).
  kEplb,
};

enum class SharedExpertsMode { kSharded, kReplicated };
enum class LatentProjMode { kReplicated, kSharded };

const char* PaddingPolicyName(PaddingPolicy policy);  // "backend", "model-floor", "legacy-tp"
Result<PaddingPolicy> ParsePaddingPolicy(const std::string& name);
const char* ExpertPlacementName(ExpertPlacement placement);  // "linear", "round-robin", "eplb"
Result<ExpertPlacement> ParseExpertPlacement(const std::string& name);

// PlanOptions::num_redundant_experts value asking for the fewest redundant experts that make
// the slots divide by the MoE EP size: (ep - E mod ep) mod ep (`--num-redundant-experts auto`;
// vLLM issue 30075 asks for this rule, which vLLM does not apply itself).
inline constexpr int64_t kRedundantExpertsAuto = -1;

struct PlanOptions {
  Topology topology;
  std::string backend = "auto";
  // The target GPU runs FP8 GEMMs natively (GpuSpec::NativeFp8). Without, `auto` runs fp8
  // experts on Marlin, as vLLM does below compute capability 8.9.
  bool native_fp8 = true;
  // The target GPU's compute capability x 10 (GpuSpec::sm; 0: unknown). `auto` runs gpt-oss's
  // MXFP4 experts (quant_method "mxfp4") on Triton from 9.0 on, on Marlin below, as vLLM does.
  int gpu_sm = 0;
  PaddingPolicy padding = PaddingPolicy::kBackend;
  ExpertPlacement placement = ExpertPlacement::kLinear;
  int64_t num_redundant_experts = 0;  // EPLB: slots = experts + redundant; or kRedundantExpertsAuto
  SharedExpertsMode shared_experts = SharedExpertsMode::kSharded;
  LatentProjMode latent_proj = LatentProjMode::kReplicated;
  ExpertLoad expert_load{};  // kEplb: tokens per expert per MoE layer (`--expert-load FILE`)
};

// logical -> raw local -> padded local for one dimension of the routed experts.
struct DimLayout {
  int64_t logical = 0;
  int64_t divisor = 1;  // ways the dimension is split (moe_tp for I, 1 for H)
  // Even: logical / divisor. Uneven block shards (`uneven`): ceil(logical / group / divisor) *
  // group, the stride of the slices and the widest one.
  int64_t raw_local = 0;
  int64_t floor = 0;         // per-partition floor applied (0: none)
  int64_t align = 1;         // lcm(backend alignment, quantization group)
  int64_t padded_local = 0;  // round_up(max(raw_local, floor), align) (legacy-tp: see policy)
  // Uneven block shards (docs/uneven-shards.md): part r holds [SliceBegin(r), SliceEnd(r)) of
  // the checkpoint, whole quantization groups; the last parts are short or empty, their tail
  // zero padding. False: every part holds raw_local.
  bool uneven = false;
  int64_t padding() const { return padded_local - raw_local; }
  int64_t SliceBegin(int64_t part) const {
    return part * raw_local < logical ? part * raw_local : logical;
  }
  int64_t SliceEnd(int64_t part) const {
    return (part + 1) * raw_local < logical ? (part + 1) * raw_local : logical;
  }
  int64_t SliceWidth(int64_t part) const { return SliceEnd(part) - SliceBegin(part); }
};

// An immutable, shared list of layer indices: every rank of a stage holding a per-layer tensor
// points at one copy (plans of 64 ranks x 93 layers stay cheap to build and copy).
class LayerSet {
 public:
  LayerSet() = default;
  explicit LayerSet(std::vector<int64_t> layers)
      : layers_(std::make_shared<const std::vector<int64_t>>(std::move(layers))) {}
  const std::vector<int64_t>& vec() const { return layers_ ? *layers_ : Empty(); }
  size_t size() const { return vec().size(); }
  bool empty() const { return vec().empty(); }
  int64_t front() const { return vec().front(); }
  std::vector<int64_t>::const_iterator begin() const { return vec().begin(); }
  std::vector<int64_t>::const_iterator end() const { return vec().end(); }

 private:
  static const std::vector<int64_t>& Empty() {
    static const std::vector<int64_t> empty;
    return empty;
  }
  std::shared_ptr<const std::vector<int64_t>> layers_;
};

// One tensor as one rank holds it. For per-layer tensors, `name` has a "{layer}" placeholder
// and the entry stands for `layers.size()` identical tensors.
struct TensorShard {
  std::string name;  // e.g. "model.layers.{layer}.mlp.experts.w13_weight"
  TensorCategory category = TensorCategory::kRoutedExperts;
  TensorRole role = TensorRole::kOther;  // what the runtime uses it for
  TensorPart part = TensorPart::kValue;
  DType dtype = DType::kBF16;
  std::vector<int64_t> logical_shape;  // the whole tensor, unpadded
  std::vector<int64_t> local_shape;    // this rank's slice, unpadded
  std::vector<int64_t> padded_shape;   // what is allocated
  int shard_dim = -1;                  // dimension split across ranks; -1: replicated
  int64_t shard_begin = 0;             // [begin, end) of shard_dim in logical coordinates
  int64_t shard_end = 0;
  // shard_dim is `sections` equal blocks; [begin, end) is the slice of the first block and the
  // rank holds the same slice of every block (local_shape[shard_dim] = sections * slice).
  int64_t sections = 1;
  // Non-empty: the blocks have these sizes instead of being equal; the rank holds the r-th
  // 1/TP of each, in order ([shard_begin, shard_end) is its slice of the first block).
  std::vector<int64_t> section_sizes;
  // The split part of one block of shard_dim, when only a leading part is split and read (the
  // rest stored but unread: Kimi-K3's A_log); 0: the whole block.
  int64_t split_extent = 0;
  // Non-empty: not in the checkpoint; a copy of this tensor (a tied lm_head on the last stage).
  std::string tied_source;
  // kShapeMeta: the values it holds (the module's logical [out, in]).
  std::vector<int64_t> meta_values;
  // A part of a non-routed linear (weight, scales, zero points, ...): the module's logical
  // [out, in] in elements; empty otherwise.
  std::vector<int64_t> linear_shape;
  LayerSet layers;            // layer indices on this rank; empty for non-layer tensors
  int64_t bytes = 0;          // padded bytes, all layers together
  int64_t padding_bytes = 0;  // bytes spent on padding, all layers together

  int64_t count() const { return layers.empty() ? 1 : static_cast<int64_t>(layers.size()); }
};

struct RankPlan {
  RankCoords coords;
  std::vector<int64_t> expert_slots;  // global expert id of each local slot (EPLB may repeat)
  std::vector<int64_t> layers;        // decoder layers on this rank's pipeline stage
  std::vector<TensorShard> tensors;

  int64_t BytesOf(TensorCategory category) const;
  int64_t PaddingBytesOf(TensorCategory category) const;
  int64_t WeightBytes() const;
};

struct ShardPlan {
  ModelConfig model;
  PlanOptions options;
  ResolvedTopology topology;
  BackendSpec backend;
  WeightScheme expert_scheme;   // how the routed experts are stored (the model's quantization)
  ExpertLayout experts;         // how the family names and lays out its routed experts
  int64_t num_slots = 0;        // experts + redundant experts
  DimLayout intermediate;       // routed experts' I
  DimLayout hidden;             // routed experts' H (latent width for latent MoE)
  std::vector<RankPlan> ranks;  // [world]
  // With an expert load: max / mean routed tokens per MoE EP rank for each measured layer,
  // under the linear placement of the same slots and under the plan's placement.
  std::vector<double> load_imbalance_linear, load_imbalance_placed;
  std::vector<std::string> notes;

  // Ranks grouped by identical routed-expert layout (expert count, bytes and padding bytes):
  // "rank kinds", most slots and bytes first, then least padding.
  std::vector<std::vector<int64_t>> RoutedRankKinds() const;
};

// Builds the plan; every user-caused problem (impossible topology, backend that cannot run the
// format, indivisible quantization groups, uneven experts on a backend that forbids it) is an
// error naming the numbers and the nearest valid choices.
Result<ShardPlan> BuildShardPlan(const ModelConfig& model, const PlanOptions& options);

// Routed-expert slots held by EP rank `ep_rank`, as global expert ids.
std::vector<int64_t> ExpertSlotsOf(int64_t num_experts, int64_t num_slots, int64_t ep_size,
                                   int64_t ep_rank, ExpertPlacement placement);

// The routed intermediate layout alone (the padding contract, DESIGN.md rule 4 and 5).
Result<DimLayout> IntermediateLayout(const ModelConfig& model, const ResolvedTopology& topo,
                                     const BackendSpec& backend, PaddingPolicy policy);

}  // namespace moeshard
