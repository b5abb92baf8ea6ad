// AlignedBuffer: a zero-initialised, 64-byte aligned byte buffer for weights and other large
// read-mostly arrays.
//
// Buffers of kHugePageBytes or more are mapped anonymously (zero pages arrive lazily, so
// allocating a multi-GiB rank costs nothing until it is filled), aligned to 2 MiB and advised
// for transparent huge pages (madvise MADV_HUGEPAGE, which Debian's default "madvise" THP mode
// honours). Expert kernels stream weight rows of a few KiB from many places at once; on 4 KiB
// pages every row is its own TLB entry and the page walks cost the prefill kernels a large
// fraction of their speed (docs/PERFORMANCE.md). Smaller buffers come from calloc.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moeshard {

class AlignedBuffer {
 public:
  static constexpr size_t kHugePageBytes = size_t{2} << 20;

  AlignedBuffer() = default;
  // Throws std::bad_alloc when the memory cannot be had.
  explicit AlignedBuffer(size_t num_bytes);
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(data_);
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data_);
  }
  // True when the buffer is mapped and advised for huge pages (whether the kernel backs it
  // with them is its decision: see AnonHugePages in /proc/meminfo).
  bool huge_page_advised() const { return mapped_ && advised_; }

 private:
  void Release();

  std::byte* data_ = nullptr;
  size_t size_ = 0;
  void* raw_ = nullptr;  // what calloc or mmap returned
  size_t raw_bytes_ = 0;
  bool mapped_ = false;
  bool advised_ = false;
};

}  // namespace moeshard
