// gpt-oss (`gpt_oss`: gpt-oss-20b, -120b): GQA with biases and per-head sinks, alternating
// sliding-window and full attention (`layer_types`), a router with a bias, top-k over logits
// then softmax over the k, SwiGLU-OAI experts with biases. Experts are stored fused over E
// (llama.cpp conversion/gpt_oss.py): gate_up_proj with gate and up rows interleaved (row 2j
// gate j, 2j+1 up j), in MXFP4 as `<module>_blocks` U8 [E, out, in/32, 16] and `_scales` U8
// [E, out, in/32]; biases `<module>_bias` BF16 [E, out]; bf16 releases store the matrices
// input-major ([E, in, out]). MXFP4 covers only the experts.
#include <fmt/format.h>

#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

Status Parse(const ConfigFields& f, const ConfigFields& /*top*/, ModelConfig& c) {
  MOESHARD_RETURN_IF_ERROR(family::ParseGqa(f, c, /*head_dim_required=*/true,
                                            /*attention_bias_default=*/true));
  c.attention_sinks = true;
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size, f.Int("intermediate_size", std::nullopt, 1));
  c.intermediate_size = c.moe_intermediate_size;
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts,
                            f.IntAlias({"num_local_experts", "num_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(
      c.num_experts_per_tok,
      f.IntAlias({"num_experts_per_tok", "experts_per_token"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.sliding_window, f.Int("sliding_window", 0));
  MOESHARD_ASSIGN_OR_RETURN(c.swiglu_limit, f.Double("swiglu_limit", 7.0));
  c.activation = ExpertActivation::kSwiGluOai;
  c.scoring = ScoringFunc::kSoftmax;
  c.routing = RoutingMethod::kTopKThenSoftmax;
  c.norm_topk_prob = true;
  c.router_bias = true;
  c.expert_bias = true;
  c.routed_expert_hidden_size = c.hidden_size;
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerSpec{AttentionKind::kGqa, true, false});
  if (f.Has("layer_types")) {
    const nlohmann::json& lt = f.Raw("layer_types");
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.num_layers) {
      return f.Error("layer_types", fmt::format("an array of {} layer types", c.num_layers),
                     lt.is_array() ? fmt::format("{} entries", lt.size()) : lt.dump());
    }
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const nlohmann::json& e = lt[static_cast<size_t>(i)];
      if (e == "sliding_attention") {
        c.layers[static_cast<size_t>(i)].sliding = true;
      } else if (e != "full_attention") {
        return f.Error("layer_types", "\"sliding_attention\" or \"full_attention\"", e.dump());
      }
    }
  }
  return Status::Ok();
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, "");
  family::AddEmbeddingsAndHead(t);
  family::AddLayerNorms(t);
  family::AddGqaAttention(t, family::AllLayers(c),
                          {.quant = family::Quantizable::kNo, .bias = true, .sinks = true});
  family::AddRouter(t, "model.layers.{layer}.mlp.router", family::MoeLayers(c));
  return t.Take();
}

ExpertLayout Experts(const ModelConfig& /*c*/) {
  ExpertLayout x;
  x.rank_prefix = "model.layers.{layer}.mlp.experts.";
  x.fused = true;
  x.fused_gate_up = "model.layers.{layer}.mlp.experts.gate_up_proj";
  x.fused_down = "model.layers.{layer}.mlp.experts.down_proj";
  x.gate_up_interleaved = true;
  x.fused_in_major = true;
  x.fused_weight_suffix = "_blocks";
  x.fused_scale_suffix = "_scales";
  x.bias_suffix = "_bias";
  x.bias_dtype = DType::kBF16;
  return x;
}

}  // namespace

const FamilyDescriptor& MoeshardFamily_gpt_oss() {
  static const FamilyDescriptor d{
      .name = "gpt_oss",
      .model_types = {"gpt_oss"},
      .summary = "gpt-oss: GQA with sinks, fused interleaved MXFP4 experts with biases",
      .text_prefix = "",
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
