#include "moeshard/config/config_loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "config/presets.h"

namespace moeshard {
namespace {

using nlohmann::json;

// Reads typed fields from one JSON object, naming the field and the file in every error.
class Fields {
 public:
  Fields(const json& obj, std::string source, std::string prefix = "")
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool Has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  const json& Raw(const char* key) const { return obj_.at(key); }
  const std::string& source() const { return source_; }

  std::string Where(const char* key) const {
    return fmt::format("'{}{}' in {}", prefix_, key, source_);
  }

  Status Error(const char* key, const std::string& expected, const std::string& got,
               const std::string& fix = "") const {
    std::string msg = fmt::format("config: {}: expected {}, got {}", Where(key), expected, got);
    if (!fix.empty()) msg += fmt::format(" ({})", fix);
    return InvalidArgumentError(msg);
  }

  Result<int64_t> Int(const char* key, std::optional<int64_t> fallback = std::nullopt,
                      int64_t min = 0) const {
    if (!Has(key)) {
      if (fallback) return *fallback;
      return InvalidArgumentError(fmt::format(
          "config: {}: required field is missing (is this a config.json of a supported MoE "
          "model?)",
          Where(key)));
    }
    const json& v = obj_.at(key);
    if (!v.is_number_integer()) return Error(key, "an integer", v.dump());
    const int64_t x = v.get<int64_t>();
    if (x < min) return Error(key, fmt::format("an integer >= {}", min), std::to_string(x));
    return x;
  }

  Result<double> Double(const char* key, std::optional<double> fallback = std::nullopt) const {
    if (!Has(key)) {
      if (fallback) return *fallback;
      return InvalidArgumentError(
          fmt::format("config: {}: required field is missing", Where(key)));
    }
    const json& v = obj_.at(key);
    if (!v.is_number()) return Error(key, "a number", v.dump());
    return v.get<double>();
  }

  Result<bool> Bool(const char* key, bool fallback) const {
    if (!Has(key)) return fallback;
    const json& v = obj_.at(key);
    if (!v.is_boolean()) return Error(key, "true or false", v.dump());
    return v.get<bool>();
  }

  Result<std::string> String(const char* key, std::optional<std::string> fallback) const {
    if (!Has(key)) {
      if (fallback) return *fallback;
      return InvalidArgumentError(
          fmt::format("config: {}: required field is missing", Where(key)));
    }
    const json& v = obj_.at(key);
    if (!v.is_string()) return Error(key, "a string", v.dump());
    return v.get<std::string>();
  }

  // The first present of several spellings of one field; two present with different values is
  // a contradiction.
  Result<int64_t> IntAlias(std::initializer_list<const char*> keys,
                           std::optional<int64_t> fallback = std::nullopt, int64_t min = 0) const {
    const char* found = nullptr;
    int64_t value = 0;
    for (const char* k : keys) {
      if (!Has(k)) continue;
      MOESHARD_ASSIGN_OR_RETURN(int64_t v, Int(k, std::nullopt, min));
      if (found && v != value) {
        return InvalidArgumentError(fmt::format(
            "config: {} and '{}{}' contradict: {} vs {} (they name the same quantity; keep one)",
            Where(k), prefix_, found, v, value));
      }
      found = k;
      value = v;
    }
    if (found) return value;
    if (fallback) return *fallback;
    std::string names;
    for (const char* k : keys) names += fmt::format("{}'{}{}'", names.empty() ? "" : " or ", prefix_, k);
    return InvalidArgumentError(
        fmt::format("config: {} in {}: required field is missing", names, source_));
  }

