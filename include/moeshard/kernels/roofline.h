// Machine limits the kernels are measured against: sustained read bandwidth and the peak rate
// of the multiply-add instruction the kernels of the context's instruction set use.
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

// The peak of the multiply-add instruction the context's kernels use (vdpbf16ps on AVX-512 BF16;
// fp32 FMA on AVX2, AVX-512 without BF16, NEON and SVE; the plain C++ loop on the portable
// path), on registers only, all threads, best of `repetitions`. Returns FLOP/s (2 per
// multiply-add).
Result<double> MeasureComputePeak(KernelContext& ctx, int repetitions);
// The name of that instruction ("vdpbf16ps", "fp32 FMA (avx2)", ...).
const char* ComputePeakInstruction(const KernelContext& ctx);

}  // namespace moeshard
