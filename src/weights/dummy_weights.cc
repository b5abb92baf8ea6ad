// Layout-invariant dummy weights: see moeshard/weights/dummy_weights.h.
//
// The inner loops are plain element loops over 32-bit integer arithmetic so the compiler
// vectorises them (this file is built with -O3); the per-element cost is two 32-bit mixes,
// which generates a few GB/s per core -- a rank of a full-size model in seconds.
#include "moeshard/weights/dummy_weights.h"

#include <cstring>
#include <numeric>
#include <string>

#include "base/check.h"
#include "moeshard/base/numeric.h"

namespace moeshard {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// Chris Wellons' lowbias32: a bijective 32-bit mix with low bias.
inline uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

inline uint32_t Hash(uint32_t lo, uint32_t k0, uint32_t k1) { return Mix32(Mix32(lo + k0) ^ k1); }

// [-1, 1) from the top 24 bits.
inline float Signed(uint32_t h) {
  return static_cast<float>(static_cast<int32_t>(h >> 8) - (1 << 23)) * (1.0f / (1 << 23));
}

struct FloatParams {
  float offset;
  float scale;
};

FloatParams ParamsOf(DummyKind kind) {
  switch (kind) {
    case DummyKind::kWeight: return {0.0f, 0.05f};
    case DummyKind::kNorm: return {1.0f, 0.05f};
    case DummyKind::kBias: return {0.0f, 0.02f};
    case DummyKind::kScale:
    case DummyKind::kGlobalScale: return {0.01f, 0.005f};
    case DummyKind::kFp8:
    case DummyKind::kNibbles:
    case DummyKind::kE8M0:
    case DummyKind::kZeroPoint:
    case DummyKind::kE4M3Scale: break;
  }
  return {0.0f, 0.05f};
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// One run of n elements that does not cross a 2^32 index boundary.
__attribute__((target_clones("avx512f", "avx2", "default"))) void FillRun(uint64_t key, DType dtype,
                                                                          DummyKind kind,
                                                                          uint64_t first, int64_t n,
                                                                          std::byte* dst) {
  const uint64_t k = SplitMix64(key + (first >> 32));
  const uint32_t k0 = static_cast<uint32_t>(k), k1 = static_cast<uint32_t>(k >> 32);
  const uint32_t lo = static_cast<uint32_t>(first);
  switch (kind) {
    case DummyKind::kFp8: {
      auto* out = reinterpret_cast<uint8_t*>(dst);
      // Magnitude codes 0..0x50 (0x50 = 2^3 = 8); bit 7 is the sign. Never 0x7f / 0xff (NaN).
      for (int64_t j = 0; j < n; ++j) {
        const uint32_t h = Hash(lo + static_cast<uint32_t>(j), k0, k1);
        out[j] = static_cast<uint8_t>((((h & 0xffu) * 0x51u) >> 8) | ((h >> 8) & 0x80u));
      }
      return;
    }
    case DummyKind::kNibbles: {
      auto* out = reinterpret_cast<uint8_t*>(dst);
      for (int64_t j = 0; j < n; ++j) {
        out[j] = static_cast<uint8_t>(Hash(lo + static_cast<uint32_t>(j), k0, k1) >> 24);
      }
      return;
    }
    case DummyKind::kE8M0: {
      auto* out = reinterpret_cast<uint8_t*>(dst);
      for (int64_t j = 0; j < n; ++j) {
        const uint32_t h = Hash(lo + static_cast<uint32_t>(j), k0, k1);
        out[j] = static_cast<uint8_t>(120u + (((h >> 16) * 3u) >> 16));
      }
      return;
    }
    case DummyKind::kZeroPoint: {
      auto* out = reinterpret_cast<uint8_t*>(dst);
      for (int64_t j = 0; j < n; ++j) {
        const uint32_t h = Hash(lo + static_cast<uint32_t>(j), k0, k1);
        out[j] = static_cast<uint8_t>(6u + (((h >> 16) * 5u) >> 16));
      }
      return;
    }
    case DummyKind::kE4M3Scale: {
      auto* out = reinterpret_cast<uint8_t*>(dst);
      for (int64_t j = 0; j < n; ++j) {
        out[j] = static_cast<uint8_t>(0x30u + (Hash(lo + static_cast<uint32_t>(j), k0, k1) >> 28));
      }
      return;
    }
    case DummyKind::kWeight:
    case DummyKind::kNorm:
    case DummyKind::kBias:
    case DummyKind::kScale:
    case DummyKind::kGlobalScale: break;
  }
  const FloatParams p = ParamsOf(kind);
  switch (dtype) {
    case DType::kBF16: {
      auto* out = reinterpret_cast<uint16_t*>(dst);
      for (int64_t j = 0; j < n; ++j) {
        const float v = p.offset + p.scale * Signed(Hash(lo + static_cast<uint32_t>(j), k0, k1));
        out[j] = FloatToBf16(v).bits;
      }
      return;
    }
    case DType::kF32: {
      auto* out = reinterpret_cast<float*>(dst);
      for (int64_t j = 0; j < n; ++j) {
        out[j] = p.offset + p.scale * Signed(Hash(lo + static_cast<uint32_t>(j), k0, k1));
      }
      return;
    }
    case DType::kF16: {
      // FloatToHalf rounds to nearest even, as a cast to _Float16 does (which clang 14, the
      // clang-tidy front end, does not accept on x86).
      auto* out = reinterpret_cast<uint16_t*>(dst);
      for (int64_t j = 0; j < n; ++j) {
        out[j] =
            FloatToHalf(p.offset + p.scale * Signed(Hash(lo + static_cast<uint32_t>(j), k0, k1)))
                .bits;
      }
      return;
    }
    case DType::kF64: {
      auto* out = reinterpret_cast<double*>(dst);
      for (int64_t j = 0; j < n; ++j) {
        out[j] = p.offset + p.scale * Signed(Hash(lo + static_cast<uint32_t>(j), k0, k1));
      }
      return;
    }
    default: {
      // Integer and other whole-byte types: hash bytes, element by element.
      const int64_t size = DTypeBits(dtype) / 8;
      for (int64_t j = 0; j < n; ++j) {
        const uint32_t h = Hash(lo + static_cast<uint32_t>(j), k0, k1);
        for (int64_t b = 0; b < size; ++b) {
          dst[j * size + b] = static_cast<std::byte>(b < 4 ? (h >> (8 * b)) : 0);
        }
      }
      return;
    }
  }
}

}  // namespace

DummyKind DummyKindOf(std::string_view name, DType dtype) {
  if (dtype == DType::kF8E4M3) return DummyKind::kFp8;
  if (dtype == DType::kF8E8M0) return DummyKind::kE8M0;
  if (EndsWith(name, "weight_scale_inv")) return DummyKind::kScale;
  if (EndsWith(name, "weight_scale") || EndsWith(name, "_scales")) {
    return dtype == DType::kU8 ? DummyKind::kE8M0 : DummyKind::kScale;
  }
  if (EndsWith(name, "weight_packed") || EndsWith(name, "_blocks")) return DummyKind::kNibbles;
  if (EndsWith(name, "bias") || EndsWith(name, "sinks")) return DummyKind::kBias;
  if (EndsWith(name, "norm.weight")) return DummyKind::kNorm;
  return DummyKind::kWeight;
}

std::vector<int64_t> DummyExpertTable(int64_t num_experts, int64_t top_k) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(kDummyExpertTableRows * top_k));
  const int64_t stride = num_experts / top_k;
  for (int64_t r = 0; r < kDummyExpertTableRows; ++r) {
    for (int64_t j = 0; j < top_k; ++j) out.push_back((7 * r + j * stride) % num_experts);
  }
  return out;
}

