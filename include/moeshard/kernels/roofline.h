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

#include "moeshard/base/aligned_buffer.h"
#include "moeshard/base/status.h"

namespace moeshard {

class KernelContext;

// The buffer MeasureReadBandwidth reads: one chunk per thread of the context it was made for,
// chunk i first-touched and later read by the pool's thread i (NUMA-local pages when the
// threads are pinned), huge-page advised. Made once and measured many times: with a buffer
// allocated and zeroed per measurement, twice per case, `bench kernels` took about a quarter
// longer.
class ReadBuffer {
 public:
  // `bytes` (choose it far larger than the last-level cache) rounded down to whole 4 KiB pages
  // per thread, at least 256 bytes per thread.
  static Result<ReadBuffer> Create(KernelContext& ctx, int64_t bytes);

  bool empty() const { return buf_.empty(); }
  int threads() const { return threads_; }
  int64_t chunk_bytes() const { return chunk_; }
  const uint8_t* chunk(int64_t thread) const { return buf_.as<uint8_t>() + thread * chunk_; }

 private:
  AlignedBuffer buf_;
  int threads_ = 0;
  int64_t chunk_ = 0;
};

// Multi-threaded streaming read of `buffer` (made for a context with as many threads as ctx),
// best of `repetitions` passes of every read pattern (AVX-512: one sequential stream, and four
// interleaved prefetched streams). Returns bytes per second.
Result<double> MeasureReadBandwidth(KernelContext& ctx, const ReadBuffer& buffer, int repetitions);

// The peak of the multiply-add instruction the context's kernels use (vdpbf16ps on AVX-512 BF16;
// fp32 FMA on AVX2, AVX-512 without BF16, NEON and SVE; the plain C++ loop on the portable
// path), on registers only, all threads, best of `repetitions`. Returns FLOP/s (2 per
// multiply-add).
Result<double> MeasureComputePeak(KernelContext& ctx, int repetitions);
// The name of that instruction ("vdpbf16ps", "fp32 FMA (avx2)", ...).
const char* ComputePeakInstruction(const KernelContext& ctx);

}  // namespace moeshard
