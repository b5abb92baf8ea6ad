#include "moeshard/kernels/kernel_context.h"

#include <fmt/format.h>

#include <cstdlib>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "kernels/cpu/cpu_backend.h"
#include "kernels/kernel_scratch.h"

namespace moeshard {

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto: return "auto";
    case CpuIsa::kAvx512Bf16: return "avx512-bf16";
    case CpuIsa::kAvx512Vnni: return "avx512-vnni";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx2Vnni: return "avx2-vnni";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kNeon: return "neon";
    case CpuIsa::kSve: return "sve";
    case CpuIsa::kPortable: return "portable";
  }
  return "?";
}

Result<CpuIsa> ParseCpuIsa(const std::string& name) {
  if (name == "auto") return CpuIsa::kAuto;
  std::string names = "auto";
  for (CpuIsa isa : kAllCpuIsas) {
    if (name == CpuIsaName(isa)) return isa;
    names += std::string(", ") + CpuIsaName(isa);
  }
  return InvalidArgumentError(
      fmt::format("kernel context: 'isa {}': expected one of {}", name, names));
}

bool CpuSupportsIsa(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
    case CpuIsa::kPortable: return true;
    case CpuIsa::kAvx512Bf16: return CpuSupportsAvx512Bf16();
    case CpuIsa::kAvx512Vnni:
    case CpuIsa::kAvx512:
    case CpuIsa::kAvx2Vnni:
    case CpuIsa::kAvx2:
    case CpuIsa::kNeon:
    case CpuIsa::kSve: return internal::CpuSupportsSimd(isa);
  }
  return false;
}

std::vector<CpuIsa> SupportedCpuIsas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : kAllCpuIsas) {
    if (CpuSupportsIsa(isa)) out.push_back(isa);
  }
  return out;
}

bool CpuSupportsAvx512Bf16() {
#if defined(__x86_64__) || defined(__i386__)
  // __builtin_cpu_supports also checks that the OS enabled the ZMM state (XCR0).
  // F16C from CPUID leaf 1 (ECX bit 29): clang before 15 has no "f16c" feature string.
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") &&
         __builtin_cpu_supports("fma") && f16c;
#else
  return false;
#endif
}

Result<KernelContext> KernelContext::Create(const KernelContextOptions& options) {
  CpuIsa isa = options.isa;
  if (isa == CpuIsa::kAuto) {
    if (const char* env = std::getenv("MOESHARD_CPU_ISA"); env != nullptr && *env != '\0') {
      Result<CpuIsa> parsed = ParseCpuIsa(env);
      if (!parsed.ok()) return parsed.status().WithContext("MOESHARD_CPU_ISA");
      isa = *parsed;
    }
  }
  if (isa == CpuIsa::kAuto) {
    isa = SupportedCpuIsas().front();
  } else if (!CpuSupportsIsa(isa)) {
    std::string ok;
    for (CpuIsa s : SupportedCpuIsas()) ok += std::string(ok.empty() ? "" : ", ") + CpuIsaName(s);
    return FailedPreconditionError(fmt::format(
        "kernel context: 'isa {}': this CPU (or build) cannot run it (this one runs: {}; use "
        "auto)",
        CpuIsaName(isa), ok));
  }
  const bool simd_int8 = isa != CpuIsa::kPortable &&
                         (isa != CpuIsa::kAvx512Bf16 || internal::Avx512SimdFallback() != nullptr);
  if (options.int8_activations && !simd_int8) {
    return FailedPreconditionError(fmt::format(
        "kernel context: 'int8_activations' (run --activations int8): the {} kernels "
        "of this build have no int8 inputs (the SIMD kernels do: avx2, avx2-vnni, "
        "avx512, avx512-vnni, avx512-bf16, neon, sve); drop int8 activations or pick one of those "
        "instruction sets",
        CpuIsaName(isa)));
  }
  if (options.num_threads < 0) {
    return InvalidArgumentError(
        fmt::format("kernel context: 'num_threads': expected >= 0, got {}", options.num_threads));
  }
  std::unique_ptr<ThreadPool> owned;
  ThreadPool* pool = options.pool;
  if (pool == nullptr) {
    owned = std::make_unique<ThreadPool>(options.num_threads, -1, options.cpus);
    pool = owned.get();
  }
  return KernelContext(std::move(owned), pool, isa, options.int8_activations);
}

bool Int8ActivationScheme(const WeightScheme& scheme) {
  const bool format = scheme.format == WeightFormat::kMxfp4 ||
                      scheme.format == WeightFormat::kInt4 || scheme.format == WeightFormat::kNvfp4;
  const int64_t g = scheme.group;
  return format && (g == 16 || g == 32 || g == 64 || g == 128);
}

KernelContext::KernelContext(std::unique_ptr<ThreadPool> owned_pool, ThreadPool* pool, CpuIsa isa,
                             bool int8_activations)
    : owned_pool_(std::move(owned_pool)),
      pool_(pool),
      isa_(isa),
      int8_activations_(int8_activations),
      scratch_(std::make_unique<internal::KernelScratch>(pool->num_threads())) {}

CpuIsa KernelContext::int8_isa() const {
  if (isa_ != CpuIsa::kAvx512Bf16) return isa_;
  const internal::CpuBackend* fallback = internal::Avx512SimdFallback();
  if (fallback == nullptr) return isa_;  // no int8 kernels: Create refused int8_activations
  const Result<CpuIsa> isa = ParseCpuIsa(fallback->name);
  return isa.ok() ? *isa : isa_;
}

KernelContext::KernelContext(KernelContext&&) noexcept = default;
KernelContext& KernelContext::operator=(KernelContext&&) noexcept = default;
KernelContext::~KernelContext() = default;

}  // namespace moeshard
