#include "kernels/cpu/roofline_avx512.h"

// GCC 12's AVX-512 intrinsics initialise their "undefined" pass-through operands from
// themselves (_mm256_undefined_pd etc.), which -Wuninitialized reports once inlined here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

namespace moeshard::internal {
namespace {

uint64_t Fold(__m512i x) {
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, x);
  uint64_t r = 0;
  for (uint64_t v : lanes) r ^= v;
  return r;
}

// kReadStreams interleaved sequential streams, each prefetched `ahead` bytes into L1.
template <int64_t kAhead>
uint64_t ReadStreamsPrefetched(const uint8_t* p, int64_t bytes) {
  static_assert(kReadStreams == 4);
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  const int64_t part = bytes / 256 * 64;  // bytes per stream, a multiple of 64
  const uint8_t* s0 = p;
  const uint8_t* s1 = p + part;
  const uint8_t* s2 = p + 2 * part;
  const uint8_t* s3 = p + 3 * part;
  for (int64_t i = 0; i < part; i += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(s0 + i + kAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(s1 + i + kAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(s2 + i + kAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(s3 + i + kAhead), _MM_HINT_T0);
    a0 = _mm512_xor_si512(a0, _mm512_load_si512(s0 + i));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512(s1 + i));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512(s2 + i));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512(s3 + i));
  }
  return Fold(_mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3)));
}

}  // namespace

uint64_t ReadStreamAvx512(const uint8_t* p, int64_t bytes, int pattern) {
  if (pattern == 1) return ReadStreamsPrefetched<2048>(p, bytes);
  if (pattern == 2) return ReadStreamsPrefetched<1024>(p, bytes);
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < bytes; i += 256) {
    a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 192));
  }
  return Fold(_mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3)));
}

// 24 accumulators: vdpbf16ps has a latency of up to 6 cycles and up to 2 issue ports, so at
// least 12 independent chains are needed to saturate it; 24 leaves margin.
float DotPeakLoopAvx512(int64_t iterations, float seed) {
  __m512 acc[kDotPeakOpsPerIteration];
  for (int i = 0; i < kDotPeakOpsPerIteration; ++i)
    acc[i] = _mm512_set1_ps(seed * static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(seed), b = _mm512_set1_ps(1e-3f);
  __m512bh x = _mm512_cvtne2ps_pbh(a, b);
  __m512bh y = _mm512_cvtne2ps_pbh(b, a);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < kDotPeakOpsPerIteration; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
    __asm__ volatile("" : "+v"(x), "+v"(y));  // keep the operands opaque to the optimiser
  }
  __m512 s = acc[0];
  for (int i = 1; i < kDotPeakOpsPerIteration; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float r = 0.0f;
  for (float v : lanes) r += v;
  return r;
}

}  // namespace moeshard::internal
