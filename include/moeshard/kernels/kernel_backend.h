// KernelBackend: the MoE operations the sharded runtime runs, behind one interface, so a kernel
// backend (CPU today, CUDA later) is one folder under src/kernels/ selected by name at run time.
//
// The operations, in the order one MoE layer calls them (DESIGN.md "The sharded MoE forward"):
//
//   RmsNorm      pre-MoE norm (and the latent norm)                       dense_ops.h
//   Linear       router logits, latent projections, the shared-expert gate
//   Route        logits -> top-k ids and weights, every routing family    routing.h
//   MoeExperts   Permute -> ExpertGemm (gate_up, bias, gated activation, down, bias) ->
//                Unpermute (weighted combine), the composition the runtime calls; the parts
//                are operations of their own for tests and other compositions  permute.h,
//                                                                          expert_gemm.h
//   GatedMlp     the shared experts
//   glue         ToExpertRows (fp32 -> bf16 expert inputs), AddRows (residual, shared-expert
//                output), CopyRows, Convert (Forward's input and output)
//
// Memory: the runtime asks the backend for its buffers (Allocate) and hands the backend's
// memory to the operations. Weights stay where the caller loaded them; PrepareExperts lets a
// backend rewrite one layer's routed-expert tensors once, in place, into its own layout (the
// CPU backend's bf16 row groups), which it remembers by address: nothing above the kernels knows
// the layout, and later calls with the same tensors use it.
//
// Each backend also runs the kernels' own instruction-set variants, chosen from its options.
//
// Thread safety: a backend is NOT thread-safe: one call at a time (its scratch memory and
// thread pool are shared by its calls); use one backend per rank thread. PrepareExperts must
// finish before the prepared weights are used by any call.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moeshard/base/dtype.h"
#include "moeshard/base/numeric.h"
#include "moeshard/base/status.h"
#include "moeshard/kernels/dense_ops.h"
#include "moeshard/kernels/expert_gemm.h"
#include "moeshard/kernels/moe_forward.h"
#include "moeshard/kernels/permute.h"
#include "moeshard/kernels/routing.h"

namespace moeshard {

// Memory from a backend (host memory for "cpu" and "reference"), zero-filled, aligned to 64
// bytes, freed with the buffer. Move-only.
class KernelBuffer {
 public:
  using Release = void (*)(void* data);
  KernelBuffer() = default;
  KernelBuffer(void* data, int64_t bytes, Release release)
      : data_(data), bytes_(bytes), release_(release) {}
  KernelBuffer(KernelBuffer&& o) noexcept { *this = std::move(o); }
  KernelBuffer& operator=(KernelBuffer&& o) noexcept;
  KernelBuffer(const KernelBuffer&) = delete;
  KernelBuffer& operator=(const KernelBuffer&) = delete;
  ~KernelBuffer();

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  Release release_ = nullptr;
};

// The element-wise glue between the operations, on the backend's memory.

// rows[r, :cols] = bf16(x[r, :cols] (* row_weights[r])), rows[r, cols:padded_cols] = 0; with
// row_weights (Llama-4's weight on the input) each row_weights[r] is then set to 1.
struct ExpertRowsArgs {
  const float* x = nullptr;  // [num_rows, x_stride] fp32
  int64_t x_stride = 0;
  int64_t num_rows = 0;
  int64_t cols = 0;
  int64_t padded_cols = 0;
  bf16_t* rows = nullptr;        // out: [num_rows, padded_cols] bf16
  float* row_weights = nullptr;  // optional [num_rows] fp32 (in/out)
};

// y[r, :] += x[r, :], or (gate_logits) y[r, :] += sigmoid(gate_logits[r]) * x[r, :].
struct AddRowsArgs {
  float* y = nullptr;        // [num_rows, cols] fp32
  const float* x = nullptr;  // [num_rows, cols] fp32
  int64_t num_rows = 0;
  int64_t cols = 0;
  const float* gate_logits = nullptr;  // optional [num_rows] fp32
};

// num_rows rows of row_bytes, src_stride / dst_stride bytes apart; either side may be host
// memory (the caller's inputs and outputs) or the backend's. Rows may overlap (memmove).
struct CopyRowsArgs {
  void* dst = nullptr;
  int64_t dst_stride = 0;
  const void* src = nullptr;
  int64_t src_stride = 0;
  int64_t num_rows = 0;
  int64_t row_bytes = 0;
};

// dst[i] = src[i] converted (F32 or BF16 each; fp32 -> bf16 rounds to nearest even); one side
// may be host memory, as CopyRows.
struct ConvertArgs {
  const void* src = nullptr;
  DType src_dtype = DType::kF32;
  void* dst = nullptr;
  DType dst_dtype = DType::kF32;
  int64_t n = 0;
};

// One layer's routed experts handed to PrepareExperts: the view as loaded (row-major, the
// layout expert_gemm.h describes) and the writable tensors it views. For act-order GPTQ experts
// without biases the view also holds their scales, zero points and g_idx, and w13's scales and
// zero points are writable too (SortActOrderExperts); elsewhere those stay null.
struct PrepareExpertsArgs {
  ExpertWeights weights;
  void* w13 = nullptr;           // = weights.w13, writable
  void* w2 = nullptr;            // = weights.w2, writable
  void* w13_scales = nullptr;    // = weights.w13_scales, writable (act-order only)
  uint8_t* w13_zeros = nullptr;  // = weights.w13_zeros, writable (act-order only)
};

class KernelBackend {
 public:
  virtual ~KernelBackend() = default;

