// Test helpers for per-rank loading (private): an independent, element-by-element reference of
// what a rank's buffer must hold, computed from whole checkpoint tensors in memory.
//
// ReferenceRankTensor re-derives the fused expert layout and every family's naming from the
// plan contract (shard_plan.h) with plain loops and none of the loader's window arithmetic, so
// comparing it with the loader checks slicing, offsets from unpadded sizes and zero padding.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "moeshard/plan/shard_plan.h"
#include "moeshard/weights/checkpoint.h"
#include "moeshard/weights/dummy_weights.h"
#include "moeshard/weights/loader.h"

namespace moeshard::testing_util {

// A whole checkpoint tensor in memory.
struct FullTensor {
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};
using FullTensors = std::map<std::string, FullTensor>;

inline int64_t NumElements(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// The whole dummy model: every expected tensor generated from index 0.
inline FullTensors FullDummyTensors(const std::vector<SourceTensorSpec>& specs, uint64_t seed) {
  FullTensors out;
  for (const SourceTensorSpec& s : specs) {
    FullTensor t{s.dtype, s.shape, {}};
    t.bytes.resize(static_cast<size_t>(NumElements(s.shape) * DTypeBits(s.dtype) / 8));
    if (!s.values.empty()) {  // weight_shape: its known values
      for (size_t i = 0; i < s.values.size(); ++i) {
        const int64_t v = s.values[i];
        const int32_t v32 = static_cast<int32_t>(v);
        if (s.dtype == DType::kI64) std::memcpy(t.bytes.data() + i * 8, &v, 8);
        if (s.dtype == DType::kI32) std::memcpy(t.bytes.data() + i * 4, &v32, 4);
      }
    } else {
      FillDummy(DummyTensorKey(seed, s.name), s.dtype, s.dummy_kind, 0, t.bytes);
    }
    out.emplace(s.name, std::move(t));
  }
  return out;
}

// Every tensor of an open checkpoint, read whole.
inline FullTensors FullCheckpointTensors(const Checkpoint& ckpt) {
  FullTensors out;
  for (const auto& [name, e] : ckpt.tensors()) {
    FullTensor t{e.info->dtype, e.info->shape, {}};
    t.bytes.resize(static_cast<size_t>(e.info->num_bytes()));
    if (!ckpt.ReadTensor(name, t.bytes).ok()) std::abort();
    out.emplace(name, std::move(t));
  }
  return out;
}

namespace detail {

// The rank buffer being built, and the element copy every reference step uses.
struct RankBuffer {
  std::vector<std::byte> bytes;
  int64_t elem_size = 0;  // bytes per element
  int64_t rows_p = 1;     // expert tensors: padded [slots, rows_p, cols_p]
  int64_t cols_p = 1;

  void Copy(const FullTensor& src, int64_t src_elem, int64_t dst_elem) {
    std::memcpy(bytes.data() + dst_elem * elem_size, src.bytes.data() + src_elem * elem_size,
                static_cast<size_t>(elem_size));
  }
  int64_t At(int64_t slot, int64_t r, int64_t c) const { return (slot * rows_p + r) * cols_p + c; }
};

// Index along plain tensor `s`'s shard dim (global size `global`) of local index `local`.
inline int64_t PlainSourceIndex(const TensorShard& s, int64_t global, int64_t local) {
  const int64_t slice = s.shard_end - s.shard_begin;
  if (!s.section_sizes.empty()) {
    // Unequal blocks: local index falls in block b at offset j; the rank holds the
    // (shard_begin / first slice)-th slice of each block.
    const int64_t r = s.shard_begin / slice;
    int64_t at = 0, local_at = 0;
    for (int64_t size : s.section_sizes) {
      const int64_t n = size * slice / s.section_sizes[0];
      if (local < local_at + n) return at + r * n + (local - local_at);
      at += size;
      local_at += n;
    }
    return local;
  }
  const int64_t block = global / s.sections;
  return (local / slice) * block + s.shard_begin + local % slice;
}

// Plain tensor: an N-d slice along shard_dim (of each of its `sections` blocks).
inline void ReferencePlainTensor(const TensorShard& s, const std::string& name,
                                 const FullTensors& full, RankBuffer& out) {
  const FullTensor& src = full.at(s.tied_source.empty() ? name : s.tied_source);
  const std::vector<int64_t>& L = s.local_shape;
  const std::vector<int64_t>& G = src.shape;
  std::vector<int64_t> idx(L.size(), 0);
  const int64_t n = NumElements(L);
  for (int64_t k = 0; k < n; ++k) {
    int64_t rem = k;
    for (size_t d = L.size(); d-- > 0;) {
      idx[d] = rem % L[d];
      rem /= L[d];
    }
    int64_t flat = 0;
    for (size_t d = 0; d < G.size(); ++d) {
      const int64_t i =
          static_cast<int>(d) == s.shard_dim ? PlainSourceIndex(s, G[d], idx[d]) : idx[d];
      flat = flat * G[d] + i;
    }
    out.Copy(src, flat, k);  // local == padded for non-expert tensors
  }
}

// One routed-expert plan tensor at one layer on one rank: what it holds and its slice of I.
struct ExpertRef {
  const ExpertLayout& x;
  const WeightScheme& q;
  const TensorShard& s;
  int64_t layer = 0;
  bool w13 = false;  // gate_up (weight, scale or bias); else down
  std::string leaf;  // per-expert checkpoint leaf: "bias", "weight_shape", scale or weight leaf
  int64_t I = 0;     // moe_intermediate_size
  int64_t H = 0;     // routed_expert_hidden_size
  int64_t ib = 0;    // the rank's slice of I: [ib, ib + Ir)
  int64_t Ir = 0;
  int64_t Ip = 0;  // padded local intermediate
};

inline ExpertRef MakeExpertRef(const ShardPlan& plan, const RankPlan& rp, const TensorShard& s,
                               int64_t layer) {
  const ModelConfig& m = plan.model;
  const WeightScheme& q = plan.expert_scheme;
  const bool is_bias =
      s.role == TensorRole::kExpertsW13Bias || s.role == TensorRole::kExpertsW2Bias;
  const std::string leaf = is_bias                            ? "bias"
                           : s.part == TensorPart::kShapeMeta ? "weight_shape"
                           : s.part == TensorPart::kScale     ? std::string(q.spec().scale_leaf)
                                                              : std::string(q.spec().weight_leaf);
  const int64_t I = m.moe_intermediate_size;
  // Uneven block shards (shard_plan.h): the stride is raw_local and the last ranks' slices are
  // cut at I (short, or empty).
  const int64_t stride = plan.intermediate.raw_local;
  const int64_t ib = std::min(rp.coords.moe_tp_rank * stride, I);
  return ExpertRef{plan.experts,
                   q,
                   s,
                   layer,
                   s.role == TensorRole::kExpertsW13 || s.role == TensorRole::kExpertsW13Bias,
                   leaf,
                   I,
                   m.routed_expert_hidden_size,
                   ib,
                   std::min(stride, I - ib),
                   plan.intermediate.padded_local};
}

// Fused bias [E, out] (gpt-oss): expert e's slice into slot `sl`.
inline void ReferenceFusedBias(const ExpertRef& t, const std::string& module, int64_t e, int64_t sl,
                               const FullTensors& full, RankBuffer& out) {
  const FullTensor& src = full.at(module + t.x.bias_suffix);
  const int64_t n = t.w13 ? 2 * t.I : t.H;
  for (int64_t j = 0; j < (t.w13 ? 2 * t.Ir : t.H); ++j) {
    out.Copy(src, e * n + (t.w13 ? 2 * t.ib : 0) + j, sl * t.s.padded_shape[1] + j);
  }
}

// Fused MXFP4 blocks or scales [E, out, in / unit] (gpt-oss).
inline void ReferenceFusedMxfp4(const ExpertRef& t, const std::string& module, int64_t e,
                                int64_t sl, const FullTensors& full, RankBuffer& out) {
  const bool sc = t.s.part == TensorPart::kScale;
  const int64_t unit = sc ? 32 : 2;
  const FullTensor& src = full.at(module + (sc ? t.x.fused_scale_suffix : t.x.fused_weight_suffix));
  const int64_t out_rows = t.w13 ? 2 * t.I : t.H, in = t.w13 ? t.H : t.I;
  const int64_t cols = in / unit;
  if (t.w13) {
    for (int64_t r = 0; r < 2 * t.Ir; ++r) {
      for (int64_t c = 0; c < cols; ++c)
        out.Copy(src, (e * out_rows + 2 * t.ib + r) * cols + c, out.At(sl, r, c));
    }
  } else {
    for (int64_t h = 0; h < t.H; ++h) {
      for (int64_t c = 0; c < t.Ir / unit; ++c)
        out.Copy(src, (e * out_rows + h) * cols + t.ib / unit + c, out.At(sl, h, c));
    }
  }
}

// Fused bf16, stored out-major [E, out, in] (Qwen3.5) or in-major [E, in, out] (gpt-oss,
// Llama-4). Interleaved (gpt-oss): the rank's gate_up rows are 2*[ib, ib + Ir). Gate then up
// halves (Llama-4): rows [h*I + ib, h*I + ib + Ir) go to rows h*Ip + [0, Ir).
inline void ReferenceFusedBf16(const ExpertRef& t, const std::string& module, int64_t e, int64_t sl,
                               const FullTensors& full, RankBuffer& out) {
  const FullTensor& src = full.at(module);
  const int64_t I = t.I, H = t.H, ib = t.ib, Ir = t.Ir;
  if (t.w13) {
    for (int64_t r = 0; r < 2 * Ir; ++r) {
      const int64_t h = r / Ir, j = r % Ir;
      const int64_t from = t.x.gate_up_interleaved ? 2 * ib + r : h * I + ib + j;
      const int64_t to = t.x.gate_up_interleaved ? r : h * t.Ip + j;
      for (int64_t c = 0; c < H; ++c) {
        const int64_t src_elem =
            t.x.fused_in_major ? (e * H + c) * 2 * I + from : (e * 2 * I + from) * H + c;
        out.Copy(src, src_elem, out.At(sl, to, c));
      }
    }
  } else {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < Ir; ++i) {
        const int64_t src_elem =
            t.x.fused_in_major ? (e * I + ib + i) * H + h : (e * H + h) * I + ib + i;
        out.Copy(src, src_elem, out.At(sl, h, i));
      }
    }
  }
}

// Fused over experts (gpt-oss, Llama-4, Qwen3.5): expert e into slot `sl`.
inline void ReferenceFusedSlot(const ExpertRef& t, int64_t e, int64_t sl, const FullTensors& full,
                               RankBuffer& out) {
  const std::string module = ExpandName(t.w13 ? t.x.fused_gate_up : t.x.fused_down, t.layer);
  if (t.leaf == "bias") {
    ReferenceFusedBias(t, module, e, sl, full, out);
  } else if (t.q.format == WeightFormat::kMxfp4) {
    ReferenceFusedMxfp4(t, module, e, sl, full, out);
  } else {
    ReferenceFusedBf16(t, module, e, sl, full, out);
  }
}

// Per-expert tensors, named by the family's layout: expert e into slot `sl`.
inline void ReferencePerExpertSlot(const ExpertRef& t, int64_t e, int64_t sl,
                                   const FullTensors& full, RankBuffer& out) {
  auto src_name = [&](int proj) {
    const std::string* modules[] = {&t.x.gate, &t.x.up, &t.x.down};
    return ExpandName(*modules[proj] + "." + t.leaf, t.layer, e);
  };
  if (t.s.part == TensorPart::kShapeMeta) {
    // Whole [2] tensors, gate and up for w13, down for w2.
    const int parts = t.w13 ? 2 : 1;
    for (int h = 0; h < parts; ++h) {
      const FullTensor& src = full.at(src_name(t.w13 ? h : 2));
      for (int64_t j = 0; j < 2; ++j) out.Copy(src, j, (sl * parts + h) * 2 + j);
    }
    return;
  }
  // Logical columns per storage element along the input dim, rows per storage row.
  int64_t col_unit = 1, row_unit = 1;
  if (t.s.part == TensorPart::kWeight && t.q.packed()) col_unit = 2;
  if (t.s.part == TensorPart::kScale) {
    col_unit = t.q.group;
    if (t.q.format == WeightFormat::kFp8Block) row_unit = t.q.block_rows;
  }
  if (t.w13) {
    for (int h = 0; h < 2; ++h) {
      const FullTensor& src = full.at(src_name(h));
      const int64_t cols = src.shape[1];
      for (int64_t r = 0; r < t.Ir / row_unit; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          out.Copy(src, (t.ib / row_unit + r) * cols + c, out.At(sl, (h * t.Ip) / row_unit + r, c));
        }
      }
    }
  } else {
    const FullTensor& src = full.at(src_name(2));
    const int64_t cols = src.shape[1];
    for (int64_t r = 0; r < src.shape[0]; ++r) {
      for (int64_t c = 0; c < t.Ir / col_unit; ++c)
        out.Copy(src, r * cols + t.ib / col_unit + c, out.At(sl, r, c));
    }
  }
}

}  // namespace detail

