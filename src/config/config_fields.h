// ConfigFields: typed, named reads of one config.json object, for the config loader and the
// family descriptors (private to the config layer). Every error names the field and the file,
// what was expected and what was found:
//   config: 'text_config.num_experts' in models/x.json: expected an integer >= 1, got -3
//
// Thread safety: a view of a JSON object that must outlive it; use from one thread.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "moeshard/base/status.h"

namespace moeshard {

class ConfigFields {
 public:
  ConfigFields(const nlohmann::json& obj, std::string source, std::string prefix = "")
      : obj_(&obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool Has(const char* key) const { return obj_->contains(key) && !obj_->at(key).is_null(); }
  const nlohmann::json& Raw(const char* key) const { return obj_->at(key); }
  const nlohmann::json& object() const { return *obj_; }
  const std::string& source() const { return source_; }
  const std::string& prefix() const { return prefix_; }

  // "'text_config.num_experts' in models/x.json"
  std::string Where(const char* key) const;
  Status Error(const char* key, const std::string& expected, const std::string& got,
               const std::string& fix = "") const;

  Result<int64_t> Int(const char* key, std::optional<int64_t> fallback = std::nullopt,
                      int64_t min = 0) const;
  Result<double> Double(const char* key, std::optional<double> fallback = std::nullopt) const;
  Result<bool> Bool(const char* key, bool fallback) const;
  Result<std::string> String(const char* key, std::optional<std::string> fallback) const;
  // A string that must be one of `allowed` (the error lists them).
  Result<std::string> Choice(const char* key, std::optional<std::string> fallback,
                             std::initializer_list<const char*> allowed) const;

  // The first present of several spellings of one field (transformers 4 and 5, or two
  // families' names); two present with different values is a contradiction.
  Result<int64_t> IntAlias(std::initializer_list<const char*> keys,
                           std::optional<int64_t> fallback = std::nullopt, int64_t min = 0) const;
  Result<bool> BoolAlias(std::initializer_list<const char*> keys, bool fallback) const;
  Result<std::string> StringAlias(std::initializer_list<const char*> keys,
                                  std::optional<std::string> fallback) const;

  // An array of integers in [min, max].
  Result<std::vector<int64_t>> IntList(const char* key, int64_t min, int64_t max) const;

  // The same reads on the nested object `key`; an error when absent or not an object.
  Result<ConfigFields> Object(const char* key) const;

 private:
  const nlohmann::json* obj_;
  std::string source_;
  std::string prefix_;
};

}  // namespace moeshard
