// Always-on invariant checks for programmer errors.
//
// MOESHARD_CHECK(cond, fmt, args...) aborts with file:line, the condition and a formatted
// message when `cond` is false, in every build type. User-caused failures must use Status.
//
// Thread safety: safe from any thread.
#pragma once

#include <fmt/format.h>

#include <string>

namespace moeshard::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* condition,
                              const std::string& message);
}  // namespace moeshard::internal

#define MOESHARD_CHECK(cond, ...)                                                               \
  do {                                                                                          \
    if (!(cond)) [[unlikely]] {                                                                 \
      ::moeshard::internal::CheckFailed(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
    }                                                                                           \
  } while (0)

#define MOESHARD_CHECK_EQ(a, b) \
  MOESHARD_CHECK((a) == (b), "{} == {} failed: {} vs {}", #a, #b, (a), (b))
