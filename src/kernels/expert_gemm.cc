#include "moeshard/kernels/expert_gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>

#include "base/check.h"
#include "kernels/activation_inl.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/kernel_scratch.h"
#include "moeshard/base/math.h"
#include "moeshard/base/numeric.h"
#include "moeshard/kernels/cpu_constraints.h"
#include "moeshard/kernels/kernel_context.h"

namespace moeshard {

const char* ActivationName(Activation act) {
  switch (act) {
    case Activation::kSwiGlu: return "swiglu";
    case Activation::kSwiGluOai: return "swiglu_oai";
    case Activation::kSiTu: return "situ";
    case Activation::kReluSquared: return "relu2";
    case Activation::kGeluTanhGated: return "gelu_tanh";
    case Activation::kSwiGluClamp: return "swiglu_clamp";
  }
  return "?";
}

bool IsGated(Activation act) {
  switch (act) {
    case Activation::kSwiGlu:
    case Activation::kSwiGluOai:
    case Activation::kSiTu:
    case Activation::kGeluTanhGated:
    case Activation::kSwiGluClamp: return true;
    case Activation::kReluSquared: return false;
  }
  return true;
}

float ApplyActivation(const ActivationParams& a, float gate, float up) {
  return internal::VisitActivation(
      a.kind, [&](auto kind) { return internal::ActivationOf<kind.value>(a, gate, up); });
}

int64_t ExpertMatrixBytes(const WeightScheme& scheme, int64_t rows, int64_t cols) {
  return scheme.WeightBytes(rows, cols) + scheme.ScaleBytes(rows, cols) +
         scheme.ZeroBytes(rows, cols);
}

namespace {

constexpr int64_t kRowGroup = 16;  // rows per group of the bf16 row-group layout

Status CheckInputDim(const ExpertWeights& w, const char* what, int64_t cols) {
  switch (w.scheme.format) {
    case WeightFormat::kBf16:
    case WeightFormat::kFp8Block: return Status::Ok();
    case WeightFormat::kMxfp4:
      if (cols % w.scheme.group != 0) {
        return InvalidArgumentError(fmt::format(
            "expert weights: '{}': MXFP4 needs the input dimension to be a multiple of {}, got "
            "{} (pad it with zeros)",
            what, w.scheme.group, cols));
      }
      return Status::Ok();
    case WeightFormat::kInt4:
    case WeightFormat::kInt4Zp:
    case WeightFormat::kNvfp4:
      if (cols % w.scheme.group != 0) {
        return InvalidArgumentError(fmt::format(
            "expert weights: '{}': {} needs the input dimension to be a multiple of the group "
            "size {}, got {} (pad it with zeros)",
            what, WeightFormatName(w.scheme.format), w.scheme.group, cols));
      }
      return Status::Ok();
  }
  return Status::Ok();
}

}  // namespace

Status CheckBf16RowGroupShape(const ExpertWeights& w) {
  if (w.scheme.format != WeightFormat::kBf16) {
    return InvalidArgumentError(fmt::format(
        "expert weights: 'bf16_row_groups': expected bf16 weights for the row-group layout, got "
        "{} (keep the row-major layout)",
        WeightFormatName(w.scheme.format)));
  }
  if (w.gate_up_interleaved) {
    return InvalidArgumentError(
        "expert weights: 'bf16_row_groups': expected gate and up rows in two halves, got "
        "interleaved gate/up rows (gpt-oss; keep the row-major layout)");
  }
  if (w.hidden % kRowGroup != 0 || w.intermediate % kRowGroup != 0) {
    return InvalidArgumentError(fmt::format(
        "expert weights: 'bf16_row_groups': expected H and I to be multiples of {}, got H {}, "
        "I {} (pad them with zeros, or keep the row-major layout)",
        kRowGroup, w.hidden, w.intermediate));
  }
  return Status::Ok();
}

Status ValidateExpertWeights(const ExpertWeights& w, const ActivationParams& act) {
  if (w.num_experts_local < 0 || w.hidden < 1 || w.intermediate < 1) {
    return InvalidArgumentError(fmt::format(
        "expert weights: 'num_experts_local/hidden/intermediate': expected >= 0 / >= 1 / >= 1, "
        "got {} / {} / {}",
        w.num_experts_local, w.hidden, w.intermediate));
  }
  if (w.gated != IsGated(act.kind)) {
    return InvalidArgumentError(
        fmt::format("expert weights: 'gated': activation {} is {}, but the weights are {}",
                    ActivationName(act.kind), IsGated(act.kind) ? "gated" : "not gated",
                    w.gated ? "gated (w13 has 2*I rows)" : "not gated (w13 has I rows)"));
  }
  if (w.gate_up_interleaved && !w.gated) {
    return InvalidArgumentError(
        "expert weights: 'gate_up_interleaved': only meaningful for gated activations");
  }
  if (w.num_experts_local > 0 && (w.w13 == nullptr || w.w2 == nullptr)) {
    return InvalidArgumentError("expert weights: 'w13/w2': expected non-null");
  }
  if (w.scheme.format != WeightFormat::kBf16 && w.num_experts_local > 0 &&
      (w.w13_scales == nullptr || w.w2_scales == nullptr)) {
    return InvalidArgumentError(
        fmt::format("expert weights: 'w13_scales/w2_scales': expected non-null for format {}",
                    WeightFormatName(w.scheme.format)));
  }
  const bool int4 =
      w.scheme.format == WeightFormat::kInt4 || w.scheme.format == WeightFormat::kInt4Zp;
  if (int4 && (w.scheme.group < kCpuInt4GroupSizeMultiple ||
               w.scheme.group % kCpuInt4GroupSizeMultiple != 0)) {
    return InvalidArgumentError(
        fmt::format("expert weights: 'scheme.group': expected an {} group that is a positive "
                    "multiple of {}, got {}",
                    WeightFormatName(w.scheme.format), kCpuInt4GroupSizeMultiple, w.scheme.group));
  }
  if (w.scheme.format == WeightFormat::kInt4Zp && w.num_experts_local > 0 &&
      (w.w13_zeros == nullptr || w.w2_zeros == nullptr)) {
    return InvalidArgumentError(
        "expert weights: 'w13_zeros/w2_zeros': expected non-null for format int4-zp (AWQ/GPTQ "
        "zero points)");
  }
  if (w.scheme.format == WeightFormat::kNvfp4) {
    if (w.scheme.group != kCpuNvfp4GroupSize) {
      return InvalidArgumentError(
          fmt::format("expert weights: 'scheme.group': expected the NVFP4 group {}, got {}",
                      kCpuNvfp4GroupSize, w.scheme.group));
    }
    if (w.num_experts_local > 0 && (w.w13_global == nullptr || w.w2_global == nullptr)) {
      return InvalidArgumentError(
          "expert weights: 'w13_global/w2_global': expected non-null for format nvfp4 (the "
          "per-tensor global scales)");
    }
  }
  if (w.scheme.format == WeightFormat::kMxfp4 && w.scheme.group != kCpuMxfp4GroupSize) {
    return InvalidArgumentError(
        fmt::format("expert weights: 'scheme.group': expected the MXFP4 group {}, got {}",
                    kCpuMxfp4GroupSize, w.scheme.group));
  }
  // The K blocks of the kernels (kCpuKBlock columns) must start on a scale group.
  if (w.scheme.format == WeightFormat::kFp8Block &&
      (w.scheme.block_rows < 1 || w.scheme.group < 1 ||
       internal::kCpuKBlock % w.scheme.group != 0)) {
    return InvalidArgumentError(fmt::format(
        "expert weights: 'scheme': expected fp8 blocks of >= 1 rows x a divisor of {} columns, "
        "got {} x {}",
        internal::kCpuKBlock, w.scheme.block_rows, w.scheme.group));
  }
  if (w.scheme.act_order) {
    if (w.scheme.format != WeightFormat::kInt4Zp || w.bf16_row_groups) {
      return InvalidArgumentError(
          fmt::format("expert weights: 'scheme.act_order': expected format int4-zp (GPTQ), got {}",
                      WeightFormatName(w.scheme.format)));
    }
    if (w.num_experts_local > 0 && (w.w13_group_index == nullptr || w.w2_group_index == nullptr)) {
      return InvalidArgumentError(
          "expert weights: 'w13_group_index/w2_group_index': expected non-null for act-order "
          "int4-zp (GPTQ g_idx)");
    }
    if (w.w13_input_perm != nullptr) {
      return InvalidArgumentError(
          "expert weights: 'w13_input_perm': expected null for act-order weights as loaded (the "
          "input order belongs to the view SortActOrderExperts makes, which is no longer "
          "act-order)");
    }
  }
  MOESHARD_RETURN_IF_ERROR(CheckInputDim(w, "w13 (input = hidden)", w.hidden));
  MOESHARD_RETURN_IF_ERROR(CheckInputDim(w, "w2 (input = intermediate)", w.intermediate));
  if (w.bf16_row_groups) MOESHARD_RETURN_IF_ERROR(CheckBf16RowGroupShape(w));
  return Status::Ok();
}

Status RepackBf16RowGroups(KernelContext& ctx, ExpertWeights* weights, void* w13, void* w2) {
  MOESHARD_CHECK(weights != nullptr, "RepackBf16RowGroups: null weights");
  ExpertWeights& w = *weights;
  if (w.bf16_row_groups) {
    return InvalidArgumentError(
        "repack: 'bf16_row_groups': expected row-major weights, got weights already in the "
        "row-group layout");
  }
  if (w13 != w.w13 || w2 != w.w2) {
    return InvalidArgumentError(
        "repack: 'w13/w2': expected the writable buffers the weights view, got other pointers");
  }
  ActivationParams act;  // any activation of the weights' kind: only the shape is validated
  act.kind = w.gated ? Activation::kSwiGlu : Activation::kReluSquared;
  MOESHARD_RETURN_IF_ERROR(ValidateExpertWeights(w, act));
  MOESHARD_RETURN_IF_ERROR(CheckBf16RowGroupShape(w));
  for (const bool is_w13 : {true, false}) {
    const int64_t rows = is_w13 ? w.w13_rows() : w.hidden;
    const int64_t cols = is_w13 ? w.hidden : w.intermediate;
    const int64_t n = rows * cols;
    const int64_t pairs = cols / 2;
    bf16_t* data = static_cast<bf16_t*>(is_w13 ? w13 : w2);
    // One contiguous range of experts per thread, so each thread faults in its buffer once.
    const int64_t num_threads = ctx.num_threads();
    ctx.pool().ParallelFor(num_threads, 1, [&](int64_t t0, int64_t t1, int) {
      const std::unique_ptr<bf16_t[]> tmp = std::make_unique_for_overwrite<bf16_t[]>(n);
      const int64_t begin = t0 * w.num_experts_local / num_threads;
      const int64_t end = t1 * w.num_experts_local / num_threads;
      for (int64_t e = begin; e < end; ++e) {
        bf16_t* m = data + e * n;
        // In destination order (Bf16RowGroupsIndex): sequential writes, 16 row streams read.
        bf16_t* out = tmp.get();
        for (int64_t g = 0; g < rows / kRowGroup; ++g) {
          const bf16_t* group = m + g * kRowGroup * cols;
          for (int64_t p = 0; p < pairs; ++p) {
            for (int64_t l = 0; l < kRowGroup; ++l) {
              *out++ = group[l * cols + 2 * p];
              *out++ = group[l * cols + 2 * p + 1];
            }
          }
        }
        std::copy(tmp.get(), tmp.get() + n, m);
      }
    });
  }
  w.bf16_row_groups = true;
  return Status::Ok();
}

namespace internal {

MatrixRef ExpertMatrix(const ExpertWeights& w, bool w13, int64_t expert) {
  MatrixRef m;
  m.format = w.scheme.format;
  m.rows = w13 ? w.w13_rows() : w.hidden;
  m.cols = w13 ? w.hidden : w.intermediate;
  m.group = w.scheme.group;
  m.block_rows = w.scheme.block_rows;
  m.row_groups = w.bf16_row_groups;
  m.row_bytes = w.scheme.WeightRowBytes(m.cols);
  const int64_t data_bytes = w.scheme.WeightBytes(m.rows, m.cols);
  // Scales and zero points per expert: ScaleRows x ScaleCols (act-order w2: every group's).
  const int64_t scale_cols = w.ScaleCols(w13);
  const int64_t scale_bytes =
      w.scheme.ScaleRows(m.rows) * scale_cols *
      (w.scheme.has_scales() ? DTypeBits(w.scheme.spec().scale_dtype) / 8 : 0);
  m.data = static_cast<const uint8_t*>(w13 ? w.w13 : w.w2) + expert * data_bytes;
  const void* scales = w13 ? w.w13_scales : w.w2_scales;
  m.scales =
      scales == nullptr ? nullptr : static_cast<const uint8_t*>(scales) + expert * scale_bytes;
  const uint8_t* zeros = w13 ? w.w13_zeros : w.w2_zeros;
  m.zeros = zeros == nullptr ? nullptr : zeros + expert * w.scheme.ScaleRows(m.rows) * scale_cols;
  if (w.scheme.act_order) {
    m.scale_cols = scale_cols;
    m.group_index[0] = w.GroupIndex(w13, expert, 0);
    m.group_index[1] =
        w13 ? w.GroupIndex(w13, expert, w.gate_up_interleaved ? 1 : m.rows - 1) : m.group_index[0];
    m.group_index_split = w13 && w.gated ? w.intermediate : m.rows;
    m.group_index_interleaved = w13 && w.gate_up_interleaved;
  }
  if (w.scheme.format == WeightFormat::kNvfp4 && w.w13_global != nullptr &&
      w.w2_global != nullptr) {
    if (!w13) {
      m.global[0] = m.global[1] = w.w2_global[expert];
    } else {
      m.global[0] = w.W13Global(expert, 0);
      m.global[1] =
          w.gated ? w.W13Global(expert, w.gate_up_interleaved ? 1 : w.intermediate) : m.global[0];
      m.global_interleaved = w.gate_up_interleaved;
      m.global_split = w.gated ? w.intermediate : m.rows;
    }
  }
  return m;
}

}  // namespace internal

namespace {

// Task granularity. Gate_up tasks cover kGateUpBlock intermediate indices (2x rows when gated),
// down tasks kDownBlock output rows: small enough that decode (one token, 8 experts) yields
// 100+ tasks to balance over the threads, large enough that per-task overhead (one atomic, one
// epilogue) is noise. Both are multiples of the AVX-512 micro-kernels' row tiles (6 and 12).
constexpr int64_t kGateUpBlock = 48;
constexpr int64_t kDownBlock = 96;
// Packed-path (prefill) tasks are twice as large: each task's first weight strip starts cold
// (the kernel prefetches the next strip only within a task), and at 32 tokens per expert the
// larger blocks measured 2-3 % faster. Multiples of the packed kernel's 8-row strips;
// kPackedGateUpBlock is even so tasks write whole column pairs of the packed activations.
constexpr int64_t kPackedGateUpBlock = 96;
constexpr int64_t kPackedDownBlock = 192;
// The row-group layout's tasks must cover whole groups of 16 gate, up and down rows.
static_assert(kGateUpBlock % 16 == 0 && kDownBlock % 16 == 0);

// Dot-path (decode) tasks restart their weight streams cold, so when many experts are touched
// the blocks grow, up to kMaxBlockMultiple times, while every thread keeps at least
// kMinTasksPerThread tasks to balance.
constexpr int64_t kMaxBlockMultiple = 4;
constexpr int64_t kMinTasksPerThread = 16;

// Experts with at least this many tokens take the packed path (schemes PackedFormat takes): its
// token groups of 16 waste at most 15 padded tokens, which the outer-product kernel's speed repays
// from about one full group on; below it the dot-product kernels stream the weights at memory
// speed.
constexpr int64_t kPackedMinTokens = 16;

// Tokens per task: the bf16 input panel (tokens x K) is sized to stay in a 1 MiB L2 (half of
// it), so each weight row fetched from memory is reused for all tokens of the block.
int64_t TokenBlock(int64_t k) {
  const int64_t fit = (512 * 1024) / std::max<int64_t>(1, 2 * std::min(k, internal::kCpuKBlock));
  return std::clamp<int64_t>(fit / 4 * 4, 4, 128);
}

// The same for packed tasks, in whole groups of 16 (up to 256 tokens).
int64_t PackedTokenBlock(int64_t k) {
  const int64_t fit = (512 * 1024) / std::max<int64_t>(1, 2 * std::min<int64_t>(k, 1024));
  return std::clamp<int64_t>(fit / internal::kPackedGroup, 1, 16) * internal::kPackedGroup;
}

}  // namespace

namespace internal {

// The work split of one GroupedExpertGemm call, built by BuildGemmSchedule from the weights'
// shape, the rows per expert and the thread count, and executed by RunGemmSchedule. A plain
// description: which path each expert takes, the block sizes, and the task lists of the two
// parallel loops; its arrays live in the context's scratch (KernelScratch), valid until the
// next call.
//
//   pass 0 (pack_tasks):  16-row groups of input rows: packed-path experts' inputs packed into
//                         x_packed, the others' rows converted/gathered into contiguous bf16
//   pass 1 (tasks):       [gate_up tasks 0 .. num_gate_up) [down tasks num_gate_up ..)
//                         gate_up: (expert, token block, j block) -> h or h_packed
//                         down:    (expert, token block, output-row block) -> y_sorted;
//                         a down task waits for its expert's gate_up_pending to reach 0
struct GemmSchedule {
  int64_t num_experts = 0;  // E_local
  int64_t hidden = 0;       // H
  int64_t inter = 0;        // I
  int64_t rows_per_j = 1;   // w13 rows per intermediate index (2 when gated)
  int64_t num_rows = 0;     // grouped rows
  // Per expert: first packed group (-1: the dot path), and its last tokens left unpacked.
  const int64_t* packed_base = nullptr;  // [E_local]
  const int64_t* packed_rem = nullptr;   // [E_local]
  int64_t total_groups = 0;              // packed groups of 16 tokens over all experts
  int64_t x_group_stride = 0;            // uint32 per packed input group
  int64_t h_group_stride = 0;            // uint32 per packed activation group
  bool copy_rows = false;                // pass 0 writes contiguous bf16 rows for dot experts
  // Tokens per task (dot path tb*, packed path ptb*) for gate_up (1) and down (2), and the
  // dot path's output blocks (the packed path's are kPackedGateUpBlock / kPackedDownBlock).
  int64_t tb1 = 0, tb2 = 0, ptb1 = 0, ptb2 = 0;
  int64_t gu_block = 0, down_block = 0;
  const std::vector<GemmTask>* pack_tasks = nullptr;
  const std::vector<GemmTask>* tasks = nullptr;
  int64_t num_gate_up = 0;
  // [E_local] gate_up tasks per expert not finished yet (one more for an expert whose
  // activations are quantized ahead: the last gate_up task quantizes them, then releases it).
  int32_t* gate_up_pending = nullptr;
  // Inputs quantized once per call for the integer 4-bit decode (int8 or int16:
  // CpuBackend::quantized_rows_layout) instead of in every task of an expert: per expert whether
  // its gate_up tasks take the inputs so (qx; pass 0 quantizes them) and its down tasks the
  // activations (qh); null where no expert does. The layouts' sizes: [0] the inputs' (w13's),
  // [1] the activations' (w2's).
  const uint8_t* qx = nullptr;
  const uint8_t* qh = nullptr;
  internal::QuantizedRows q_layout[2];
  int64_t q_scratch = 0;  // bytes of quantize_rows's scratch
};

}  // namespace internal

namespace {

using internal::GemmSchedule;
using internal::GemmTask;
using internal::KernelScratch;
using internal::kPackedGroup;

// The dot path's output block for one phase: grows up to kMaxBlockMultiple times `base` while
// every thread keeps at least kMinTasksPerThread tasks.
int64_t DotOutBlock(const GemmSchedule& g, const int64_t* offsets, int64_t token_block,
                    int64_t out_size, int64_t base, int num_threads) {
  int64_t pairs = 0;  // (expert, token block) pairs on the dot path
  for (int64_t e = 0; e < g.num_experts; ++e) {
    if (g.packed_base[e] < 0) pairs += CeilDiv(offsets[e + 1] - offsets[e], token_block);
  }
  const int64_t units = pairs * CeilDiv(out_size, base);
  return base *
         std::clamp<int64_t>(units / (kMinTasksPerThread * num_threads), 1, kMaxBlockMultiple);
}

// Appends one phase's tasks to `tasks`, expert by expert; the expert's task counts go to
// `per_expert` when non-null.
void AppendPhaseTasks(const GemmSchedule& g, const int64_t* offsets, int64_t token_block,
                      int64_t packed_block, int64_t out_size, int64_t dot_out_block,
                      int64_t packed_out_block, std::vector<GemmTask>* tasks, int32_t* per_expert) {
  for (int64_t e = 0; e < g.num_experts; ++e) {
    const size_t before = tasks->size();
    const bool packed = g.packed_base[e] >= 0;
    const int64_t tb = packed ? packed_block : token_block;
    const int64_t ob = packed ? packed_out_block : dot_out_block;
    for (int64_t r = offsets[e]; r < offsets[e + 1]; r += tb) {
      for (int64_t o = 0; o < out_size; o += ob) {
        tasks->push_back({static_cast<int32_t>(e), r, std::min(r + tb, offsets[e + 1]), o,
                          std::min(o + ob, out_size)});
      }
    }
    if (per_expert != nullptr) per_expert[e] = static_cast<int32_t>(tasks->size() - before);
  }
}

// Sizes every per-thread scratch buffer the schedule's tasks use.
void GrowPerThread(const GemmSchedule& g, const internal::CpuBackend& be, KernelScratch& s) {
  const int64_t rows_per_j = g.rows_per_j;
  for (auto& pt : s.per_thread) {
    KernelScratch::Grow(
        pt.tile, std::max({g.tb1 * g.gu_block * rows_per_j, g.tb2 * g.down_block,
                           (g.ptb1 + internal::kPackedMaxRem) * kPackedGateUpBlock * rows_per_j,
                           (g.ptb2 + internal::kPackedMaxRem) * kPackedDownBlock}));
    KernelScratch::Grow(pt.work, std::max({be.work_floats(g.tb1, g.hidden),
                                           be.work_floats(g.tb2, g.inter), g.q_scratch / 4 + 1}));
    KernelScratch::Grow(pt.rows, std::max({g.gu_block * rows_per_j, g.down_block,
                                           kPackedGateUpBlock * rows_per_j, kPackedDownBlock}));
    KernelScratch::Grow(pt.act, 2 * g.ptb1);
    if (g.total_groups > 0) {
      KernelScratch::Grow(pt.packed_work,
                          internal::kPackedWorkBytesPerCol * std::max(g.hidden, g.inter));
    }
  }
}

// Which dot-path experts take their inputs quantized ahead (GemmSchedule::qx, qh): those whose
// token blocks the backend's integer decode takes so (`int8`: the call's int8_activations).
void PlanQuantizedAhead(const GroupedGemmParams& p, const internal::CpuBackend& be, bool int8,
                        KernelScratch& s, GemmSchedule* g) {
  if (be.quantized_rows_layout == nullptr) return;
  const ExpertWeights& w = *p.weights;
  const internal::MatrixRef m[2] = {internal::ExpertMatrix(w, /*w13=*/true, 0),
                                    internal::ExpertMatrix(w, /*w13=*/false, 0)};
  const int64_t tb[2] = {g->tb1, g->tb2};
  const int64_t ne = g->num_experts;
  uint8_t* ahead = KernelScratch::Grow(s.q_ahead, 2 * ne);
  bool any[2] = {false, false};
  for (int i = 0; i < 2; ++i) {
    for (int64_t e = 0; e < ne; ++e) {
      const int64_t n = p.expert_offsets[e + 1] - p.expert_offsets[e];
      int64_t scratch = 0;
      const bool take =
          g->packed_base[e] < 0 && n > 0 &&
          be.quantized_rows_layout(m[i], std::min(n, tb[i]), int8, &g->q_layout[i], &scratch);
      ahead[i * ne + e] = take ? 1 : 0;
      any[i] = any[i] || take;
      g->q_scratch = std::max(g->q_scratch, scratch);
    }
  }
  g->qx = any[0] ? ahead : nullptr;
  g->qh = any[1] ? ahead + ne : nullptr;
}

// The schedule of one call (REQUIRES: validated params with at least one row). Grows the
// scratch it describes.
GemmSchedule BuildGemmSchedule(const GroupedGemmParams& p, const internal::CpuBackend& be,
                               bool int8, int num_threads, KernelScratch& s) {
  const ExpertWeights& w = *p.weights;
  const int64_t* offsets = p.expert_offsets;
  GemmSchedule g;
  g.num_experts = w.num_experts_local;
  g.hidden = w.hidden;
  g.inter = w.intermediate;
  g.rows_per_j = w.gated ? 2 : 1;
  g.num_rows = offsets[g.num_experts];
  // Which experts take the packed path, and where their packed inputs and activations live.
  g.x_group_stride = internal::PackedPairs(g.hidden) * kPackedGroup;
  g.h_group_stride = internal::PackedPairs(g.inter) * kPackedGroup;
  int64_t* packed_base = KernelScratch::Grow(s.packed_base, g.num_experts);
  // A packed expert's last n % 16 tokens, when at most kPackedMaxRem, stay unpacked (PackedGemmArgs
  // rem_x: dot products on the L1-hot strips) instead of filling a zero-padded group; 0 otherwise.
  int64_t* packed_rem = KernelScratch::Grow(s.packed_rem, g.num_experts);
  for (int64_t e = 0; e < g.num_experts; ++e) {
    const int64_t n = offsets[e + 1] - offsets[e];
    const bool packed = be.packed_gemm != nullptr && internal::PackedFormat(w.scheme) &&
                        !w.bf16_row_groups && n >= kPackedMinTokens;
    packed_base[e] = packed ? g.total_groups : -1;
    packed_rem[e] = packed && n % kPackedGroup <= internal::kPackedMaxRem ? n % kPackedGroup : 0;
    if (packed) g.total_groups += CeilDiv(n - packed_rem[e], kPackedGroup);
  }
  g.packed_base = packed_base;
  g.packed_rem = packed_rem;
  g.tb1 = TokenBlock(g.hidden);
  g.tb2 = TokenBlock(g.inter);
  PlanQuantizedAhead(p, be, int8, s, &g);
  // Pass 0: pack the packed experts' inputs (16 tokens per task) and give the other experts
  // contiguous bf16 rows (rounding fp32 inputs, gathering through x_rows): the dot kernels reuse
  // each row for many weight rows; and quantize the inputs of qx's experts.
  g.copy_rows = p.x_dtype == DType::kF32 || p.x_rows != nullptr;
  s.pack_tasks.clear();
  for (int64_t e = 0; e < g.num_experts; ++e) {
    const bool quantize = g.qx != nullptr && g.qx[e] != 0;
    if (packed_base[e] < 0 && !g.copy_rows && !quantize) continue;
    const int64_t end = g.copy_rows ? offsets[e + 1] : offsets[e + 1] - packed_rem[e];
    for (int64_t r = offsets[e]; r < end; r += kPackedGroup) {
      s.pack_tasks.push_back({static_cast<int32_t>(e), r, std::min(r + kPackedGroup, end), 0, 0});
    }
  }
  g.pack_tasks = &s.pack_tasks;
  g.ptb1 = PackedTokenBlock(g.hidden);
  g.ptb2 = PackedTokenBlock(g.inter);
  g.gu_block = DotOutBlock(g, offsets, g.tb1, g.inter, kGateUpBlock, num_threads);
  g.down_block = DotOutBlock(g, offsets, g.tb2, g.hidden, kDownBlock, num_threads);
  // Pass 1: both phases as one loop over [gate_up tasks..., down tasks...].
  s.tasks.clear();
  g.gate_up_pending = KernelScratch::Grow(s.gate_up_pending, g.num_experts);
  AppendPhaseTasks(g, offsets, g.tb1, g.ptb1, g.inter, g.gu_block, kPackedGateUpBlock, &s.tasks,
                   g.gate_up_pending);
  for (int64_t e = 0; g.qh != nullptr && e < g.num_experts; ++e) {
    g.gate_up_pending[e] += g.qh[e];
  }
  g.num_gate_up = static_cast<int64_t>(s.tasks.size());
  AppendPhaseTasks(g, offsets, g.tb2, g.ptb2, g.hidden, g.down_block, kPackedDownBlock, &s.tasks,
                   nullptr);
  g.tasks = &s.tasks;
  return g;
}

// What every task of one call reads and writes: the schedule, the call's parameters and the
// scratch buffers the schedule sized.
struct GemmRun {
  const GemmSchedule* g = nullptr;
  const GroupedGemmParams* p = nullptr;
  const internal::CpuBackend* be = nullptr;
  KernelScratch* s = nullptr;
  uint32_t* x_packed = nullptr;      // [total_groups, x_group_stride]
  uint32_t* h_packed = nullptr;      // [total_groups, h_group_stride]
  bf16_t* h = nullptr;               // [num_rows, I] dot-path activations
  bf16_t* x_bf16 = nullptr;          // [num_rows, H] (copy_rows) or null
  const bf16_t* x = nullptr;         // the dot path's bf16 input rows
  bool int8_inputs = false;          // KernelContext::int8_activations for this scheme
  internal::QuantizedRows qrows[2];  // GemmSchedule::qx / qh's rows: inputs', activations'

