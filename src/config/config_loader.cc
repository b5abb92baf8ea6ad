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
    return InvalidArgumentError(fmt::format("config: '{}': not valid JSON: {}", source, e.what()));
  }
  if (!duplicate.empty()) {
    return InvalidArgumentError(
        fmt::format("config: '{}': key '{}' appears twice in one object (which value is meant?)",
                    source, duplicate));
  }
  if (!j.is_object()) {
    return InvalidArgumentError(fmt::format(
        "config: '{}': expected a JSON object at the top level, got {}", source, j.type_name()));
  }
  return j;
}

// The ignore lists every method spells its own way, appended to out.ignore.
Status ReadIgnore(const ConfigFields& f, const char* key, QuantizationConfig& out) {
  if (!f.Has(key)) return Status::Ok();
  if (!f.Raw(key).is_array()) return f.Error(key, "an array of strings", f.Raw(key).dump());
  for (const json& e : f.Raw(key)) {
    if (!e.is_string()) return f.Error(key, "an array of strings", e.dump());
    out.ignore.push_back(e.get<std::string>());
  }
  return Status::Ok();
}

// `text` as a regex matching itself literally.
std::string EscapeRegex(const std::string& text) {
  std::string re;
  for (char ch : text) {
    if (std::string_view("\\^$.|?*+()[]{}").find(ch) != std::string_view::npos) re += '\\';
    re += ch;
  }
  return re;
}

// GPTQ's `modules_in_block_to_quantize` (optimum / transformers GPTQConfig, written by Qwen's
// GPTQ releases): lists of module names inside a decoder layer; a layer module whose name ends
// with none of them stays unquantized (optimum gptq/quantizer.py `name.endswith(layer)`). It
// becomes one ignore regex. moeshard stores every routed expert in the checkpoint's scheme, so
// a list without them would be misread: it is refused.
Status ReadModulesInBlock(const ConfigFields& f, QuantizationConfig& out) {
  const char* key = "modules_in_block_to_quantize";
  if (!f.Has(key)) return Status::Ok();
  if (!f.Raw(key).is_array()) return f.Error(key, "lists of module names", f.Raw(key).dump());
  std::vector<std::string> names;
  for (const json& e : f.Raw(key)) {
    const json items = e.is_array() ? e : json::array({e});
    for (const json& n : items) {
      if (!n.is_string()) return f.Error(key, "lists of module names", n.dump());
      names.push_back(n.get<std::string>());
    }
  }
  if (names.empty()) return Status::Ok();
  const bool experts = std::any_of(names.begin(), names.end(), [](const std::string& n) {
    return n.find("experts.") != std::string::npos && n.find("shared_expert") == std::string::npos;
  });
  if (!experts) {
    return f.Error(key,
                   "the routed experts among the quantized modules (moeshard stores them "
                   "in the checkpoint's scheme)",
                   "no routed expert module",
                   "GPTQ checkpoints with unquantized routed experts are not supported");
  }
  std::string alternatives;
  for (const std::string& n : names)
    alternatives += (alternatives.empty() ? "" : "|") + EscapeRegex(n);
  out.ignore.push_back("re:(?:.*\\.)?layers\\.[0-9]+\\.(?!(?:.*\\.)?(?:" + alternatives + ")$)");
  return Status::Ok();
}

// A group size of 32-1024 values that the 32-value kernels can walk (AWQ, GPTQ, int4).
Status CheckInt4Group(const ConfigFields& f, const char* key, int64_t group) {
  if (group <= 0 || group % 32 != 0) {
    return f.Error(key, "a positive multiple of 32 (moeshard's int4 kernels walk 32 values a step)",
                   std::to_string(group),
                   group == -1 ? "per-channel int4 (group_size -1) is not supported" : "");
  }
  return Status::Ok();
}

// DeepSeek-style block fp8 (`quant_method: fp8`; MiniMax spells fmt "float8_e4m3fn").
Status ParseFp8(const ConfigFields& f, QuantizationConfig& out) {
  out.scheme = WeightScheme::Default(WeightFormat::kFp8Block);
  if (!f.Has("weight_block_size")) {
    return InvalidArgumentError(fmt::format(
        "config: {}: required for fp8 (moeshard supports block-scaled fp8, e.g. [128, 128])",
        f.Where("weight_block_size")));
  }
  const json& b = f.Raw("weight_block_size");
  if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
      b[0].get<int64_t>() <= 0 || b[1].get<int64_t>() <= 0) {
    return f.Error("weight_block_size", "two positive integers [rows, cols]", b.dump());
  }
  out.scheme.block_rows = b[0].get<int64_t>();
  out.scheme.group = b[1].get<int64_t>();
  if (f.Has("fmt")) {
    MOESHARD_RETURN_IF_ERROR(f.Choice("fmt", std::nullopt, {"e4m3", "float8_e4m3fn"}).status());
  }
  MOESHARD_RETURN_IF_ERROR(ReadIgnore(f, "ignored_layers", out));
  return ReadIgnore(f, "modules_to_not_convert", out);
}