 private:
  const json& obj_;
  std::string source_;
  std::string prefix_;
};

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

Result<QuantizationConfig> ParseQuantization(const json& q, const std::string& source) {
  QuantizationConfig out;
  Fields f(q, source, "quantization_config.");
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
    out.method = QuantMethod::kFp8Block;
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
    out.block_out = b[0].get<int>();
    out.block_in = b[1].get<int>();
    if (f.Has("fmt")) {
      MOESHARD_ASSIGN_OR_RETURN(std::string fmt_name, f.String("fmt", std::nullopt));
      if (fmt_name != "e4m3") return f.Error("fmt", "\"e4m3\"", "\"" + fmt_name + "\"");
    }
    MOESHARD_RETURN_IF_ERROR(read_ignore("ignored_layers"));
    MOESHARD_RETURN_IF_ERROR(read_ignore("modules_to_not_convert"));
  } else if (out.quant_method == "mxfp4") {
    out.method = QuantMethod::kMxfp4;
    out.group_size = 32;
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
    const std::string gname = "quantization_config.config_groups." +
                              f.Raw("config_groups").begin().key() + ".weights.";
    if (!group.is_object() || !group.contains("weights") || !group["weights"].is_object()) {
      return InvalidArgumentError(fmt::format(
          "config: '{}' in {}: required object is missing", gname, source));
    }
    Fields w(group["weights"], source, gname);
    MOESHARD_ASSIGN_OR_RETURN(int64_t bits, w.Int("num_bits"));
    MOESHARD_ASSIGN_OR_RETURN(std::string type, w.String("type", "int"));
    MOESHARD_ASSIGN_OR_RETURN(std::string strategy, w.String("strategy", "group"));
    MOESHARD_ASSIGN_OR_RETURN(int64_t group_size, w.Int("group_size", std::nullopt, 1));
    MOESHARD_ASSIGN_OR_RETURN(bool symmetric, w.Bool("symmetric", true));
    if (bits != 4) return w.Error("num_bits", "4", std::to_string(bits));
    if (strategy != "group") return w.Error("strategy", "\"group\"", "\"" + strategy + "\"");
    out.group_size = static_cast<int>(group_size);
    if (type == "float") {
      out.method = QuantMethod::kMxfp4;
      if (group_size != 32) {
        return w.Error("group_size", "32 for mxfp4 (one E8M0 scale per 32)",
                       std::to_string(group_size));
      }
      if (out.format != "mxfp4-pack-quantized") {
        return f.Error("format", "\"mxfp4-pack-quantized\" for 4-bit float weights",
                       "\"" + out.format + "\"");
      }
    } else if (type == "int") {
      out.method = QuantMethod::kInt4;
      if (!symmetric) {
        return w.Error("symmetric", "true (moeshard supports symmetric int4)", "false");
      }
      if (out.format != "pack-quantized") {
        return f.Error("format", "\"pack-quantized\" for int4 weights",
                       "\"" + out.format + "\"");
      }
    } else {
      return w.Error("type", "\"int\" or \"float\"", "\"" + type + "\"");
    }
  } else {
    return f.Error("quant_method", "one of \"fp8\", \"mxfp4\", \"compressed-tensors\"",
                   "\"" + out.quant_method + "\"", "moeshard does not know this quantization");
  }
  return out;
}

// The MLA fields shared by deepseek_v3 and kimi_k3.
Status ParseMla(const Fields& f, ModelConfig& c) {
  MOESHARD_ASSIGN_OR_RETURN(c.mla.q_lora_rank, f.Int("q_lora_rank", 0));
  MOESHARD_ASSIGN_OR_RETURN(c.mla.kv_lora_rank, f.Int("kv_lora_rank", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.mla.qk_nope_head_dim, f.Int("qk_nope_head_dim", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.mla.qk_rope_head_dim, f.Int("qk_rope_head_dim", std::nullopt, 0));
  MOESHARD_ASSIGN_OR_RETURN(c.mla.v_head_dim, f.Int("v_head_dim", std::nullopt, 1));
  return Status::Ok();
}

// noaux_tc routing: sigmoid scores, correction bias, grouped top-k.
Status ParseNoauxRouting(const Fields& f, ModelConfig& c) {
  MOESHARD_ASSIGN_OR_RETURN(std::string scoring, f.String("scoring_func", "sigmoid"));
  MOESHARD_ASSIGN_OR_RETURN(std::string topk_method, f.String("topk_method", "noaux_tc"));
  if (scoring != "sigmoid" && scoring != "softmax") {
    return f.Error("scoring_func", "\"sigmoid\" or \"softmax\"", "\"" + scoring + "\"");
  }
  if (topk_method != "noaux_tc" && topk_method != "greedy" && topk_method != "group_limited_greedy") {
    return f.Error("topk_method", "\"noaux_tc\", \"greedy\" or \"group_limited_greedy\"",
                   "\"" + topk_method + "\"");
  }
  if (scoring == "sigmoid") {
    c.scoring = ScoringFunc::kSigmoid;
    c.routing = RoutingMethod::kSigmoidGroupedTopK;
    c.has_correction_bias = topk_method == "noaux_tc";
  } else {
    c.scoring = ScoringFunc::kSoftmax;
    c.routing = RoutingMethod::kSoftmaxTopK;
  }
  MOESHARD_ASSIGN_OR_RETURN(c.n_group, f.Int("n_group", 1, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.topk_group, f.Int("topk_group", 1, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool("norm_topk_prob", true));
  MOESHARD_ASSIGN_OR_RETURN(c.routed_scaling_factor, f.Double("routed_scaling_factor", 1.0));
  return Status::Ok();
}

Status ParseDeepseekV3(const Fields& f, ModelConfig& c) {
  c.family = ModelFamily::kDeepseekV3;
  MOESHARD_ASSIGN_OR_RETURN(c.num_attention_heads, f.Int("num_attention_heads", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_kv_heads, f.Int("num_key_value_heads", c.num_attention_heads, 1));
  MOESHARD_RETURN_IF_ERROR(ParseMla(f, c));
  MOESHARD_ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size, f.Int("moe_intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts, f.IntAlias({"n_routed_experts", "num_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts_per_tok, f.IntAlias({"num_experts_per_tok"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_shared_experts, f.IntAlias({"n_shared_experts"}, 0));
  c.shared_expert_intermediate_size = c.num_shared_experts * c.moe_intermediate_size;
  MOESHARD_ASSIGN_OR_RETURN(c.first_k_dense_replace, f.Int("first_k_dense_replace", 0));
  MOESHARD_ASSIGN_OR_RETURN(int64_t freq, f.Int("moe_layer_freq", 1, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_mtp_layers, f.Int("num_nextn_predict_layers", 0));
  MOESHARD_RETURN_IF_ERROR(ParseNoauxRouting(f, c));
  MOESHARD_ASSIGN_OR_RETURN(std::string act, f.String("hidden_act", "silu"));
  if (act != "silu") return f.Error("hidden_act", "\"silu\"", "\"" + act + "\"");
  c.activation = ExpertActivation::kSwiGlu;
  c.routed_expert_hidden_size = c.hidden_size;
  c.layers.assign(c.num_layers, LayerSpec{});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    c.layers[i].attention = AttentionKind::kMla;
    c.layers[i].moe = i >= c.first_k_dense_replace && (i % freq == 0);
  }
  return Status::Ok();
}

Status ParseKimiK3(const Fields& f, ModelConfig& c) {
  c.family = ModelFamily::kKimiK3;
  MOESHARD_ASSIGN_OR_RETURN(c.num_attention_heads, f.Int("num_attention_heads", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_kv_heads, f.Int("num_key_value_heads", c.num_attention_heads, 1));
  MOESHARD_RETURN_IF_ERROR(ParseMla(f, c));
  MOESHARD_ASSIGN_OR_RETURN(c.mla.output_gate, f.Bool("mla_use_output_gate", false));
  MOESHARD_ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size, f.Int("moe_intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts, f.IntAlias({"num_experts", "n_routed_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts_per_tok,
                            f.IntAlias({"num_experts_per_token", "num_experts_per_tok"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_shared_experts,
                            f.IntAlias({"num_shared_experts", "n_shared_experts"}, 0));
  c.shared_expert_intermediate_size = c.num_shared_experts * c.moe_intermediate_size;
  MOESHARD_ASSIGN_OR_RETURN(c.first_k_dense_replace, f.Int("first_k_dense_replace", 0));
  MOESHARD_ASSIGN_OR_RETURN(c.routed_expert_hidden_size,
                            f.Int("routed_expert_hidden_size", c.hidden_size, 1));
  c.latent_moe = c.routed_expert_hidden_size != c.hidden_size;
  MOESHARD_ASSIGN_OR_RETURN(c.latent_moe_use_norm, f.Bool("latent_moe_use_norm", false));
  MOESHARD_RETURN_IF_ERROR(ParseNoauxRouting(f, c));
  MOESHARD_ASSIGN_OR_RETURN(std::string act, f.String("hidden_act", "situ"));
  if (act == "situ") {
    c.activation = ExpertActivation::kSitu;
    MOESHARD_ASSIGN_OR_RETURN(c.situ_beta, f.Double("activation_situ_beta", 4.0));
    MOESHARD_ASSIGN_OR_RETURN(c.situ_linear_beta, f.Double("activation_situ_linear_beta", 25.0));
  } else if (act == "silu") {
    c.activation = ExpertActivation::kSwiGlu;
  } else {
    return f.Error("hidden_act", "\"situ\" or \"silu\"", "\"" + act + "\"");
  }
  MOESHARD_ASSIGN_OR_RETURN(c.min_moe_intermediate_per_partition,
                            f.Int("min_moe_intermediate_per_partition", 256, 0));

  // Hybrid attention: linear_attn_config lists 1-based layer numbers (as Kimi-Linear does).
  c.layers.assign(c.num_layers, LayerSpec{});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    c.layers[i].attention = AttentionKind::kMla;
    c.layers[i].moe = i >= c.first_k_dense_replace;
  }
  if (f.Has("linear_attn_config")) {
    const json& la = f.Raw("linear_attn_config");
    if (!la.is_object()) return f.Error("linear_attn_config", "an object", la.dump());
    Fields l(la, f.source(), "text_config.linear_attn_config.");
    MOESHARD_ASSIGN_OR_RETURN(c.kda.num_heads, l.Int("num_heads", std::nullopt, 1));
    MOESHARD_ASSIGN_OR_RETURN(c.kda.head_dim, l.Int("head_dim", std::nullopt, 1));
    MOESHARD_ASSIGN_OR_RETURN(c.kda.short_conv_kernel, l.Int("short_conv_kernel_size", 4, 1));
    c.kda.low_rank_dim = c.kda.head_dim;
    std::vector<int> seen(c.num_layers, 0);
    for (const char* key : {"kda_layers", "full_attn_layers"}) {
      if (!l.Has(key) || !l.Raw(key).is_array()) {
        return l.Error(key, "an array of 1-based layer numbers",
                       l.Has(key) ? l.Raw(key).dump() : "nothing");
      }
      for (const json& e : l.Raw(key)) {
        if (!e.is_number_integer() || e.get<int64_t>() < 1 || e.get<int64_t>() > c.num_layers) {
          return l.Error(key, fmt::format("layer numbers in [1, {}]", c.num_layers), e.dump());
        }
        const int64_t idx = e.get<int64_t>() - 1;
        if (seen[idx]++) {
          return l.Error(key, "each layer in exactly one of kda_layers and full_attn_layers",
                         fmt::format("layer {} listed twice", idx + 1));
        }
        c.layers[idx].attention =
            std::string(key) == "kda_layers" ? AttentionKind::kKda : AttentionKind::kMla;
      }
    }
    for (int64_t i = 0; i < c.num_layers; ++i) {
      if (!seen[i]) {
        return l.Error("kda_layers", "every layer in kda_layers or full_attn_layers",
                       fmt::format("layer {} in neither", i + 1));
      }
    }
  }
  return Status::Ok();
}

Status ParseQwen3Moe(const Fields& f, ModelConfig& c) {
  c.family = ModelFamily::kQwen3Moe;
  MOESHARD_ASSIGN_OR_RETURN(c.num_attention_heads, f.Int("num_attention_heads", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_kv_heads, f.Int("num_key_value_heads", c.num_attention_heads, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.head_dim, f.Int("head_dim", c.hidden_size / c.num_attention_heads, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.attention_bias, f.Bool("attention_bias", false));
  MOESHARD_ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size, f.Int("moe_intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts, f.IntAlias({"num_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts_per_tok, f.IntAlias({"num_experts_per_tok"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool("norm_topk_prob", false));
  MOESHARD_ASSIGN_OR_RETURN(int64_t step, f.Int("decoder_sparse_step", 1, 1));
  std::set<int64_t> mlp_only;
  if (f.Has("mlp_only_layers")) {
    if (!f.Raw("mlp_only_layers").is_array()) {
      return f.Error("mlp_only_layers", "an array of layer indices", f.Raw("mlp_only_layers").dump());
    }
    for (const json& e : f.Raw("mlp_only_layers")) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= c.num_layers) {
        return f.Error("mlp_only_layers", fmt::format("indices in [0, {})", c.num_layers), e.dump());
      }
      mlp_only.insert(e.get<int64_t>());
    }
  }
  MOESHARD_ASSIGN_OR_RETURN(std::string act, f.String("hidden_act", "silu"));
  if (act != "silu") return f.Error("hidden_act", "\"silu\"", "\"" + act + "\"");
  c.activation = ExpertActivation::kSwiGlu;
  c.scoring = ScoringFunc::kSoftmax;
  c.routing = RoutingMethod::kSoftmaxTopK;
  c.routed_expert_hidden_size = c.hidden_size;
  c.layers.assign(c.num_layers, LayerSpec{});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    c.layers[i].moe = !mlp_only.count(i) && (i + 1) % step == 0;
  }
  return Status::Ok();
}

Status ParseMixtral(const Fields& f, ModelConfig& c) {
  c.family = ModelFamily::kMixtral;
  MOESHARD_ASSIGN_OR_RETURN(c.num_attention_heads, f.Int("num_attention_heads", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_kv_heads, f.Int("num_key_value_heads", c.num_attention_heads, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.head_dim, f.Int("head_dim", c.hidden_size / c.num_attention_heads, 1));
  // Mixtral's experts are full-width MLPs: intermediate_size is the per-expert width.
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size, f.Int("intermediate_size", std::nullopt, 1));
  c.intermediate_size = c.moe_intermediate_size;
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts, f.IntAlias({"num_local_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts_per_tok, f.IntAlias({"num_experts_per_tok"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.sliding_window, f.Int("sliding_window", 0));
  MOESHARD_ASSIGN_OR_RETURN(std::string act, f.String("hidden_act", "silu"));
  if (act != "silu") return f.Error("hidden_act", "\"silu\"", "\"" + act + "\"");
  c.activation = ExpertActivation::kSwiGlu;
  c.scoring = ScoringFunc::kSoftmax;
  c.routing = RoutingMethod::kSoftmaxTopK;
  c.norm_topk_prob = true;  // Mixtral renormalises the top-2
  c.routed_expert_hidden_size = c.hidden_size;
  c.layers.assign(c.num_layers, LayerSpec{AttentionKind::kGqa, true, c.sliding_window > 0});
  return Status::Ok();
}

Status ParseGptOss(const Fields& f, ModelConfig& c) {
  c.family = ModelFamily::kGptOss;
  MOESHARD_ASSIGN_OR_RETURN(c.num_attention_heads, f.Int("num_attention_heads", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_kv_heads, f.Int("num_key_value_heads", c.num_attention_heads, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.head_dim, f.Int("head_dim", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.attention_bias, f.Bool("attention_bias", true));
  c.attention_sinks = true;
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size, f.Int("intermediate_size", std::nullopt, 1));
  c.intermediate_size = c.moe_intermediate_size;
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts, f.IntAlias({"num_local_experts", "num_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts_per_tok,
                            f.IntAlias({"num_experts_per_tok", "experts_per_token"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.sliding_window, f.Int("sliding_window", 0));
  MOESHARD_ASSIGN_OR_RETURN(c.swiglu_limit, f.Double("swiglu_limit", 7.0));
  c.activation = ExpertActivation::kSwiGluOai;
  c.scoring = ScoringFunc::kSoftmax;
  c.routing = RoutingMethod::kTopKThenSoftmax;
  c.norm_topk_prob = true;
  c.router_bias = true;
  c.expert_bias = true;
  c.gate_up_fused = true;
  c.routed_expert_hidden_size = c.hidden_size;
  c.layers.assign(c.num_layers, LayerSpec{AttentionKind::kGqa, true, false});
  if (f.Has("layer_types")) {
    const json& lt = f.Raw("layer_types");
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.num_layers) {
      return f.Error("layer_types", fmt::format("an array of {} layer types", c.num_layers),
                     lt.is_array() ? fmt::format("{} entries", lt.size()) : lt.dump());
    }
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const json& e = lt[i];
      if (e == "sliding_attention") {
        c.layers[i].sliding = true;
      } else if (e != "full_attention") {
        return f.Error("layer_types", "\"sliding_attention\" or \"full_attention\"", e.dump());
      }
    }
  }
  return Status::Ok();
}

// Cross-field consistency checks shared by every family.
Status Validate(const ModelConfig& c, const Fields& f) {
  if (c.num_experts_per_tok > c.num_experts) {
    return f.Error("num_experts_per_tok", fmt::format("<= the number of experts ({})", c.num_experts),
                   std::to_string(c.num_experts_per_tok));
  }
  if (c.num_attention_heads % c.num_kv_heads != 0) {
    return f.Error("num_key_value_heads",
                   fmt::format("a divisor of num_attention_heads ({})", c.num_attention_heads),
                   std::to_string(c.num_kv_heads));
  }
  if (c.routing == RoutingMethod::kSigmoidGroupedTopK) {
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
  if (c.quant.method == QuantMethod::kFp8Block &&
      (c.moe_intermediate_size % c.quant.block_out != 0 ||
       c.routed_expert_hidden_size % c.quant.block_in != 0)) {
    return f.Error("moe_intermediate_size",
                   fmt::format("a multiple of the fp8 block ({})", c.quant.block_out),
                   std::to_string(c.moe_intermediate_size));
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

  Fields top(root, source);
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
  Fields f(*text, source, prefix);

  std::string family_name = c.model_type;
  const std::string known =
      "deepseek_v3, kimi_k2, kimi_k25, kimi_k3, qwen3_moe, mixtral, gpt_oss";
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
  std::string q_source = source;
  if (top.Has("quantization_config")) q = &root["quantization_config"];
  if (prefix.size() && f.Has("quantization_config")) {
    if (q) {
      return InvalidArgumentError(fmt::format(
          "config: '{}': quantization_config appears both at the top level and in text_config "
          "(keep one)",
          source));
    }
    q = &(*text)["quantization_config"];
  }
  if (q) {
    if (!q->is_object()) return top.Error("quantization_config", "an object", q->dump());
    MOESHARD_ASSIGN_OR_RETURN(c.quant, ParseQuantization(*q, q_source));
  }

  Status s;
  if (family_name == "deepseek_v3" || family_name == "kimi_k2" || family_name == "kimi_k25") {
    s = ParseDeepseekV3(f, c);
  } else if (family_name == "kimi_k3") {
    s = ParseKimiK3(f, c);
  } else if (family_name == "qwen3_moe") {
    s = ParseQwen3Moe(f, c);
  } else if (family_name == "mixtral") {
    s = ParseMixtral(f, c);
  } else if (family_name == "gpt_oss") {
    s = ParseGptOss(f, c);
  } else {
    return top.Error("model_type", "one of " + known, "\"" + family_name + "\"",
                     "moeshard does not support this architecture yet");
  }
  MOESHARD_RETURN_IF_ERROR(s);
  if (c.family == ModelFamily::kGptOss && c.quant.method == QuantMethod::kMxfp4) {
    c.quant.group_size = 32;
  }
  if (c.family != ModelFamily::kKimiK3 && f.Has("min_moe_intermediate_per_partition")) {
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
      out.push_back(PresetInfo{e.name, PresetDescription(e.name), e.json});
    }
    std::sort(out.begin(), out.end(),
              [](const PresetInfo& a, const PresetInfo& b) { return a.name < b.name; });
    return out;
  }();
  return presets;
}

}  // namespace moeshard
