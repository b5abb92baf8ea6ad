// Portable CPU backend: plain C++ that compilers auto-vectorise, for CPUs without AVX-512 BF16
// (and forced in tests so it stays correct). Each weight row is dequantised into a small fp32
// buffer once per call and dotted with every token of the block, so weights are still streamed
// once per token block and never copied whole.
#include <algorithm>

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
      const bf16_t* b = reinterpret_cast<const bf16_t*>(row);
      for (int64_t c = 0; c < cols; ++c) out[c] = Bf16ToFloat(b[c]);
      return;
    }
    case WeightFormat::kFp8Block: {
      const int64_t scale_cols = CeilDiv(cols, kCpuFp8BlockSize);
      const float* scale =
          reinterpret_cast<const float*>(m.scales) + (r / kCpuFp8BlockSize) * scale_cols;
      for (int64_t c = 0; c < cols; ++c) {
        out[c] = Fp8E4M3ToFloat(row[c]) * scale[c / kCpuFp8BlockSize];
      }
      return;
    }
    case WeightFormat::kMxfp4: {
      const uint8_t* scale = m.scales + r * (cols / kCpuMxfp4GroupSize);
      for (int64_t c = 0; c < cols; c += 2) {
        const float s = E8M0ToFloat(scale[c / kCpuMxfp4GroupSize]);
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

// Packed product (layout: cpu_backend.h): each weight row decoded to fp32, the pairs summed in
// pair order.
void PackedGemm(const PackedGemmArgs& a) {
  const int64_t cols = a.w->cols;
  const int64_t pairs = PackedPairs(cols);
  float* wf = static_cast<float*>(a.work);  // cols floats: within kPackedWorkBytesPerCol * cols
  for (int64_t r = 0; r < a.num_rows; ++r) {
    DecodeRow(*a.w, a.row_idx[r], wf);
    for (int64_t g = 0; g < a.num_groups; ++g) {
      const uint32_t* xg = a.x + g * a.group_stride;
      float acc[kPackedGroup] = {};
      for (int64_t kp = 0; kp < pairs; ++kp) {
        const float w0 = wf[2 * kp];
        const float w1 = 2 * kp + 1 < cols ? wf[2 * kp + 1] : 0.0f;
        for (int64_t t = 0; t < kPackedGroup; ++t) {
          const uint32_t v = xg[kp * kPackedGroup + t];
          acc[t] += Bf16ToFloat(bf16_t{static_cast<uint16_t>(v & 0xffff)}) * w0 +
                    Bf16ToFloat(bf16_t{static_cast<uint16_t>(v >> 16)}) * w1;
        }
      }
      for (int64_t t = 0; t < kPackedGroup; ++t) a.out[r * a.ldo + g * kPackedGroup + t] = acc[t];
    }
  }
}

void PackGroup(const void* x, DType x_dtype, int64_t ldx, const int32_t* rows,
               int64_t num_tokens, int64_t cols, uint32_t* group) {
  const int64_t pairs = PackedPairs(cols);
  auto bits = [&](int64_t t, int64_t c) -> uint32_t {
    if (t >= num_tokens || c >= cols) return 0;
    const int64_t i = rows[t] * ldx + c;
    if (x_dtype == DType::kF32) return FloatToBf16(static_cast<const float*>(x)[i]).bits;
    return static_cast<const bf16_t*>(x)[i].bits;
  };
  for (int64_t kp = 0; kp < pairs; ++kp) {
    for (int64_t t = 0; t < kPackedGroup; ++t) {
      group[kp * kPackedGroup + t] = bits(t, 2 * kp) | bits(t, 2 * kp + 1) << 16;
    }
  }
}

void StoreTransposed(const float* tile, int64_t ldt, int64_t num_rows, int64_t num_tokens,
                     const float* bias, float* y, int64_t ldy) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t r = 0; r < num_rows; ++r) {
      y[t * ldy + r] = tile[r * ldt + t] + (bias != nullptr ? bias[r] : 0.0f);
    }
  }
}

void Activate(const ActivationParams& act, const float* gate, const float* up, int64_t n,
              bf16_t* h) {
  for (int64_t i = 0; i < n; ++i) {
    h[i] = FloatToBf16(ApplyActivation(act, gate == nullptr ? 0.0f : gate[i], up[i]));
  }
}

void ToBf16(const float* src, int64_t n, bf16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBf16(src[i]);
}

int64_t WorkFloats(int64_t num_tokens, int64_t cols) { return (num_tokens + 1) * cols; }

}  // namespace

const CpuBackend& PortableBackend() {
  static const CpuBackend backend{"portable", DotRows,    Activate, ToBf16,
                                  WorkFloats, PackedGemm, PackGroup,
                                  StoreTransposed};
  return backend;
}

}  // namespace moeshard::internal
