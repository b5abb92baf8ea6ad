// Qwen2-MoE (`qwen2_moe`: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): GQA with q/k/v biases (no o
// bias), softmax top-k (renormalised only when norm_topk_prob), one shared expert of
// `shared_expert_intermediate_size` whose output is scaled per token by
// sigmoid(shared_expert_gate . x) (transformers modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock;
// vLLM qwen2_moe.py), MoE every `decoder_sparse_step` layers except `mlp_only_layers`.
// Tensors `model.layers.L.mlp.{gate, shared_expert.*, shared_expert_gate,
// experts.E.{gate,up,down}_proj}`.
#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

Status Parse(const ConfigFields& f, const ConfigFields& /*top*/, ModelConfig& c) {
  MOESHARD_RETURN_IF_ERROR(family::ParseQwenMoe(f, c));
  MOESHARD_ASSIGN_OR_RETURN(c.shared_expert_intermediate_size,
                            f.Int("shared_expert_intermediate_size", 0));
  c.num_shared_experts = c.shared_expert_intermediate_size > 0 ? 1 : 0;
  c.shared_expert_gate = c.num_shared_experts > 0;
  c.attention_bias = true;  // Qwen2Attention: q/k/v always carry biases
  return Status::Ok();
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, "");
  const std::vector<int64_t> moe = family::MoeLayers(c);
  family::AddEmbeddingsAndHead(t);
  family::AddLayerNorms(t);
  family::AddGqaAttention(t, family::AllLayers(c), {.qkv_bias = true});
  family::AddGatedMlp(t, "model.layers.{layer}.mlp", TensorCategory::kDenseMlp, c.intermediate_size,
                      family::DenseLayers(c));
  family::AddRouter(t, "model.layers.{layer}.mlp.gate", moe);
  family::AddSharedExperts(t, "model.layers.{layer}.mlp.shared_expert", moe);
  family::AddSharedExpertGate(t, "model.layers.{layer}.mlp.shared_expert_gate", moe);
  return t.Take();
}

ExpertLayout Experts(const ModelConfig& c) {
  return family::PerExpertLayout(c, "", "model.layers.{layer}.mlp", "gate_proj", "up_proj",
                                 "down_proj");
}

}  // namespace

const FamilyDescriptor& MoeshardFamily_qwen2_moe() {
  static const FamilyDescriptor d{
      .name = "qwen2_moe",
      .model_types = {"qwen2_moe"},
      .summary = "Qwen2-MoE: GQA with q/k/v biases, softmax top-k, a sigmoid-gated shared expert",
      .text_prefix = "",
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