  // Rows of qrows[which] from sorted row r on.
  internal::QuantizedRows QRows(int which, int64_t r) const { return qrows[which].From(r); }

  // A packed task's unpacked remainder tokens (its expert's last ones, in its last block).
  int64_t TaskRem(const GemmTask& t) const {
    return t.row_end == p->expert_offsets[t.expert + 1] ? g->packed_rem[t.expert] : int64_t{0};
  }
  // A packed task's groups: the first one's index and the count.
  std::pair<int64_t, int64_t> TaskGroups(const GemmTask& t) const {
    return {g->packed_base[t.expert] + (t.row_begin - p->expert_offsets[t.expert]) / kPackedGroup,
            CeilDiv(t.row_end - t.row_begin - TaskRem(t), kPackedGroup)};
  }
};

// Quantizes rows [r0, r1) of the inputs (which 0) or the activations (1) of `expert` into
// run.qrows[which] (GemmSchedule::qx / qh), at most 16 rows per call, on thread tid's scratch.
void QuantizeAhead(const GemmRun& run, int tid, int which, int32_t expert, int64_t r0, int64_t r1) {
  const GemmSchedule& g = *run.g;
  const internal::MatrixRef m = internal::ExpertMatrix(*run.p->weights, which == 0, expert);
  const int64_t k = which == 0 ? g.hidden : g.inter;
  const bf16_t* x = which == 0 ? run.x : run.h;
  float* scratch = run.s->per_thread[static_cast<size_t>(tid)].work.data();
  for (int64_t r = r0; r < r1; r += kPackedGroup) {
    const int64_t n = std::min(kPackedGroup, r1 - r);
    run.be->quantize_rows(m, run.int8_inputs, x + r * k, k, n, run.QRows(which, r), scratch);
  }
}

// Pass 0, one task: packs a group of inputs or converts/gathers rows into x_bf16, then
// quantizes them for qx's experts.
void PackInputsTask(const GemmRun& run, int tid, const GemmTask& t) {
  const GroupedGemmParams& p = *run.p;
  const GemmSchedule& g = *run.g;
  const int64_t hidden = g.hidden;
  const int64_t* offsets = p.expert_offsets;
  int32_t src_rows[kPackedGroup];
  for (int64_t r = t.row_begin; r < t.row_end; ++r) {
    src_rows[r - t.row_begin] = p.x_rows != nullptr ? p.x_rows[r] : static_cast<int32_t>(r);
  }
  const bool unpacked = t.row_begin >= offsets[t.expert + 1] - g.packed_rem[t.expert];
  if (g.packed_base[t.expert] >= 0 && !unpacked) {
    const int64_t grp = g.packed_base[t.expert] + (t.row_begin - offsets[t.expert]) / kPackedGroup;
    run.be->pack_group(p.x_sorted, p.x_dtype, hidden, src_rows, t.row_end - t.row_begin, hidden,
                       run.x_packed + grp * g.x_group_stride);
    return;
  }
  const size_t elem = p.x_dtype == DType::kF32 ? 4 : 2;
  const uint8_t* x_bytes = static_cast<const uint8_t*>(p.x_sorted);
  for (int64_t r = t.row_begin; g.copy_rows && r < t.row_end; ++r) {
    const uint8_t* src = x_bytes + static_cast<size_t>(src_rows[r - t.row_begin] * hidden) * elem;
    if (p.x_dtype == DType::kF32) {
      run.be->to_bf16(reinterpret_cast<const float*>(src), hidden, run.x_bf16 + r * hidden);
    } else {
      std::memcpy(run.x_bf16 + r * hidden, src, static_cast<size_t>(hidden) * 2);
    }
  }
  if (g.qx != nullptr && g.qx[t.expert] != 0) {
    QuantizeAhead(run, tid, 0, t.expert, t.row_begin, t.row_end);
  }
}

// A packed task's product: tile[r][token] for its rows and its groups of `packed` (inputs
// with `group_stride`), then its remainder tokens (unpacked rows of `rows_x`, `ldx` apart);
// returns the tile's row stride (the task's tokens, the groups padded to 16).
int64_t RunPacked(const GemmRun& run, int tid, const GemmTask& t, const internal::MatrixRef& m,
                  const int32_t* rows, int64_t num_rows, const uint32_t* packed,
                  int64_t group_stride, const bf16_t* rows_x, int64_t ldx, float* tile) {
  const auto [g0, ng] = run.TaskGroups(t);
  const int64_t rem = run.TaskRem(t);
  internal::PackedGemmArgs a;
  a.w = &m;
  a.row_idx = rows;
  a.num_rows = num_rows;
  a.x = packed + g0 * group_stride;
  a.group_stride = group_stride;
  a.num_groups = ng;
  a.out = tile;
  a.ldo = ng * kPackedGroup + rem;
  a.work = run.s->per_thread[static_cast<size_t>(tid)].packed_work.data();
  a.num_rem = rem;
  a.rem_x = rows_x + (t.row_end - rem) * ldx;
  a.rem_ldx = ldx;
  run.be->packed_gemm(a);
  return a.ldo;
}

// A dot-path task's product: out[token * ldo + r] for `num_tokens` bf16 input rows of x.
// `quantized`: the tokens' inputs quantized ahead, or null.
void RunDot(const GemmRun& run, int tid, const internal::MatrixRef& m, const bf16_t* x_rows,
            int64_t ldx, int64_t num_tokens, const int32_t* rows, int64_t num_rows, float* out,
            int64_t ldo, const internal::QuantizedRows* quantized) {
  internal::DotRowsArgs a;
  a.w = &m;
  a.x = x_rows;
  a.ldx = ldx;
  a.num_tokens = num_tokens;
  a.row_idx = rows;
  a.num_rows = num_rows;
  a.out = out;
  a.ldo = ldo;
  a.work = run.s->per_thread[static_cast<size_t>(tid)].work.data();
  a.int8_inputs = run.int8_inputs;
  a.quantized = quantized;
  run.be->dot_rows(a);
}

// Gate_up epilogue of a packed task: bias, then the activations of the tile [nrows, ldt] written
// as column pairs of the packed h, and the remainder tokens' into their rows of h.
void PackedGateUpEpilogue(const GemmRun& run, int tid, const GemmTask& t, const int32_t* rows,
                          const float* bias, int64_t ldt, float* tile) {
  const GroupedGemmParams& p = *run.p;
  const ExpertWeights& w = *p.weights;
  const GemmSchedule& g = *run.g;
  auto& pt = run.s->per_thread[static_cast<size_t>(tid)];
  const int64_t nj = t.out_end - t.out_begin;
  const int64_t nrows = nj * g.rows_per_j;
  const int64_t g0 = run.TaskGroups(t).first;
  const int64_t rem = run.TaskRem(t);
  const int64_t packed_cols = ldt - rem;
  if (bias != nullptr) {
    for (int64_t r = 0; r < nrows; ++r) {
      for (int64_t c = 0; c < ldt; ++c) tile[r * ldt + c] += bias[rows[r]];
    }
  }
  // Two activation rows (j, j + 1) at a time, interleaved into the packed h's column pairs
  // (uint32 = low half j, high half j + 1; an odd I's last pair has a zero high half).
  bf16_t* act0 = pt.act.data();
  bf16_t* act1 = act0 + ldt;
  uint32_t* hp = run.h_packed + g0 * g.h_group_stride;
  for (int64_t j = 0; j < nj; j += 2) {
    const int64_t jj = t.out_begin + j;
    for (int64_t q = 0; q < 2; ++q) {
      bf16_t* act = q == 0 ? act0 : act1;
      if (j + q == nj) {
        std::fill(act, act + packed_cols, bf16_t{});
        continue;
      }
      run.be->activate(p.activation, w.gated ? tile + (j + q) * ldt : nullptr,
                       tile + (w.gated ? nj + j + q : j + q) * ldt, packed_cols, act);
    }
    for (int64_t c0 = 0; c0 < packed_cols; c0 += kPackedGroup) {
      uint32_t* dst = hp + (c0 / kPackedGroup) * g.h_group_stride + (jj / 2) * kPackedGroup;
      for (int64_t c = 0; c < kPackedGroup; ++c) {
        dst[c] = uint32_t{act0[c0 + c].bits} | (uint32_t{act1[c0 + c].bits} << 16);
      }
    }
  }
  // Remainder tokens: activations into their rows of h, like the dot path's.
  for (int64_t q = 0; q < rem; ++q) {
    float gate[kPackedGateUpBlock], up[kPackedGateUpBlock];
    for (int64_t j = 0; j < nj; ++j) {
      gate[j] = w.gated ? tile[j * ldt + packed_cols + q] : 0.0f;
      up[j] = tile[(w.gated ? nj + j : j) * ldt + packed_cols + q];
    }
    run.be->activate(p.activation, w.gated ? gate : nullptr, up, nj,
                     run.h + (t.row_end - rem + q) * g.inter + t.out_begin);
  }
}

// Phase 1, one task (expert, token block, j block): gate_up + bias + activation -> h (dot path)
// or h_packed (packed path).
void GateUpTask(const GemmRun& run, int tid, const GemmTask& t) {
  const ExpertWeights& w = *run.p->weights;
  const GemmSchedule& g = *run.g;
  auto& pt = run.s->per_thread[static_cast<size_t>(tid)];
  const internal::MatrixRef m = internal::ExpertMatrix(w, /*w13=*/true, t.expert);
  const int64_t nj = t.out_end - t.out_begin;
  const int64_t nrows = nj * g.rows_per_j;
  int32_t* rows = pt.rows.data();
  // Row list: [gate rows of the block..., up rows of the block...] (or just the rows).
  for (int64_t j = 0; j < nj; ++j) {
    const int64_t jj = t.out_begin + j;
    if (!w.gated) {
      rows[j] = static_cast<int32_t>(jj);
    } else if (w.gate_up_interleaved) {
      rows[j] = static_cast<int32_t>(2 * jj);
      rows[nj + j] = static_cast<int32_t>(2 * jj + 1);
    } else {
      rows[j] = static_cast<int32_t>(jj);
      rows[nj + j] = static_cast<int32_t>(g.inter + jj);
    }
  }
  const float* bias = w.w13_bias == nullptr ? nullptr : w.w13_bias + t.expert * w.w13_rows();
  float* tile = pt.tile.data();
  if (g.packed_base[t.expert] >= 0) {
    // tile[r][token]; activations written as column pairs of the packed h.
    const int64_t ldt = RunPacked(run, tid, t, m, rows, nrows, run.x_packed, g.x_group_stride,
                                  run.x, g.hidden, tile);
    PackedGateUpEpilogue(run, tid, t, rows, bias, ldt, tile);
    return;
  }
  const int64_t ntok = t.row_end - t.row_begin;
  const internal::QuantizedRows xq = run.QRows(0, t.row_begin);
  RunDot(run, tid, m, run.x + t.row_begin * g.hidden, g.hidden, ntok, rows, nrows, tile, nrows,
         g.qx != nullptr && g.qx[t.expert] != 0 ? &xq : nullptr);
  for (int64_t m_i = 0; m_i < ntok; ++m_i) {
    float* o = tile + m_i * nrows;
    if (bias != nullptr) {
      for (int64_t r = 0; r < nrows; ++r) o[r] += bias[rows[r]];
    }
    bf16_t* hrow = run.h + (t.row_begin + m_i) * g.inter + t.out_begin;
    if (w.gated) {
      run.be->activate(run.p->activation, o, o + nj, nj, hrow);
    } else {
      run.be->activate(run.p->activation, nullptr, o, nj, hrow);
    }
  }
}

// Phase 2, one task (expert, token block, output-row block): down (+ bias) -> y_sorted.
void DownTask(const GemmRun& run, int tid, const GemmTask& t) {
  const GroupedGemmParams& p = *run.p;
  const ExpertWeights& w = *p.weights;
  const GemmSchedule& g = *run.g;
  auto& pt = run.s->per_thread[static_cast<size_t>(tid)];
  const internal::MatrixRef m = internal::ExpertMatrix(w, /*w13=*/false, t.expert);
  const int64_t nr = t.out_end - t.out_begin;
  int32_t* rows = pt.rows.data();
  for (int64_t r = 0; r < nr; ++r) rows[r] = static_cast<int32_t>(t.out_begin + r);
  const int64_t ntok = t.row_end - t.row_begin;
  const float* bias = p.add_down_bias && w.w2_bias != nullptr
                          ? w.w2_bias + t.expert * g.hidden + t.out_begin
                          : nullptr;
  float* y = p.y_sorted + t.row_begin * g.hidden + t.out_begin;
  if (g.packed_base[t.expert] >= 0) {
    const int64_t ldt = RunPacked(run, tid, t, m, rows, nr, run.h_packed, g.h_group_stride, run.h,
                                  g.inter, pt.tile.data());
    run.be->store_transposed(pt.tile.data(), ldt, nr, ntok, bias, y, g.hidden);
    return;
  }
  const internal::QuantizedRows hq = run.QRows(1, t.row_begin);
  RunDot(run, tid, m, run.h + t.row_begin * g.inter, g.inter, ntok, rows, nr, y, g.hidden,
         g.qh != nullptr && g.qh[t.expert] != 0 ? &hq : nullptr);
  if (bias != nullptr) {
    for (int64_t m_i = 0; m_i < ntok; ++m_i) {
      float* o = y + m_i * g.hidden;
      for (int64_t r = 0; r < nr; ++r) o[r] += bias[r];
    }
  }
}

// Executes `g` on the pool: pass 0, then both phases as one parallel loop over [gate_up
// tasks..., down tasks...]: a down task waits until its expert's gate_up tasks are done, which
// (tasks being claimed in order) are already running. So threads move on to down projections
// while the last gate_up tasks finish, instead of idling at a barrier between the phases (up to
// a task per thread, 5 % of a small-expert decode step).
void RunGemmSchedule(ThreadPool& pool, const GemmRun& run) {
  const GemmSchedule& g = *run.g;
  const GemmRun* r = &run;
  auto pack = [r](int64_t b, int64_t e, int tid) {
    for (int64_t ti = b; ti < e; ++ti) PackInputsTask(*r, tid, (*r->g->pack_tasks)[ti]);
  };
  pool.ParallelFor(static_cast<int64_t>(g.pack_tasks->size()), 1, pack);
  auto phases = [r](int64_t b, int64_t e, int tid) {
    for (int64_t ti = b; ti < e; ++ti) {
      const GemmTask& t = (*r->g->tasks)[static_cast<size_t>(ti)];
      std::atomic_ref<int32_t> pending(r->g->gate_up_pending[t.expert]);
      if (ti < r->g->num_gate_up) {
        GateUpTask(*r, tid, t);
        // With qh the count started one higher: the expert's last gate_up task (the others'
        // activations acquired) quantizes them before the down tasks may start.
        if (pending.fetch_sub(1, std::memory_order_acq_rel) == 2 && r->g->qh != nullptr &&
            r->g->qh[t.expert] != 0) {
          const int64_t* offsets = r->p->expert_offsets;
          QuantizeAhead(*r, tid, 1, t.expert, offsets[t.expert], offsets[t.expert + 1]);
          pending.fetch_sub(1, std::memory_order_release);
        }
      } else {
        while (pending.load(std::memory_order_acquire) > 0) CpuRelax();
        DownTask(*r, tid, t);
      }
    }
  };
  pool.ParallelFor(static_cast<int64_t>(g.tasks->size()), 1, phases);
}

// InvalidArgument naming the field when `p` cannot be run.
Status ValidateGemmParams(const GroupedGemmParams& p) {
  if (p.weights == nullptr) {
    return InvalidArgumentError("grouped gemm: 'weights': expected non-null");
  }
  const ExpertWeights& w = *p.weights;
  MOESHARD_RETURN_IF_ERROR(ValidateExpertWeights(w, p.activation));
  if (p.x_dtype != DType::kF32 && p.x_dtype != DType::kBF16) {
    return InvalidArgumentError(
        fmt::format("grouped gemm: 'x_dtype': expected F32 or BF16, got {}", DTypeName(p.x_dtype)));
  }
  if (p.expert_offsets == nullptr) {
    return InvalidArgumentError("grouped gemm: 'expert_offsets': expected [E_local + 1], got null");
  }
  const int64_t num_experts = w.num_experts_local;
  if (p.expert_offsets[0] != 0) {
    return InvalidArgumentError(
        fmt::format("grouped gemm: 'expert_offsets[0]': expected 0, got {}", p.expert_offsets[0]));
  }
  for (int64_t e = 0; e < num_experts; ++e) {
    if (p.expert_offsets[e + 1] < p.expert_offsets[e]) {
      return InvalidArgumentError(fmt::format(
          "grouped gemm: 'expert_offsets': expected non-decreasing, got [{}]={} > [{}]={}", e,
          p.expert_offsets[e], e + 1, p.expert_offsets[e + 1]));
    }
  }
  if (p.expert_offsets[num_experts] > 0 && (p.x_sorted == nullptr || p.y_sorted == nullptr)) {
    return InvalidArgumentError("grouped gemm: 'x_sorted/y_sorted': expected non-null");
  }
  return Status::Ok();
}

// Experts sorted by SortActOrderExperts read x through their input order: each grouped row
// gathered (through x_rows) and put in its expert's order as bf16 (rounded as pass 0 rounds), in
// s.x_perm. Returns params reading those rows.
GroupedGemmParams InputsInExpertOrder(KernelContext& ctx, const GroupedGemmParams& p,
                                      KernelScratch& s) {
  const ExpertWeights& w = *p.weights;
  const int64_t H = w.hidden;
  const int64_t* offsets = p.expert_offsets;
  const int64_t num_rows = offsets[w.num_experts_local];
  bf16_t* out = KernelScratch::Grow(s.x_perm, num_rows * H);
  ctx.pool().ParallelFor(num_rows, 0, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t e =
          std::upper_bound(offsets, offsets + w.num_experts_local + 1, r) - offsets - 1;
      const int32_t* order = w.w13_input_perm + e * H;
      const int64_t src = p.x_rows != nullptr ? p.x_rows[r] : r;
      bf16_t* dst = out + r * H;
      if (p.x_dtype == DType::kF32) {
        const float* x = static_cast<const float*>(p.x_sorted) + src * H;
        for (int64_t c = 0; c < H; ++c) dst[c] = FloatToBf16(x[order[c]]);
      } else {
        const bf16_t* x = static_cast<const bf16_t*>(p.x_sorted) + src * H;
        for (int64_t c = 0; c < H; ++c) dst[c] = x[order[c]];
      }
    }
  });
  GroupedGemmParams q = p;
  q.x_sorted = out;
  q.x_dtype = DType::kBF16;
  q.x_rows = nullptr;
  return q;
}

