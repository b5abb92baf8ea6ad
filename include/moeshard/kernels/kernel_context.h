// KernelContext: the explicit context every CPU MoE kernel runs in.
//
// It owns or borrows the ThreadPool the kernels parallelise over, holds the instruction set
// chosen at construction (runtime CPU dispatch: AVX-512 with native BF16 dot products when the
// CPU has them, a portable C++ path otherwise, or either one forced, e.g. by tests), and keeps
// scratch buffers that grow to the largest call seen so that steady-state calls with the same
// shapes do not allocate.
//
// Thread safety: a KernelContext is NOT thread-safe: one kernel call at a time per context
// (scratch buffers are shared by its calls). Use one context per rank thread. Contexts sharing
// one borrowed ThreadPool serialise their parallel loops on it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/base/thread_pool.h"
#include "moeshard/base/weight_format.h"

namespace moeshard {

enum class CpuIsa {
  kAuto,        // pick the best the running CPU supports (or MOESHARD_CPU_ISA, see Create)
  kAvx512Bf16,  // AVX-512 F/BW/VL + AVX512_BF16 (vdpbf16ps) + FMA: native bf16 dot products
  kAvx512Vnni,  // kAvx512 with AVX512_VNNI (Cascade Lake, Ice Lake): integer products by VNNI
  kAvx512,      // AVX-512 F/BW/DQ/VL without BF16 (Skylake-SP to Ice Lake): the SIMD backend
  kAvx2Vnni,    // kAvx2 with AVX-VNNI (Alder Lake on, Zen 5): integer products by vpdpwssd/vpdpbusd
  kAvx2,        // AVX2 + FMA + F16C (Haswell on, Zen 1-3): the SIMD backend
  kNeon,        // Arm NEON: the SIMD backend
  kSve,         // Arm SVE: the SIMD backend
  kPortable,    // plain C++ (auto-vectorised), runs anywhere
};
inline constexpr CpuIsa kAllCpuIsas[] = {CpuIsa::kAvx512Bf16, CpuIsa::kAvx512Vnni, CpuIsa::kAvx512,
                                         CpuIsa::kAvx2Vnni,   CpuIsa::kAvx2,       CpuIsa::kNeon,
                                         CpuIsa::kSve,        CpuIsa::kPortable};

const char* CpuIsaName(CpuIsa isa);  // "avx512-bf16", "avx512-vnni", "avx512", "avx2-vnni", ...
// Inverse of CpuIsaName (and "auto"); an error lists the names.
Result<CpuIsa> ParseCpuIsa(const std::string& name);
// Whether the running CPU (and this build) can run `isa`; kAuto and kPortable always can.
bool CpuSupportsIsa(CpuIsa isa);
// Every instruction set this CPU can run, best first (the last is kPortable).
std::vector<CpuIsa> SupportedCpuIsas();

// True when the running CPU (and OS, via XSAVE state) supports every instruction the
// kAvx512Bf16 path uses.
bool CpuSupportsAvx512Bf16();

struct KernelContextOptions {
  // Borrowed pool; when null the context owns a pool of `num_threads` threads.
  ThreadPool* pool = nullptr;
  // Threads of the owned pool, counting the caller (0: hardware concurrency). Ignored with `pool`.
  int num_threads = 0;
  CpuIsa isa = CpuIsa::kAuto;
  // The owned pool's threads pinned to these CPUs, thread i to cpus[i % size] (the caller is
  // thread 0); empty: not pinned. Ignored with `pool`.
  std::vector<int> cpus = {};
  // Opt-in: the experts of the schemes Int8ActivationScheme takes multiply int8 inputs, each
  // token's inputs quantized per scale group with the scale max|x| / 127 (as llama.cpp's q8_0),
  // for twice the byte products per instruction where the decode is instruction-bound (AVX2).
  // Each input then carries an error of up to half its group's scale (max|x| / 254) instead of
  // none; reference::Int8Inputs is its oracle. Run by the SIMD kernels (avx2, avx512, neon,
  // sve), at every token count. avx512-bf16 runs these experts on its avx512 SIMD kernels,
  // slower there than its native bf16 kernels (docs/PERFORMANCE.md): the mode is for CPUs
  // without AVX-512 BF16. --isa portable has no int8 kernels and is refused.
  bool int8_activations = false;
};

// Whether KernelContextOptions::int8_activations applies to experts of `scheme`: MXFP4, int4
// and NVFP4 with groups of 16, 32, 64 or 128 columns. Other experts keep their bf16 inputs.
bool Int8ActivationScheme(const WeightScheme& scheme);

namespace internal {
struct KernelScratch;  // defined in src/kernels/kernel_scratch.h
}

class KernelContext {
 public:
  // Fails when `options.isa` forces an instruction set the CPU lacks. With kAuto the
  // environment variable MOESHARD_CPU_ISA (a CpuIsaName) forces one, so a whole test suite or
  // benchmark can run on each variant; otherwise the best supported is picked.
  static Result<KernelContext> Create(const KernelContextOptions& options = {});

  KernelContext(KernelContext&&) noexcept;
  KernelContext& operator=(KernelContext&&) noexcept;
  ~KernelContext();

  ThreadPool& pool() { return *pool_; }
  int num_threads() const { return pool_->num_threads(); }
  // The resolved instruction set: never kAuto.
  CpuIsa isa() const { return isa_; }
  bool int8_activations() const { return int8_activations_; }
  // The variant whose kernels multiply int8 inputs (the experts Int8ActivationScheme takes, with
  // int8_activations): isa(), except avx512-bf16, whose native kernels take bf16 inputs only and
  // hand these experts to avx512-vnni's (or avx512's).
  CpuIsa int8_isa() const;

  // Internal: scratch memory for the kernels of this context.
  internal::KernelScratch& scratch() { return *scratch_; }
  const internal::KernelScratch& scratch() const { return *scratch_; }

 private:
  KernelContext(std::unique_ptr<ThreadPool> owned_pool, ThreadPool* pool, CpuIsa isa,
                bool int8_activations);

  std::unique_ptr<ThreadPool> owned_pool_;
  ThreadPool* pool_ = nullptr;
  CpuIsa isa_ = CpuIsa::kPortable;
  bool int8_activations_ = false;
  std::unique_ptr<internal::KernelScratch> scratch_;
};

}  // namespace moeshard
