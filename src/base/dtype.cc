#include "moeshard/base/dtype.h"

#include "moeshard/base/math.h"

namespace moeshard {

int DTypeBits(DType dtype) {
  switch (dtype) {
    case DType::kBool: return 8;
    case DType::kF4: return 4;
    case DType::kF6E2M3: return 6;
    case DType::kF6E3M2: return 6;
    case DType::kU8: return 8;
    case DType::kI8: return 8;
    case DType::kF8E5M2: return 8;
    case DType::kF8E4M3: return 8;
    case DType::kF8E8M0: return 8;
    case DType::kF8E4M3Fnuz: return 8;
    case DType::kF8E5M2Fnuz: return 8;
    case DType::kI16: return 16;
    case DType::kU16: return 16;
    case DType::kF16: return 16;
    case DType::kBF16: return 16;
    case DType::kI32: return 32;
    case DType::kU32: return 32;
    case DType::kF32: return 32;
    case DType::kC64: return 64;
    case DType::kF64: return 64;
    case DType::kI64: return 64;
    case DType::kU64: return 64;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBool: return "BOOL";
    case DType::kF4: return "F4";
    case DType::kF6E2M3: return "F6_E2M3";
    case DType::kF6E3M2: return "F6_E3M2";
    case DType::kU8: return "U8";
    case DType::kI8: return "I8";
    case DType::kF8E5M2: return "F8_E5M2";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E8M0: return "F8_E8M0";
    case DType::kF8E4M3Fnuz: return "F8_E4M3FNUZ";
    case DType::kF8E5M2Fnuz: return "F8_E5M2FNUZ";
    case DType::kI16: return "I16";
    case DType::kU16: return "U16";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI32: return "I32";
    case DType::kU32: return "U32";
    case DType::kF32: return "F32";
    case DType::kC64: return "C64";
    case DType::kF64: return "F64";
    case DType::kI64: return "I64";
    case DType::kU64: return "U64";
  }
  return "?";
}

std::optional<DType> ParseDType(std::string_view name) {
  for (DType d : kAllDTypes) {
    if (DTypeName(d) == name) return d;
  }
  return std::nullopt;
}

std::optional<int64_t> DTypeBytes(DType dtype, int64_t num_elements) {
  auto bits = CheckedMul(num_elements, DTypeBits(dtype));
  if (!bits || *bits % 8 != 0) return std::nullopt;
  return *bits / 8;
}

}  // namespace moeshard
