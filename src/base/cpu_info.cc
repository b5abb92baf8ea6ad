#include "moeshard/base/cpu_info.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

namespace moeshard {
namespace {

// The value of the first line "key<spaces or tabs>: value" in the first processor's block.
std::string Field(std::string_view text, std::string_view key) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty()) break;  // a blank line ends the first processor's block
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view name = line.substr(0, colon);
    while (!name.empty() && (name.back() == ' ' || name.back() == '\t')) name.remove_suffix(1);
    if (name != key) continue;
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
      value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\r')) value.remove_suffix(1);
    return std::string(value);
  }
  return {};
}

}  // namespace

std::string DescribeCpu(std::string_view cpuinfo) {
  std::string name = Field(cpuinfo, "model name");
  const std::string family = Field(cpuinfo, "cpu family");
  const std::string model = Field(cpuinfo, "model");
  if (!name.empty()) {
    if (family.empty() || model.empty()) return name;
    return fmt::format("{} (family {} model {})", name, family, model);
  }
  const std::string implementer = Field(cpuinfo, "CPU implementer");
  const std::string part = Field(cpuinfo, "CPU part");
  if (!implementer.empty() && !part.empty()) {
    return fmt::format("Arm (implementer {} part {})", implementer, part);
  }
  return "unknown";
}

std::string CpuDescription(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "unknown";
  std::ostringstream text;
  text << in.rdbuf();
  return DescribeCpu(text.str());
}

}  // namespace moeshard
