// AVX-512 measurement loops behind roofline.h (private; compiled with AVX-512 BF16 flags).
#pragma once

#include <cstdint>

namespace moeshard::internal {

// CpuBackend::read_stream (cpu_backend.h) with 512-bit loads. On the 2-core VM pattern 1 gets up
// to 1.5x pattern 0 when the host's memory is busy, and on one core 1 KiB (pattern 2) read up to
// 13 % more than 2 KiB.
uint64_t ReadStreamAvx512(const uint8_t* p, int64_t bytes, int pattern);
inline constexpr int kReadPatterns = 3;
inline constexpr int kReadStreams = 4;

// Runs `iterations` x 24 independent vdpbf16ps on registers; returns a data-dependent value.
float DotPeakLoopAvx512(int64_t iterations, float seed);

// vdpbf16ps per iteration of DotPeakLoopAvx512.
inline constexpr int kDotPeakOpsPerIteration = 24;

}  // namespace moeshard::internal
