#include "moeshard/kernels/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/check.h"
#include "moeshard/base/math.h"
#include "moeshard/base/numeric.h"
#include "moeshard/kernels/cpu_constraints.h"
#include "moeshard/kernels/kernel_context.h"

namespace moeshard {

float Nvfp4GlobalScale(const float* w, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::abs(w[i]));
  return amax > 0.0f ? amax / (6.0f * 448.0f) : 1.0f;
}

namespace {

// fp8 e4m3 in [block_rows, group] blocks, one f32 scale (amax / 448) per block.
void QuantizeFp8Block(const WeightScheme& scheme, const float* w, int64_t rows, int64_t cols,
                      uint8_t* data, uint8_t* scales, uint8_t* zeros, float* global) {
  const int64_t group = scheme.group;
  const int64_t b = scheme.block_rows, bw = group;
  const int64_t sc = CeilDiv(cols, bw);
  float* s = reinterpret_cast<float*>(scales);
  for (int64_t br = 0; br < CeilDiv(rows, b); ++br) {
    for (int64_t bc = 0; bc < sc; ++bc) {
      float amax = 0.0f;
      for (int64_t r = br * b; r < std::min(rows, (br + 1) * b); ++r) {
        for (int64_t c = bc * bw; c < std::min(cols, (bc + 1) * bw); ++c) {
          amax = std::max(amax, std::abs(w[r * cols + c]));
        }
      }
      const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
      s[br * sc + bc] = scale;
      for (int64_t r = br * b; r < std::min(rows, (br + 1) * b); ++r) {
        for (int64_t c = bc * bw; c < std::min(cols, (bc + 1) * bw); ++c) {
          data[r * cols + c] = FloatToFp8E4M3(w[r * cols + c] / scale);
        }
      }
    }
  }
}

// MXFP4: fp4 e2m1 codes, two a byte, one E8M0 scale per 32 columns (rounded up).
void QuantizeMxfp4(const WeightScheme& scheme, const float* w, int64_t rows, int64_t cols,
                   uint8_t* data, uint8_t* scales, uint8_t* zeros, float* global) {
  const int64_t group = scheme.group;
  MOESHARD_CHECK(cols % group == 0, "MXFP4 cols {} % 32 != 0", cols);
  const int64_t groups = cols / group;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* v = w + r * cols + g * group;
      float amax = 0.0f;
      for (int64_t i = 0; i < group; ++i) amax = std::max(amax, std::abs(v[i]));
      const uint8_t e = FloatToE8M0Ceil(amax / 6.0f);
      scales[r * groups + g] = e;
      const float inv = 1.0f / E8M0ToFloat(e);
      for (int64_t i = 0; i < group; i += 2) {
        const uint8_t lo = FloatToFp4E2M1(v[i] * inv);
        const uint8_t hi = FloatToFp4E2M1(v[i + 1] * inv);
        data[(r * cols + g * group + i) / 2] = static_cast<uint8_t>(lo | hi << 4);
      }
    }
  }
}

// Symmetric int4 (codes + 8), two a byte, one bf16 scale (amax / 7) per group.
void QuantizeInt4(const WeightScheme& scheme, const float* w, int64_t rows, int64_t cols,
                  uint8_t* data, uint8_t* scales, uint8_t* zeros, float* global) {
  const int64_t group = scheme.group;
  MOESHARD_CHECK(group > 0 && group % 2 == 0 && cols % group == 0, "int4 cols {} / group {}", cols,
                 group);
  const int64_t groups = cols / group;
  bf16_t* s = reinterpret_cast<bf16_t*>(scales);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* v = w + r * cols + g * group;
      float amax = 0.0f;
      for (int64_t i = 0; i < group; ++i) amax = std::max(amax, std::abs(v[i]));
      const bf16_t sb = FloatToBf16(amax > 0.0f ? amax / 7.0f : 1.0f);
      s[r * groups + g] = sb;
      const float scale = Bf16ToFloat(sb);
      auto code = [&](float x) {
        const float q = std::nearbyint(x / scale);
        return static_cast<uint8_t>(std::clamp(q, -8.0f, 7.0f) + 8.0f);
      };
      for (int64_t i = 0; i < group; i += 2) {
        data[(r * cols + g * group + i) / 2] =
            static_cast<uint8_t>(code(v[i]) | code(v[i + 1]) << 4);
      }
    }
  }
}

