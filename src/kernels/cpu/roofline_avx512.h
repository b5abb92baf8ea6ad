// AVX-512 measurement loops behind roofline.h (private; compiled with AVX-512 BF16 flags).
#pragma once

#include <cstdint>

namespace moeshard::internal {

// XOR-folds `bytes` (a multiple of 256) from p with 512-bit loads; returns a value that depends
// on every byte so the loads cannot be removed.
uint64_t ReadStreamAvx512(const uint8_t* p, int64_t bytes);

// Runs `iterations` x 24 independent vdpbf16ps on registers; returns a data-dependent value.
float DotPeakLoopAvx512(int64_t iterations, float seed);

// vdpbf16ps per iteration of DotPeakLoopAvx512.
inline constexpr int kDotPeakOpsPerIteration = 24;

}  // namespace moeshard::internal
