// Rank tensor -> checkpoint windows, named by the family descriptor (see checkpoint_map.h and
// loader.h).
#include "weights/checkpoint_map.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "moeshard/base/math.h"
#include "weights/quant_layouts.h"

namespace moeshard::internal {
namespace {

int64_t Product(const std::vector<int64_t>& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end && i < shape.size(); ++i) n *= shape[i];
  return n;
}

int64_t BytesOf(DType dtype, const std::vector<int64_t>& shape) {
  return DTypeBytes(dtype, Product(shape, 0, shape.size())).value_or(-1);
}

int64_t ElementBytes(DType dtype) { return DTypeBits(dtype) / 8; }

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

// How the dummy source fills a tensor: by its part and storage dtype (the weight-format
// table's: fp8 codes, packed nibbles, E8M0 or float scales), plain tensors by name (norms,
// biases).
DummyKind KindOf(const std::string& name, TensorPart part, DType dtype) {
  switch (part) {
    case TensorPart::kWeight:
      if (dtype == DType::kF8E4M3) return DummyKind::kFp8;
      return dtype == DType::kU8 ? DummyKind::kNibbles : DummyKind::kWeight;
    case TensorPart::kScale:
      if (dtype == DType::kF8E4M3) return DummyKind::kE4M3Scale;
      return dtype == DType::kU8 || dtype == DType::kF8E8M0 ? DummyKind::kE8M0 : DummyKind::kScale;
    case TensorPart::kZeroPoint: return DummyKind::kZeroPoint;
    case TensorPart::kGlobalScale: return DummyKind::kGlobalScale;
    case TensorPart::kInputScale: return DummyKind::kNorm;    // about 1
    case TensorPart::kGroupIndex: return DummyKind::kWeight;  // hashed integers
    case TensorPart::kShapeMeta: return DummyKind::kWeight;
    case TensorPart::kValue: return DummyKindOf(name, dtype);
  }
  return DummyKind::kWeight;
}

// A plain tensor whose split dimension holds blocks of unequal sizes (TensorShard::
// section_sizes): the rank's 1/TP of each block, in order.
Status MapUnequalSections(const ShardPlan& plan, int64_t rank, int src, MappedTensor& t) {
  const TensorShard& s = *t.shard;
  const size_t d = static_cast<size_t>(s.shard_dim);
  const int64_t es = ElementBytes(s.dtype);
  const int64_t tp = plan.topology.tp;
  const int64_t r = plan.ranks[static_cast<size_t>(rank)].coords.tp_rank;
  int64_t sum = 0;
  for (int64_t size : s.section_sizes) sum += size;
  if (d >= s.logical_shape.size() || s.logical_shape[d] != sum || s.local_shape[d] * tp != sum) {
    return MapError(plan, rank, t.name,
                    fmt::format("shard dim {} blocks [{}] do not match logical [{}] / local [{}]",
                                d, fmt::join(s.section_sizes, ", "),
                                fmt::join(s.logical_shape, ", "), fmt::join(s.local_shape, ", ")));
  }
  const int64_t outer = Product(s.logical_shape, 0, d);
  const int64_t inner = Product(s.logical_shape, d + 1, s.logical_shape.size()) * es;
  if (outer == 0 || inner == 0) return Status::Ok();
  int64_t src_at = 0, dst_at = 0;
  for (int64_t size : s.section_sizes) {
    const int64_t slice = size / tp;
    Piece p;
    p.source_idx = src;
    p.element_bytes = es;
    p.window = Slice2D{.base_offset = 0,
                       .row_bytes = sum * inner,
                       .row_begin = 0,
                       .row_end = outer,
                       .col_begin = (src_at + r * slice) * inner,
                       .col_end = (src_at + (r + 1) * slice) * inner,
                       .dst_row_stride = s.local_shape[d] * inner};
    p.dst_offset = dst_at * inner;
    t.pieces.push_back(p);
    src_at += size;
    dst_at += slice;
  }
  return Status::Ok();
}

// Non-expert tensors: the checkpoint tensor has the plan's logical (storage) shape; the rank
// holds [begin, end) of shard_dim in each of its `sections` blocks. View the tensor as
// [prod(dims before d), bytes from d on] and take the byte columns of each block.
// A part of a quantized linear (weight, scales, zero points, global scale) that a checkpoint
// in another layout (AWQ, GPTQ, compressed-tensors, ModelOpt) stores under its own name: read
// as the rank layout's view (quant_layouts.h), rows of the view split by column parallelism,
// bytes of a row by row parallelism.
bool IsQuantizedPart(const ShardPlan& plan, const TensorShard& s) {
  const WeightScheme& q = plan.model.quant.scheme;
  if (!q.quantized() || q.layout == QuantLayout::kNative) return false;
  switch (s.part) {
    case TensorPart::kWeight: return s.dtype == q.spec().weight_dtype;
    case TensorPart::kScale:
    case TensorPart::kZeroPoint:
    case TensorPart::kGlobalScale: return true;
    case TensorPart::kShapeMeta:
    case TensorPart::kInputScale:
    case TensorPart::kGroupIndex:
    case TensorPart::kValue: return false;
  }
  return false;
}

Status MapEncodedPlain(const ShardPlan& plan, int64_t rank, MappedTensor& t) {
  const TensorShard& s = *t.shard;
  const WeightScheme& q = plan.model.quant.scheme;
  const std::string name = ExpandName(s.name, t.layer);
  const std::string leaf = "." + RankLeaf(q, s.part);
  if (name.size() <= leaf.size() ||
      name.compare(name.size() - leaf.size(), leaf.size(), leaf) != 0 ||
      s.linear_shape.size() != 2 || (s.shard_dim >= 0 && s.sections != 1)) {
    return MapError(plan, rank, t.name,
                    fmt::format("a {} part in {} layout without the leaf '{}'",
                                WeightFormatName(q.format), QuantLayoutName(q.layout), leaf));
  }
  const int64_t out = s.linear_shape[0], in = s.linear_shape[1];
  const int src =
      AddSource(t, EncodedSpec(q, s.part, name.substr(0, name.size() - leaf.size()), out, in,
                               plan.model.dtype, KindOf(name, s.part, s.dtype)));
  const SourceTensorSpec& spec = t.sources[static_cast<size_t>(src)];
  const int64_t es = ElementBytes(s.dtype);
  const int64_t rows = spec.view_shape[0];
  const int64_t row_bytes = spec.view_shape.size() > 1 ? spec.view_shape[1] * es : es;
  Piece p;
  p.source_idx = src;
  p.element_bytes = es;
  p.window = Slice2D{.base_offset = 0,
                     .row_bytes = row_bytes,
                     .row_begin = 0,
                     .row_end = rows,
                     .col_begin = 0,
                     .col_end = row_bytes,
                     .dst_row_stride = row_bytes};
  if (s.shard_dim == 0) {
    p.window.row_begin = s.shard_begin;
    p.window.row_end = s.shard_end;
  } else if (s.shard_dim == 1) {
    p.window.col_begin = s.shard_begin * es;
    p.window.col_end = s.shard_end * es;
    p.window.dst_row_stride = s.local_shape[1] * es;
  }
  t.pieces.push_back(p);
  return Status::Ok();
}

Status MapPlain(const ShardPlan& plan, int64_t rank, MappedTensor& t) {
  const TensorShard& s = *t.shard;
  if (IsQuantizedPart(plan, s)) return MapEncodedPlain(plan, rank, t);
  const std::string source = ExpandName(s.tied_source.empty() ? s.name : s.tied_source, t.layer);
  const int64_t es = ElementBytes(s.dtype);
  SourceTensorSpec spec{source, s.dtype, s.logical_shape, KindOf(source, s.part, s.dtype), {}};
  if (s.part == TensorPart::kShapeMeta) spec.values = s.meta_values;
  // Token -> expert tables hold expert ids, which hashed bits are not.
  if (s.role == TensorRole::kHashTable) {
    spec.values = DummyExpertTable(plan.model.num_experts, plan.model.num_experts_per_tok);
  }
  // Act-order group indices are used: the dummy source writes valid ones.
  if (s.part == TensorPart::kGroupIndex && plan.model.quant.scheme.act_order) {
    spec.values = DummyGroupIndex(s.logical_shape[0], plan.model.quant.scheme.group);
  }
  const int src = AddSource(t, std::move(spec));
  const int64_t total = BytesOf(s.dtype, s.logical_shape);
  if (s.shard_dim < 0) {
    if (s.local_shape != s.logical_shape) {
      return MapError(
          plan, rank, t.name,
          fmt::format("replicated but local shape [{}] differs from logical [{}]",
                      fmt::join(s.local_shape, ", "), fmt::join(s.logical_shape, ", ")));
    }
    if (total == 0) return Status::Ok();
    Piece p;
    p.source_idx = src;
    p.element_bytes = es;
    p.window = Slice2D{.base_offset = 0,
                       .row_bytes = total,
                       .row_begin = 0,
                       .row_end = 1,
                       .col_begin = 0,
                       .col_end = total,
                       .dst_row_stride = total};
    t.pieces.push_back(p);
    return Status::Ok();
  }
  const size_t d = static_cast<size_t>(s.shard_dim);
  if (!s.section_sizes.empty()) return MapUnequalSections(plan, rank, src, t);
  const int64_t sections = std::max<int64_t>(1, s.sections);
  const int64_t slice = s.shard_end - s.shard_begin;
  if (d >= s.logical_shape.size() || s.local_shape.size() != s.logical_shape.size() ||
      s.local_shape[d] != sections * slice || s.logical_shape[d] % sections != 0) {
    return MapError(
        plan, rank, t.name,
        fmt::format("shard dim {} [{}, {}) x {} blocks does not match local shape [{}]", d,
                    s.shard_begin, s.shard_end, sections, fmt::join(s.local_shape, ", ")));
  }
  const int64_t outer = Product(s.logical_shape, 0, d);
  const int64_t inner = Product(s.logical_shape, d + 1, s.logical_shape.size()) * es;
  const int64_t block = s.logical_shape[d] / sections;
  const int64_t cols = slice * inner;
  if (outer == 0 || cols == 0) return Status::Ok();
  for (int64_t b = 0; b < sections; ++b) {
    Piece p;
    p.source_idx = src;
    p.element_bytes = es;
    p.window = Slice2D{.base_offset = 0,
                       .row_bytes = s.logical_shape[d] * inner,
                       .row_begin = 0,
                       .row_end = outer,
                       .col_begin = (b * block + s.shard_begin) * inner,
                       .col_end = (b * block + s.shard_end) * inner,
                       .dst_row_stride = sections * cols};
    p.dst_offset = b * cols;
    t.pieces.push_back(p);
  }
  return Status::Ok();
}

// Storage geometry of one per-expert [out, in] matrix part in the expert scheme.
struct Geometry {
  const WeightScheme& q;
  bool scale = false;  // the scale or zero-point tensor rather than the weight
  DType model_dtype = DType::kBF16;
  bool zeros = false;  // the zero points (one byte per scale)