// Asymmetric int4 with zero points: one fp16 scale and one zero point per group.
void QuantizeInt4Zp(const WeightScheme& scheme, const float* w, int64_t rows, int64_t cols,
                    uint8_t* data, uint8_t* scales, uint8_t* zeros, float* global) {
  const int64_t group = scheme.group;
  MOESHARD_CHECK(group > 0 && group % 2 == 0 && cols % group == 0 && zeros != nullptr,
                 "int4-zp cols {} / group {} / zeros", cols, group);
  const int64_t groups = cols / group;
  fp16_t* s = reinterpret_cast<fp16_t*>(scales);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* v = w + r * cols + g * group;
      float lo = 0.0f, hi = 0.0f;
      for (int64_t i = 0; i < group; ++i) {
        lo = std::min(lo, v[i]);
        hi = std::max(hi, v[i]);
      }
      const fp16_t sh = FloatToHalf(hi > lo ? (hi - lo) / 15.0f : 1.0f);
      s[r * groups + g] = sh;
      const float scale = HalfToFloat(sh);
      const float zero = std::clamp(std::nearbyint(-lo / scale), 0.0f, 15.0f);
      zeros[r * groups + g] = static_cast<uint8_t>(zero);
      auto code = [&](float x) {
        return static_cast<uint8_t>(std::clamp(std::nearbyint(x / scale) + zero, 0.0f, 15.0f));
      };
      for (int64_t i = 0; i < group; i += 2) {
        data[(r * cols + g * group + i) / 2] =
            static_cast<uint8_t>(code(v[i]) | code(v[i + 1]) << 4);
      }
    }
  }
}

// NVFP4: fp4 e2m1 codes, one fp8 e4m3 scale per group under a per-tensor f32 global scale.
void QuantizeNvfp4(const WeightScheme& scheme, const float* w, int64_t rows, int64_t cols,
                   uint8_t* data, uint8_t* scales, uint8_t* zeros, float* global) {
  const int64_t group = scheme.group;
  MOESHARD_CHECK(group == kCpuNvfp4GroupSize && cols % group == 0 && global != nullptr,
                 "nvfp4 cols {} / group {} / global", cols, group);
  if (!(*global > 0.0f)) *global = Nvfp4GlobalScale(w, rows * cols);
  const float gs = *global;
  const int64_t groups = cols / group;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* v = w + r * cols + g * group;
      float amax = 0.0f;
      for (int64_t i = 0; i < group; ++i) amax = std::max(amax, std::abs(v[i]));
      const uint8_t sc = FloatToFp8E4M3(amax / 6.0f / gs);
      scales[r * groups + g] = sc;
      const float step = Fp8E4M3ToFloat(sc) * gs;
      const float inv = step > 0.0f ? 1.0f / step : 0.0f;
      for (int64_t i = 0; i < group; i += 2) {
        const uint8_t lo = FloatToFp4E2M1(v[i] * inv);
        const uint8_t hi = FloatToFp4E2M1(v[i + 1] * inv);
        data[(r * cols + g * group + i) / 2] = static_cast<uint8_t>(lo | hi << 4);
      }
    }
  }
}

}  // namespace

void QuantizeMatrix(const WeightScheme& scheme, const float* w, int64_t rows, int64_t cols,
                    uint8_t* data, uint8_t* scales, uint8_t* zeros, float* global) {
  switch (scheme.format) {
    case WeightFormat::kBf16: {
      bf16_t* out = reinterpret_cast<bf16_t*>(data);
      for (int64_t i = 0; i < rows * cols; ++i) out[i] = FloatToBf16(w[i]);
      return;
    }
    case WeightFormat::kFp8Block:
      return QuantizeFp8Block(scheme, w, rows, cols, data, scales, zeros, global);
    case WeightFormat::kMxfp4:
      return QuantizeMxfp4(scheme, w, rows, cols, data, scales, zeros, global);
    case WeightFormat::kInt4:
      return QuantizeInt4(scheme, w, rows, cols, data, scales, zeros, global);
    case WeightFormat::kInt4Zp:
      return QuantizeInt4Zp(scheme, w, rows, cols, data, scales, zeros, global);
    case WeightFormat::kNvfp4:
      return QuantizeNvfp4(scheme, w, rows, cols, data, scales, zeros, global);
  }
}

