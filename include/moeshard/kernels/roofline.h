// Machine limits the kernels are measured against: sustained read bandwidth and the peak rate
// of the bf16 dot-product instruction (vdpbf16ps).
//
// Both run on every thread of the context's pool at once, as the kernels do. Results are in one
// run's units (bytes/s, FLOP/s with 2 FLOPs per multiply-add) and are meant for ratios reported
// by benchmarks, never for assertions in tests.
//
// Thread safety: one call at a time per KernelContext.
#pragma once

#include <cstdint>

#include "moeshard/base/status.h"

namespace moeshard {

class KernelContext;

// Multi-threaded streaming read of a buffer of `buffer_bytes` (choose it far larger than the
// last-level cache; huge-page advised), best of `repetitions` passes of every read pattern
// (AVX-512: one sequential stream, and four interleaved prefetched streams). Returns bytes per
// second.
Result<double> MeasureReadBandwidth(KernelContext& ctx, int64_t buffer_bytes, int repetitions);

// vdpbf16ps on registers only (independent accumulators, no memory traffic), all threads, best
// of `repetitions`. Returns FLOP/s (one vdpbf16ps on 512 bits = 32 multiply-adds = 64 FLOPs).
// FailedPrecondition when the CPU lacks AVX512_BF16.
Result<double> MeasureBf16DotPeak(KernelContext& ctx, int repetitions);

}  // namespace moeshard
