// Per-rank loading: see moeshard/weights/loader.h.
#include "moeshard/weights/loader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <new>
#include <set>
#include <unordered_set>

#include "plan/plan_json.h"
#include "moeshard/weights/dummy_weights.h"
#include "moeshard/weights/presharded.h"
#include "weights/presharded_manifest.h"
#include "weights/checkpoint_map.h"
#include "weights/quant_layouts.h"

namespace moeshard {

using internal::MappedTensor;
using internal::Piece;

namespace {

// Work items are at most this many destination bytes, so a 1 GiB embedding spreads over all
// threads and progress moves smoothly; 4 MiB keeps the per-item overhead negligible.
constexpr int64_t kItemBytes = int64_t{4} << 20;

std::string RankTag(const ShardPlan& plan, int64_t rank) {
  return fmt::format("[rank {}/{}]", rank, plan.topology.world);
}

std::string Dims(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

int64_t Bytes(DType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return DTypeBytes(dtype, n).value_or(0);
}

// A checkpoint tensor is compatible with the expected spec when it is the same dtype and shape,
// or one of the byte-identical spellings real checkpoints use: E8M0 scales as U8 or F8_E8M0,
// packed 4-bit weights as U8 [.., n] or I32 [.., n / 4] (compressed-tensors pack-quantized).
bool Compatible(const SourceTensorSpec& want, const TensorInfo& got) {
  if (got.dtype == want.dtype && got.shape == want.shape) return true;
  // One value stored as a scalar [] where [1] is expected (ModelOpt's per-tensor scales).
  if (got.dtype == want.dtype && got.shape.empty() && want.shape == std::vector<int64_t>{1}) {
    return true;
  }
  if (want.encoding == SourceEncoding::kScalarF32 || want.encoding == SourceEncoding::kReciprocalF32 ||
      want.encoding == SourceEncoding::kTensorScale) {
    // One F32 per tensor, stored as a scalar [] (ModelOpt) or [1] (compressed-tensors).
    return got.dtype == DType::kF32 && (got.shape.empty() || got.shape == std::vector<int64_t>{1});
  }
  if (want.dtype == DType::kU8 && got.dtype == DType::kF8E8M0 && got.shape == want.shape) {
    return true;
  }
  if (want.dtype == DType::kU8 && got.dtype == DType::kI32 && !want.shape.empty() &&
      got.shape.size() == want.shape.size() && want.shape.back() % 4 == 0) {
    std::vector<int64_t> s = want.shape;
    s.back() /= 4;
    return got.shape == s;
  }
  return false;
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

// Runs fn(i) for i in [0, n) on the pool, stopping at the first error.
Status ParallelForStatus(ThreadPool& pool, int64_t n, const std::function<Status(int64_t)>& fn) {
  std::mutex mu;
  Status first;
  std::atomic<bool> failed{false};
  pool.ParallelFor(n, 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end && !failed.load(std::memory_order_relaxed); ++i) {
      Status s;
      try {
        s = fn(i);
      } catch (const std::exception& e) {
        s = InternalError(e.what());
      }
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = s;
        failed = true;
      }
    }
  });
  return first;
}

struct Item {
  int tensor = 0;
  int piece = 0;
  int64_t row_begin = 0;  // window rows [row_begin, row_end)
  int64_t row_end = 0;
};

std::vector<Item> SplitItems(const std::vector<MappedTensor>& tensors) {
  std::vector<Item> items;
  for (size_t t = 0; t < tensors.size(); ++t) {
    for (size_t p = 0; p < tensors[t].pieces.size(); ++p) {
      const Piece& piece = tensors[t].pieces[p];
      if (piece.bytes() == 0) continue;
      const int64_t rows_per =
          std::max<int64_t>(1, kItemBytes / std::max<int64_t>(1, piece.cols()));
      for (int64_t r = piece.window.row_begin; r < piece.window.row_end; r += rows_per) {
        items.push_back({static_cast<int>(t), static_cast<int>(p), r,
                         std::min(piece.window.row_end, r + rows_per)});
      }
    }
  }
  return items;
}

// Writes window rows [a, b) (already in `rows`, `cols` bytes each, contiguous) transposed into
// the destination: window element (r, c) -> dst element (c, r).
void ScatterTransposed(const Piece& p, int64_t a, int64_t b, const std::byte* rows,
                       std::byte* dst) {
  const int64_t es = p.element_bytes, cols = p.cols(), n = cols / es;
  for (int64_t r = a; r < b; ++r) {
    const std::byte* src = rows + (r - a) * cols;
    std::byte* d = dst + p.dst_offset + (r - p.window.row_begin) * es;
    for (int64_t c = 0; c < n; ++c) {
      std::memcpy(d + c * p.window.dst_row_stride, src + c * es, static_cast<size_t>(es));
    }
  }
}

}  // namespace