// Sizes the rows of the inputs and activations quantized ahead (GemmSchedule::qx, qh) and
// points run->qrows at them.
void GrowQuantizedRows(const GemmSchedule& g, KernelScratch& s, GemmRun* run) {
  const bool take[2] = {g.qx != nullptr, g.qh != nullptr};
  internal::LineVector<uint8_t>* values[2] = {&s.x_q, &s.h_q};
  internal::LineVector<float>* scales[2] = {&s.x_q_scales, &s.h_q_scales};
  for (int i = 0; i < 2; ++i) {
    if (!take[i]) continue;
    internal::QuantizedRows& r = run->qrows[i];
    r = g.q_layout[i];
    r.q = KernelScratch::Grow(*values[i], g.num_rows * r.ldq * r.q_bytes);
    const int64_t n = g.num_rows * r.ldu;
    r.sx = KernelScratch::Grow(*scales[i], r.with_negc ? 2 * n : n);
    r.negc = r.with_negc ? r.sx + n : nullptr;
  }
}

// Act-order weights look up each column's group: only the portable dot path does. Int8 inputs
// run on the kernels KernelContext::int8_isa names (on AVX-512 BF16 CPUs avx512-vnni's or
// avx512's: the native kernels take bf16 inputs), so what it reports is what runs.
const internal::CpuBackend& GemmBackend(const KernelContext& ctx, const WeightScheme& q,
                                        bool int8) {
  if (q.act_order) return internal::PortableBackend();
  return internal::CpuBackendFor(int8 ? ctx.int8_isa() : ctx.isa());
}

}  // namespace

