#include "moeshard/base/units.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

namespace moeshard {

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  const double mag = std::abs(b);
  if (mag >= static_cast<double>(kGiB)) return fmt::format("{:.2f} GiB", b / kGiB);
  if (mag >= static_cast<double>(kMiB)) return fmt::format("{:.1f} MiB", b / kMiB);
  if (mag >= static_cast<double>(kKiB)) return fmt::format("{:.1f} KiB", b / kKiB);
  return fmt::format("{} B", bytes);
}

std::string FormatGiB(int64_t bytes) {
  return fmt::format("{:.2f}", static_cast<double>(bytes) / kGiB);
}

std::string FormatFraction(double f) {
  const bool two = std::abs(f * 100 - std::round(f * 100)) < 1e-6;
  return two ? fmt::format("{:.2f}", f) : fmt::format("{:.3f}", f);
}

std::string FormatCount(int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  std::string out;
  const int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    out.push_back(digits[i]);
    const int left = n - 1 - i;
    if (left > 0 && left % 3 == 0) out.push_back(',');
  }
  return value < 0 ? "-" + out : out;
}

}  // namespace moeshard