// AutoAWQ (`quant_method: awq`; quant_config.json spells w_bit / q_group_size, vLLM awq.py
// reads both): 4-bit GEMM packing with zero points.
Status ParseAwq(const ConfigFields& f, QuantizationConfig& out) {
  MOESHARD_ASSIGN_OR_RETURN(int64_t bits, f.IntAlias({"bits", "w_bit"}));
  MOESHARD_ASSIGN_OR_RETURN(int64_t group, f.IntAlias({"group_size", "q_group_size"}, 128, -1));
  MOESHARD_ASSIGN_OR_RETURN(bool zero_point, f.Bool("zero_point", true));
  MOESHARD_ASSIGN_OR_RETURN(std::string version, f.String("version", "gemm"));
  if (bits != 4) return f.Error("bits", "4 (moeshard reads 4-bit AWQ)", std::to_string(bits));
  MOESHARD_RETURN_IF_ERROR(CheckInt4Group(f, "group_size", group));
  if (!zero_point) {
    return f.Error("zero_point", "true (AWQ's GEMM layout stores zero points)", "false");
  }
  if (version != "gemm" && version != "GEMM") {
    return f.Error("version", "\"gemm\" (the packing vLLM and AutoAWQ GEMM kernels read)",
                   "\"" + version + "\"", "GEMV and Marlin-packed AWQ are not supported");
  }
  out.scheme = WeightScheme{WeightFormat::kInt4Zp, group, 1, QuantLayout::kAwq};
  // AutoAWQ and vLLM (awq.py is_layer_skipped_awq) skip a module when any entry is a substring
  // of its name: each entry becomes a regex matching it anywhere.
  const size_t first = out.ignore.size();
  MOESHARD_RETURN_IF_ERROR(ReadIgnore(f, "modules_to_not_convert", out));
  for (size_t i = first; i < out.ignore.size(); ++i)
    out.ignore[i] = "re:.*" + EscapeRegex(out.ignore[i]);
  return Status::Ok();
}

// AutoGPTQ / GPTQModel (`quant_method: gptq`): 4-bit, zero points stored minus one unless
// `checkpoint_format` is "gptq_v2". Act-order (`desc_act`) assigns each input channel its group
// through the stored `g_idx` (WeightScheme::act_order).
Status ParseGptq(const ConfigFields& f, QuantizationConfig& out) {
  MOESHARD_ASSIGN_OR_RETURN(int64_t bits, f.IntAlias({"bits", "w_bit"}));
  MOESHARD_ASSIGN_OR_RETURN(int64_t group, f.Int("group_size", 128, -1));
  MOESHARD_ASSIGN_OR_RETURN(bool desc_act, f.Bool("desc_act", false));
  MOESHARD_ASSIGN_OR_RETURN(std::string format,
                            f.Choice("checkpoint_format", "gptq", {"gptq", "gptq_v2"}));
  if (bits != 4) return f.Error("bits", "4 (moeshard reads 4-bit GPTQ)", std::to_string(bits));
  MOESHARD_RETURN_IF_ERROR(CheckInt4Group(f, "group_size", group));
  out.scheme = WeightScheme{WeightFormat::kInt4Zp, group, 1,
                            format == "gptq_v2" ? QuantLayout::kGptqV2 : QuantLayout::kGptq};
  out.scheme.act_order = desc_act;
  // GPTQModel's per-module rules (vLLM gptq.py `dynamic`): "-:<regex>" leaves the modules it
  // matches unquantized; "+:<regex>" (or a bare regex) overrides bits / group_size, which
  // moeshard's one-scheme plan supports only when they equal the defaults.
  if (f.Has("dynamic")) {
    const json& d = f.Raw("dynamic");
    if (!d.is_object()) return f.Error("dynamic", "an object of module rules", d.dump());
    for (const auto& [key, rule] : d.items()) {
      if (key.rfind("-:", 0) == 0) {
        out.ignore.push_back("re:" + key.substr(2));
        continue;
      }
      for (const char* field : {"bits", "group_size", "desc_act", "sym"}) {
        if (!rule.is_object() || !rule.contains(field)) continue;
        const json base = field == std::string_view("bits")         ? json(bits)
                          : field == std::string_view("group_size") ? json(group)
                          : field == std::string_view("desc_act")   ? json(desc_act)
                                                                    : rule[field];
        if (rule[field] != base) {
          return InvalidArgumentError(fmt::format(
              "config: {}: rule '{}' sets {} to {}: expected the checkpoint-wide {} (moeshard "
              "plans one int4 scheme; per-module overrides are not supported)",
              f.Where("dynamic"), key, field, rule[field].dump(), base.dump()));
        }
      }
    }
  }
  MOESHARD_RETURN_IF_ERROR(ReadModulesInBlock(f, out));
  return ReadIgnore(f, "modules_to_not_convert", out);
}

