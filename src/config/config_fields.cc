#include "config/config_fields.h"

#include <fmt/format.h>

namespace moeshard {

using nlohmann::json;

std::string ConfigFields::Where(const char* key) const {
  return fmt::format("'{}{}' in {}", prefix_, key, source_);
}

Status ConfigFields::Error(const char* key, const std::string& expected, const std::string& got,
                           const std::string& fix) const {
  std::string msg = fmt::format("config: {}: expected {}, got {}", Where(key), expected, got);
  if (!fix.empty()) msg += fmt::format(" ({})", fix);
  return InvalidArgumentError(msg);
}

Result<int64_t> ConfigFields::Int(const char* key, std::optional<int64_t> fallback,
                                  int64_t min) const {
  if (!Has(key)) {
    if (fallback) return *fallback;
    return InvalidArgumentError(fmt::format(
        "config: {}: required field is missing (is this a config.json of a supported MoE "
        "model?)",
        Where(key)));
  }
  const json& v = obj_->at(key);
  if (!v.is_number_integer()) return Error(key, "an integer", v.dump());
  const int64_t x = v.get<int64_t>();
  if (x < min) return Error(key, fmt::format("an integer >= {}", min), std::to_string(x));
  return x;
}

Result<double> ConfigFields::Double(const char* key, std::optional<double> fallback) const {
  if (!Has(key)) {
    if (fallback) return *fallback;
    return InvalidArgumentError(fmt::format("config: {}: required field is missing", Where(key)));
  }
  const json& v = obj_->at(key);
  if (!v.is_number()) return Error(key, "a number", v.dump());
  return v.get<double>();
}

Result<bool> ConfigFields::Bool(const char* key, bool fallback) const {
  if (!Has(key)) return fallback;
  const json& v = obj_->at(key);
  if (!v.is_boolean()) return Error(key, "true or false", v.dump());
  return v.get<bool>();
}

Result<std::string> ConfigFields::String(const char* key,
                                         std::optional<std::string> fallback) const {
  if (!Has(key)) {
    if (fallback) return *fallback;
    return InvalidArgumentError(fmt::format("config: {}: required field is missing", Where(key)));
  }
  const json& v = obj_->at(key);
  if (!v.is_string()) return Error(key, "a string", v.dump());
  return v.get<std::string>();
}

Result<std::string> ConfigFields::Choice(const char* key, std::optional<std::string> fallback,
                                         std::initializer_list<const char*> allowed) const {
  MOESHARD_ASSIGN_OR_RETURN(std::string v, String(key, std::move(fallback)));
  std::string list;
  for (const char* a : allowed) {
    if (v == a) return v;
    list += fmt::format("{}\"{}\"", list.empty() ? "" : ", ", a);
  }
  return Error(key, "one of " + list, "\"" + v + "\"", "moeshard does not support this value");
}

namespace {

// The first present key of `keys` read with `read`; two present with different values
// contradict.
template <typename T, typename Read>
Result<T> FirstOf(const ConfigFields& f, std::initializer_list<const char*> keys,
                  std::optional<T> fallback, Read read) {
  const char* found = nullptr;
  T value{};
  for (const char* k : keys) {
    if (!f.Has(k)) continue;
    MOESHARD_ASSIGN_OR_RETURN(T v, read(k));
    if (found && v != value) {
      return InvalidArgumentError(fmt::format(
          "config: {} and '{}{}' contradict: {} vs {} (they name the same quantity; keep one)",
          f.Where(k), f.prefix(), found, f.Raw(k).dump(), f.Raw(found).dump()));
    }
    found = k;
    value = v;
  }
  if (found) return value;
  if (fallback) return *fallback;
  std::string names;
  for (const char* k : keys) {
    names += fmt::format("{}'{}{}'", names.empty() ? "" : " or ", f.prefix(), k);
  }
  return InvalidArgumentError(fmt::format(
      "config: {} in {}: required field is missing (is this a config.json of a supported MoE "
      "model?)",
      names, f.source()));
}

}  // namespace

Result<int64_t> ConfigFields::IntAlias(std::initializer_list<const char*> keys,
                                       std::optional<int64_t> fallback, int64_t min) const {
  return FirstOf<int64_t>(*this, keys, fallback,
                          [&](const char* k) { return Int(k, std::nullopt, min); });
}

Result<bool> ConfigFields::BoolAlias(std::initializer_list<const char*> keys, bool fallback) const {
  return FirstOf<bool>(*this, keys, fallback, [&](const char* k) { return Bool(k, false); });
}

Result<std::string> ConfigFields::StringAlias(std::initializer_list<const char*> keys,
                                              std::optional<std::string> fallback) const {
  return FirstOf<std::string>(*this, keys, std::move(fallback),
                              [&](const char* k) { return String(k, std::nullopt); });
}

Result<std::vector<int64_t>> ConfigFields::IntList(const char* key, int64_t min,
                                                   int64_t max) const {
  if (!Has(key) || !Raw(key).is_array()) {
    return Error(key, "an array of integers", Has(key) ? Raw(key).dump() : "nothing");
  }
  std::vector<int64_t> out;
  for (const json& e : Raw(key)) {
    if (!e.is_number_integer() || e.get<int64_t>() < min || e.get<int64_t>() > max) {
      return Error(key, fmt::format("integers in [{}, {}]", min, max), e.dump());
    }
    out.push_back(e.get<int64_t>());
  }
  return out;
}

Result<ConfigFields> ConfigFields::Object(const char* key) const {
  if (!Has(key) || !Raw(key).is_object()) {
    return Error(key, "an object", Has(key) ? Raw(key).dump() : "nothing");
  }
  return ConfigFields(Raw(key), source_, prefix_ + key + ".");
}

}  // namespace moeshard
