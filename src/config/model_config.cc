#include "moeshard/config/model_config.h"

#include <regex>

#include "moeshard/config/family.h"

namespace moeshard {

namespace {

// Glob match with '*' matching any run of characters (gpt-oss modules_to_not_convert).
bool GlobMatch(const std::string& pattern, const std::string& text) {
  size_t p = 0, t = 0, star = std::string::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (p < pattern.size() && pattern[p] == text[t]) {
      ++p;
      ++t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace

bool QuantizationConfig::IsIgnored(const std::string& module) const {
  for (const std::string& entry : ignore) {
    if (entry.rfind("re:", 0) == 0) {
      // compressed-tensors matches regexes against the module name with re.match semantics.
      if (std::regex_search(module, std::regex("^(?:" + entry.substr(3) + ")"))) return true;
    } else if (entry.find('*') != std::string::npos) {
      // Globs name a module or any of its submodules.
      if (GlobMatch(entry, module) || GlobMatch(entry + ".*", module)) return true;
    } else if (module == entry || module.rfind(entry + ".", 0) == 0) {
      return true;
    }
  }
  return false;
}

int64_t ModelConfig::num_moe_layers() const {
  int64_t n = 0;
  for (const LayerSpec& l : layers) n += l.moe ? 1 : 0;
  return n;
}

int64_t ModelConfig::num_hash_layers() const {
  int64_t n = 0;
  for (const LayerSpec& l : layers) n += l.hash_routing ? 1 : 0;
  return n;
}

int64_t ModelConfig::num_layers_of(AttentionKind kind) const {
  int64_t n = 0;
  for (const LayerSpec& l : layers) n += l.attention == kind ? 1 : 0;
  return n;
}

std::string_view ModelConfig::family_name() const {
  return family != nullptr ? family->name : std::string_view("?");
}

const char* AttentionKindName(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kMla: return "mla";
    case AttentionKind::kGqa: return "gqa";
    case AttentionKind::kKda: return "kda";
    case AttentionKind::kGatedDeltaNet: return "gated_deltanet";
    case AttentionKind::kCompressedMqa: return "compressed_mqa";
  }
  return "?";
}

const char* ExpertActivationName(ExpertActivation act) {
  switch (act) {
    case ExpertActivation::kSwiGlu: return "swiglu";
    case ExpertActivation::kSwiGluOai: return "swiglu-oai";
    case ExpertActivation::kSitu: return "situ";
    case ExpertActivation::kRelu2: return "relu2";
    case ExpertActivation::kGeluTanh: return "gelu-tanh";
    case ExpertActivation::kSwiGluClamp: return "swiglu-clamp";
  }
  return "?";
}

const char* RoutingMethodName(RoutingMethod method) {
  switch (method) {
    case RoutingMethod::kSoftmaxTopK: return "softmax-topk";
    case RoutingMethod::kSigmoidGroupedTopK: return "sigmoid-grouped-topk";
    case RoutingMethod::kTopKThenSoftmax: return "topk-softmax";
    case RoutingMethod::kSoftmaxGroupedTopK: return "softmax-grouped-topk";
    case RoutingMethod::kTopKThenSigmoid: return "topk-sigmoid";
    case RoutingMethod::kSqrtSoftplusTopK: return "sqrtsoftplus-topk";
  }
  return "?";
}

}  // namespace moeshard