// NVIDIA ModelOpt (`quant_method: modelopt` or `modelopt_fp4`): `quant_algo` at the top or, as
// hf_quant_config.json writes it, under `quantization` (vLLM modelopt.py reads both).
Status ParseModelOpt(const ConfigFields& top, QuantizationConfig& out) {
  const bool nested = top.Has("quantization") && top.Raw("quantization").is_object();
  ConfigFields f = top;
  if (nested) {
    MOESHARD_ASSIGN_OR_RETURN(f, top.Object("quantization"));
  }
  MOESHARD_ASSIGN_OR_RETURN(std::string algo, f.String("quant_algo", std::nullopt));
  if (algo == "FP8") {  // per-tensor fp8 weights (and activations, which the CPU path keeps 16-bit)
    out.scheme = WeightScheme{WeightFormat::kFp8Block, kFp8RowUniformGroup, 1,
                              QuantLayout::kFp8PerTensor, true};
    MOESHARD_RETURN_IF_ERROR(ReadIgnore(f, "exclude_modules", out));
    return ReadIgnore(top, "ignore", out);
  }
  if (algo != "NVFP4") {
    return f.Error("quant_algo", "\"NVFP4\" or \"FP8\"", "\"" + algo + "\"",
                   "moeshard reads ModelOpt NVFP4 and per-tensor FP8");
  }
  MOESHARD_ASSIGN_OR_RETURN(int64_t group, f.Int("group_size", 16, 1));
  if (group != 16)
    return f.Error("group_size", "16 (NVFP4: one E4M3 scale per 16)", std::to_string(group));
  out.scheme = WeightScheme{WeightFormat::kNvfp4, 16, 1, QuantLayout::kModelOpt, true};
  MOESHARD_RETURN_IF_ERROR(ReadIgnore(f, "exclude_modules", out));
  return ReadIgnore(top, "ignore", out);
}

// compressed-tensors fp8 (`format: float-quantized`, e.g. the FP8-dynamic releases): one scale
// per output channel, per tensor, or per block (`block_structure`).
Status ParseCtFp8(const ConfigFields& f, const ConfigFields& w, const std::string& strategy,
                  QuantizationConfig& out) {
  if (out.format != "float-quantized" && out.format != "naive-quantized") {
    return f.Error("format", "\"float-quantized\" for fp8 weights", "\"" + out.format + "\"");
  }
  if (strategy == "channel") {
    out.scheme =
        WeightScheme{WeightFormat::kFp8Block, kFp8RowUniformGroup, 1, QuantLayout::kFp8PerChannel};
    return Status::Ok();
  }
  if (strategy == "tensor") {
    out.scheme =
        WeightScheme{WeightFormat::kFp8Block, kFp8RowUniformGroup, 1, QuantLayout::kFp8PerTensor};
    return Status::Ok();
  }
  if (strategy == "block") {
    MOESHARD_ASSIGN_OR_RETURN(std::vector<int64_t> b, w.IntList("block_structure", 1, 1 << 20));
    if (b.size() != 2) {
      return w.Error("block_structure", "two positive integers [rows, cols]",
                     std::to_string(b.size()) + " values");
    }
    out.scheme = WeightScheme{WeightFormat::kFp8Block, b[1], b[0], QuantLayout::kCompressedTensors};
    return Status::Ok();
  }
  return w.Error("strategy", "\"channel\", \"tensor\" or \"block\" for fp8",
                 "\"" + strategy + "\"");
}

