#include "moeshard/kernels/kernel_context.h"

#include <fmt/format.h>

#include "kernels/kernel_scratch.h"

namespace moeshard {

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto: return "auto";
    case CpuIsa::kAvx512Bf16: return "avx512-bf16";
    case CpuIsa::kPortable: return "portable";
  }
  return "?";
}

bool CpuSupportsAvx512Bf16() {
#if defined(__x86_64__) || defined(__i386__)
  // __builtin_cpu_supports also checks that the OS enabled the ZMM state (XCR0).
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") &&
         __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

Result<KernelContext> KernelContext::Create(const KernelContextOptions& options) {
  CpuIsa isa = options.isa;
  const bool has_avx512 = CpuSupportsAvx512Bf16();
  switch (isa) {
    case CpuIsa::kAuto: isa = has_avx512 ? CpuIsa::kAvx512Bf16 : CpuIsa::kPortable; break;
    case CpuIsa::kAvx512Bf16:
      if (!has_avx512) {
        return FailedPreconditionError(
            "kernel context: 'isa': expected a CPU with AVX-512 F/BW/VL and AVX512_BF16, this "
            "one lacks them (use --isa auto or portable)");
      }
      break;
    case CpuIsa::kPortable: break;
  }
  if (options.num_threads < 0) {
    return InvalidArgumentError(
        fmt::format("kernel context: 'num_threads': expected >= 0, got {}", options.num_threads));
  }
  std::unique_ptr<ThreadPool> owned;
  ThreadPool* pool = options.pool;
  if (pool == nullptr) {
    owned = std::make_unique<ThreadPool>(options.num_threads);
    pool = owned.get();
  }
  return KernelContext(std::move(owned), pool, isa);
}

KernelContext::KernelContext(std::unique_ptr<ThreadPool> owned_pool, ThreadPool* pool, CpuIsa isa)
    : owned_pool_(std::move(owned_pool)),
      pool_(pool),
      isa_(isa),
      scratch_(std::make_unique<internal::KernelScratch>(pool->num_threads())) {}

KernelContext::KernelContext(KernelContext&&) noexcept = default;
KernelContext& KernelContext::operator=(KernelContext&&) noexcept = default;
KernelContext::~KernelContext() = default;

}  // namespace moeshard