  // Storage rows holding `n` logical rows.
  int64_t Rows(int64_t n) const { return scale ? q.ScaleRows(n) : n; }
  // Bytes of `c` logical columns of one storage row.
  int64_t ColBytes(int64_t c) const {
    if (zeros) return q.ScaleCols(c) * DTypeBits(q.spec().zero_dtype) / 8;
    return scale ? q.ScaleRowBytes(c) : q.WeightRowBytes(c, model_dtype);
  }
};

// What every step of MapExperts reads: the rank tensor's role and part, the experts' layout
// and scheme, and the rank's window [ib, ie) of I.
struct ExpertMap {
  ExpertMap(const ShardPlan& plan_in, int64_t rank_in, const MappedTensor& t)
      : plan(plan_in),
        rank(rank_in),
        s(*t.shard),
        m(plan.model),
        rp(plan.ranks[static_cast<size_t>(rank)]),
        x(plan.experts),
        q(plan.expert_scheme),
        I(plan.intermediate),
        H(plan.hidden) {
    w13 = s.role == TensorRole::kExpertsW13 || s.role == TensorRole::kExpertsW13Bias;
    bias = s.role == TensorRole::kExpertsW13Bias || s.role == TensorRole::kExpertsW2Bias;
    zeros = s.part == TensorPart::kZeroPoint;
    scale = s.part == TensorPart::kScale || zeros;
    meta = s.part == TensorPart::kShapeMeta;
    global = s.part == TensorPart::kGlobalScale;
    // Another checkpoint layout than the rank's: each part read through its conversion.
    group_index = s.part == TensorPart::kGroupIndex;
    const bool as_stored = s.part == TensorPart::kInputScale || group_index;  // read as they are
    encoded = q.layout != QuantLayout::kNative && q.quantized() && !meta && !bias && !as_stored &&
              s.part != TensorPart::kValue;
    g = m.gated() ? 2 : 1;
    // The rank's checkpoint slice of I (uneven block shards: short or empty on the last ranks).
    ib = I.SliceBegin(rp.coords.moe_tp_rank), ie = I.SliceEnd(rp.coords.moe_tp_rank);
    E = m.num_experts;
    es = ElementBytes(s.dtype);
    num_slots = static_cast<int64_t>(rp.expert_slots.size());
    layer = t.layer;
    kind = bias ? DummyKind::kBias : KindOf(t.name, s.part, s.dtype);
  }
  // The global expert id in local slot `slot`.
  int64_t Expert(int64_t slot) const { return rp.expert_slots[static_cast<size_t>(slot)]; }

