// Rank tensor -> checkpoint windows, per family naming (see checkpoint_map.h and loader.h).
#include "weights/checkpoint_map.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "moeshard/base/math.h"

namespace moeshard::internal {
namespace {

constexpr std::string_view kExpertsPrefix = "model.layers.{layer}.mlp.experts.";

int64_t Product(const std::vector<int64_t>& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end && i < shape.size(); ++i) n *= shape[i];
  return n;
}

int64_t BytesOf(DType dtype, const std::vector<int64_t>& shape) {
  return DTypeBytes(dtype, Product(shape, 0, shape.size())).value_or(-1);
}

int64_t ElementBytes(DType dtype) { return DTypeBits(dtype) / 8; }

std::string FamilyPrefix(const ModelConfig& m) {
  return m.family == ModelFamily::kKimiK3 ? "language_model." : "";
}

Status MapError(const ShardPlan& plan, int64_t rank, const std::string& name,
                const std::string& what) {
  return InternalError(
      fmt::format("[rank {}/{}] load: '{}': {} (a plan the loader cannot fill: "
                  "moeshard bug)",
                  rank, plan.topology.world, name, what));
}

// Adds `spec` to the tensor's sources (deduplicated) and returns its index.
int AddSource(MappedTensor& t, SourceTensorSpec spec) {
  for (size_t i = 0; i < t.sources.size(); ++i) {
    if (t.sources[i].name == spec.name) return static_cast<int>(i);
  }
  t.sources.push_back(std::move(spec));
  return static_cast<int>(t.sources.size()) - 1;
}

// Non-expert tensors: the checkpoint tensor has the plan's logical (storage) shape; the rank
// holds [begin, end) of shard_dim. View the tensor as [prod(dims before d), bytes from d on]
// and take byte columns [begin * inner, end * inner).
Status MapPlain(const ShardPlan& plan, int64_t rank, MappedTensor& t) {
  const TensorShard& s = *t.shard;
  const ModelConfig& m = plan.model;
  std::string source = FamilyPrefix(m) + t.name;
  if (s.name == "lm_head.weight" && m.tie_word_embeddings) {
    source = FamilyPrefix(m) + "model.embed_tokens.weight";  // the tied head's own copy
  }
  const int64_t es = ElementBytes(s.dtype);
  const int src = AddSource(t, {source, s.dtype, s.logical_shape});
  Piece p;
  p.source_idx = src;
  p.element_bytes = es;
  const int64_t total = BytesOf(s.dtype, s.logical_shape);
  if (s.shard_dim < 0) {
    if (s.local_shape != s.logical_shape) {
      return MapError(
          plan, rank, t.name,
          fmt::format("replicated but local shape [{}] differs "
                      "from logical [{}]",
                      fmt::join(s.local_shape, ", "), fmt::join(s.logical_shape, ", ")));
    }
    if (total == 0) return Status::Ok();
    p.window = Slice2D{.base_offset = 0,
                       .row_bytes = total,
                       .row_begin = 0,
                       .row_end = 1,
                       .col_begin = 0,
                       .col_end = total,
                       .dst_row_stride = total};
  } else {
    const size_t d = static_cast<size_t>(s.shard_dim);
    if (d >= s.logical_shape.size() || s.local_shape.size() != s.logical_shape.size() ||
        s.local_shape[d] != s.shard_end - s.shard_begin) {
      return MapError(plan, rank, t.name,
                      fmt::format("shard dim {} [{}, {}) does not match local shape [{}]", d,
                                  s.shard_begin, s.shard_end, fmt::join(s.local_shape, ", ")));
    }
    const int64_t outer = Product(s.logical_shape, 0, d);
    const int64_t inner = Product(s.logical_shape, d + 1, s.logical_shape.size()) * es;
    const int64_t cols = (s.shard_end - s.shard_begin) * inner;
    if (outer == 0 || cols == 0) return Status::Ok();
    p.window = Slice2D{.base_offset = 0,
                       .row_bytes = s.logical_shape[d] * inner,
                       .row_begin = 0,
                       .row_end = outer,
                       .col_begin = s.shard_begin * inner,
                       .col_end = s.shard_end * inner,
                       .dst_row_stride = cols};
  }
  t.pieces.push_back(p);
  return Status::Ok();
}

// Storage geometry of one per-expert [out, in] matrix part in the expert format.
struct Geometry {
  QuantMethod q;
  bool scale;  // the scale tensor rather than the weight
  const QuantizationConfig* quant;
  DType model_dtype;

