// Portable CPU backend: plain C++ that compilers auto-vectorise, for CPUs without AVX-512 BF16
// (and forced in tests so it stays correct). It has no packed (prefill) path: in plain C++ the
// packed outer product measured 1.5x slower than this dot-product loop (Qwen3 shape, 512
// tokens), so every expert takes the dot path here. Each weight row is dequantised into a small
// fp32 buffer once per call and dotted with every token of the block, so weights are still streamed
// once per token block and never copied whole.
#include <algorithm>
#include <cstring>

#include "kernels/activation_inl.h"
#include "kernels/cpu/cpu_backend.h"
#include "moeshard/base/math.h"
#include "moeshard/kernels/cpu_constraints.h"

namespace moeshard::internal {
namespace {

void DecodeRow(const MatrixRef& m, int64_t r, float* out) {
  const uint8_t* row = m.Row(r);
  const int64_t cols = m.cols;
  switch (m.format) {
    case WeightFormat::kBf16: {
      if (m.row_groups) {
        const bf16_t* b = reinterpret_cast<const bf16_t*>(m.data);
        for (int64_t c = 0; c < cols; ++c) out[c] = Bf16ToFloat(b[Bf16RowGroupsIndex(r, c, cols)]);
        return;
      }
      const bf16_t* b = reinterpret_cast<const bf16_t*>(row);
      for (int64_t c = 0; c < cols; ++c) out[c] = Bf16ToFloat(b[c]);
      return;
    }
    case WeightFormat::kFp8Block: {
      const int64_t scale_cols = CeilDiv(cols, m.group);
      const float* scale =
          reinterpret_cast<const float*>(m.scales) + (r / m.block_rows) * scale_cols;
      for (int64_t c = 0; c < cols; ++c) {
        out[c] = Fp8E4M3ToFloat(row[c]) * scale[c / m.group];
      }
      return;
    }
    case WeightFormat::kMxfp4: {
      const uint8_t* scale = m.scales + r * (cols / m.group);
      for (int64_t c = 0; c < cols; c += 2) {
        const float s = E8M0ToFloat(scale[c / m.group]);
        out[c] = kFp4E2M1Values[row[c / 2] & 0xf] * s;
        out[c + 1] = kFp4E2M1Values[row[c / 2] >> 4] * s;
      }
      return;
    }
    case WeightFormat::kInt4: {
      const bf16_t* scale = reinterpret_cast<const bf16_t*>(m.scales) + r * (cols / m.group);
      for (int64_t c = 0; c < cols; c += 2) {
        const float s = Bf16ToFloat(scale[c / m.group]);
        out[c] = static_cast<float>((row[c / 2] & 0xf) - 8) * s;
        out[c + 1] = static_cast<float>((row[c / 2] >> 4) - 8) * s;
      }
      return;
    }
    case WeightFormat::kInt4Zp: {
      const int64_t groups = m.scale_cols > 0 ? m.scale_cols : cols / m.group;
      const fp16_t* scale = reinterpret_cast<const fp16_t*>(m.scales) + r * groups;
      const uint8_t* zero = m.zeros + r * groups;
      if (const int32_t* gidx = m.RowGroupIndex(r); gidx != nullptr) {  // act-order
        // The row's scales and zero points widened once (a row has few groups), then looked up
        // per column: the same (code - zero) * scale in fp32 as the direct form below.
        constexpr int64_t kMaxGroups = 1024;
        float sf[kMaxGroups], zf[kMaxGroups];
        if (groups <= kMaxGroups) {
          for (int64_t g = 0; g < groups; ++g) {
            sf[g] = HalfToFloat(scale[g]);
            zf[g] = static_cast<float>(zero[g]);
          }
          for (int64_t c = 0; c < cols; ++c) {
            const int code = (c & 1) ? (row[c / 2] >> 4) : (row[c / 2] & 0xf);
            out[c] = (static_cast<float>(code) - zf[gidx[c]]) * sf[gidx[c]];
          }
          return;
        }
        for (int64_t c = 0; c < cols; ++c) {
          const int code = (c & 1) ? (row[c / 2] >> 4) : (row[c / 2] & 0xf);
          out[c] = static_cast<float>(code - zero[gidx[c]]) * HalfToFloat(scale[gidx[c]]);
        }
        return;
      }
      for (int64_t c = 0; c < cols; c += 2) {
        const float s = HalfToFloat(scale[c / m.group]);
        const int z = zero[c / m.group];
        out[c] = static_cast<float>((row[c / 2] & 0xf) - z) * s;
        out[c + 1] = static_cast<float>((row[c / 2] >> 4) - z) * s;
      }
      return;
    }
    case WeightFormat::kNvfp4: {
      // E2M1 x E4M3 is exact in fp32; the global scale multiplies the product.
      const uint8_t* scale = m.scales + r * (cols / m.group);
      const float global = m.RowGlobal(r);
      for (int64_t c = 0; c < cols; c += 2) {
        const float s = Fp8E4M3ToFloat(scale[c / m.group]);
        out[c] = kFp4E2M1Values[row[c / 2] & 0xf] * s * global;
        out[c + 1] = kFp4E2M1Values[row[c / 2] >> 4] * s * global;
      }
      return;
    }
  }
}

// fp32 dot product with 8 independent partial sums (vectorisable without -ffast-math).
float Dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  }
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void DotRows(const DotRowsArgs& a) {
  const int64_t k = a.w->cols;
  float* xf = a.work;
  float* wf = a.work + a.num_tokens * k;
  for (int64_t m = 0; m < a.num_tokens; ++m) {
    const bf16_t* xr = a.x + m * a.ldx;
    for (int64_t c = 0; c < k; ++c) xf[m * k + c] = Bf16ToFloat(xr[c]);
  }
  for (int64_t r = 0; r < a.num_rows; ++r) {
    DecodeRow(*a.w, a.row_idx[r], wf);
    for (int64_t m = 0; m < a.num_tokens; ++m) a.out[m * a.ldo + r] = Dot(xf + m * k, wf, k);
  }
}

void Activate(const ActivationParams& act, const float* gate, const float* up, int64_t n,
              bf16_t* h) {
  VisitActivation(act.kind, [&](auto kind) {
    for (int64_t i = 0; i < n; ++i) {
      h[i] = FloatToBf16(ActivationOf<kind.value>(act, gate == nullptr ? 0.0f : gate[i], up[i]));
    }
  });
}

void ToBf16(const float* src, int64_t n, bf16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBf16(src[i]);
}

int64_t WorkFloats(int64_t num_tokens, int64_t cols) { return (num_tokens + 1) * cols; }

void WeightedSum(const float* const* rows, const float* weights, int64_t num_rows, int64_t n,
                 float* out, bool accumulate) {
  if (!accumulate) std::fill(out, out + n, 0.0f);
  for (int64_t s = 0; s < num_rows; ++s) {
    const float w = weights[s];
    const float* y = rows[s];
    for (int64_t i = 0; i < n; ++i) out[i] += w * y[i];
  }
}

// Plain C++ multiply-adds over 16 independent fp32 accumulators (what the compiler makes of the
// portable kernels' loops).
float PeakLoop(int64_t iterations, float seed, double* flops) {
  float acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = seed + static_cast<float>(i);
  const float x = 0.999f, y = 1e-3f;
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = acc[i] * x + y;
  }
  *flops += 2.0 * 16.0 * static_cast<double>(iterations);
  float s = 0.0f;
  for (float a : acc) s += a;
  return s;
}

// One sequential stream of 64-bit loads (the read-bandwidth probe's pattern 0).
uint64_t ReadStream(const uint8_t* p, int64_t bytes, int /*pattern*/) {
  uint64_t acc[8] = {};
  for (int64_t i = 0; i < bytes; i += 64) {
    for (int l = 0; l < 8; ++l) {
      uint64_t v;
      std::memcpy(&v, p + i + 8 * l, 8);
      acc[l] ^= v;
    }
  }
  uint64_t r = 0;
  for (uint64_t v : acc) r ^= v;
  return r;
}

}  // namespace

const CpuBackend& PortableBackend() {
  static const CpuBackend backend{
      "portable", DotRows,    Activate, ToBf16,      WorkFloats,
      nullptr,    nullptr,    nullptr,  WeightedSum, "fp32 multiply-add (plain C++)",
      PeakLoop,   ReadStream, 1,        nullptr,     nullptr};
  return backend;
}

}  // namespace moeshard::internal
