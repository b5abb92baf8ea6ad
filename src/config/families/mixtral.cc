// Mixtral (`mixtral`): GQA, full-width experts (`intermediate_size` is the expert width),
// softmax top-2 renormalised; the MoE module is `block_sparse_moe` with experts w1 (gate),
// w3 (up), w2 (down).
#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

Status Parse(const ConfigFields& f, const ConfigFields& /*top*/, ModelConfig& c) {
  MOESHARD_RETURN_IF_ERROR(family::ParseGqa(f, c));
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size, f.Int("intermediate_size", std::nullopt, 1));
  c.intermediate_size = c.moe_intermediate_size;
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts,
                            f.IntAlias({"num_local_experts", "num_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts_per_tok,
                            f.IntAlias({"num_experts_per_tok"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.sliding_window, f.Int("sliding_window", 0));
  MOESHARD_RETURN_IF_ERROR(f.Choice("hidden_act", "silu", {"silu"}).status());
  c.activation = ExpertActivation::kSwiGlu;
  c.scoring = ScoringFunc::kSoftmax;
  c.routing = RoutingMethod::kSoftmaxTopK;
  c.norm_topk_prob = true;  // Mixtral renormalises the top-2
  c.routed_expert_hidden_size = c.hidden_size;
  c.layers.assign(static_cast<size_t>(c.num_layers),
                  LayerSpec{AttentionKind::kGqa, true, c.sliding_window > 0});
  return Status::Ok();
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, "");
  family::AddEmbeddingsAndHead(t);
  family::AddLayerNorms(t);
  family::AddGqaAttention(t, family::AllLayers(c), {});
  family::AddRouter(t, "model.layers.{layer}.block_sparse_moe.gate", family::MoeLayers(c));
  return t.Take();
}

ExpertLayout Experts(const ModelConfig& c) {
  return family::PerExpertLayout(c, "", "model.layers.{layer}.block_sparse_moe", "w1", "w3", "w2");
}

}  // namespace

const FamilyDescriptor& MoeshardFamily_mixtral() {
  static const FamilyDescriptor d{
      .name = "mixtral",
      .model_types = {"mixtral"},
      .summary = "Mixtral: GQA, full-width experts w1/w3/w2, softmax top-2",
      .text_prefix = "",
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
