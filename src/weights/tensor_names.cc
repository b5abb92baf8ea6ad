#include "moeshard/weights/tensor_names.h"

#include <set>

namespace moeshard {
namespace {

std::optional<int64_t> ParseIndex(std::string_view s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

bool EndsWith(std::string_view s, std::string_view suffix) { return s.ends_with(suffix); }

}  // namespace

TensorNameParts ParseTensorName(std::string_view name) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = name.find('.', start);
    parts.push_back(name.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  TensorNameParts out;
  out.leaf = parts.back();
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string_view p = parts[i];
    const std::optional<int64_t> next =
        i + 1 < parts.size() ? ParseIndex(parts[i + 1]) : std::nullopt;
    if (p == "layers" && next && !out.layer_idx) out.layer_idx = next;
    if (p == "shared_experts" || p == "shared_expert") out.in_shared_experts = true;
    if (p == "experts" && !out.in_experts) {
      out.in_experts = true;
      size_t module_idx = i + 1;
      if (next) {
        out.expert_idx = next;
        module_idx = i + 2;
      }
      if (module_idx < parts.size()) out.module = parts[module_idx];
    }
  }
  return out;
}

std::string_view ExpertQuantizationName(ExpertQuantization q) {
  switch (q) {
    case ExpertQuantization::kNone: return "none";
    case ExpertQuantization::kFp8BlockScale: return "fp8 block scales (weight_scale_inv)";
    case ExpertQuantization::kMxfp4Blocks: return "mxfp4 (_blocks/_scales)";
    case ExpertQuantization::kPackedWeightScale: return "packed (weight_packed/weight_scale)";
  }
  return "?";
}

CheckpointStructure SummarizeCheckpoint(std::span<const TensorInfo* const> tensors) {
  CheckpointStructure s;
  std::set<int64_t> layers;
  std::map<int64_t, std::set<int64_t>> expert_ids;  // per-expert tensors
  std::map<int64_t, int64_t> fused_counts;          // fused tensors: leading dim
  bool blocks = false, scales = false, packed = false, packed_scale = false, scale_inv = false;
  for (const TensorInfo* t : tensors) {
    ++s.num_tensors;
    s.total_bytes += t->num_bytes();
    s.bytes_by_dtype[t->dtype] += t->num_bytes();
    ++s.tensors_by_dtype[t->dtype];
    const TensorNameParts parts = ParseTensorName(t->name);
    if (parts.layer_idx) {
      layers.insert(*parts.layer_idx);
      s.max_layer_idx = std::max(s.max_layer_idx.value_or(0), *parts.layer_idx);
    }
    if (parts.in_shared_experts) s.shared_experts = true;
    if (parts.in_experts && parts.layer_idx) {
      if (parts.expert_idx) {
        expert_ids[*parts.layer_idx].insert(*parts.expert_idx);
      } else if (!parts.module.empty() && !t->shape.empty()) {
        // One tensor holds all experts: [num_experts, ...].
        s.fused_experts = true;
        int64_t& n = fused_counts[*parts.layer_idx];
        n = std::max(n, t->shape[0]);
      }
    }
    if (parts.module.starts_with("gate_up_proj") || parts.leaf.starts_with("gate_up_proj")) {
      s.gate_up_fused = true;
    }
    const std::string_view leaf = parts.leaf;
    if (EndsWith(leaf, "_blocks")) blocks = true;
    if (EndsWith(leaf, "_scales")) scales = true;
    if (leaf == "weight_packed") packed = true;
    if (leaf == "weight_scale") packed_scale = true;
    if (leaf == "weight_scale_inv") scale_inv = true;
  }
  s.num_layers = static_cast<int64_t>(layers.size());
  for (const auto& [layer, ids] : expert_ids) {
    s.experts_per_layer[layer] = static_cast<int64_t>(ids.size());
  }
  for (const auto& [layer, n] : fused_counts) {
    s.experts_per_layer[layer] = std::max(s.experts_per_layer[layer], n);
  }
  if (scale_inv) s.quantization.push_back(ExpertQuantization::kFp8BlockScale);
  if (blocks && scales) s.quantization.push_back(ExpertQuantization::kMxfp4Blocks);
  if (packed && packed_scale) s.quantization.push_back(ExpertQuantization::kPackedWeightScale);
  return s;
}

}  // namespace moeshard
