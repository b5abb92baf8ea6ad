#include "moeshard/base/aligned_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>
#include <utility>

namespace moeshard {
namespace {

constexpr size_t kAlign = 64;

}  // namespace

AlignedBuffer::AlignedBuffer(size_t num_bytes) : size_(num_bytes) {
  if (num_bytes == 0) return;
  if (num_bytes >= kHugePageBytes) {
    // Over-map by one huge page so a 2 MiB aligned start exists inside the mapping.
    raw_bytes_ = num_bytes + kHugePageBytes;
    void* p =
        ::mmap(nullptr, raw_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    raw_ = p;
    mapped_ = true;
    const uintptr_t base = reinterpret_cast<uintptr_t>(p);
    const uintptr_t aligned = (base + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
    data_ = reinterpret_cast<std::byte*>(aligned);
#ifdef MADV_HUGEPAGE
    advised_ = ::madvise(data_, num_bytes, MADV_HUGEPAGE) == 0;  // advice only: failure is fine
#endif
    return;
  }
  raw_bytes_ = num_bytes + kAlign;
  raw_ = std::calloc(raw_bytes_, 1);
  if (raw_ == nullptr) throw std::bad_alloc();
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw_);
  data_ = reinterpret_cast<std::byte*>((base + kAlign - 1) & ~(uintptr_t{kAlign} - 1));
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      raw_(std::exchange(o.raw_, nullptr)),
      raw_bytes_(std::exchange(o.raw_bytes_, 0)),
      mapped_(std::exchange(o.mapped_, false)),
      advised_(std::exchange(o.advised_, false)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    Release();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    raw_ = std::exchange(o.raw_, nullptr);
    raw_bytes_ = std::exchange(o.raw_bytes_, 0);
    mapped_ = std::exchange(o.mapped_, false);
    advised_ = std::exchange(o.advised_, false);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { Release(); }

void AlignedBuffer::Release() {
  if (raw_ == nullptr) return;
  if (mapped_) {
    ::munmap(raw_, raw_bytes_);
  } else {
    std::free(raw_);
  }
  raw_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

}  // namespace moeshard