namespace {

void SetView(OwnedExpertWeights& o, const ExpertWeightsShape& s) {
  ExpertWeights& v = o.view;
  v.scheme = s.scheme;
  v.num_experts_local = s.num_experts_local;
  v.hidden = s.hidden;
  v.intermediate = s.intermediate;
  v.gated = s.gated;
  v.gate_up_interleaved = s.gate_up_interleaved;
  v.w13 = o.w13.data();
  v.w2 = o.w2.data();
  v.w13_scales = o.w13_scales.empty() ? nullptr : o.w13_scales.data();
  v.w2_scales = o.w2_scales.empty() ? nullptr : o.w2_scales.data();
  v.w13_bias = o.w13_bias.empty() ? nullptr : o.w13_bias.data();
  v.w2_bias = o.w2_bias.empty() ? nullptr : o.w2_bias.data();
  v.w13_zeros = o.w13_zeros.empty() ? nullptr : o.w13_zeros.data();
  v.w2_zeros = o.w2_zeros.empty() ? nullptr : o.w2_zeros.data();
  v.w13_global = o.w13_global.empty() ? nullptr : o.w13_global.data();
  v.w2_global = o.w2_global.empty() ? nullptr : o.w2_global.data();
}

void Allocate(OwnedExpertWeights& o, const ExpertWeightsShape& s) {
  const int64_t r13 = s.gated ? 2 * s.intermediate : s.intermediate;
  const int64_t e = s.num_experts_local;
  const WeightScheme& q = s.scheme;
  o.w13 = AlignedBuffer(static_cast<size_t>(e * q.WeightBytes(r13, s.hidden)));
  o.w2 = AlignedBuffer(static_cast<size_t>(e * q.WeightBytes(s.hidden, s.intermediate)));
  o.w13_scales.resize(static_cast<size_t>(e * q.ScaleBytes(r13, s.hidden)));
  o.w2_scales.resize(static_cast<size_t>(e * q.ScaleBytes(s.hidden, s.intermediate)));
  o.w13_zeros.resize(static_cast<size_t>(e * q.ZeroBytes(r13, s.hidden)));
  o.w2_zeros.resize(static_cast<size_t>(e * q.ZeroBytes(s.hidden, s.intermediate)));
  if (q.has_global_scale()) {
    o.w13_global.assign(static_cast<size_t>(e * (s.gated ? 2 : 1)), 1.0f);
    o.w2_global.assign(static_cast<size_t>(e), 1.0f);
  }
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

OwnedExpertWeights EncodeExpertWeights(const ExpertWeightsShape& s, const float* w13,
                                       const float* w2, const float* w13_bias,
                                       const float* w2_bias) {
  OwnedExpertWeights o;
  Allocate(o, s);
  const int64_t r13 = s.gated ? 2 * s.intermediate : s.intermediate;
  const WeightScheme& q = s.scheme;
  const int64_t d13 = q.WeightBytes(r13, s.hidden), d2 = q.WeightBytes(s.hidden, s.intermediate);
  const int64_t s13 = q.ScaleBytes(r13, s.hidden), s2 = q.ScaleBytes(s.hidden, s.intermediate);
  const int64_t z13 = q.ZeroBytes(r13, s.hidden), z2 = q.ZeroBytes(s.hidden, s.intermediate);
  for (int64_t e = 0; e < s.num_experts_local; ++e) {
    const float* m13 = w13 + e * r13 * s.hidden;
    if (q.has_global_scale() && s.gated) {
      // One global per half (gate rows, up rows), each row quantized with its half's.
      std::vector<float> half[2];
      for (int64_t r = 0; r < r13; ++r) {
        const bool up = s.gate_up_interleaved ? r % 2 == 1 : r >= s.intermediate;
        half[up].insert(half[up].end(), m13 + r * s.hidden, m13 + (r + 1) * s.hidden);
      }
      for (int h = 0; h < 2; ++h) {
        o.w13_global[2 * e + h] =
            Nvfp4GlobalScale(half[h].data(), static_cast<int64_t>(half[h].size()));
      }
      const int64_t row_bytes = q.WeightRowBytes(s.hidden), scale_row = q.ScaleRowBytes(s.hidden);
      for (int64_t r = 0; r < r13; ++r) {
        const bool up = s.gate_up_interleaved ? r % 2 == 1 : r >= s.intermediate;
        QuantizeMatrix(q, m13 + r * s.hidden, 1, s.hidden,
                       o.w13.as<uint8_t>() + e * d13 + r * row_bytes,
                       o.w13_scales.data() + e * s13 + r * scale_row, nullptr,
                       &o.w13_global[2 * e + (up ? 1 : 0)]);
      }
    } else {
      QuantizeMatrix(q, m13, r13, s.hidden, o.w13.as<uint8_t>() + e * d13,
                     o.w13_scales.data() + e * s13,
                     o.w13_zeros.empty() ? nullptr : o.w13_zeros.data() + e * z13,
                     o.w13_global.empty() ? nullptr : &(o.w13_global[e] = 0.0f));
    }
    QuantizeMatrix(q, w2 + e * s.hidden * s.intermediate, s.hidden, s.intermediate,
                   o.w2.as<uint8_t>() + e * d2, o.w2_scales.data() + e * s2,
                   o.w2_zeros.empty() ? nullptr : o.w2_zeros.data() + e * z2,
                   o.w2_global.empty() ? nullptr : &(o.w2_global[e] = 0.0f));
  }
  if (w13_bias != nullptr) o.w13_bias.assign(w13_bias, w13_bias + s.num_experts_local * r13);
  if (w2_bias != nullptr) o.w2_bias.assign(w2_bias, w2_bias + s.num_experts_local * s.hidden);
  SetView(o, s);
  return o;
}

OwnedExpertWeights MakeRandomExpertWeights(KernelContext& ctx, const ExpertWeightsShape& s,
                                           uint64_t seed) {
  OwnedExpertWeights o;
  Allocate(o, s);
  // fp8 codes as a block-quantized checkpoint has them: E4M3 of Gaussian weights whose block
  // maximum (about 4 sigma over 128 x 128 values) maps to 448, drawn through a table of 2^16
  // samples by 16 hash bits a byte. Subnormal codes are then about 1 in 10^4, as in released
  // fp8 checkpoints, where uniform bytes would make every eighth code one (and would time a
  // decode path that real weights rarely take).
  std::vector<uint8_t> fp8_codes;
  if (s.scheme.format == WeightFormat::kFp8Block) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> gauss(0.0f, 448.0f / 4.0f);
    fp8_codes.resize(size_t{1} << 16);
    for (uint8_t& c : fp8_codes) c = FloatToFp8E4M3(gauss(rng));
  }
  // Data: 8 bytes per hash. bf16 lanes get a small value (|w| < 2^-4, random mantissa, never
  // NaN); fp8 bytes as above; MXFP4/int4 nibbles are any code.
  auto fill = [&](auto& buf, uint64_t stream, bool data) {
    const int64_t words = static_cast<int64_t>(buf.size()) / 8;
    ctx.pool().ParallelFor(words, 1 << 16, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) {
        uint64_t h = SplitMix64(seed ^ (stream << 56) ^ static_cast<uint64_t>(i));
        if (data && s.scheme.format == WeightFormat::kBf16) {
          // Each 16-bit lane: sign + exponent 118..122 + random mantissa.
          uint64_t v = 0;
          for (int l = 0; l < 4; ++l) {
            const uint64_t r = (h >> (16 * l)) & 0xffff;
            const uint64_t lane = (r & 0x807f) | ((118 + (r >> 7) % 5) << 7);
            v |= lane << (16 * l);
          }
          h = v;
        } else if (data && s.scheme.format == WeightFormat::kFp8Block) {
          const uint64_t h2 = SplitMix64(h);
          uint64_t v = 0;
          for (int l = 0; l < 8; ++l) {
            const uint64_t bits = ((l < 4 ? h : h2) >> (16 * (l % 4))) & 0xffff;
            v |= uint64_t{fp8_codes[bits]} << (8 * l);
          }
          h = v;
        } else if (!data) {
          switch (s.scheme.format) {
            case WeightFormat::kBf16: break;
            case WeightFormat::kFp8Block: {
              const float f = 1.0f / 8192;  // weights of sigma 112 / 8192, about 0.014
              uint32_t u;
              std::memcpy(&u, &f, 4);
              h = (static_cast<uint64_t>(u) << 32) | u;
              break;
            }
            case WeightFormat::kMxfp4: h = 0x7878787878787878ull; break;   // 2^-7
            case WeightFormat::kInt4: h = 0x3c233c233c233c23ull; break;    // bf16 ~0.01
            case WeightFormat::kInt4Zp: h = 0x211f211f211f211full; break;  // fp16 ~0.01
            case WeightFormat::kNvfp4: h = 0x3838383838383838ull; break;   // e4m3 1.0
          }
        }
        std::memcpy(buf.data() + i * 8, &h, 8);
      }
    });
  };
  fill(o.w13, 1, true);
  fill(o.w2, 2, true);
  fill(o.w13_scales, 3, false);
  fill(o.w2_scales, 4, false);
  std::fill(o.w13_zeros.begin(), o.w13_zeros.end(), uint8_t{8});
  std::fill(o.w2_zeros.begin(), o.w2_zeros.end(), uint8_t{8});
  std::fill(o.w13_global.begin(), o.w13_global.end(), 1.0f / 128);  // with e4m3 1.0: ~0.01
  std::fill(o.w2_global.begin(), o.w2_global.end(), 1.0f / 128);
  SetView(o, s);
  return o;
}

}  // namespace moeshard
