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

// Expected bytes (padded, padding zero) of plan tensor `s` at `layer` on `rank`. Throws
// std::out_of_range (via map::at) when a checkpoint tensor is missing.
inline std::vector<std::byte> ReferenceRankTensor(const ShardPlan& plan, int64_t rank,
                                                  const TensorShard& s, int64_t layer,
                                                  const FullTensors& full) {
  const ModelConfig& m = plan.model;
  const RankPlan& rp = plan.ranks[static_cast<size_t>(rank)];
  const int64_t es = DTypeBits(s.dtype) / 8;
  std::vector<std::byte> out(static_cast<size_t>(NumElements(s.padded_shape) * es));
  const std::string name = ExpandName(s.name, layer);
  auto copy_elem = [&](const FullTensor& src, int64_t src_elem, int64_t dst_elem) {
    std::memcpy(out.data() + dst_elem * es, src.bytes.data() + src_elem * es,
                static_cast<size_t>(es));
  };

  if (s.category != TensorCategory::kRoutedExperts) {
    // Plain tensor: an N-d slice along shard_dim (of each of its `sections` blocks).
    const std::string src_name = s.tied_source.empty() ? name : s.tied_source;
    const FullTensor& src = full.at(src_name);
    const std::vector<int64_t>& L = s.local_shape;
    const std::vector<int64_t>& G = src.shape;
    std::vector<int64_t> idx(L.size(), 0);
    const int64_t n = NumElements(L);
    const int64_t slice = s.shard_end - s.shard_begin;
    for (int64_t k = 0; k < n; ++k) {
      int64_t rem = k;
      for (size_t d = L.size(); d-- > 0;) {
        idx[d] = rem % L[d];
        rem /= L[d];
      }
      int64_t flat = 0;
      for (size_t d = 0; d < G.size(); ++d) {
        int64_t i = idx[d];
        if (static_cast<int>(d) == s.shard_dim && !s.section_sizes.empty()) {
          // Unequal blocks: local index i falls in block b at offset j; the rank holds the
          // (shard_begin / first slice)-th slice of each block.
          const int64_t r = s.shard_begin / slice;
          int64_t at = 0, local_at = 0;
          for (int64_t size : s.section_sizes) {
            const int64_t n = size * slice / s.section_sizes[0];
            if (idx[d] < local_at + n) {
              i = at + r * n + (idx[d] - local_at);
              break;
            }
            at += size;
            local_at += n;
          }
        } else if (static_cast<int>(d) == s.shard_dim) {
          const int64_t block = G[d] / s.sections;
          i = (idx[d] / slice) * block + s.shard_begin + idx[d] % slice;
        }
        flat = flat * G[d] + i;
      }
      copy_elem(src, flat, k);  // local == padded for non-expert tensors
    }
    return out;
  }

  const ExpertLayout& x = plan.experts;
  const WeightScheme& q = plan.expert_scheme;
  const bool w13 = s.role == TensorRole::kExpertsW13 || s.role == TensorRole::kExpertsW13Bias;
  const bool is_bias =
      s.role == TensorRole::kExpertsW13Bias || s.role == TensorRole::kExpertsW2Bias;
  const std::string leaf = is_bias                            ? "bias"
                           : s.part == TensorPart::kShapeMeta ? "weight_shape"
                           : s.part == TensorPart::kScale     ? std::string(q.spec().scale_leaf)
                                                              : std::string(q.spec().weight_leaf);
  const int64_t I = m.moe_intermediate_size, H = m.routed_expert_hidden_size;
  // The rank's slice of I: [ib, ib + Ir). Uneven block shards (shard_plan.h): the stride is
  // raw_local and the last ranks' slices are cut at I (short, or empty).
  const int64_t stride = plan.intermediate.raw_local, Ip = plan.intermediate.padded_local;
  const int64_t ib = std::min(rp.coords.moe_tp_rank * stride, I);
  const int64_t Ir = std::min(stride, I - ib);
  const int64_t rows_p = s.padded_shape[1];
  const int64_t cols_p = s.padded_shape.size() > 2 ? s.padded_shape[2] : 1;
  auto dst_at = [&](int64_t slot, int64_t r, int64_t c) {
    return (slot * rows_p + r) * cols_p + c;
  };

  for (size_t slot = 0; slot < rp.expert_slots.size(); ++slot) {
    const int64_t e = rp.expert_slots[slot];
    const auto sl = static_cast<int64_t>(slot);
    if (x.fused) {  // gpt-oss, Llama-4
      const std::string module = ExpandName(w13 ? x.fused_gate_up : x.fused_down, layer);
      if (leaf == "bias") {
        const FullTensor& src = full.at(module + x.bias_suffix);
        const int64_t n = w13 ? 2 * I : H;
        for (int64_t j = 0; j < (w13 ? 2 * Ir : H); ++j) {
          copy_elem(src, e * n + (w13 ? 2 * ib : 0) + j, sl * s.padded_shape[1] + j);
        }
      } else if (q.format == WeightFormat::kMxfp4) {
        const bool sc = s.part == TensorPart::kScale;
        const int64_t unit = sc ? 32 : 2;
        const FullTensor& src =
            full.at(module + (sc ? x.fused_scale_suffix : x.fused_weight_suffix));
        const int64_t out_rows = w13 ? 2 * I : H, in = w13 ? H : I;
        const int64_t cols = in / unit;
        if (w13) {
          for (int64_t r = 0; r < 2 * Ir; ++r) {
            for (int64_t c = 0; c < cols; ++c)
              copy_elem(src, (e * out_rows + 2 * ib + r) * cols + c, dst_at(sl, r, c));
          }
        } else {
          for (int64_t h = 0; h < H; ++h) {
            for (int64_t c = 0; c < Ir / unit; ++c)
              copy_elem(src, (e * out_rows + h) * cols + ib / unit + c, dst_at(sl, h, c));
          }
        }
      } else if (!x.fused_in_major) {  // bf16, stored out-major [E, out, in] (Qwen3.5)
        const FullTensor& src = full.at(module);
        if (w13) {
          for (int64_t r = 0; r < 2 * Ir; ++r) {
            const int64_t h = r / Ir, j = r % Ir;
            const int64_t row = x.gate_up_interleaved ? 2 * ib + r : h * I + ib + j;
            const int64_t dst = x.gate_up_interleaved ? r : h * Ip + j;
            for (int64_t c = 0; c < H; ++c)
              copy_elem(src, (e * 2 * I + row) * H + c, dst_at(sl, dst, c));
          }
        } else {
          for (int64_t h = 0; h < H; ++h) {
            for (int64_t i = 0; i < Ir; ++i)
              copy_elem(src, (e * H + h) * I + ib + i, dst_at(sl, h, i));
          }
        }
      } else {  // bf16, stored in-major [E, in, out]
        const FullTensor& src = full.at(module);
        if (w13) {
          // Interleaved (gpt-oss): the rank's columns are 2*[ib, ib + Ir). Gate then up halves
          // (Llama-4): columns [h*I + ib, h*I + ib + Ir) go to rows h*Ip + [0, Ir).
          for (int64_t r = 0; r < 2 * Ir; ++r) {
            const int64_t h = r / Ir, j = r % Ir;
            const int64_t col = x.gate_up_interleaved ? 2 * ib + r : h * I + ib + j;
            const int64_t row = x.gate_up_interleaved ? r : h * Ip + j;
            for (int64_t c = 0; c < H; ++c)
              copy_elem(src, (e * H + c) * 2 * I + col, dst_at(sl, row, c));
          }
        } else {
          for (int64_t h = 0; h < H; ++h) {
            for (int64_t i = 0; i < Ir; ++i)
              copy_elem(src, (e * I + ib + i) * H + h, dst_at(sl, h, i));
          }
        }
      }
      continue;
    }
    // Per-expert tensors, named by the family's layout.
    auto src_name = [&](int proj) {
      const std::string* modules[] = {&x.gate, &x.up, &x.down};
      return ExpandName(*modules[proj] + "." + leaf, layer, e);
    };
    if (s.part == TensorPart::kShapeMeta) {
      // Whole [2] tensors, gate and up for w13, down for w2.
      const int parts = w13 ? 2 : 1;
      for (int h = 0; h < parts; ++h) {
        const FullTensor& src = full.at(src_name(w13 ? h : 2));
        for (int64_t j = 0; j < 2; ++j) copy_elem(src, j, (sl * parts + h) * 2 + j);
      }
      continue;
    }
    // Logical columns per storage element along the input dim, rows per storage row.
    int64_t col_unit = 1, row_unit = 1;
    if (s.part == TensorPart::kWeight && q.packed()) col_unit = 2;
    if (s.part == TensorPart::kScale) {
      col_unit = q.group;
      if (q.format == WeightFormat::kFp8Block) row_unit = q.block_rows;
    }
    if (w13) {
      for (int h = 0; h < 2; ++h) {
        const FullTensor& src = full.at(src_name(h));
        const int64_t cols = src.shape[1];
        for (int64_t r = 0; r < Ir / row_unit; ++r) {
          for (int64_t c = 0; c < cols; ++c)
            copy_elem(src, (ib / row_unit + r) * cols + c, dst_at(sl, (h * Ip) / row_unit + r, c));
        }
      }
    } else {
      const FullTensor& src = full.at(src_name(2));
      const int64_t cols = src.shape[1];
      for (int64_t r = 0; r < src.shape[0]; ++r) {
        for (int64_t c = 0; c < Ir / col_unit; ++c)
          copy_elem(src, r * cols + ib / col_unit + c, dst_at(sl, r, c));
      }
    }
  }
  return out;
}

}  // namespace moeshard::testing_util
