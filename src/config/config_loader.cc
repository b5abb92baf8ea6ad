#include "moeshard/config/config_loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "config/config_fields.h"
#include "config/presets.h"
#include "moeshard/config/family.h"

namespace moeshard {
namespace {

using nlohmann::json;

// Parses JSON rejecting duplicate keys (nlohmann keeps the last one silently).
Result<json> ParseJsonStrict(std::string_view text, const std::string& source) {
  std::vector<std::set<std::string>> keys_stack;
  std::string duplicate;
  json::parser_callback_t cb = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: keys_stack.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!keys_stack.empty()) keys_stack.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string key = parsed.get<std::string>();
        if (!keys_stack.empty() && !keys_stack.back().insert(key).second && duplicate.empty()) {
          duplicate = key;
        }
        break;
      }
      case json::parse_event_t::array_start:
      case json::parse_event_t::array_end:
      case json::parse_event_t::value: break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), cb);
  } catch (const json::parse_error& e) {
    return InvalidArgumentError(
        fmt::format("config: '{}': not valid JSON: {}", source, e.what()));
  }
  if (!duplicate.empty()) {
    return InvalidArgumentError(fmt::format(
        "config: '{}': key '{}' appears twice in one object (which value is meant?)", source,
        duplicate));
  }
  if (!j.is_object()) {
    return InvalidArgumentError(
        fmt::format("config: '{}': expected a JSON object at the top level, got {}", source,
                    j.type_name()));
  }
  return j;
}

