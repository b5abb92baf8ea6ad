// Kimi-K2.5 / K2.6 (`kimi_k25`, KimiK25ForConditionalGeneration): the Kimi-K2 (DeepSeek-V3)
// text backbone nested under `text_config`, with `quantization_config` inside it and every
// text tensor under "language_model." (SGLang kimi_k25.py strips the prefix when loading), and
// a MoonViT vision tower with biases and a LayerNorm patch merger (`patchmerger`). Its
// compressed-tensors `weight_shape` tensors are I32 (the release's header dump; Kimi-K2's are
// I64, checkpoints.md).
#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

constexpr const char* kPrefix = "language_model.";

Status Parse(const ConfigFields& f, const ConfigFields& top, ModelConfig& c) {
  MOESHARD_RETURN_IF_ERROR(family::ParseDeepseekText(f, c));
  return family::ParseMoonVit(top, c);
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, kPrefix);
  family::AddDeepseekTextTensors(t);
  std::vector<TensorDef> out = t.Take();
  family::AddMoonVit(c, out);
  return out;
}

ExpertLayout Experts(const ModelConfig& c) { return family::DeepseekExperts(c, kPrefix); }

}  // namespace

const FamilyDescriptor& MoeshardFamily_kimi_k25() {
  static const FamilyDescriptor d{
      .name = "kimi_k25",
      .model_types = {"kimi_k25"},
      .summary = "Kimi-K2.5/K2.6: Kimi-K2 text backbone under language_model., int4 experts",
      .text_prefix = kPrefix,
      .nested_text_config = true,
      .shape_meta_dtype = DType::kI32,
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
