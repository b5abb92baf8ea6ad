// The kernel backends this build has, and what their factories share. Private to kernels/.
//
// Adding a backend: a folder src/kernels/<name>/ with a factory declared here and one line in
// kBackends (kernel_backend.cc), both under the backend's CMake option (docs/backends.md).
//
// Thread safety: the factories are reentrant.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/kernels/kernel_backend.h"

namespace moeshard::internal {

Result<std::unique_ptr<KernelBackend>> CreateCpuKernelBackend(const KernelBackendOptions& options);
Result<std::unique_ptr<KernelBackend>> CreateReferenceKernelBackend(
    const KernelBackendOptions& options);
#ifdef MOESHARD_HAVE_CUDA
// src/kernels/cuda/ (docs/backends.md "Adding a CUDA backend").
Result<std::unique_ptr<KernelBackend>> CreateCudaKernelBackend(const KernelBackendOptions& options);
#endif

// Zero-filled host memory, 64-byte aligned (the "cpu" and "reference" backends' Allocate).
KernelBuffer AllocateHostBuffer(int64_t bytes);

// The "activations" setting: bf16 (default; false) or int8 (true: KernelContextOptions::
// int8_activations and its oracle); InvalidArgument for any other value.
Result<bool> Int8ActivationsSetting(const KernelBackendOptions& options);

// InvalidArgument when `options.settings` has a name outside `known`, naming the backend, the
// setting and the known ones.
Status CheckSettingNames(const KernelBackendOptions& options,
                         const std::vector<std::string>& known);

}  // namespace moeshard::internal
