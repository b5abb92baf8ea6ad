// Builds for CPUs other than x86 (Arm): the AVX-512 BF16 kernels (avx512_backend.cc,
// roofline_avx512.cc) are x86 code, so this stands in for the one symbol the other kernels name.
// It is never selected here: CpuSupportsAvx512Bf16() is false off x86, so KernelContext never
// resolves to kAvx512Bf16 and CpuBackendFor never asks for it.
#include "kernels/cpu/cpu_backend.h"

namespace moeshard::internal {

const CpuBackend& Avx512Backend() { return PortableBackend(); }

}  // namespace moeshard::internal
