// Shape constraints of moeshard's own CPU MoE kernels (backend `moeshard-cpu` in the plan's
// backend catalog).
//
// The plan layer pads each rank's expert shapes so that every backend's constraints hold; these
// constants are the CPU kernels' side of that contract and the plan's catalog entry must match
// them (a plan-layer test compares the two). The CPU kernels handle any intermediate or hidden
// size (tails use masked vector loads), so the alignments are 1; only the quantization formats
// impose divisibility of the reduction (input) dimension of each projection.
//
// Thread safety: constants only.
#pragma once

#include <cstdint>

namespace moeshard {

// The plan's backend name for these kernels.
inline constexpr const char kCpuBackendName[] = "moeshard-cpu";

// Per-rank intermediate size I_local must be a multiple of this (before quantization groups).
inline constexpr int64_t kCpuIntermediateAlignment = 1;
// Hidden (or latent) size H must be a multiple of this (before quantization groups).
inline constexpr int64_t kCpuHiddenAlignment = 1;

// MXFP4: one E8M0 scale per 32 consecutive input values; both H (gate_up input) and I (down
// input) must be multiples of it.
inline constexpr int64_t kCpuMxfp4GroupSize = 32;
// fp8 e4m3 with block scales: 128 x 128 blocks (DeepSeek-V3 `weight_block_size`). Shapes need
// not be multiples of the block: partial edge blocks have their own scale.
inline constexpr int64_t kCpuFp8BlockSize = 128;
// int4 symmetric with per-group scales: the default group (Kimi-K2 "pack-quantized" uses 32).
inline constexpr int64_t kCpuInt4DefaultGroupSize = 32;
// Any int4 group size must be a multiple of this (one 32-wide bf16 dot-product step), and the
// input dimension of each projection a multiple of the group size.
inline constexpr int64_t kCpuInt4GroupSizeMultiple = 32;
// NVFP4: one E4M3 scale per 16 consecutive input values; H and I must be multiples of it.
inline constexpr int64_t kCpuNvfp4GroupSize = 16;

}  // namespace moeshard
