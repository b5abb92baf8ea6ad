#include "moeshard/kernels/kernel_backend.h"

#include <fmt/format.h>

#include <cstring>
#include <new>

#include "base/check.h"
#include "kernels/kernel_backend_registry.h"

namespace moeshard {
namespace {

struct BackendEntry {
  const char* name;
  Result<std::unique_ptr<KernelBackend>> (*create)(const KernelBackendOptions&);
};

// Registry order: the default first.
const BackendEntry kBackends[] = {
    {"cpu", internal::CreateCpuKernelBackend},
    {"reference", internal::CreateReferenceKernelBackend},
#ifdef MOESHARD_HAVE_CUDA
    {"cuda", internal::CreateCudaKernelBackend},
#endif
};

constexpr std::align_val_t kBufferAlign{64};

void ReleaseHost(void* p) { ::operator delete(p, kBufferAlign); }

}  // namespace

KernelBuffer& KernelBuffer::operator=(KernelBuffer&& o) noexcept {
  if (this != &o) {
    if (release_ != nullptr && data_ != nullptr) release_(data_);
    data_ = o.data_;
    bytes_ = o.bytes_;
    release_ = o.release_;
    o.data_ = nullptr;
    o.bytes_ = 0;
    o.release_ = nullptr;
  }
  return *this;
}

KernelBuffer::~KernelBuffer() {
  if (release_ != nullptr && data_ != nullptr) release_(data_);
}

Result<std::unique_ptr<KernelBackend>> CreateKernelBackend(const KernelBackendOptions& options) {
  for (const BackendEntry& b : kBackends) {
    if (options.name == b.name) return b.create(options);
  }
  return InvalidArgumentError(fmt::format(
      "kernel backend: '{}': expected one of {} (backends this build has; a CUDA backend needs "
      "-DMOESHARD_WITH_CUDA=ON)",
      options.name, fmt::join(KernelBackendNames(), ", ")));
}

std::vector<std::string> KernelBackendNames() {
  std::vector<std::string> names;
  for (const BackendEntry& b : kBackends) names.emplace_back(b.name);
  return names;
}

namespace internal {

KernelBuffer AllocateHostBuffer(int64_t bytes) {
  MOESHARD_CHECK(bytes >= 0, "AllocateHostBuffer: negative size {}", bytes);
  if (bytes == 0) return KernelBuffer();
  void* p = ::operator new(static_cast<size_t>(bytes), kBufferAlign);
  std::memset(p, 0, static_cast<size_t>(bytes));
  return KernelBuffer(p, bytes, ReleaseHost);
}

Result<bool> Int8ActivationsSetting(const KernelBackendOptions& options) {
  const auto it = options.settings.find("activations");
  if (it == options.settings.end() || it->second == "bf16") return false;
  if (it->second == "int8") return true;
  return InvalidArgumentError(fmt::format(
      "kernel backend '{}': '--activations {}': expected bf16 (the default: inputs as they are) "
      "or int8 (MXFP4, int4 and NVFP4 experts quantize their inputs per scale group)",
      options.name, it->second));
}

Status CheckSettingNames(const KernelBackendOptions& options,
                         const std::vector<std::string>& known) {
  for (const auto& [key, value] : options.settings) {
    bool found = false;
    for (const std::string& k : known) found |= k == key;
    if (!found) {
      return InvalidArgumentError(
          fmt::format("kernel backend '{}': setting '{}': expected one of [{}]", options.name, key,
                      fmt::join(known, ", ")));
    }
  }
  return Status::Ok();
}

}  // namespace internal
}  // namespace moeshard
