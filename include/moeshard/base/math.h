// Small integer helpers used by the planner and loaders: rounding, divisors, checked arithmetic.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <numeric>
#include <optional>
#include <vector>

namespace moeshard {

constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Smallest multiple of `align` >= value. REQUIRES: align >= 1.
constexpr int64_t RoundUp(int64_t value, int64_t align) { return CeilDiv(value, align) * align; }

constexpr int64_t Lcm(int64_t a, int64_t b) { return std::lcm(a, b); }

// All positive divisors of n (n >= 1), ascending.
std::vector<int64_t> Divisors(int64_t n);

// a * b, or nullopt on overflow of int64 or if either is negative.
std::optional<int64_t> CheckedMul(int64_t a, int64_t b);
// a + b, or nullopt on overflow or if either is negative.
std::optional<int64_t> CheckedAdd(int64_t a, int64_t b);

}  // namespace moeshard
