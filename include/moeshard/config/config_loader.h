// Loading ModelConfigs: from a Hugging Face config.json text, a file, a checkpoint directory,
// or a preset built into the executable (models/*.json, embedded at build time).
//
// Errors name the field and the file: "config: 'num_experts_per_tok' in models/x.json:
// expected <= num_experts (128), got 256".
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "moeshard/base/status.h"
#include "moeshard/config/model_config.h"

namespace moeshard {

// Parses config.json text. `source` names it in errors; `name` becomes ModelConfig::name.
Result<ModelConfig> ParseModelConfig(std::string_view json_text, const std::string& source,
                                     const std::string& name);

// A file path to a config.json.
Result<ModelConfig> LoadModelConfigFile(const std::string& path);

// `spec` is a preset name ("kimi-k3"), a path to a config.json, or a checkpoint directory that
// holds one. Presets win over relative paths of the same name only when no such path exists.
Result<ModelConfig> LoadModelConfig(const std::string& spec);

struct PresetInfo {
  std::string name;         // "kimi-k3"
  std::string description;  // one line
  std::string_view json;    // the embedded config.json text
};

// Every built-in preset, sorted by name.
const std::vector<PresetInfo>& ModelPresets();

}  // namespace moeshard