Result<QuantizationConfig> ParseQuantization(const json& q, const std::string& source,
                                             const std::string& prefix) {
  QuantizationConfig out;
  ConfigFields f(q, source, prefix + "quantization_config.");
  MOESHARD_ASSIGN_OR_RETURN(out.quant_method, f.String("quant_method", std::nullopt));
  auto read_ignore = [&](const char* key) -> Status {
    if (!f.Has(key)) return Status::Ok();
    if (!f.Raw(key).is_array()) return f.Error(key, "an array of strings", f.Raw(key).dump());
    for (const json& e : f.Raw(key)) {
      if (!e.is_string()) return f.Error(key, "an array of strings", e.dump());
      out.ignore.push_back(e.get<std::string>());
    }
    return Status::Ok();
  };
  if (out.quant_method == "fp8") {
    out.scheme = WeightScheme::Default(WeightFormat::kFp8Block);
    if (!f.Has("weight_block_size")) {
      return InvalidArgumentError(fmt::format(
          "config: {}: required for fp8 (moeshard supports block-scaled fp8, e.g. [128, 128])",
          f.Where("weight_block_size")));
    }
    const json& b = f.Raw("weight_block_size");
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() ||
        !b[1].is_number_integer() || b[0].get<int64_t>() <= 0 || b[1].get<int64_t>() <= 0) {
      return f.Error("weight_block_size", "two positive integers [rows, cols]", b.dump());
    }
    out.scheme.block_rows = b[0].get<int64_t>();
    out.scheme.group = b[1].get<int64_t>();
    if (f.Has("fmt")) {
      // Both spellings name fp8 e4m3fn: DeepSeek writes "e4m3", MiniMax "float8_e4m3fn".
      MOESHARD_RETURN_IF_ERROR(f.Choice("fmt", std::nullopt, {"e4m3", "float8_e4m3fn"}).status());
    }
    MOESHARD_RETURN_IF_ERROR(read_ignore("ignored_layers"));
    MOESHARD_RETURN_IF_ERROR(read_ignore("modules_to_not_convert"));
  } else if (out.quant_method == "mxfp4") {
    out.scheme = WeightScheme::Default(WeightFormat::kMxfp4);
    MOESHARD_RETURN_IF_ERROR(read_ignore("modules_to_not_convert"));
  } else if (out.quant_method == "compressed-tensors") {
    MOESHARD_ASSIGN_OR_RETURN(out.format, f.String("format", std::nullopt));
    MOESHARD_RETURN_IF_ERROR(read_ignore("ignore"));
    if (!f.Has("config_groups") || !f.Raw("config_groups").is_object() ||
        f.Raw("config_groups").empty()) {
      return InvalidArgumentError(
          fmt::format("config: {}: required object is missing", f.Where("config_groups")));
    }
    if (f.Raw("config_groups").size() != 1) {
      return f.Error("config_groups", "exactly one group (moeshard plans one weight scheme)",
                     std::to_string(f.Raw("config_groups").size()) + " groups");
    }
    const json& group = f.Raw("config_groups").begin().value();
    const std::string gname = f.prefix() + "config_groups." + f.Raw("config_groups").begin().key() +
                              ".weights.";
    if (!group.is_object() || !group.contains("weights") || !group["weights"].is_object()) {
      return InvalidArgumentError(fmt::format(
          "config: '{}' in {}: required object is missing", gname, source));
    }
    ConfigFields w(group["weights"], source, gname);
    MOESHARD_ASSIGN_OR_RETURN(int64_t bits, w.Int("num_bits"));
    MOESHARD_ASSIGN_OR_RETURN(std::string type, w.String("type", "int"));
    MOESHARD_ASSIGN_OR_RETURN(std::string strategy, w.String("strategy", "group"));
    MOESHARD_ASSIGN_OR_RETURN(int64_t group_size, w.Int("group_size", std::nullopt, 1));
    MOESHARD_ASSIGN_OR_RETURN(bool symmetric, w.Bool("symmetric", true));
    if (bits != 4) return w.Error("num_bits", "4", std::to_string(bits));
    if (strategy != "group") return w.Error("strategy", "\"group\"", "\"" + strategy + "\"");
    if (type == "float") {
      out.scheme = WeightScheme::Default(WeightFormat::kMxfp4);
      if (group_size != out.scheme.group) {
        return w.Error("group_size", "32 for mxfp4 (one E8M0 scale per 32)",
                       std::to_string(group_size));
      }
      if (out.format != "mxfp4-pack-quantized") {
        return f.Error("format", "\"mxfp4-pack-quantized\" for 4-bit float weights",
                       "\"" + out.format + "\"");
      }
    } else if (type == "int") {
      out.scheme = WeightScheme::Default(WeightFormat::kInt4);
      out.scheme.group = group_size;
      if (!symmetric) {
        return w.Error("symmetric", "true (moeshard supports symmetric int4)", "false");
      }
      if (out.format != "pack-quantized") {
        return f.Error("format", "\"pack-quantized\" for int4 weights",
                       "\"" + out.format + "\"");
      }
      // compressed-tensors' pack-quantized compressor writes `weight_shape` beside each packed
      // weight (Kimi-K2-Thinking's headers).
      out.weight_shape_meta = true;
    } else {
      return w.Error("type", "\"int\" or \"float\"", "\"" + type + "\"");
    }
  } else {
    return f.Error("quant_method", "one of \"fp8\", \"mxfp4\", \"compressed-tensors\"",
                   "\"" + out.quant_method + "\"", "moeshard does not know this quantization");
  }
  return out;
}