std::vector<int64_t> DummyGroupIndex(int64_t channels, int64_t group) {
  int64_t a = 7;
  while (std::gcd(a, channels) != 1) a += 2;
  std::vector<int64_t> out(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) {
    out[static_cast<size_t>(c)] = ((a % channels) * c + 3) % channels / group;
  }
  return out;
}

uint64_t DummyTensorKey(uint64_t seed, std::string_view name) {
  return SplitMix64(seed ^ SplitMix64(Fnv1a64(name)));
}

void FillDummy(uint64_t key, DType dtype, DummyKind kind, int64_t first_idx,
               std::span<std::byte> dst) {
  const int bits = DTypeBits(dtype);
  MOESHARD_CHECK(bits % 8 == 0, "dummy weights of sub-byte dtype {}", DTypeName(dtype));
  const int64_t size = bits / 8;
  MOESHARD_CHECK(static_cast<int64_t>(dst.size()) % size == 0, "{} bytes of {}", dst.size(),
                 DTypeName(dtype));
  const int64_t n = static_cast<int64_t>(dst.size()) / size;
  uint64_t idx = static_cast<uint64_t>(first_idx);
  int64_t done = 0;
  while (done < n) {
    const uint64_t to_boundary = (uint64_t{1} << 32) - (idx & 0xffffffffull);
    const int64_t run =
        static_cast<int64_t>(std::min<uint64_t>(to_boundary, static_cast<uint64_t>(n - done)));
    FillRun(key, dtype, kind, idx, run, dst.data() + done * size);
    done += run;
    idx += static_cast<uint64_t>(run);
  }
}

}  // namespace moeshard
