// Human-readable byte counts and sizes in the units deployers use.
//
// GiB = 2^30 bytes (what `nvidia-smi`-style budgets and vLLM logs print); GB = 10^9 (what GPU
// datasheets print). Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace moeshard {

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

// "12.34 GiB", "512.0 MiB", "96 B": the largest binary unit that keeps the value >= 1.
std::string FormatBytes(int64_t bytes);
// Bytes in GiB with two decimals, e.g. "12.34".
std::string FormatGiB(int64_t bytes);
// 1234567 -> "1,234,567".
std::string FormatCount(int64_t value);
// A memory fraction with two decimals, three where the third is not zero: "0.90", "0.835".
std::string FormatFraction(double f);

}  // namespace moeshard