  const ShardPlan& plan;
  int64_t rank;
  const TensorShard& s;
  const ModelConfig& m;
  const RankPlan& rp;
  const ExpertLayout& x;
  const WeightScheme& q;
  const DimLayout& I;
  const DimLayout& H;
  bool w13 = false, bias = false, zeros = false, scale = false, meta = false, global = false;
  bool group_index = false, encoded = false;
  int64_t g = 1, ib = 0, ie = 0, E = 0, es = 0, num_slots = 0, layer = 0;
  int64_t slot_bytes = 0, dst_row = 0;  // set once the shape is checked
  DummyKind kind = DummyKind::kWeight;
};

// Fused expert biases [E, n]: each slot's row, w13's columns 2*[ib, ie).
Status MapExpertBiases(const ExpertMap& c, MappedTensor& t) {
  const ExpertLayout& x = c.x;
  if (!x.fused || x.bias_suffix.empty()) {
    return UnimplementedError(
        fmt::format("[rank {}/{}] load: '{}': expert biases are only known in fused layouts",
                    c.rank, c.plan.topology.world, t.name));
  }
  const int64_t es = c.es;
  const std::string module = ExpandName(c.w13 ? x.fused_gate_up : x.fused_down, c.layer);
  const int64_t n = c.w13 ? c.g * c.I.logical : c.H.logical;
  const int src = AddSource(t, {module + x.bias_suffix, c.s.dtype, {c.E, n}, c.kind, {}});
  const int64_t cb = c.w13 ? c.g * c.ib * es : 0, ce = c.w13 ? c.g * c.ie * es : n * es;
  for (int64_t slot = 0; slot < c.num_slots; ++slot) {
    Piece p;
    p.source_idx = src;
    p.element_bytes = es;
    p.window = Slice2D{.base_offset = c.Expert(slot) * n * es,
                       .row_bytes = n * es,
                       .row_begin = 0,
                       .row_end = 1,
                       .col_begin = cb,
                       .col_end = ce,
                       .dst_row_stride = ce - cb};
    p.dst_offset = slot * c.slot_bytes;
    t.pieces.push_back(p);
  }
  return Status::Ok();
}

// The module, rows and columns of one fused expert matrix (out-major: [E, out, in]).
struct FusedMatrix {
  std::string module;
  int64_t out = 0;     // rows of the out-major matrix
  int64_t in = 0;      // its columns
  int64_t in_pad = 0;  // the rank's padded columns
};

// Fused MXFP4 blocks and scales [E, out, in/group(, group/2)].
Status MapFusedMxfp4(const ExpertMap& c, const FusedMatrix& f, MappedTensor& t) {
  const WeightScheme& q = c.q;
  const Geometry geo{q, c.scale, c.m.dtype};
  const int64_t cols = geo.ColBytes(f.in);
  const std::vector<int64_t> shape =
      c.scale ? std::vector<int64_t>{c.E, f.out, f.in / q.group}
              : std::vector<int64_t>{c.E, f.out, f.in / q.group, q.group / 2};
  const int src =
      AddSource(t, {f.module + (c.scale ? c.x.fused_scale_suffix : c.x.fused_weight_suffix),
                    c.s.dtype,
                    shape,
                    c.kind,
                    {}});
  for (int64_t slot = 0; slot < c.num_slots; ++slot) {
    Piece p;
    p.source_idx = src;
    p.window.base_offset = c.Expert(slot) * f.out * cols;
    p.window.row_bytes = cols;
    if (c.w13) {
      p.window.row_begin = c.g * c.ib, p.window.row_end = c.g * c.ie;
      p.window.col_begin = 0, p.window.col_end = cols;
    } else {
      p.window.row_begin = 0, p.window.row_end = f.out;
      p.window.col_begin = geo.ColBytes(c.ib), p.window.col_end = geo.ColBytes(c.ie);
    }
    p.window.dst_row_stride = geo.ColBytes(f.in_pad);
    p.dst_offset = slot * c.slot_bytes;
    t.pieces.push_back(p);
  }
  return Status::Ok();
}

// Stored input-major: [E, in, out]. Read the rank's window and transpose it into the
// out-major rank layout. Interleaved gate/up (gpt-oss) is one window of 2*[ib, ie) columns;
// gate-then-up halves (Llama-4: columns [0, I) gate, [I, 2I) up) are one window per half, the
// up half landing at row I_padded.
Status MapFusedBf16InMajor(const ExpertMap& c, const FusedMatrix& f, MappedTensor& t) {
  const int64_t es = c.es, in = f.in, out = f.out, ib = c.ib, ie = c.ie;
  const int src = AddSource(t, {f.module, c.s.dtype, {c.E, in, out}, c.kind, {}});
  const int64_t halves = c.w13 && !c.x.gate_up_interleaved ? c.g : 1;
  for (int64_t slot = 0; slot < c.num_slots; ++slot) {
    for (int64_t h = 0; h < halves; ++h) {
      Piece p;
      p.source_idx = src;
      p.transpose = true;
      p.element_bytes = es;
      p.window.base_offset = c.Expert(slot) * in * out * es;
      p.window.row_bytes = out * es;
      p.dst_offset = slot * c.slot_bytes;
      if (c.w13 && halves > 1) {
        p.window.row_begin = 0, p.window.row_end = in;
        p.window.col_begin = (h * c.I.logical + ib) * es;
        p.window.col_end = (h * c.I.logical + ie) * es;
        p.dst_offset += h * c.I.padded_local * c.dst_row;
      } else if (c.w13) {
        p.window.row_begin = 0, p.window.row_end = in;
        p.window.col_begin = c.g * ib * es, p.window.col_end = c.g * ie * es;
      } else {
        p.window.row_begin = ib, p.window.row_end = ie;
        p.window.col_begin = 0, p.window.col_end = out * es;
      }
      p.window.dst_row_stride = c.dst_row;
      t.pieces.push_back(p);
    }
  }
  return Status::Ok();
}

// Stored out-major: [E, out, in] (Qwen3.5: gate rows [0, I), up rows [I, 2I)). The rank's rows
// of each half (interleaved: 2*[ib, ie) at once), or its columns of down.
Status MapFusedBf16OutMajor(const ExpertMap& c, const FusedMatrix& f, MappedTensor& t) {
  const int64_t es = c.es, in = f.in, out = f.out, ib = c.ib, ie = c.ie;
  const int src = AddSource(t, {f.module, c.s.dtype, {c.E, out, in}, c.kind, {}});
  const int64_t halves = c.w13 && !c.x.gate_up_interleaved ? c.g : 1;
  for (int64_t slot = 0; slot < c.num_slots; ++slot) {
    for (int64_t h = 0; h < halves; ++h) {
      Piece p;
      p.source_idx = src;
      p.element_bytes = es;
      p.window.base_offset = c.Expert(slot) * out * in * es;
      p.window.row_bytes = in * es;
      p.window.dst_row_stride = c.dst_row;
      p.dst_offset = slot * c.slot_bytes;
      if (c.w13) {
        const int64_t r0 = halves > 1 ? h * c.I.logical + ib : c.g * ib;
        const int64_t r1 = halves > 1 ? h * c.I.logical + ie : c.g * ie;
        p.window.row_begin = r0, p.window.row_end = r1;
        p.window.col_begin = 0, p.window.col_end = in * es;
        p.dst_offset += h * c.I.padded_local * c.dst_row;
      } else {
        p.window.row_begin = 0, p.window.row_end = out;
        p.window.col_begin = ib * es, p.window.col_end = ie * es;
      }
      t.pieces.push_back(p);
    }
  }
  return Status::Ok();
}

// Fused experts: gate and up interleaved (row 2j gate j, 2j+1 up j), so the rank's rows
// [2*ib, 2*ie) are contiguous, or in halves.
Status MapFusedExperts(const ExpertMap& c, MappedTensor& t) {
  const FusedMatrix f{
      .module = ExpandName(c.w13 ? c.x.fused_gate_up : c.x.fused_down, c.layer),
      .out = c.w13 ? c.g * c.I.logical : c.H.logical,
      .in = c.w13 ? c.H.logical : c.I.logical,
      .in_pad = c.w13 ? c.H.padded_local : c.I.padded_local,
  };
  if (c.q.format == WeightFormat::kMxfp4 && !c.meta) return MapFusedMxfp4(c, f, t);
  if (c.q.format == WeightFormat::kBf16 && c.x.fused_in_major) {
    return MapFusedBf16InMajor(c, f, t);
  }
  if (c.q.format == WeightFormat::kBf16) return MapFusedBf16OutMajor(c, f, t);
  return UnimplementedError(fmt::format(
      "[rank {}/{}] load: '{}': fused experts in {} are not supported (expected bf16 or "
      "mxfp4)",
      c.rank, c.plan.topology.world, t.name, WeightFormatName(c.q.format)));
}

// Per-expert tensors [out, in]: gate/up [I, H], down [H, I]; names and source specs.
struct PerExpertSources {
  explicit PerExpertSources(const ExpertMap& c_in)
      : c(c_in),
        modules{&c.x.gate, &c.x.up, &c.x.down},
        leaf(RankLeaf(c.q, c.s.part)),
        geo{c.q, c.scale, c.m.dtype, c.zeros} {}
  // Projection `proj` (0 gate, 1 up, 2 down) of expert `e`: its checkpoint tensor's name.
  std::string NameOf(int64_t e, int proj) const {
    return ExpandName(*modules[proj] + "." + leaf, c.layer, e);
  }
  SourceTensorSpec EncodedSpecOf(int64_t e, int proj) const {
    const int64_t out = proj == 2 ? c.H.logical : c.I.logical;
    const int64_t in = proj == 2 ? c.I.logical : c.H.logical;
    return EncodedSpec(c.q, c.s.part, ExpandName(*modules[proj], c.layer, e), out, in, c.m.dtype,
                       c.kind);
  }
  // The matrix part as stored, or through its conversion when encoded.
  SourceTensorSpec SpecOf(int64_t e, int proj) const {
    if (c.encoded) return EncodedSpecOf(e, proj);
    const int64_t out = proj == 2 ? c.H.logical : c.I.logical;
    const int64_t in = proj == 2 ? c.I.logical : c.H.logical;
    return SourceTensorSpec{
        NameOf(e, proj), c.s.dtype, {geo.Rows(out), geo.ColBytes(in) / c.es}, c.kind, {}};
  }
  // Part h of a w13 tensor (gate, up; ungated experts: up only), or down.
  int ProjOf(int64_t h) const { return !c.w13 ? 2 : (c.g == 2 ? static_cast<int>(h) : 1); }

