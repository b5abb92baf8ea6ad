// Element types: the safetensors dtype vocabulary plus sizes in bits.
//
// Sub-byte types (F4, F6_*) are counted in bits; a tensor's byte size is only defined when its
// element count times bits is a multiple of 8 (safetensors rule 4). MXFP4 checkpoints usually
// store packed nibbles as U8 (two E2M1 values per byte, low nibble first) with a separate U8 or
// F8_E8M0 scale tensor.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace moeshard {

enum class DType {
  kBool,
  kF4,  // E2M1
  kF6E2M3,
  kF6E3M2,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kF8E8M0,
  kF8E4M3Fnuz,
  kF8E5M2Fnuz,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kC64,
  kF64,
  kI64,
  kU64,
};

inline constexpr DType kAllDTypes[] = {
    DType::kBool,       DType::kF4,     DType::kF6E2M3, DType::kF6E3M2, DType::kU8,
    DType::kI8,         DType::kF8E5M2, DType::kF8E4M3, DType::kF8E8M0, DType::kF8E4M3Fnuz,
    DType::kF8E5M2Fnuz, DType::kI16,    DType::kU16,    DType::kF16,    DType::kBF16,
    DType::kI32,        DType::kU32,    DType::kF32,    DType::kC64,    DType::kF64,
    DType::kI64,        DType::kU64,
};

// Bits per element (4 for F4, 6 for F6_*, 1 byte = 8 for BOOL).
int DTypeBits(DType dtype);

// The safetensors spelling: "BF16", "F8_E4M3", ...
std::string_view DTypeName(DType dtype);

// Inverse of DTypeName; nullopt for an unknown name.
std::optional<DType> ParseDType(std::string_view name);

// Bytes held by `num_elements` elements, or nullopt when the bit count overflows or is not a
// whole number of bytes. REQUIRES: num_elements >= 0.
std::optional<int64_t> DTypeBytes(DType dtype, int64_t num_elements);

}  // namespace moeshard
