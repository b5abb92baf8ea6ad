#include "moeshard/weights/rank_weights.h"

#include <cstdlib>
#include <new>
#include <string_view>

#include "weights/checkpoint_map.h"

namespace moeshard {
namespace {

// Buffers come from calloc, which for large sizes maps fresh zero pages lazily (zeroing a
// multi-GiB rank costs nothing until it is filled), over-allocated by the alignment; the
// pointer calloc returned is stored in the 8 bytes just below the aligned data.
constexpr size_t kAlign = 64;

}  // namespace

AlignedBuffer::AlignedBuffer(size_t num_bytes) : size_(num_bytes) {
  if (num_bytes == 0) return;
  void* raw = std::calloc(num_bytes + kAlign + sizeof(void*), 1);
  if (raw == nullptr) throw std::bad_alloc();
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw) + sizeof(void*);
  const uintptr_t aligned = (base + kAlign - 1) & ~(uintptr_t{kAlign} - 1);
  reinterpret_cast<void**>(aligned)[-1] = raw;
  data_.reset(reinterpret_cast<std::byte*>(aligned));
}

void AlignedBuffer::Free::operator()(std::byte* p) const {
  if (p != nullptr) std::free(reinterpret_cast<void**>(p)[-1]);
}

const TensorBuffer* RankWeights::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorBuffer* RankWeights::FindLayer(int64_t layer, const std::string& suffix) const {
  return Find(internal::ConcreteName("model.layers.{layer}." + suffix, layer));
}

int64_t RankWeights::BytesOf(TensorCategory category) const {
  int64_t n = 0;
  for (const TensorBuffer& t : tensors_) {
    if (t.category == category) n += static_cast<int64_t>(t.data.size());
  }
  return n;
}

int64_t RankWeights::TotalBytes() const {
  int64_t n = 0;
  for (const TensorBuffer& t : tensors_) n += static_cast<int64_t>(t.data.size());
  return n;
}

TensorBuffer& RankWeights::Add(TensorBuffer buffer) {
  MOESHARD_CHECK(index_.find(buffer.name) == index_.end(), "tensor '{}' added twice to rank {}",
                 buffer.name, rank_);
  index_.emplace(buffer.name, tensors_.size());
  tensors_.push_back(std::move(buffer));
  return tensors_.back();
}

}  // namespace moeshard
