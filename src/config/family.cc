#include "moeshard/config/family.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace moeshard {

namespace internal {
const std::vector<const FamilyDescriptor*>& RegisteredFamilies();  // generated
}  // namespace internal

const char* TensorCategoryName(TensorCategory c) {
  switch (c) {
    case TensorCategory::kEmbedding: return "embedding";
    case TensorCategory::kAttention: return "attention";
    case TensorCategory::kDenseMlp: return "dense_mlp";
    case TensorCategory::kRouter: return "router";
    case TensorCategory::kSharedExperts: return "shared_experts";
    case TensorCategory::kLatentProj: return "latent_proj";
    case TensorCategory::kRoutedExperts: return "routed_experts";
    case TensorCategory::kNorm: return "norms";
    case TensorCategory::kLmHead: return "lm_head";
    case TensorCategory::kVision: return "vision";
  }
  return "?";
}

const char* TensorRoleName(TensorRole r) {
  switch (r) {
    case TensorRole::kOther: return "other";
    case TensorRole::kPreMoeNorm: return "pre_moe_norm";
    case TensorRole::kRouter: return "router";
    case TensorRole::kRouterBias: return "router_bias";
    case TensorRole::kCorrectionBias: return "correction_bias";
    case TensorRole::kHashTable: return "hash_table";
    case TensorRole::kSharedGate: return "shared_gate";
    case TensorRole::kSharedUp: return "shared_up";
    case TensorRole::kSharedDown: return "shared_down";
    case TensorRole::kSharedGateProj: return "shared_expert_gate";
    case TensorRole::kLatentDown: return "latent_down";
    case TensorRole::kLatentUp: return "latent_up";
    case TensorRole::kLatentNorm: return "latent_norm";
    case TensorRole::kExpertsW13: return "experts_w13";
    case TensorRole::kExpertsW2: return "experts_w2";
    case TensorRole::kExpertsW13Bias: return "experts_w13_bias";
    case TensorRole::kExpertsW2Bias: return "experts_w2_bias";
  }
  return "?";
}

std::span<const FamilyDescriptor* const> Families() {
  static const std::vector<const FamilyDescriptor*> sorted = [] {
    std::vector<const FamilyDescriptor*> v = internal::RegisteredFamilies();
    std::sort(v.begin(), v.end(), [](const FamilyDescriptor* a, const FamilyDescriptor* b) {
      return a->name < b->name;
    });
    return v;
  }();
  return sorted;
}

const FamilyDescriptor* FindFamily(std::string_view model_type) {
  for (const FamilyDescriptor* f : Families()) {
    for (std::string_view t : f->model_types) {
      if (t == model_type) return f;
    }
  }
  return nullptr;
}

std::string KnownModelTypes() {
  std::vector<std::string_view> types;
  for (const FamilyDescriptor* f : Families()) {
    for (std::string_view t : f->model_types) types.push_back(t);
  }
  std::sort(types.begin(), types.end());
  return fmt::format("{}", fmt::join(types, ", "));
}

std::string ExpandName(std::string_view name_template, int64_t layer, int64_t expert) {
  std::string out(name_template);
  auto replace = [&out](std::string_view ph, int64_t v) {
    if (v < 0) return;
    if (const size_t pos = out.find(ph); pos != std::string::npos) {
      out.replace(pos, ph.size(), std::to_string(v));
    }
  };
  replace("{layer}", layer);
  replace("{expert}", expert);
  return out;
}

namespace {

// Replaces the decimal index after the first `marker` ("layers.") with `placeholder`.
int64_t ExtractIndex(std::string& name, std::string_view marker, std::string_view placeholder) {
  size_t pos = 0;
  while ((pos = name.find(marker, pos)) != std::string::npos) {
    // The marker must start a component.
    if (pos == 0 || name[pos - 1] == '.') break;
    pos += marker.size();
  }
  if (pos == std::string::npos) return -1;
  const size_t begin = pos + marker.size();
  size_t end = begin;
  while (end < name.size() && end - begin < 10 && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == begin || end - begin >= 10 || (end < name.size() && name[end] != '.')) return -1;
  const int64_t v = std::stoll(name.substr(begin, end - begin));
  name.replace(begin, end - begin, placeholder);
  return v;
}

}  // namespace

NameKey KeyOfName(std::string_view name) {
  NameKey k;
  k.key = std::string(name);
  k.layer = ExtractIndex(k.key, "layers.", "{layer}");
  k.expert = ExtractIndex(k.key, "experts.", "{expert}");
  return k;
}

bool IsMtpTensor(const ModelConfig& m, std::string_view name, int64_t* mtp_layer) {
  const int64_t layer = KeyOfName(name).layer;
  int64_t at = -1;
  bool mtp = false;
  if (m.family != nullptr && !m.family->mtp_prefix.empty() &&
      name.substr(0, m.family->mtp_prefix.size()) == m.family->mtp_prefix) {
    mtp = true;
    if (layer >= 0) {
      at = m.num_layers + layer;
    } else {
      // DeepSeek-V4 numbers its MTP blocks right after the prefix: "mtp.0.ffn...".
      size_t p = m.family->mtp_prefix.size();
      int64_t i = 0;
      const size_t digits = p;
      while (p < name.size() && name[p] >= '0' && name[p] <= '9') i = 10 * i + (name[p++] - '0');
      if (p > digits && p < name.size() && name[p] == '.') at = m.num_layers + i;
    }
  } else if (layer >= m.num_layers && layer < m.num_layers + m.num_mtp_layers) {
    mtp = true;
    at = layer;
  }
  if (mtp && mtp_layer != nullptr) *mtp_layer = at;
  return mtp;
}

}  // namespace moeshard