Status GroupedExpertGemm(KernelContext& ctx, const GroupedGemmParams& params) {
  MOESHARD_RETURN_IF_ERROR(ValidateGemmParams(params));
  if (params.expert_offsets[params.weights->num_experts_local] == 0) return Status::Ok();
  const GroupedGemmParams p = params.weights->w13_input_perm == nullptr
                                  ? params
                                  : InputsInExpertOrder(ctx, params, ctx.scratch());
  const bool int8 = ctx.int8_activations() && Int8ActivationScheme(p.weights->scheme);
  const internal::CpuBackend& be = GemmBackend(ctx, p.weights->scheme, int8);
  KernelScratch& s = ctx.scratch();
  const GemmSchedule g = BuildGemmSchedule(p, be, int8, ctx.pool().num_threads(), s);
  GemmRun run;
  run.g = &g;
  run.p = &p;
  run.be = &be;
  run.s = &s;
  run.int8_inputs = int8;
  run.x_packed = KernelScratch::Grow(s.x_packed, g.total_groups * g.x_group_stride);
  run.h_packed = KernelScratch::Grow(s.h_packed, g.total_groups * g.h_group_stride);
  run.h = KernelScratch::Grow(s.h, g.num_rows * g.inter);
  run.x_bf16 = g.copy_rows ? KernelScratch::Grow(s.x_bf16, g.num_rows * g.hidden) : nullptr;
  run.x = g.copy_rows ? run.x_bf16 : static_cast<const bf16_t*>(p.x_sorted);
  GrowQuantizedRows(g, s, &run);
  GrowPerThread(g, be, s);
  RunGemmSchedule(ctx.pool(), run);
  return Status::Ok();
}

}  // namespace moeshard