  // Storage rows holding `n` logical rows (fp8 scales: one per block of rows).
  int64_t Rows(int64_t n) const {
    return scale && q == QuantMethod::kFp8Block ? CeilDiv(n, int64_t{quant->block_out}) : n;
  }
  // Bytes of `c` logical columns of one storage row.
  int64_t ColBytes(int64_t c) const {
    if (!scale) {
      switch (q) {
        case QuantMethod::kNone: return c * ElementBytes(model_dtype);
        case QuantMethod::kFp8Block: return c;
        case QuantMethod::kMxfp4:
        case QuantMethod::kInt4: return c / 2;
      }
      return c;
    }
    switch (q) {
      case QuantMethod::kNone: return 0;
      case QuantMethod::kFp8Block: return CeilDiv(c, int64_t{quant->block_in}) * 4;
      case QuantMethod::kMxfp4: return c / 32;
      case QuantMethod::kInt4: return CeilDiv(c, int64_t{quant->group_size}) * 2;
    }
    return 0;
  }
};

std::string PerExpertName(const ModelConfig& m, int64_t layer, int64_t expert, int proj,
                          const std::string& leaf) {
  static const char* kMixtral[] = {"w1", "w3", "w2"};
  static const char* kDeepseek[] = {"gate_proj", "up_proj", "down_proj"};
  if (m.family == ModelFamily::kMixtral) {
    return fmt::format("model.layers.{}.block_sparse_moe.experts.{}.{}.{}", layer, expert,
                       kMixtral[proj], leaf);
  }
  return fmt::format("{}model.layers.{}.mlp.experts.{}.{}.{}", FamilyPrefix(m), layer, expert,
                     kDeepseek[proj], leaf);
}

// Routed experts in the fused per-rank layout (shard_plan.h), from per-expert tensors or from
// gpt-oss's fused ones.
Status MapExperts(const ShardPlan& plan, int64_t rank, MappedTensor& t) {
  const TensorShard& s = *t.shard;
  const ModelConfig& m = plan.model;
  const RankPlan& rp = plan.ranks[rank];
  const std::string suffix = s.name.substr(kExpertsPrefix.size());
  const bool w13 = suffix.rfind("w13_", 0) == 0;
  if (!w13 && suffix.rfind("w2_", 0) != 0) {
    return MapError(plan, rank, t.name, "unknown routed-expert tensor");
  }
  const std::string leaf = suffix.substr(w13 ? 4 : 3);  // weight, weight_packed, ..., bias
  const bool bias = leaf == "bias";
  const bool scale = leaf == "weight_scale" || leaf == "weight_scale_inv";
  const int64_t g = m.gated() ? 2 : 1;
  const DimLayout& I = plan.intermediate;
  const DimLayout& H = plan.hidden;
  const int64_t ib = rp.coords.moe_tp_rank * I.raw_local, ie = ib + I.raw_local;
  const int64_t E = m.num_experts;
  const int64_t es = ElementBytes(s.dtype);
  const int64_t num_slots = static_cast<int64_t>(rp.expert_slots.size());
  if (s.padded_shape.empty() || s.padded_shape[0] != num_slots) {
    return MapError(plan, rank, t.name,
                    fmt::format("expected {} local slots, got shape [{}]", num_slots,
                                fmt::join(s.padded_shape, ", ")));
  }
  const int64_t slot_bytes = BytesOf(s.dtype, s.padded_shape) / num_slots;
  const int64_t dst_row = BytesOf(s.dtype, {s.padded_shape.begin() + 2, s.padded_shape.end()});
  const int64_t layer = t.layer;

  if (bias) {
    if (!m.expert_bias || !m.gate_up_fused) {
      return UnimplementedError(fmt::format(
          "[rank {}/{}] load: '{}': expert biases are only known in gpt-oss's fused layout", rank,
          plan.topology.world, t.name));
    }
    const std::string base = fmt::format("model.layers.{}.mlp.experts.", layer);
    const int64_t n = w13 ? 2 * I.logical : H.logical;
    const int src =
        AddSource(t, {base + (w13 ? "gate_up_proj_bias" : "down_proj_bias"), s.dtype, {E, n}});
    const int64_t cb = w13 ? 2 * ib * es : 0, ce = w13 ? 2 * ie * es : n * es;
    for (int64_t slot = 0; slot < num_slots; ++slot) {
      Piece p;
      p.source_idx = src;
      p.element_bytes = es;
      p.window = Slice2D{.base_offset = rp.expert_slots[slot] * n * es,
                         .row_bytes = n * es,
                         .row_begin = 0,
                         .row_end = 1,
                         .col_begin = cb,
                         .col_end = ce,
                         .dst_row_stride = ce - cb};
      p.dst_offset = slot * slot_bytes;
      t.pieces.push_back(p);
    }
    return Status::Ok();
  }

  if (m.gate_up_fused) {
    // gpt-oss: gate_up_proj with gate/up interleaved (row 2j gate j, 2j+1 up j), so the rank's
    // rows [2*ib, 2*ie) are contiguous.
    const std::string base = fmt::format("model.layers.{}.mlp.experts.", layer);
    const std::string proj = w13 ? "gate_up_proj" : "down_proj";
    const int64_t out = w13 ? 2 * I.logical : H.logical;  // rows of the out-major matrix
    const int64_t in = w13 ? H.logical : I.logical;
    const int64_t in_pad = w13 ? H.padded_local : I.padded_local;
    switch (plan.expert_format) {
      case QuantMethod::kMxfp4: {
        const int64_t cols = scale ? in / 32 : in / 2;
        const std::vector<int64_t> shape = scale ? std::vector<int64_t>{E, out, in / 32}
                                                 : std::vector<int64_t>{E, out, in / 32, 16};
        const int src =
            AddSource(t, {base + proj + (scale ? "_scales" : "_blocks"), s.dtype, shape});
        const int64_t unit = scale ? 32 : 2;  // logical columns per storage byte column
        for (int64_t slot = 0; slot < num_slots; ++slot) {
          Piece p;
          p.source_idx = src;
          p.window.base_offset = rp.expert_slots[slot] * out * cols;
          p.window.row_bytes = cols;
          if (w13) {
            p.window.row_begin = 2 * ib, p.window.row_end = 2 * ie;
            p.window.col_begin = 0, p.window.col_end = cols;
          } else {
            p.window.row_begin = 0, p.window.row_end = out;
            p.window.col_begin = ib / unit, p.window.col_end = ie / unit;
          }
          p.window.dst_row_stride = in_pad / unit;
          p.dst_offset = slot * slot_bytes;
          t.pieces.push_back(p);
        }
        return Status::Ok();
      }
      case QuantMethod::kNone: {
        // bf16 gpt-oss stores experts in-major: gate_up_proj [E, H, 2I], down_proj [E, I, H].
        // Read the rank's window and transpose it into the out-major rank layout.
        const int src = AddSource(t, {base + proj, s.dtype, {E, in, out}});
        for (int64_t slot = 0; slot < num_slots; ++slot) {
          Piece p;
          p.source_idx = src;
          p.transpose = true;
          p.element_bytes = es;
          p.window.base_offset = rp.expert_slots[slot] * in * out * es;
          p.window.row_bytes = out * es;
          if (w13) {
            p.window.row_begin = 0, p.window.row_end = in;
            p.window.col_begin = 2 * ib * es, p.window.col_end = 2 * ie * es;
          } else {
            p.window.row_begin = ib, p.window.row_end = ie;
            p.window.col_begin = 0, p.window.col_end = out * es;
          }
          p.window.dst_row_stride = dst_row;
          p.dst_offset = slot * slot_bytes;
          t.pieces.push_back(p);
        }
        return Status::Ok();
      }
      case QuantMethod::kFp8Block:
      case QuantMethod::kInt4: break;
    }
    return UnimplementedError(fmt::format(
        "[rank {}/{}] load: '{}': gpt-oss fused experts in {} are not supported (expected "
        "bf16 or mxfp4)",
        rank, plan.topology.world, t.name, QuantMethodName(plan.expert_format)));
  }

  // Per-expert tensors [out, in]: gate/up [I, H], down [H, I].
  const Geometry geo{plan.expert_format, scale, &m.quant, m.dtype};
  auto spec = [&](int64_t e, int proj) {
    const int64_t out = proj == 2 ? H.logical : I.logical;
    const int64_t in = proj == 2 ? I.logical : H.logical;
    return SourceTensorSpec{
        PerExpertName(m, layer, e, proj, leaf), s.dtype, {geo.Rows(out), geo.ColBytes(in) / es}};
  };
  for (int64_t slot = 0; slot < num_slots; ++slot) {
    const int64_t e = rp.expert_slots[slot];
    if (w13) {
      for (int64_t h = 0; h < g; ++h) {
        const int proj = g == 2 ? static_cast<int>(h) : 1;  // ungated experts: up_proj only
        Piece p;
        p.source_idx = AddSource(t, spec(e, proj));
        p.window = Slice2D{.base_offset = 0,
                           .row_bytes = geo.ColBytes(H.logical),
                           .row_begin = geo.Rows(ib),
                           .row_end = geo.Rows(ie),
                           .col_begin = 0,
                           .col_end = geo.ColBytes(H.logical),
                           .dst_row_stride = geo.ColBytes(H.padded_local)};
        p.dst_offset = slot * slot_bytes + geo.Rows(h * I.padded_local) * p.window.dst_row_stride;
        t.pieces.push_back(p);
      }
    } else {
      Piece p;
      p.source_idx = AddSource(t, spec(e, 2));
      p.window = Slice2D{.base_offset = 0,
                         .row_bytes = geo.ColBytes(I.logical),
                         .row_begin = 0,
                         .row_end = geo.Rows(H.logical),
                         .col_begin = geo.ColBytes(ib),
                         .col_end = geo.ColBytes(ie),
                         .dst_row_stride = geo.ColBytes(I.padded_local)};
      p.dst_offset = slot * slot_bytes;
      t.pieces.push_back(p);
    }
  }
  return Status::Ok();
}

// Every window lies in its source and its destination, and the windows cover exactly the
// unpadded bytes.
Status Validate(const ShardPlan& plan, int64_t rank, const MappedTensor& t) {
  int64_t covered = 0;
  for (const Piece& p : t.pieces) {
    const SourceTensorSpec& src = t.sources[static_cast<size_t>(p.source_idx)];
    const int64_t src_bytes = BytesOf(src.dtype, src.shape);
    const Slice2D& w = p.window;
    if (w.row_end * w.row_bytes + w.base_offset > src_bytes || w.col_end > w.row_bytes) {
      return MapError(plan, rank, t.name,
                      fmt::format("window rows [{}, {}) x bytes [{}, {}) of rows of {} at {} "
                                  "exceeds '{}' ({} bytes)",
                                  w.row_begin, w.row_end, w.col_begin, w.col_end, w.row_bytes,
                                  w.base_offset, src.name, src_bytes));
    }
    int64_t end = 0;
    if (p.rows() > 0 && p.cols() > 0) {
      end = p.transpose ? p.dst_offset + (p.cols() / p.element_bytes - 1) * w.dst_row_stride +
                              p.rows() * p.element_bytes
                        : p.dst_offset + (p.rows() - 1) * w.dst_row_stride + p.cols();
    }
    if (end > t.buffer_bytes) {
      return MapError(plan, rank, t.name,
                      fmt::format("a window from '{}' ends at byte {} of a {}-byte buffer",
                                  src.name, end, t.buffer_bytes));
    }
    covered += p.bytes();
  }
  if (covered != t.data_bytes) {
    return MapError(plan, rank, t.name,
                    fmt::format("the checkpoint windows cover {} bytes, expected the unpadded "
                                "local shape [{}]'s {}",
                                covered, fmt::join(t.shard->local_shape, ", "), t.data_bytes));
  }
  return Status::Ok();
}

}  // namespace

