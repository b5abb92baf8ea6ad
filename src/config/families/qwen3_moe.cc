// Qwen3-MoE (`qwen3_moe`: Qwen3-30B-A3B, Qwen3-235B-A22B): GQA with q/k norms, softmax top-k
// routing (renormalised when norm_topk_prob), no shared expert, MoE every
// `decoder_sparse_step` layers except `mlp_only_layers`. Configs written by transformers 5
// spell the expert count `num_local_experts` (older ones `num_experts`).
#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

Status Parse(const ConfigFields& f, const ConfigFields& /*top*/, ModelConfig& c) {
  return family::ParseQwenMoe(f, c);
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, "");
  family::AddEmbeddingsAndHead(t);
  family::AddLayerNorms(t);
  family::AddGqaAttention(t, family::AllLayers(c), {.bias = c.attention_bias, .qk_norm = true});
  family::AddGatedMlp(t, "model.layers.{layer}.mlp", TensorCategory::kDenseMlp, c.intermediate_size,
                      family::DenseLayers(c));
  family::AddRouter(t, "model.layers.{layer}.mlp.gate", family::MoeLayers(c));
  return t.Take();
}

ExpertLayout Experts(const ModelConfig& c) {
  return family::PerExpertLayout(c, "", "model.layers.{layer}.mlp", "gate_proj", "up_proj",
                                 "down_proj");
}

}  // namespace

const FamilyDescriptor& MoeshardFamily_qwen3_moe() {
  static const FamilyDescriptor d{
      .name = "qwen3_moe",
      .model_types = {"qwen3_moe"},
      .summary = "Qwen3-MoE: GQA with q/k norms, softmax top-k, no shared expert",
      .text_prefix = "",
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