// Expected bytes (padded, padding zero) of plan tensor `s` at `layer` on `rank`. Throws
// std::out_of_range (via map::at) when a checkpoint tensor is missing.
inline std::vector<std::byte> ReferenceRankTensor(const ShardPlan& plan, int64_t rank,
                                                  const TensorShard& s, int64_t layer,
                                                  const FullTensors& full) {
  const RankPlan& rp = plan.ranks[static_cast<size_t>(rank)];
  detail::RankBuffer out;
  out.elem_size = DTypeBits(s.dtype) / 8;
  out.bytes.resize(static_cast<size_t>(NumElements(s.padded_shape) * out.elem_size));
  if (s.category != TensorCategory::kRoutedExperts) {
    detail::ReferencePlainTensor(s, ExpandName(s.name, layer), full, out);
    return std::move(out.bytes);
  }
  out.rows_p = s.padded_shape[1];
  out.cols_p = s.padded_shape.size() > 2 ? s.padded_shape[2] : 1;
  const detail::ExpertRef t = detail::MakeExpertRef(plan, rp, s, layer);
  for (size_t slot = 0; slot < rp.expert_slots.size(); ++slot) {
    const int64_t e = rp.expert_slots[slot];
    const auto sl = static_cast<int64_t>(slot);
    if (t.x.fused) {
      detail::ReferenceFusedSlot(t, e, sl, full, out);
    } else {
      detail::ReferencePerExpertSlot(t, e, sl, full, out);
    }
  }
  return std::move(out.bytes);
}

}  // namespace moeshard::testing_util
