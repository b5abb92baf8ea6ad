// Layout-invariant dummy weights (`--load-format dummy`).
//
// Element i (flat index in the checkpoint tensor's storage order) of checkpoint tensor `name`
// is a pure function of (seed, name, i):
//
//   key = SplitMix64(seed ^ SplitMix64(Fnv1a64(name)))          one per tensor
//   k   = SplitMix64(key + (i >> 32))                          one per 2^32 elements
//   h   = Mix32(Mix32(uint32(i) + uint32(k)) ^ uint32(k >> 32)) 32 hash bits per element
//
// mapped to a value by the tensor's DummyKind (from its name and dtype):
//   kWeight      uniform in [-0.05, 0.05)      (vLLM tests use randn / 10)
//   kNorm        1 + uniform in [-0.05, 0.05)  (RMSNorm gains)
//   kBias        uniform in [-0.02, 0.02)
//   kFp8         an e4m3 code of magnitude <= 8 (never NaN), so with ~1e-2 block scales the
//                weights are ~+-0.08
//   kNibbles     a random byte: two E2M1 (MXFP4) or int4 codes, every code valid
//   kE8M0        2^-7, 2^-6 or 2^-5 (bytes 120..122): MXFP4 values up to 6 * 2^-5 = 0.19
//   kScale       0.01 * (1 + uniform in [-0.5, 0.5)) (fp8 block scale_inv, int4 group scales)
//   kZeroPoint   6..10 (int4-zp zero points, one per byte)
//   kE4M3Scale   a positive e4m3 code 0x30..0x3f, 0.5 .. 1.875 (NVFP4 per-16 scales)
//   kGlobalScale as kScale (NVFP4's per-tensor scale: weights up to 6 * 1.9 * 0.015 = 0.17)
// Scales are hashed from their own flat index, i.e. from the logical block or group they cover,
// so every topology agrees on them too. Because the value depends only on the logical position,
// a rank generates exactly its slice, and any two layouts reassemble to the same model.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "moeshard/base/dtype.h"

namespace moeshard {

enum class DummyKind {
  kWeight,
  kNorm,
  kBias,
  kFp8,
  kNibbles,
  kE8M0,
  kScale,
  kZeroPoint,    // int4-zp zero points: 6..10 (codes 0..15 then give weights of either sign)
  kE4M3Scale,    // NVFP4 per-16 scales: positive e4m3 codes 0x30..0x3f (0.5 .. 1.875)
  kGlobalScale,  // NVFP4 per-tensor scale (F32): 0.01 * (1 + uniform in [-0.5, 0.5))
};

// The kind of a checkpoint tensor from its name and dtype (e.g. "...weight_scale_inv" -> kScale,
// "...input_layernorm.weight" -> kNorm, an F8_E4M3 tensor -> kFp8).
DummyKind DummyKindOf(std::string_view name, DType dtype);

// The values of a dummy token -> experts table (DeepSeek-V4's `tid2eid` [vocab, k] int32, role
// kHashTable): hashed bits would not be expert ids, so the dummy source writes these instead,
// cycled over the table's flat index. Token id v gets row v % kDummyExpertTableRows, whose
// slot j holds (7 r + j * floor(E / k)) % E: k distinct experts, every row shifted.
// REQUIRES: 1 <= top_k <= num_experts. Returns [kDummyExpertTableRows * top_k] values.
inline constexpr int64_t kDummyExpertTableRows = 61;
std::vector<int64_t> DummyExpertTable(int64_t num_experts, int64_t top_k);

// The values of a dummy act-order GPTQ `g_idx` over `channels` input channels in groups of
// `group` (hashed bits would index scales that do not exist): channel c belongs to group
// ((a c + 3) mod channels) / group for the first a in 7, 11, 13, ... coprime to `channels`, a
// permutation of the channels, so every group has `group` members (the last one fewer when
// `group` does not divide `channels`) and they are spread over the input as act-order
// spreads them. REQUIRES: channels >= 1, group >= 1.
std::vector<int64_t> DummyGroupIndex(int64_t channels, int64_t group);

// The per-tensor hash key (first line above).
uint64_t DummyTensorKey(uint64_t seed, std::string_view name);

// Writes elements [first_idx, first_idx + dst.size() / element bytes) of the tensor with key
// `key`, dtype `dtype` and kind `kind` into dst. REQUIRES: dtype has whole-byte elements and
// dst.size() is a multiple of the element size.
void FillDummy(uint64_t key, DType dtype, DummyKind kind, int64_t first_idx,
               std::span<std::byte> dst);

}  // namespace moeshard