// Cross-field consistency checks shared by every family.
Status Validate(const ModelConfig& c, const ConfigFields& f) {
  if (c.num_experts_per_tok > c.num_experts) {
    return f.Error("num_experts_per_tok", fmt::format("<= the number of experts ({})", c.num_experts),
                   std::to_string(c.num_experts_per_tok));
  }
  if (c.num_attention_heads % c.num_kv_heads != 0) {
    return f.Error("num_key_value_heads",
                   fmt::format("a divisor of num_attention_heads ({})", c.num_attention_heads),
                   std::to_string(c.num_kv_heads));
  }
  if (c.routing == RoutingMethod::kSigmoidGroupedTopK ||
      c.routing == RoutingMethod::kSoftmaxGroupedTopK) {
    if (c.num_experts % c.n_group != 0) {
      return f.Error("n_group", fmt::format("a divisor of the number of experts ({})", c.num_experts),
                     std::to_string(c.n_group));
    }
    if (c.topk_group > c.n_group) {
      return f.Error("topk_group", fmt::format("<= n_group ({})", c.n_group),
                     std::to_string(c.topk_group));
    }
    if (c.num_experts_per_tok > c.topk_group * (c.num_experts / c.n_group)) {
      return f.Error("num_experts_per_tok",
                     fmt::format("<= experts in the kept groups ({})",
                                 c.topk_group * (c.num_experts / c.n_group)),
                     std::to_string(c.num_experts_per_tok));
    }
  }
  if (c.first_k_dense_replace > c.num_layers) {
    return f.Error("first_k_dense_replace", fmt::format("<= num_hidden_layers ({})", c.num_layers),
                   std::to_string(c.first_k_dense_replace));
  }
  if (c.routed_expert_hidden_size > c.hidden_size) {
    return f.Error("routed_expert_hidden_size",
                   fmt::format("<= hidden_size ({}) (a latent width is smaller)", c.hidden_size),
                   std::to_string(c.routed_expert_hidden_size));
  }
  if (c.num_moe_layers() == 0) {
    return InvalidArgumentError(fmt::format(
        "config: '{}': expected at least one MoE layer, got none (moeshard plans MoE models)",
        f.source()));
  }
  const int64_t granule = c.expert_scheme().SplitGranule();
  if (c.moe_intermediate_size % granule != 0) {
    return f.Error("moe_intermediate_size",
                   fmt::format("a multiple of the {} granule ({})",
                               WeightFormatName(c.expert_scheme().format), granule),
                   std::to_string(c.moe_intermediate_size));
  }
  if (c.routed_expert_hidden_size % granule != 0) {
    return f.Error(c.latent_moe ? "routed_expert_hidden_size" : "hidden_size",
                   fmt::format("a multiple of the {} granule ({})",
                               WeightFormatName(c.expert_scheme().format), granule),
                   std::to_string(c.routed_expert_hidden_size));
  }
  if (c.kda.num_heads == 0 && c.num_layers_of(AttentionKind::kKda) > 0) {
    return f.Error("linear_attn_config", "KDA head settings for the KDA layers", "none");
  }
  return Status::Ok();
}

}  // namespace