std::string ConcreteName(const std::string& name, int64_t layer) {
  if (layer < 0) return name;
  static const std::string kPlaceholder = "{layer}";
  std::string out = name;
  if (const size_t pos = out.find(kPlaceholder); pos != std::string::npos) {
    out.replace(pos, kPlaceholder.size(), std::to_string(layer));
  }
  return out;
}

Result<MappedTensor> MapRankTensor(const ShardPlan& plan, int64_t rank, const TensorShard& shard,
                                   int64_t layer) {
  MappedTensor t;
  t.name = ConcreteName(shard.name, layer);
  t.shard = &shard;
  t.layer = layer;
  t.buffer_bytes = BytesOf(shard.dtype, shard.padded_shape);
  t.data_bytes = BytesOf(shard.dtype, shard.local_shape);
  if (t.buffer_bytes < 0 || t.data_bytes < 0 || DTypeBits(shard.dtype) % 8 != 0) {
    return MapError(plan, rank, t.name, "shape is not a whole number of bytes");
  }
  if (shard.category == TensorCategory::kRoutedExperts &&
      shard.name.rfind(kExpertsPrefix, 0) == 0) {
    MOESHARD_RETURN_IF_ERROR(MapExperts(plan, rank, t));
  } else {
    MOESHARD_RETURN_IF_ERROR(MapPlain(plan, rank, t));
  }
  MOESHARD_RETURN_IF_ERROR(Validate(plan, rank, t));
  return t;
}

}  // namespace moeshard::internal
