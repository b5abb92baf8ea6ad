// Status and Result<T>: how every fallible operation in moeshard reports failure.
//
// Anything a user's input can cause (a malformed config, an impossible topology, a bad
// checkpoint) returns a Status or Result<T>; programmer errors use MOESHARD_CHECK
// (src/base/check.h). Messages follow STYLE.md: "<operation>: '<subject>': expected X, got Y
// (<likely fix>)".
//
// Thread safety: value types; distinct objects may be used from distinct threads freely.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace moeshard {

namespace internal {
// Aborts with the message: a Result used against its contract (a programmer error).
[[noreturn]] void ResultMisuse(const std::string& message);
}  // namespace internal

enum class StatusCode {
  kOk,
  kInvalidArgument,     // bad flag, config field or topology
  kNotFound,            // missing file, tensor, preset
  kOutOfRange,          // a value outside what the format allows
  kDataLoss,            // malformed or truncated file
  kFailedPrecondition,  // valid input that the current state cannot take (e.g. does not fit)
  kResourceExhausted,   // memory budget exceeded
  kUnimplemented,
  kInternal,          // a moeshard bug surfaced as an error (e.g. plan != allocation)
  kDeadlineExceeded,  // collective timeout
  kAborted,           // another rank failed
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "<code>: <message>", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>" (no-op on OK).
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status OutOfRangeError(std::string message);
Status DataLossError(std::string message);
Status FailedPreconditionError(std::string message);
Status ResourceExhaustedError(std::string message);
Status UnimplementedError(std::string message);
Status InternalError(std::string message);
Status DeadlineExceededError(std::string message);
Status AbortedError(std::string message);

// Holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (status_.ok())
      internal::ResultMisuse("Result constructed from an OK Status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  T& value() & {
    if (!ok()) internal::ResultMisuse("Result::value() on error: " + status_.ToString());
    return *value_;
  }
  const T& value() const& {
    if (!ok()) internal::ResultMisuse("Result::value() on error: " + status_.ToString());
    return *value_;
  }
  T&& value() && {
    if (!ok()) internal::ResultMisuse("Result::value() on error: " + status_.ToString());
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace moeshard

#define MOESHARD_CONCAT_INNER_(a, b) a##b
#define MOESHARD_CONCAT_(a, b) MOESHARD_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define MOESHARD_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    ::moeshard::Status moeshard_status_ = (expr);        \
    if (!moeshard_status_.ok()) return moeshard_status_; \
  } while (0)

// `lhs = value of expr`, or returns its Status. lhs may be a declaration: `auto x`.
#define MOESHARD_ASSIGN_OR_RETURN(lhs, expr) \
  MOESHARD_ASSIGN_OR_RETURN_IMPL_(MOESHARD_CONCAT_(moeshard_result_, __LINE__), lhs, expr)
// `tmp` names a variable and `lhs` may be a declaration: neither can take parentheses.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define MOESHARD_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp.ok()) return tmp.status();                   \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)