const char* LoadSourceName(LoadOptions::Source source) {
  switch (source) {
    case LoadOptions::Source::kDummy: return "dummy";
    case LoadOptions::Source::kCheckpoint: return "safetensors";
    case LoadOptions::Source::kPresharded: return "presharded";
  }
  return "?";
}

Result<LoadOptions::Source> ParseLoadFormat(const std::string& load_format,
                                            const std::string& checkpoint,
                                            std::initializer_list<LoadOptions::Source> allowed) {
  using S = LoadOptions::Source;
  std::string names = "auto";
  for (S a : allowed) names += fmt::format(", {}", LoadSourceName(a));
  S source = S::kDummy;
  if (load_format == "auto" || load_format.empty()) {
    source = checkpoint.empty() ? S::kDummy
             : IsPreshardedDir(checkpoint) ? S::kPresharded
                                            : S::kCheckpoint;
  } else if (load_format == "dummy") {
    source = S::kDummy;
  } else if (load_format == "safetensors") {
    source = S::kCheckpoint;
  } else if (load_format == "presharded") {
    source = S::kPresharded;
  } else {
    return InvalidArgumentError(
        fmt::format("'--load-format {}': expected {}", load_format, names));
  }
  if (std::find(allowed.begin(), allowed.end(), source) == allowed.end()) {
    return InvalidArgumentError(fmt::format(
        "'--load-format {}': this command reads {}, not {} (--checkpoint {})",
        load_format.empty() ? "auto" : load_format, names, LoadSourceName(source),
        checkpoint.empty() ? "not given" : checkpoint));
  }
  if (source == S::kDummy && !checkpoint.empty()) {
    return InvalidArgumentError(
        fmt::format("'--load-format dummy': expected no --checkpoint, got '{}'", checkpoint));
  }
  if (source != S::kDummy && checkpoint.empty()) {
    return InvalidArgumentError(
        fmt::format("'--load-format {}': expected --checkpoint DIR", LoadSourceName(source)));
  }
  return source;
}

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

WeightLoader::WeightLoader(const ShardPlan& plan, const LoadOptions& options)
    : plan_(plan), options_(options) {}

WeightLoader::~WeightLoader() = default;

