// Scratch memory owned by a KernelContext (private to the kernels layer).
//
// Buffers only grow (std::vector keeps its capacity), so repeated calls with the same shapes do
// not allocate. Per-thread buffers are indexed by the ThreadPool's thread_idx.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "moeshard/base/numeric.h"
#include "moeshard/kernels/permute.h"

namespace moeshard::internal {

// Cache-line aligned storage for the scratch vectors the kernels stream through with 64-byte
// vector loads and stores (std::allocator only guarantees 16 bytes: a row of y_sorted would
// then straddle a line boundary with every full-vector store).
template <typename T>
struct LineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  LineAllocator() = default;
  template <typename U>
  // NOLINTNEXTLINE(google-explicit-constructor): allocators convert implicitly (std requirement)
  LineAllocator(const LineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <typename U>
  bool operator==(const LineAllocator<U>&) const {
    return true;
  }
};
template <typename T>
using LineVector = std::vector<T, LineAllocator<T>>;

// One unit of work of the grouped GEMM's parallel loops.
struct GemmTask {
  int32_t expert = 0;
  int64_t row_begin = 0;  // first sorted row (token) of the block
  int64_t row_end = 0;
  int64_t out_begin = 0;  // first output index (intermediate j for gate_up, hidden for down)
  int64_t out_end = 0;
  // Packed-path experts (KernelScratch::packed_base >= 0): rows are whole groups of 16 from
  // row_begin.
};

struct KernelScratch {
  explicit KernelScratch(int num_threads) : per_thread(num_threads) {}

  // Grows v to at least n elements (never shrinks) and returns its data.
  template <typename T, typename A>
  static T* Grow(std::vector<T, A>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
    return v.data();
  }

  LineVector<bf16_t> x_bf16;  // [num_rows, H] the grouped GEMM's input rounded to bf16
  LineVector<bf16_t> x_perm;  // [num_rows, H] sorted act-order experts' inputs in their order
  LineVector<bf16_t> h;       // [num_rows, I] activation output (dot-path experts)
  // Packed-path experts (layout: PackedGemmArgs in cpu/cpu_backend.h): first group per expert
  // (-1: dot path), packed inputs and packed activations.
  std::vector<int64_t> packed_base;
  std::vector<int64_t> packed_rem;  // per expert: last tokens left unpacked (see expert_gemm.cc)
  LineVector<uint32_t> x_packed;
  LineVector<uint32_t> h_packed;
  std::vector<GemmTask> pack_tasks;  // the grouped GEMM's pass 0 (GemmSchedule)
  std::vector<GemmTask> tasks;       // its gate_up and down tasks
  // Per expert: gate_up tasks not finished yet (atomically decremented; its down tasks wait).
  std::vector<int32_t> gate_up_pending;
  std::vector<int32_t> row_idx;  // per-task row lists are built per thread (see per_thread)
  // Inputs quantized once per call for the dot path's integer decode (GemmSchedule::qx / qh):
  // the inputs' and the activations' rows (QuantizedRows in cpu/cpu_backend.h: int8 or int16
  // values; per row the scales sx, and with int8, int4 or int4-zp negc), and per expert whether
  // its gate_up / down tasks take them.
  LineVector<uint8_t> x_q;
  LineVector<uint8_t> h_q;
  LineVector<float> x_q_scales;
  LineVector<float> h_q_scales;
  std::vector<uint8_t> q_ahead;  // [2 * E_local]: gate_up, then down
  struct PerThread {
    LineVector<float> tile;           // DotRows output tile
    LineVector<float> work;           // backend work space (portable: decoded rows), line-aligned
    std::vector<int32_t> rows;        // row index list of the current task
    std::vector<bf16_t> act;          // packed path: one activation row over the task's tokens
    LineVector<uint8_t> packed_work;  // packed path: decoded weight rows (PackedGemmArgs)
    std::vector<int32_t> aux;         // routing: group candidates
  };
  std::vector<PerThread> per_thread;

  // MoeForward / MoeExpertsForward.
  std::vector<int32_t> topk_ids;
  std::vector<float> topk_weights;
  TokenPermutation perm;
  LineVector<float> y_sorted;

  // Bytes held by the large buffers (their capacities), for workspace reports.
  int64_t Bytes() const {
    auto b = [](const auto& v) { return static_cast<int64_t>(v.capacity() * sizeof(*v.data())); };
    int64_t n = b(x_bf16) + b(x_perm) + b(h) + b(x_packed) + b(h_packed) + b(y_sorted) +
                b(topk_ids) + b(topk_weights) + b(x_q) + b(h_q) + b(x_q_scales) + b(h_q_scales);
    for (const PerThread& t : per_thread) n += b(t.tile) + b(t.work) + b(t.act) + b(t.packed_work);
    return n;
  }
};

}  // namespace moeshard::internal