  const ExpertMap& c;
  const std::string* modules[3];
  std::string leaf;
  Geometry geo;
};

// Group indices: w13 [El, parts, H_pad] (gate, up), w2 [El, I_pad] with the rank's [ib, ie) of
// I.
Status MapExpertGroupIndex(const PerExpertSources& src, MappedTensor& t) {
  const ExpertMap& c = src.c;
  const int64_t es = c.es, parts = c.w13 ? c.g : 1;
  for (int64_t slot = 0; slot < c.num_slots; ++slot) {
    const int64_t e = c.Expert(slot);
    for (int64_t h = 0; h < parts; ++h) {
      const int proj = src.ProjOf(h);
      const int64_t n = c.w13 ? c.H.logical : c.I.logical;
      Piece p;
      SourceTensorSpec spec{src.NameOf(e, proj), c.s.dtype, {n}, c.kind, {}};
      if (c.q.act_order) spec.values = DummyGroupIndex(n, c.q.group);  // used: valid values
      p.source_idx = AddSource(t, std::move(spec));
      p.element_bytes = es;
      p.window = Slice2D{.base_offset = 0,
                         .row_bytes = n * es,
                         .row_begin = 0,
                         .row_end = 1,
                         .col_begin = c.w13 ? 0 : c.ib * es,
                         .col_end = c.w13 ? n * es : c.ie * es,
                         .dst_row_stride = n * es};
      p.dst_offset = slot * c.slot_bytes + h * c.s.padded_shape.back() * es;
      t.pieces.push_back(p);
    }
  }
  return Status::Ok();
}

// Global and input scales: [El, parts] (w13: gate, up) or [El]: one F32 per checkpoint tensor.
Status MapExpertScalars(const PerExpertSources& src, MappedTensor& t) {
  const ExpertMap& c = src.c;
  const int64_t es = c.es, parts = c.w13 ? c.g : 1;
  for (int64_t slot = 0; slot < c.num_slots; ++slot) {
    const int64_t e = c.Expert(slot);
    for (int64_t h = 0; h < parts; ++h) {
      const int proj = src.ProjOf(h);
      Piece p;
      p.source_idx = AddSource(
          t, c.encoded ? src.EncodedSpecOf(e, proj)
                       : SourceTensorSpec{src.NameOf(e, proj), c.s.dtype, {1}, c.kind, {}});
      p.element_bytes = es;
      p.window = Slice2D{.base_offset = 0,
                         .row_bytes = es,
                         .row_begin = 0,
                         .row_end = 1,
                         .col_begin = 0,
                         .col_end = es,
                         .dst_row_stride = es};
      p.dst_offset = slot * c.slot_bytes + h * es;
      t.pieces.push_back(p);
    }
  }
  return Status::Ok();
}

// Shape metadata [El, parts, 2]: each part's logical [out, in], whole.
Status MapExpertShapeMeta(const PerExpertSources& src, MappedTensor& t) {
  const ExpertMap& c = src.c;
  const int64_t es = c.es, parts = c.w13 ? c.g : 1;
  for (int64_t slot = 0; slot < c.num_slots; ++slot) {
    const int64_t e = c.Expert(slot);
    for (int64_t h = 0; h < parts; ++h) {
      const int proj = src.ProjOf(h);
      const std::vector<int64_t> logical = proj == 2
                                               ? std::vector<int64_t>{c.H.logical, c.I.logical}
                                               : std::vector<int64_t>{c.I.logical, c.H.logical};
      Piece p;
      p.source_idx = AddSource(t, {src.NameOf(e, proj), c.s.dtype, {2}, c.kind, logical});
      p.element_bytes = es;
      p.window = Slice2D{.base_offset = 0,
                         .row_bytes = 2 * es,
                         .row_begin = 0,
                         .row_end = 1,
                         .col_begin = 0,
                         .col_end = 2 * es,
                         .dst_row_stride = 2 * es};
      p.dst_offset = slot * c.slot_bytes + h * 2 * es;
      t.pieces.push_back(p);
    }
  }
  return Status::Ok();
}

// Weights, scales and zero points: w13's rows [ib, ie) of gate and up, w2's columns.
Status MapExpertMatrices(const PerExpertSources& src, MappedTensor& t) {
  const ExpertMap& c = src.c;
  const Geometry& geo = src.geo;
  const DimLayout& I = c.I;
  const DimLayout& H = c.H;
  for (int64_t slot = 0; slot < c.num_slots; ++slot) {
    const int64_t e = c.Expert(slot);
    if (c.w13) {
      for (int64_t h = 0; h < c.g; ++h) {
        const int proj = c.g == 2 ? static_cast<int>(h) : 1;  // ungated experts: up only
        Piece p;
        p.source_idx = AddSource(t, src.SpecOf(e, proj));
        p.window = Slice2D{.base_offset = 0,
                           .row_bytes = geo.ColBytes(H.logical),
                           .row_begin = geo.Rows(c.ib),
                           .row_end = geo.Rows(c.ie),
                           .col_begin = 0,
                           .col_end = geo.ColBytes(H.logical),
                           .dst_row_stride = geo.ColBytes(H.padded_local)};
        p.dst_offset = slot * c.slot_bytes + geo.Rows(h * I.padded_local) * p.window.dst_row_stride;
        t.pieces.push_back(p);
      }
    } else {
      Piece p;
      p.source_idx = AddSource(t, src.SpecOf(e, 2));
      p.window = Slice2D{.base_offset = 0,
                         .row_bytes = geo.ColBytes(I.logical),
                         .row_begin = 0,
                         .row_end = geo.Rows(H.logical),
                         .col_begin = geo.ColBytes(c.ib),
                         .col_end = geo.ColBytes(c.ie),
                         .dst_row_stride = geo.ColBytes(I.padded_local)};
      if (c.scale && c.q.act_order && c.s.shard_dim < 0) {
        // Act-order: every group's scales and zero points, whatever slice of I the rank holds.
        p.window.col_begin = 0;
        p.window.col_end = geo.ColBytes(I.logical);
        p.window.dst_row_stride = c.s.padded_shape.back() * c.es;
      }
      if (c.scale && c.q.RowUniform()) {
        // Every block of a row holds the row's scale: the rank's blocks are the first ones.
        p.window.col_begin = 0;
        p.window.col_end = geo.ColBytes(c.ie - c.ib);
      }
      p.dst_offset = slot * c.slot_bytes;
      t.pieces.push_back(p);
    }
  }
  return Status::Ok();
}

// Routed experts in the fused per-rank layout (shard_plan.h), from per-expert tensors or from
// fused ones, named by the family's ExpertLayout.
Status MapExperts(const ShardPlan& plan, int64_t rank, MappedTensor& t) {
  ExpertMap c(plan, rank, t);
  const TensorShard& s = c.s;
  if (s.padded_shape.empty() || s.padded_shape[0] != c.num_slots) {
    return MapError(plan, rank, t.name,
                    fmt::format("expected {} local slots, got shape [{}]", c.num_slots,
                                fmt::join(s.padded_shape, ", ")));
  }
  c.slot_bytes = BytesOf(s.dtype, s.padded_shape) / c.num_slots;
  c.dst_row = s.padded_shape.size() > 2
                  ? BytesOf(s.dtype, {s.padded_shape.begin() + 2, s.padded_shape.end()})
                  : ElementBytes(s.dtype);  // [El] or [El, parts]: global scales
  if (c.bias) return MapExpertBiases(c, t);
  if (c.x.fused) return MapFusedExperts(c, t);
  const PerExpertSources src(c);
  if (c.group_index) return MapExpertGroupIndex(src, t);
  if (c.global || s.part == TensorPart::kInputScale) return MapExpertScalars(src, t);
  if (c.meta) return MapExpertShapeMeta(src, t);
  return MapExpertMatrices(src, t);
}

// Every window lies in its source and its destination, and the windows cover exactly the
// unpadded bytes.
Status Validate(const ShardPlan& plan, int64_t rank, const MappedTensor& t) {
  int64_t covered = 0;
  for (const Piece& p : t.pieces) {
    const SourceTensorSpec& src = t.sources[static_cast<size_t>(p.source_idx)];
    const int64_t src_bytes = src.encoding == SourceEncoding::kDirect
                                  ? BytesOf(src.dtype, src.shape)
                                  : BytesOf(src.view_dtype, src.view_shape);
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

std::string ConcreteName(const std::string& name, int64_t layer) { return ExpandName(name, layer); }

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
  if (shard.category == TensorCategory::kRoutedExperts) {
    MOESHARD_RETURN_IF_ERROR(MapExperts(plan, rank, t));
  } else {
    MOESHARD_RETURN_IF_ERROR(MapPlain(plan, rank, t));
  }
  MOESHARD_RETURN_IF_ERROR(Validate(plan, rank, t));
  return t;
}

}  // namespace moeshard::internal