Result<std::unique_ptr<WeightLoader>> WeightLoader::Create(const ShardPlan& plan,
                                                           const LoadOptions& options) {
  std::unique_ptr<WeightLoader> loader(new WeightLoader(plan, options));
  switch (options.source) {
    case LoadOptions::Source::kDummy: break;
    case LoadOptions::Source::kCheckpoint: {
      if (options.checkpoint != nullptr) {
        loader->checkpoint_ = options.checkpoint;
      } else {
        MOESHARD_ASSIGN_OR_RETURN(loader->owned_checkpoint_,
                                  Checkpoint::Open(options.checkpoint_dir));
        loader->checkpoint_ = loader->owned_checkpoint_.get();
      }
      const Checkpoint& ckpt = *loader->checkpoint_;
      MOESHARD_ASSIGN_OR_RETURN(std::vector<SourceTensorSpec> expected,
                                ExpectedCheckpointTensors(plan));
      // Every tensor the model needs must be there, in the expected dtype and shape.
      std::vector<std::string> missing;
      std::unordered_set<std::string> names;
      for (const SourceTensorSpec& spec : expected) {
        names.insert(spec.name);
        const Checkpoint::Entry* e = ckpt.Find(spec.name);
        if (e == nullptr) {
          missing.push_back(spec.name);
          continue;
        }
        if (!Compatible(spec, *e->info)) {
          return InvalidArgumentError(fmt::format(
              "load: '{}' in {}: {} {} does not match config {} {} (wrong config.json or "
              "topology flags for this checkpoint?)",
              spec.name, e->file->path(), DTypeName(e->info->dtype), Dims(e->info->shape),
              DTypeName(spec.dtype), Dims(spec.shape)));
        }
      }
      if (!missing.empty()) {
        const size_t show = std::min<size_t>(missing.size(), 8);
        return NotFoundError(fmt::format(
            "load: checkpoint '{}': expected {} tensor{} the model needs, e.g. {} (wrong "
            "--model for this checkpoint, or an incomplete download?)",
            ckpt.path(), missing.size(), missing.size() == 1 ? "" : "s",
            fmt::format("'{}'", fmt::join(missing.begin(), missing.begin() + show, "', '"))));
      }
      const ModelConfig& m = plan.model;
      for (const auto& [name, entry] : ckpt.tensors()) {
        if (names.count(name)) continue;
        if (IsMtpTensor(m, name)) {
          loader->mtp_.push_back(name);  // loaded only for speculative decoding
        } else {
          loader->unplaced_.push_back(name);
        }
      }
      break;
    }
    case LoadOptions::Source::kPresharded: {
      MOESHARD_ASSIGN_OR_RETURN(nlohmann::json manifest,
                                ReadPreshardedManifest(options.checkpoint_dir));
      const nlohmann::json want = ShardPlanToJson(plan, true);
      const nlohmann::json& got = manifest["plan"];
      if (got != want) {
        // Name the first part that differs, in the order a user would fix it.
        for (const char* key : {"model", "topology", "backend", "padding_policy",
                                "routed_experts", "ranks", "notes"}) {
          const nlohmann::json a = want.value(key, nlohmann::json()),
                               b = got.value(key, nlohmann::json());
          if (a == b) continue;
          std::string fix = "pass the model and flags it was sharded with; see its manifest.json";
          if (std::string_view(key) == "backend") {
            fix = fmt::format("pass --moe-backend {}, or shard it again for {}",
                              b.value("name", std::string("?")), plan.backend.name);
          }
          auto brief = [](const nlohmann::json& j) {
            std::string t = j.dump();
            return t.size() > 160 ? t.substr(0, 157) + "..." : t;
          };
          return InvalidArgumentError(fmt::format(
              "load: pre-sharded checkpoint '{}' was made for a different plan: '{}': expected {} "
              "(this plan: {} {}), got {} ({})",
              options.checkpoint_dir, key, brief(a), plan.model.name, plan.topology.Label(),
              brief(b), fix));
        }
        return InvalidArgumentError(fmt::format(
            "load: pre-sharded checkpoint '{}': made for a different plan than {} {} (see its "
            "manifest.json)",
            options.checkpoint_dir, plan.model.name, plan.topology.Label()));
      }
      break;
    }
  }
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
  const bool presharded = options_.source == LoadOptions::Source::kPresharded;
  MOESHARD_ASSIGN_OR_RETURN(std::vector<MappedTensor> tensors,
                            MapRank(plan, rank, layers, !presharded));

  // Allocate every buffer (zeroed) before filling.
  RankWeights weights(rank);
  weights.Reserve(tensors.size());
  LoadStats st;
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
      st.bytes_allocated += t.buffer_bytes;
      st.bytes_by_category[b.category] += t.buffer_bytes;
      weights.Add(std::move(b));
    }
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(fmt::format(
        "{} load: out of memory after allocating {} bytes of the rank's weights (build fewer "
        "layers with --layers N, or one rank at a time)",
        RankTag(plan, rank), st.bytes_allocated));
  }
  st.num_tensors = static_cast<int64_t>(tensors.size());
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
  auto report = [&](int64_t n) {
    filled.fetch_add(n, std::memory_order_relaxed);
    if (options_.progress) options_.progress(n);
  };
  // The buffers' base pointers, by tensor index (RankWeights holds them in the same order).
  std::vector<std::byte*> dst(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    dst[i] = weights.FindMutable(tensors[i].name)->data.data();
  }

  if (presharded) {
    const std::string path = (std::filesystem::path(options_.checkpoint_dir) /
                              PreshardedRankFileName(rank, plan.topology.world))
                                 .string();
    MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
    for (const MappedTensor& t : tensors) {
      const TensorInfo* info = file->Find(t.name);
      if (info == nullptr) {
        return NotFoundError(
            fmt::format("{} load: '{}' in {}: missing (a pre-sharded file of "
                        "another plan, or a damaged one)",
                        RankTag(plan, rank), t.name, path));
      }
      if (info->dtype != t.shard->dtype || info->shape != t.shard->padded_shape) {
        return DataLossError(
            fmt::format("{} load: '{}' in {}: {} {} does not match the plan's "
                        "{} {}",
                        RankTag(plan, rank), t.name, path, DTypeName(info->dtype),
                        Dims(info->shape), DTypeName(t.shard->dtype), Dims(t.shard->padded_shape)));
      }
    }
    if (options_.max_moe_layers < 0 && file->tensors().size() != tensors.size()) {
      return DataLossError(fmt::format("{} load: {}: expected {} tensors, got {}",
                                       RankTag(plan, rank), path, tensors.size(),
                                       file->tensors().size()));
    }
    // Whole tensors, in chunks of kItemBytes.
    std::vector<std::pair<int, int64_t>> chunks;
    for (size_t i = 0; i < tensors.size(); ++i) {
      for (int64_t off = 0; off < tensors[i].buffer_bytes; off += kItemBytes) {
        chunks.push_back({static_cast<int>(i), off});
      }
    }
    MOESHARD_RETURN_IF_ERROR(
        ParallelForStatus(*pool, static_cast<int64_t>(chunks.size()), [&](int64_t c) -> Status {
          const auto [i, off] = chunks[static_cast<size_t>(c)];
          const MappedTensor& t = tensors[static_cast<size_t>(i)];
          const int64_t n = std::min(kItemBytes, t.buffer_bytes - off);
          MOESHARD_RETURN_IF_ERROR(file->ReadRange(
              *file->Find(t.name), off,
              std::span<std::byte>(dst[static_cast<size_t>(i)] + off, static_cast<size_t>(n))));
          report(n);
          return Status::Ok();
        }));
    st.bytes_read = file->bytes_read();
    st.num_source_tensors = static_cast<int64_t>(tensors.size());
  } else {
    // Per source tensor: checkpoint entry or dummy key and kind.
    struct Source {
      const Checkpoint::Entry* entry = nullptr;
      uint64_t key = 0;
      DummyKind kind = DummyKind::kWeight;
      int64_t element_bytes = 1;
      DType dtype = DType::kU8;
      const std::vector<int64_t>* values = nullptr;  // known values (weight_shape)
      const SourceTensorSpec* spec = nullptr;          // set when it is converted
    };
    std::vector<std::vector<Source>> sources(tensors.size());
    std::unordered_set<std::string> distinct;
    for (size_t i = 0; i < tensors.size(); ++i) {
      for (const SourceTensorSpec& spec : tensors[i].sources) {
        distinct.insert(spec.name);
        Source s;
        const bool encoded = spec.encoding != SourceEncoding::kDirect;
        s.dtype = encoded ? spec.view_dtype : spec.dtype;  // what the windows address
        s.element_bytes = DTypeBits(s.dtype) / 8;
        if (encoded) s.spec = &spec;
        if (options_.source == LoadOptions::Source::kCheckpoint) {
          s.entry = checkpoint_->Find(spec.name);
          if (s.entry == nullptr) {
            return NotFoundError(
                fmt::format("{} load: '{}': not in checkpoint '{}' (needed for "
                            "'{}')",
                            RankTag(plan, rank), spec.name, checkpoint_->path(), tensors[i].name));
          }
          if (!Compatible(spec, *s.entry->info)) {
            return InvalidArgumentError(fmt::format(
                "{} load: '{}' in {}: {} {} does not match config {} {} (wrong config.json for "
                "this checkpoint?)",
                RankTag(plan, rank), spec.name, s.entry->file->path(),
                DTypeName(s.entry->info->dtype), Dims(s.entry->info->shape), DTypeName(spec.dtype),
                Dims(spec.shape)));
          }
        } else {
          s.key = DummyTensorKey(options_.seed, spec.name);
          s.kind = spec.dummy_kind;
          if (!spec.values.empty()) s.values = &spec.values;
        }
        sources[i].push_back(s);
      }
    }
    st.num_source_tensors = static_cast<int64_t>(distinct.size());
    const std::vector<Item> items = SplitItems(tensors);
    const int64_t read_before = checkpoint_ != nullptr ? checkpoint_->bytes_read() : 0;

    // Produces window rows [a, b) of piece p into `out` (row r at out + (r - a) * stride).
    auto produce = [&](const Source& src, const Piece& p, int64_t a, int64_t b, std::byte* out,
                       int64_t stride) -> Status {
      if (src.entry != nullptr && src.spec != nullptr) {
        return internal::ReadEncoded(*src.entry->file, *src.entry->info, *src.spec, a, b,
                                     p.window.col_begin, p.window.col_end, out, stride);
      }
      if (src.entry != nullptr) {
        Slice2D w = p.window;
        w.row_begin = a;
        w.row_end = b;
        w.dst_row_stride = stride;
        return src.entry->file->ReadSlice2D(
            *src.entry->info, w,
            std::span<std::byte>(out, static_cast<size_t>(w.DstBytesNeeded())));
      }
      for (int64_t r = a; r < b; ++r) {
        const int64_t flat = p.window.base_offset + r * p.window.row_bytes + p.window.col_begin;
        std::byte* row = out + (r - a) * stride;
        if (src.values != nullptr) {
          // Known integers (I32 or I64), element by element from the window's start.
          for (int64_t c = 0; c < p.cols() / src.element_bytes; ++c) {
            const int64_t v = (*src.values)[static_cast<size_t>(flat / src.element_bytes + c) %
                                            src.values->size()];
            if (src.element_bytes == 8) {
              std::memcpy(row + c * 8, &v, 8);
            } else {
              const int32_t v32 = static_cast<int32_t>(v);
              std::memcpy(row + c * 4, &v32, 4);
            }
          }
          continue;
        }
        if (src.spec != nullptr && RowUniformEncoding(src.spec->encoding)) {
          // One value per view row (per-channel) or per tensor, repeated along the row.
          const int64_t index = src.spec->encoding == SourceEncoding::kRowScale ? r : 0;
          for (int64_t c = 0; c < p.cols(); c += src.element_bytes) {
            FillDummy(src.key, src.dtype, src.kind, index,
                      std::span<std::byte>(row + c, static_cast<size_t>(src.element_bytes)));
          }
          continue;
        }
        FillDummy(src.key, src.dtype, src.kind, flat / src.element_bytes,
                  std::span<std::byte>(row, static_cast<size_t>(p.cols())));
      }
      return Status::Ok();
    };
    MOESHARD_RETURN_IF_ERROR(
        ParallelForStatus(*pool, static_cast<int64_t>(items.size()), [&](int64_t k) -> Status {
          const Item& it = items[static_cast<size_t>(k)];
          const MappedTensor& t = tensors[static_cast<size_t>(it.tensor)];
          const Piece& p = t.pieces[static_cast<size_t>(it.piece)];
          const Source& src =
              sources[static_cast<size_t>(it.tensor)][static_cast<size_t>(p.source_idx)];
          std::byte* base = dst[static_cast<size_t>(it.tensor)];
          Status s;
          if (p.transpose) {
            std::vector<std::byte> tmp(static_cast<size_t>((it.row_end - it.row_begin) * p.cols()));
            s = produce(src, p, it.row_begin, it.row_end, tmp.data(), p.cols());
            if (s.ok()) ScatterTransposed(p, it.row_begin, it.row_end, tmp.data(), base);
          } else {
            std::byte* out =
                base + p.dst_offset + (it.row_begin - p.window.row_begin) * p.window.dst_row_stride;
            s = produce(src, p, it.row_begin, it.row_end, out, p.window.dst_row_stride);
          }
          if (!s.ok())
            return s.WithContext(fmt::format("{} load: '{}'", RankTag(plan, rank), t.name));
          report((it.row_end - it.row_begin) * p.cols());
          return Status::Ok();
        }));
    if (checkpoint_ != nullptr) st.bytes_read = checkpoint_->bytes_read() - read_before;
  }
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
