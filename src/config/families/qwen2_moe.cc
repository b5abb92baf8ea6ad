// Qwen2-MoE (`qwen2_moe`: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): GQA with q/k/v biases (no o
// bias), softmax top-k (renormalised only when norm_topk_prob), one shared expert of
// `shared_expert_intermediate_size` whose output is scaled per token by
// sigmoid(shared_expert_gate . x) (transformers modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock;
// vLLM qwen2_moe.py), MoE every `decoder_sparse_step` layers except `mlp_only_layers`.
// Tensors `model.layers.L.mlp.{gate, shared_expert.*, shared_expert_gate,
// experts.E.{gate,up,down}_proj}`.
#include <set>

#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

Status Parse(const ConfigFields& f, const ConfigFields& /*top*/, ModelConfig& c) {
  MOESHARD_RETURN_IF_ERROR(family::ParseGqa(f, c));
  MOESHARD_ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size,
                            f.Int("moe_intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts,
                            f.IntAlias({"num_experts", "num_local_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts_per_tok,
                            f.IntAlias({"num_experts_per_tok"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool("norm_topk_prob", false));
  MOESHARD_ASSIGN_OR_RETURN(c.shared_expert_intermediate_size,
                            f.Int("shared_expert_intermediate_size", 0));
  c.num_shared_experts = c.shared_expert_intermediate_size > 0 ? 1 : 0;
  c.shared_expert_gate = c.num_shared_experts > 0;
  MOESHARD_ASSIGN_OR_RETURN(int64_t step, f.Int("decoder_sparse_step", 1, 1));
  std::set<int64_t> mlp_only;
  if (f.Has("mlp_only_layers")) {
    MOESHARD_ASSIGN_OR_RETURN(std::vector<int64_t> l,
                              f.IntList("mlp_only_layers", 0, c.num_layers - 1));
    mlp_only.insert(l.begin(), l.end());
  }
  MOESHARD_RETURN_IF_ERROR(f.Choice("hidden_act", "silu", {"silu"}).status());
  c.attention_bias = true;  // Qwen2Attention: q/k/v always carry biases
  c.activation = ExpertActivation::kSwiGlu;
  c.scoring = ScoringFunc::kSoftmax;
  c.routing = RoutingMethod::kSoftmaxTopK;
  c.routed_expert_hidden_size = c.hidden_size;
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerSpec{});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    c.layers[static_cast<size_t>(i)].moe = !mlp_only.count(i) && (i + 1) % step == 0;
  }
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