// compressed-tensors (llm-compressor): one config group; int4 pack-quantized (symmetric, or
// asymmetric with packed zero points), mxfp4-pack-quantized and nvfp4-pack-quantized.
Status ParseCompressedTensors(const ConfigFields& f, QuantizationConfig& out) {
  MOESHARD_ASSIGN_OR_RETURN(out.format, f.String("format", std::nullopt));
  MOESHARD_RETURN_IF_ERROR(ReadIgnore(f, "ignore", out));
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
  const std::string gname =
      f.prefix() + "config_groups." + f.Raw("config_groups").begin().key() + ".weights.";
  if (!group.is_object() || !group.contains("weights") || !group["weights"].is_object()) {
    return InvalidArgumentError(
        fmt::format("config: '{}' in {}: required object is missing", gname, f.source()));
  }
  ConfigFields w(group["weights"], f.source(), gname);
  // Static activation scales are stored per linear (NVFP4's global one always, with
  // activations quantized at all).
  const bool acts = group.contains("input_activations") && group["input_activations"].is_object();
  const bool static_acts =
      acts && group["input_activations"].value("dynamic", nlohmann::json(true)) == false;
  MOESHARD_ASSIGN_OR_RETURN(int64_t bits, w.Int("num_bits"));
  MOESHARD_ASSIGN_OR_RETURN(std::string type, w.String("type", "int"));
  MOESHARD_ASSIGN_OR_RETURN(std::string strategy, w.String("strategy", "group"));
  // 0 when absent or null (per-channel, per-tensor and block fp8 have no group).
  MOESHARD_ASSIGN_OR_RETURN(int64_t group_size, w.Int("group_size", 0, -1));
  MOESHARD_ASSIGN_OR_RETURN(bool symmetric, w.Bool("symmetric", true));
  if (bits == 8 && type == "float") {
    MOESHARD_RETURN_IF_ERROR(ParseCtFp8(f, w, strategy, out));
    out.scheme.input_scale = static_acts;
    return Status::Ok();
  }
  if (bits != 4) {
    return w.Error("num_bits", "4 (int4 or fp4 weights) or 8 with type float (fp8)",
                   std::to_string(bits), bits == 8 ? "int8 weights are not supported yet" : "");
  }
  auto want_format = [&](const char* expected, const char* what) -> Status {
    if (out.format == expected) return Status::Ok();
    return f.Error("format", fmt::format("\"{}\" for {}", expected, what),
                   "\"" + out.format + "\"");
  };
  if (type == "float" && out.format == "nvfp4-pack-quantized") {
    // NVFP4: E2M1 with an E4M3 scale per 16 values and a global scale per tensor.
    if (group_size != 16) {
      return w.Error("group_size", "16 for nvfp4 (one E4M3 scale per 16)",
                     std::to_string(group_size));
    }
    if (strategy != "tensor_group") {
      return w.Error("strategy", "\"tensor_group\" for fp4 in groups of 16 (NVFP4)",
                     "\"" + strategy + "\"");
    }
    out.scheme = WeightScheme{WeightFormat::kNvfp4, 16, 1, QuantLayout::kCompressedTensors, acts};
    return Status::Ok();
  }
  if (strategy != "group") return w.Error("strategy", "\"group\"", "\"" + strategy + "\"");
  if (type == "float") {
    out.scheme = WeightScheme::Default(WeightFormat::kMxfp4);
    if (group_size != out.scheme.group) {
      return w.Error("group_size",
                     "32 for mxfp4 (one E8M0 scale per 32; NVFP4 is format nvfp4-pack-quantized)",
                     std::to_string(group_size));
    }
    return want_format("mxfp4-pack-quantized", "4-bit float weights");
  }
  if (type != "int") return w.Error("type", "\"int\" or \"float\"", "\"" + type + "\"");
  MOESHARD_RETURN_IF_ERROR(CheckInt4Group(w, "group_size", group_size));
  MOESHARD_RETURN_IF_ERROR(want_format("pack-quantized", "int4 weights"));
  out.scheme = symmetric ? WeightScheme{WeightFormat::kInt4, group_size, 1}
                         : WeightScheme{WeightFormat::kInt4Zp, group_size, 1,
                                        QuantLayout::kCompressedTensors};
  // The pack-quantized compressor writes `weight_shape` beside each packed weight
  // (Kimi-K2-Thinking's headers; compressed-tensors pack_quantized.py).
  out.weight_shape_meta = true;
  return Status::Ok();
}

