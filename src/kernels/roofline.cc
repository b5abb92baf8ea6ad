#include "moeshard/kernels/roofline.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "moeshard/base/aligned_buffer.h"
#include "moeshard/kernels/kernel_context.h"

namespace moeshard {
namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Makes every chunk of a ParallelFor(num_threads, 1, ...) wait until all threads hold one, so
// that the measurement really runs on every thread (otherwise a fast caller may run several
// chunks itself before a sleeping worker wakes up).
class StartBarrier {
 public:
  explicit StartBarrier(int n) : n_(n) {}
  void ArriveAndWait() {
    arrived_.fetch_add(1);
    while (arrived_.load() < n_) {
    }
  }
  void Reset() { arrived_.store(0); }

 private:
  const int n_;
  std::atomic<int> arrived_{0};
};

}  // namespace

Result<ReadBuffer> ReadBuffer::Create(KernelContext& ctx, int64_t bytes) {
  ReadBuffer r;
  r.threads_ = ctx.num_threads();
  r.chunk_ = std::max<int64_t>(256, bytes / r.threads_ / 4096 * 4096);
  const int64_t total = r.chunk_ * r.threads_;
  // Huge-page advised like the weight buffers, so the measurement is not limited by TLB misses
  // the kernels do not pay either.
  try {
    r.buf_ = AlignedBuffer(static_cast<size_t>(total));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(
        fmt::format("bandwidth: cannot allocate {} bytes for the read buffer", total));
  }
  // Each thread first-touches the chunk it will read (NUMA-local pages): chunk i belongs to the
  // pool's thread i, and the barrier makes every thread take exactly one of the calls.
  uint8_t* data = r.buf_.as<uint8_t>();
  const int64_t chunk = r.chunk_;
  StartBarrier barrier(r.threads_);
  ctx.pool().ParallelFor(r.threads_, 1, [&](int64_t, int64_t, int thread) {
    barrier.ArriveAndWait();
    std::memset(data + thread * chunk, thread + 1, static_cast<size_t>(chunk));
  });
  return r;
}

Result<double> MeasureReadBandwidth(KernelContext& ctx, const ReadBuffer& buffer, int repetitions) {
  const int threads = ctx.num_threads();
  if (buffer.empty()) {
    return InvalidArgumentError("bandwidth: the read buffer is empty (moved from)");
  }
  if (buffer.threads() != threads) {
    return InvalidArgumentError(
        fmt::format("bandwidth: the read buffer was made for {} threads, the context has {}",
                    buffer.threads(), threads));
  }
  const int64_t total = buffer.chunk_bytes() * threads;
  const internal::CpuBackend& be = internal::CpuBackendFor(ctx.isa());
  std::atomic<uint64_t> sink{0};
  double best = 0.0;
  StartBarrier barrier(threads);
  const int patterns = be.read_patterns;
  for (int rep = 0; rep < std::max(1, repetitions); ++rep) {
    for (int pattern = 0; pattern < patterns; ++pattern) {
      barrier.Reset();
      const auto t0 = std::chrono::steady_clock::now();
      ctx.pool().ParallelFor(threads, 1, [&](int64_t, int64_t, int thread) {
        barrier.ArriveAndWait();
        sink ^= be.read_stream(buffer.chunk(thread), buffer.chunk_bytes(), pattern);
      });
      const double s = Seconds(t0, std::chrono::steady_clock::now());
      best = std::max(best, static_cast<double>(total) / s);
    }
  }
  if (sink.load() == 0x123456789abcdefull) std::fputc(' ', stderr);  // keep the reads alive
  return best;
}

const char* ComputePeakInstruction(const KernelContext& ctx) {
  return internal::CpuBackendFor(ctx.isa()).peak_instruction;
}

Result<double> MeasureComputePeak(KernelContext& ctx, int repetitions) {
  const internal::CpuBackend& be = internal::CpuBackendFor(ctx.isa());
  const int threads = ctx.num_threads();
  constexpr int64_t kIterations = 2'000'000;
  std::atomic<uint32_t> sink{0};
  double best = 0.0;
  StartBarrier barrier(threads);
  for (int rep = 0; rep < std::max(1, repetitions); ++rep) {
    barrier.Reset();
    std::vector<double> flops(static_cast<size_t>(threads), 0.0);
    const auto t0 = std::chrono::steady_clock::now();
    ctx.pool().ParallelFor(threads, 1, [&](int64_t b, int64_t, int) {
      barrier.ArriveAndWait();
      const float r =
          be.peak_loop(kIterations, 1.0f + static_cast<float>(b), &flops[static_cast<size_t>(b)]);
      uint32_t u;
      std::memcpy(&u, &r, 4);
      sink ^= u;
    });
    const double s = Seconds(t0, std::chrono::steady_clock::now());
    double total = 0.0;
    for (double f : flops) total += f;
    best = std::max(best, total / s);
  }
  if (sink.load() == 0x12345678u) std::fputc(' ', stderr);
  return best;
}

}  // namespace moeshard
