// AVX-512 measurement loops behind roofline.h (private; compiled with AVX-512 BF16 flags).
#pragma once

#include <cstdint>

namespace moeshard::internal {

// XOR-folds `bytes` (a multiple of 256) from p with 512-bit loads; returns a value that depends
// on every byte so the loads cannot be removed. Access patterns (the bandwidth reported is the
// best of them, so the yardstick is what the core can pull, not what one pattern gets):
//   0: one sequential stream, hardware prefetch only;
//   1: kReadStreams interleaved sequential streams (the chunk cut in equal parts), each
//      software-prefetched 2 KiB ahead. On the 2-core VM this gets up to 1.5x pattern 0 when
//      the host's memory is busy.
//   2: the same streams prefetched 1 KiB ahead, like the decode kernels' row streams (on
//      one core of the VM 1 KiB read up to 13 % more than 2 KiB).
uint64_t ReadStreamAvx512(const uint8_t* p, int64_t bytes, int pattern);
inline constexpr int kReadPatterns = 3;
inline constexpr int kReadStreams = 4;

// Runs `iterations` x 24 independent vdpbf16ps on registers; returns a data-dependent value.
float DotPeakLoopAvx512(int64_t iterations, float seed);

// vdpbf16ps per iteration of DotPeakLoopAvx512.
inline constexpr int kDotPeakOpsPerIteration = 24;

}  // namespace moeshard::internal