// `q` is a quantization_config object, or the content of ModelOpt's hf_quant_config.json;
// `prefix` names its fields in errors ("quantization_config.", or "" for that file).
Result<QuantizationConfig> ParseQuantization(const json& q, const std::string& source,
                                             const std::string& prefix) {
  QuantizationConfig out;
  ConfigFields f(q, source, prefix);
  // hf_quant_config.json names no method, only its producer; vLLM (config.py
  // _parse_quant_hf_config) reads producer "modelopt" as quant_method modelopt.
  const bool modelopt_producer = q.contains("producer") && q["producer"].is_object() &&
                                 q["producer"].value("name", json("")) == "modelopt";
  if (!f.Has("quant_method") && modelopt_producer) {
    out.quant_method = "modelopt";
  } else {
    MOESHARD_ASSIGN_OR_RETURN(out.quant_method, f.String("quant_method", std::nullopt));
  }
  const std::string& m = out.quant_method;
  Status s;
  if (m == "fp8") {
    s = ParseFp8(f, out);
  } else if (m == "mxfp4") {
    out.scheme = WeightScheme::Default(WeightFormat::kMxfp4);
    s = ReadIgnore(f, "modules_to_not_convert", out);
  } else if (m == "compressed-tensors") {
    s = ParseCompressedTensors(f, out);
  } else if (m == "awq") {
    s = ParseAwq(f, out);
  } else if (m == "gptq") {
    s = ParseGptq(f, out);
  } else if (m == "modelopt" || m == "modelopt_fp4") {
    s = ParseModelOpt(f, out);
  } else {
    return f.Error("quant_method",
                   "one of \"fp8\", \"mxfp4\", \"compressed-tensors\", \"awq\", \"gptq\", "
                   "\"modelopt\"",
                   "\"" + m + "\"", "moeshard does not know this quantization");
  }
  MOESHARD_RETURN_IF_ERROR(s);
  return out;
}

// Cross-field consistency checks shared by every family.
Status Validate(const ModelConfig& c, const ConfigFields& f) {
  if (c.num_experts_per_tok > c.num_experts) {
    return f.Error("num_experts_per_tok",
                   fmt::format("<= the number of experts ({})", c.num_experts),
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
      return f.Error("n_group",
                     fmt::format("a divisor of the number of experts ({})", c.num_experts),
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

// ModelOpt 0.29 and earlier keep the quantization in hf_quant_config.json beside config.json;
// vLLM (transformers_utils/config.py get_config) uses it when config.json has none.
struct HfQuantConfig {
  json config;
  std::string source;
};

Result<ModelConfig> ParseRoot(const json& root, const std::string& source, const std::string& name,
                              const HfQuantConfig* hf_quant) {
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
    return top.Error("text_config",
                     fmt::format("the language model's config ({} nests it)", c.family->name),
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
    return f.Error("torch_dtype", "\"bfloat16\", \"float16\" or \"float32\"",
                   "\"" + dtype_name + "\"");
  }

  // quantization_config may sit at the top level or inside text_config.
  const json* q = nullptr;
  bool q_nested = false;
  if (top.Has("quantization_config")) q = &root.at("quantization_config");
  if (!prefix.empty() && f.Has("quantization_config")) {
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
    MOESHARD_ASSIGN_OR_RETURN(
        c.quant, ParseQuantization(*q, source, (q_nested ? prefix : "") + "quantization_config."));
  } else if (hf_quant != nullptr) {
    MOESHARD_ASSIGN_OR_RETURN(c.quant, ParseQuantization(hf_quant->config, hf_quant->source, ""));
  }

  MOESHARD_RETURN_IF_ERROR(c.family->parse(f, top, c));
  if (f.Has("min_moe_intermediate_per_partition")) {
    MOESHARD_ASSIGN_OR_RETURN(c.min_moe_intermediate_per_partition,
                              f.Int("min_moe_intermediate_per_partition", 0));
  }
  MOESHARD_RETURN_IF_ERROR(Validate(c, f));
  return c;
}

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(fmt::format("config: '{}': cannot open the file", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Result<ModelConfig> ParseModelConfig(std::string_view json_text, const std::string& source,
                                     const std::string& name) {
  MOESHARD_ASSIGN_OR_RETURN(json root, ParseJsonStrict(json_text, source));
  return ParseRoot(root, source, name, nullptr);
}

Result<ModelConfig> LoadModelConfigFile(const std::string& path) {
  namespace fs = std::filesystem;
  MOESHARD_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  MOESHARD_ASSIGN_OR_RETURN(json root, ParseJsonStrict(text, path));
  // A checkpoint's config.json reads with the hf_quant_config.json beside it (ModelOpt).
  std::error_code ec;
  const fs::path hf_path = fs::path(path).parent_path() / "hf_quant_config.json";
  if (fs::path(path).filename() != "config.json" || !fs::is_regular_file(hf_path, ec)) {
    return ParseRoot(root, path, path, nullptr);
  }
  MOESHARD_ASSIGN_OR_RETURN(std::string hf_text, ReadFile(hf_path.string()));
  HfQuantConfig hf{json(), hf_path.string()};
  MOESHARD_ASSIGN_OR_RETURN(hf.config, ParseJsonStrict(hf_text, hf.source));
  return ParseRoot(root, path, path, &hf);
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