  // The registry name ("cpu", "reference") and a one-line description of the configuration
  // ("cpu: avx512-bf16, 4 threads").
  virtual const std::string& name() const = 0;
  virtual std::string Describe() const = 0;
  // Threads the backend's operations run on (1 for a serial backend).
  virtual int num_threads() const = 0;

  // Memory for the runtime's activations (`bytes` >= 0; zero-filled).
  virtual Result<KernelBuffer> Allocate(int64_t bytes) = 0;
  // Bytes of the backend's own scratch (grown by the calls, reused once warm).
  virtual int64_t ScratchBytes() const = 0;

  // Offers one layer's routed experts for an in-place rewrite into the backend's layout.
  // Returns true when it rewrote them (then `args`' tensors must only be read through this
  // backend), false when it keeps them as they are. Idempotent for the same tensors. The
  // backend recognises rewritten layers by their tensors' addresses and shape: the tensors must
  // stay allocated while the backend is in use (free the backend first, as ShardedJob does).
  virtual Result<bool> PrepareExperts(const PrepareExpertsArgs& args) = 0;
  // The layout PrepareExperts rewrites into, for reports ("bf16 row-group layout"); empty when
  // the backend never rewrites.
  virtual std::string PreparedLayout() const = 0;

  // routing.h: Route; permute.h: PermuteTokens, GatherTokens, UnpermuteTokens; expert_gemm.h:
  // GroupedExpertGemm; moe_forward.h: MoeExpertsForward. Same contracts and errors.
  virtual Status Route(const RoutingParams& params, const RoutingArgs& args) = 0;
  virtual Status Permute(const PermuteParams& params, TokenPermutation* out) = 0;
  virtual Status Gather(const TokenPermutation& perm, const GatherParams& params) = 0;
  virtual Status ExpertGemm(const GroupedGemmParams& params) = 0;
  virtual Status Unpermute(const TokenPermutation& perm, const UnpermuteParams& params) = 0;
  virtual Status MoeExperts(const MoeExpertsParams& params) = 0;

  // dense_ops.h. REQUIRES: valid arguments (programmer errors abort).
  virtual void Linear(const LinearArgs& args) = 0;
  virtual void RmsNorm(const RmsNormArgs& args) = 0;
  virtual void GatedMlp(const GatedMlpArgs& args) = 0;

  // The glue above (REQUIRES: valid arguments).
  virtual void ToExpertRows(const ExpertRowsArgs& args) = 0;
  virtual void AddRows(const AddRowsArgs& args) = 0;
  virtual void CopyRows(const CopyRowsArgs& args) = 0;
  virtual void Convert(const ConvertArgs& args) = 0;
};

// What CreateKernelBackend builds. `settings` are the backend's own options by name, as the
// CLI passes them through; unknown names and values are errors that list the known ones.
//   "cpu":        isa = auto | avx512-bf16 | avx512-vnni | avx512 | avx2-vnni | avx2 | neon |
//                 sve | portable (auto also reads MOESHARD_CPU_ISA); expert-layout = auto (bf16
//                 experts in row groups on avx512-bf16 when they fit) | row-groups (on any
//                 instruction set) | row-major; activations = bf16 | int8
//                 (KernelContextOptions::int8_activations).
//   "reference":  activations = bf16 | int8 (the scalar oracle of kernels/reference.h, with
//                 its int8 inputs; serial; for tests).
struct KernelBackendOptions {
  std::string name = "cpu";
  int num_threads = 0;         // 0: the hardware's (serial backends ignore it)
  std::vector<int> cpus = {};  // pin thread i to cpus[i % size]; empty: not pinned
  std::map<std::string, std::string> settings = {};
};

// The backend `options.name` names, configured; InvalidArgument naming the backends this
// build has when the name is unknown.
Result<std::unique_ptr<KernelBackend>> CreateKernelBackend(const KernelBackendOptions& options);

// The names CreateKernelBackend accepts in this build, in registry order ("cpu" first).
std::vector<std::string> KernelBackendNames();

}  // namespace moeshard
