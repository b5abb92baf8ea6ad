// moeshard._core's error: a moeshard Status error, raised in Python as moeshard.Error (a
// ValueError) with the message the CLI prints after "error: ".
#pragma once

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "cli/cli_common.h"
#include "moeshard/base/status.h"

namespace moeshard::python {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline void ThrowIfError(const Status& status) {
  if (!status.ok()) throw Error(status.message());
}

template <typename T>
T ValueOrThrow(Result<T> result) {
  ThrowIfError(result.status());
  return std::move(result).value();
}

// The plan flags of `function`'s keyword arguments (tp, dp, ..., as plan() takes them),
// validated as the CLI validates them; an unknown keyword is a TypeError (python/src/module.cc).
cli::PlanFlags PlanFlagsFromKwargs(const std::string& model, const pybind11::kwargs& kw,
                                   const char* function);

}  // namespace moeshard::python
