// Per-rank loading: see moeshard/weights/loader.h.
#include "moeshard/weights/loader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <new>
#include <set>

#include "weights/checkpoint_map.h"
#include "weights/tensor_source.h"

namespace moeshard {

using internal::MappedTensor;

namespace {

int64_t Bytes(DType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return DTypeBytes(dtype, n).value_or(0);
}

// The tensors of one rank: each plan shard at each built layer.
Result<std::vector<MappedTensor>> MapRank(const ShardPlan& plan, int64_t rank,
                                          const std::vector<int64_t>& layers, bool map_pieces) {
  const RankPlan& rp = plan.ranks[static_cast<size_t>(rank)];
  const std::set<int64_t> build(layers.begin(), layers.end());
  std::vector<MappedTensor> out;
  for (const TensorShard& s : rp.tensors) {
    std::vector<int64_t> at;
    if (s.layers.empty()) {
      at.push_back(-1);
    } else {
      for (int64_t l : s.layers) {
        if (build.count(l)) at.push_back(l);
      }
    }
    for (int64_t l : at) {
      if (map_pieces) {
        MOESHARD_ASSIGN_OR_RETURN(MappedTensor t, internal::MapRankTensor(plan, rank, s, l));
        out.push_back(std::move(t));
      } else {
        MappedTensor t;
        t.name = internal::ConcreteName(s.name, l);
        t.shard = &s;
        t.layer = l;
        t.buffer_bytes = Bytes(s.dtype, s.padded_shape);
        t.data_bytes = t.buffer_bytes;
        out.push_back(std::move(t));
      }
    }
  }
  return out;
}

// Allocates every buffer of `tensors` (zeroed), counting them in `stats`.
Result<RankWeights> AllocateRank(const ShardPlan& plan, int64_t rank,
                                 const std::vector<MappedTensor>& tensors, LoadStats* stats) {
  RankWeights weights(rank);
  weights.Reserve(tensors.size());
  try {
    for (const MappedTensor& t : tensors) {
      TensorBuffer b;
      b.name = t.name;
      b.category = t.shard->category;
      b.dtype = t.shard->dtype;
      b.layer = t.layer;
      b.shape = t.shard->padded_shape;
      b.local_shape = t.shard->local_shape;
      b.data = AlignedBuffer(static_cast<size_t>(t.buffer_bytes));
      stats->bytes_allocated += t.buffer_bytes;
      stats->bytes_by_category[b.category] += t.buffer_bytes;
      weights.Add(std::move(b));
    }
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(fmt::format(
        "{} load: out of memory after allocating {} bytes of the rank's weights (build fewer "
        "layers with --layers N, or one rank at a time)",
        internal::RankTag(plan, rank), stats->bytes_allocated));
  }
  stats->num_tensors = static_cast<int64_t>(tensors.size());
  return weights;
}

}  // namespace

std::vector<int64_t> LayersToBuild(const ShardPlan& plan, const RankPlan& rank_plan,
                                   int64_t max_moe_layers) {
  if (max_moe_layers < 0) return rank_plan.layers;
  std::vector<int64_t> out;
  int64_t moe = 0;
  for (int64_t l : rank_plan.layers) {
    if (moe >= max_moe_layers) break;
    out.push_back(l);
    if (plan.model.layers[static_cast<size_t>(l)].moe) ++moe;
  }
  return out;
}

std::map<TensorCategory, int64_t> PlannedBytesByCategory(const RankPlan& rank_plan,
                                                         const std::vector<int64_t>& layers) {
  std::map<TensorCategory, int64_t> out;
  for (TensorCategory c : kAllCategories) out[c] = 0;
  const std::set<int64_t> build(layers.begin(), layers.end());
  for (const TensorShard& s : rank_plan.tensors) {
    if (s.layers.empty()) {
      out[s.category] += s.bytes;
      continue;
    }
    int64_t n = 0;
    for (int64_t l : s.layers) n += build.count(l) ? 1 : 0;
    out[s.category] += s.bytes / s.count() * n;
  }
  return out;
}

Result<std::vector<SourceTensorSpec>> ExpectedCheckpointTensors(const ShardPlan& plan) {
  std::map<std::string, SourceTensorSpec> all;
  // Ranks that differ only in moe_tp_rank read the same expert tensors, and ranks that differ
  // only in DP/EP read the same non-expert tensors: map one representative of each.
  std::set<std::pair<int64_t, int64_t>> seen_experts, seen_plain;
  for (const RankPlan& rp : plan.ranks) {
    const bool new_experts =
        seen_experts.insert({rp.coords.pp_stage, rp.coords.moe_ep_rank}).second;
    const bool new_plain = seen_plain.insert({rp.coords.pp_stage, rp.coords.tp_rank}).second;
    if (!new_experts && !new_plain) continue;
    for (const TensorShard& s : rp.tensors) {
      const bool expert = s.category == TensorCategory::kRoutedExperts;
      if (expert ? !new_experts : !new_plain) continue;
      std::vector<int64_t> at;
      if (s.layers.empty()) at.push_back(-1);
      for (int64_t l : s.layers) at.push_back(l);
      for (int64_t l : at) {
        MOESHARD_ASSIGN_OR_RETURN(MappedTensor t,
                                  internal::MapRankTensor(plan, rp.coords.rank, s, l));
        for (SourceTensorSpec& src : t.sources) {
          std::string name = src.name;
          all.emplace(std::move(name), std::move(src));
        }
      }
    }
  }
  std::vector<SourceTensorSpec> out;
  out.reserve(all.size());
  for (auto& [name, spec] : all) out.push_back(std::move(spec));
  return out;
}

WeightLoader::WeightLoader(const ShardPlan& plan, const LoadOptions& options,
                           const internal::TensorSourceFormat& format)
    : plan_(plan), options_(options), format_(format) {}

WeightLoader::~WeightLoader() = default;

const std::vector<std::string>& WeightLoader::unplaced_tensors() const {
  return source_->unplaced_tensors();
}

const std::vector<std::string>& WeightLoader::mtp_tensors() const { return source_->mtp_tensors(); }

Result<std::unique_ptr<WeightLoader>> WeightLoader::Create(const ShardPlan& plan,
                                                           const LoadOptions& options) {
  const internal::TensorSourceFormat* format = internal::FindTensorSourceFormat(options.source);
  if (format == nullptr) {
    std::vector<std::string> names;
    for (const internal::TensorSourceFormat& f : internal::TensorSourceFormats()) {
      names.emplace_back(f.name);
    }
    return InvalidArgumentError(
        fmt::format("load: source '{}': expected one of {} (the sources registered in "
                    "src/weights/tensor_source.cc)",
                    options.source, fmt::join(names, ", ")));
  }
  std::unique_ptr<WeightLoader> loader(new WeightLoader(plan, options, *format));
  MOESHARD_ASSIGN_OR_RETURN(loader->source_, format->open(plan, options));
  return loader;
}

Result<RankWeights> WeightLoader::Load(int64_t rank, LoadStats* stats) const {
  const ShardPlan& plan = plan_;
  if (rank < 0 || rank >= plan.topology.world) {
    return InvalidArgumentError(fmt::format(
        "load: rank {}: expected a rank below the world size {}", rank, plan.topology.world));
  }
  const RankPlan& rp = plan.ranks[static_cast<size_t>(rank)];
  const std::vector<int64_t> layers = LayersToBuild(plan, rp, options_.max_moe_layers);
  const bool windows = format_.layout == internal::SourceLayout::kCheckpointTensors;
  MOESHARD_ASSIGN_OR_RETURN(std::vector<MappedTensor> tensors,
                            MapRank(plan, rank, layers, windows));

  // Allocate every buffer (zeroed) before filling.
  LoadStats st;
  MOESHARD_ASSIGN_OR_RETURN(RankWeights weights, AllocateRank(plan, rank, tensors, &st));
  int64_t data_bytes = 0;
  for (const MappedTensor& t : tensors) data_bytes += t.data_bytes;
  // Padding is done once allocated (zero): count it so progress sums to the allocation.
  if (options_.progress && st.bytes_allocated > data_bytes) {
    options_.progress(st.bytes_allocated - data_bytes);
  }
  if (!options_.fill) {
    if (stats != nullptr) *stats = st;
    return weights;
  }

  std::unique_ptr<ThreadPool> own_pool;
  ThreadPool* pool = options_.pool;
  if (pool == nullptr) {
    own_pool = std::make_unique<ThreadPool>(options_.num_threads);
    pool = own_pool.get();
  }
  std::atomic<int64_t> filled{0};
  internal::RankFill fill{.plan = &plan,
                          .rank = rank,
                          .tensors = &tensors,
                          .all_layers = options_.max_moe_layers < 0,
                          .pool = pool,
                          .report = [&](int64_t n) {
                            filled.fetch_add(n, std::memory_order_relaxed);
                            if (options_.progress) options_.progress(n);
                          }};
  // The buffers' base pointers, by tensor index (RankWeights holds them in the same order).
  fill.dst.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    fill.dst[i] = weights.FindMutable(tensors[i].name)->data.data();
  }
  MOESHARD_ASSIGN_OR_RETURN(internal::FillStats fs, source_->Fill(fill));
  st.bytes_read = fs.bytes_read;
  st.num_source_tensors = fs.num_source_tensors;
  st.bytes_filled = filled.load();
  if (stats != nullptr) *stats = st;
  return weights;
}

Result<RankWeights> LoadRankWeights(const ShardPlan& plan, int64_t rank, const LoadOptions& options,
                                    LoadStats* stats) {
  MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<WeightLoader> loader,
                            WeightLoader::Create(plan, options));
  return loader->Load(rank, stats);
}

}  // namespace moeshard