Result<ModelConfig> ParseModelConfig(std::string_view json_text, const std::string& source,
                                     const std::string& name) {
  MOESHARD_ASSIGN_OR_RETURN(json root, ParseJsonStrict(json_text, source));
  ModelConfig c;
  c.name = name;
  c.source = source;

  ConfigFields top(root, source);
  MOESHARD_ASSIGN_OR_RETURN(c.model_type, top.String("model_type", std::nullopt));
  if (top.Has("architectures")) {
    const json& a = top.Raw("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string()) {
      return top.Error("architectures", "a non-empty array of strings", a.dump());
    }
    c.architecture = a[0].get<std::string>();
  }

  // Multimodal wrappers (Kimi-K3, Kimi-K2.5) nest the language model under text_config.
  const json* text = &root;
  std::string prefix;
  if (top.Has("text_config")) {
    if (!top.Raw("text_config").is_object()) {
      return top.Error("text_config", "an object", top.Raw("text_config").dump());
    }
    text = &root["text_config"];
    prefix = "text_config.";
  }
  ConfigFields f(*text, source, prefix);

  // The architecture first, so the first error names the real problem (an unknown family
  // is not reported as a bad quantization field).
  c.family = FindFamily(c.model_type);
  if (c.family == nullptr) {
    return top.Error("model_type", "one of " + KnownModelTypes(), "\"" + c.model_type + "\"",
                     "moeshard does not support this architecture yet");
  }
  if (c.family->nested_text_config && prefix.empty()) {
    return top.Error("text_config", fmt::format("the language model's config ({} nests it)",
                                                c.family->name),
                     "nothing");
  }
  MOESHARD_ASSIGN_OR_RETURN(c.hidden_size, f.Int("hidden_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_layers, f.Int("num_hidden_layers", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.vocab_size, f.Int("vocab_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.tie_word_embeddings, f.Bool("tie_word_embeddings", false));
  MOESHARD_ASSIGN_OR_RETURN(c.max_position_embeddings, f.Int("max_position_embeddings", 4096, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.rms_norm_eps, f.Double("rms_norm_eps", 1e-6));
  std::string dtype_name = "bfloat16";
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (f.Has(key)) {
      MOESHARD_ASSIGN_OR_RETURN(dtype_name, f.String(key, std::nullopt));
      break;
    }
  }
  if (dtype_name == "bfloat16") {
    c.dtype = DType::kBF16;
  } else if (dtype_name == "float16") {
    c.dtype = DType::kF16;
  } else if (dtype_name == "float32") {
    c.dtype = DType::kF32;
  } else {
    return f.Error("torch_dtype", "\"bfloat16\", \"float16\" or \"float32\"", "\"" + dtype_name + "\"");
  }

  // quantization_config may sit at the top level or inside text_config.
  const json* q = nullptr;
  bool q_nested = false;
  if (top.Has("quantization_config")) q = &root.at("quantization_config");
  if (prefix.size() && f.Has("quantization_config")) {
    if (q) {
      return InvalidArgumentError(fmt::format(
          "config: '{}': quantization_config appears both at the top level and in text_config "
          "(keep one)",
          source));
    }
    q = &text->at("quantization_config");
    q_nested = true;
  }
  if (q) {
    if (!q->is_object()) return top.Error("quantization_config", "an object", q->dump());
    MOESHARD_ASSIGN_OR_RETURN(c.quant, ParseQuantization(*q, source, q_nested ? prefix : ""));
  }

  MOESHARD_RETURN_IF_ERROR(c.family->parse(f, top, c));
  if (f.Has("min_moe_intermediate_per_partition")) {
    MOESHARD_ASSIGN_OR_RETURN(c.min_moe_intermediate_per_partition,
                              f.Int("min_moe_intermediate_per_partition", 0));
  }
  MOESHARD_RETURN_IF_ERROR(Validate(c, f));
  return c;
}

Result<ModelConfig> LoadModelConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return NotFoundError(fmt::format("config: '{}': cannot open the file", path));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseModelConfig(ss.str(), path, path);
}

Result<ModelConfig> LoadModelConfig(const std::string& spec) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(spec, ec)) {
    const fs::path cfg = fs::path(spec) / "config.json";
    if (!fs::exists(cfg, ec)) {
      return NotFoundError(fmt::format(
          "config: '{}': a checkpoint directory must hold config.json, and this one does not",
          spec));
    }
    return LoadModelConfigFile(cfg.string());
  }
  if (fs::is_regular_file(spec, ec)) return LoadModelConfigFile(spec);
  for (const PresetInfo& p : ModelPresets()) {
    if (p.name == spec) return ParseModelConfig(p.json, "preset '" + p.name + "'", p.name);
  }
  std::string names;
  for (const PresetInfo& p : ModelPresets()) {
    if (p.name.rfind("tiny-", 0) == 0) continue;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  return NotFoundError(fmt::format(
      "config: '{}': not a preset, a config.json or a checkpoint directory (presets: {})", spec,
      names));
}

const std::vector<PresetInfo>& ModelPresets() {
  static const std::vector<PresetInfo> presets = [] {
    std::vector<PresetInfo> out;
    for (const EmbeddedPreset& e : EmbeddedPresets()) {
      std::string description = PresetDescription(e.name);
      if (description.empty()) {
        // A preset without a hand-written line is described by its family's descriptor.
        Result<ModelConfig> m = ParseModelConfig(e.json, "preset '" + e.name + "'", e.name);
        if (m.ok()) description = std::string(m->family->summary);
      }
      out.push_back(PresetInfo{e.name, std::move(description), e.json});
    }
    std::sort(out.begin(), out.end(),
              [](const PresetInfo& a, const PresetInfo& b) { return a.name < b.name; });
    return out;
  }();
  return presets;
}

}  // namespace moeshard
