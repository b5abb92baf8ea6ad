// Llama-4 Scout and Maverick (`llama4`: Llama4ForConditionalGeneration, the language model
// `llama4_text` nested under text_config, its tensors under "language_model."): GQA without
// biases (the q/k norm is a weightless L2 norm), MoE every `interleave_moe_layer_step` layers
// (Scout: all, Maverick: every second; transformers Llama4TextConfig.moe_layers, vLLM
// llama4.py), the others dense of `intermediate_size_mlp`. The MoE block: top-1 over the router
// logits, the weight sigmoid(logit) applied to the expert's input (vLLM
// apply_router_weight_on_input), plus one shared expert of `intermediate_size` (not gated).
// Experts are stored fused and input-major: `feed_forward.experts.gate_up_proj` [E, H, 2I]
// (gate columns first, then up) and `down_proj` [E, I, H].
//
// The vision tower (vision_config; vLLM mllama4.py Llama4VisionModel, transformers
// modeling_llama4.py, names as the released checkpoints store them, without the text prefix):
// `vision_model.patch_embedding.linear` [Hv, C * P * P] (an unfold + linear, no bias), a class
// token `class_embedding` [Hv] and `positional_embedding_vlm` [(image_size / P)^2 + 1, Hv],
// LayerNorms `layernorm_pre` / `layernorm_post`, `num_hidden_layers` encoder layers
// `vision_model.model.layers.L.{self_attn.{q,k,v,o}_proj, mlp.fc1, mlp.fc2}` with biases and
// `input_layernorm` / `post_attention_layernorm` LayerNorms, the pixel-shuffle adapter
// `vision_model.vision_adapter.mlp.{fc1 [projector_input_dim, intermediate_size], fc2
// [projector_output_dim, projector_input_dim]}` (biases only with multi_modal_projector_bias),
// and the projector `multi_modal_projector.linear_1` [hidden_size, vision_output_dim], all BF16.
// Splits as vLLM: q/k/v and fc1 column-parallel by head, o_proj and fc2 row-parallel, the patch
// embedding column-parallel, the adapter's fc1 column- and fc2 row-parallel, only when TP
// divides the vision heads (vLLM asserts it, or runs the encoder data-parallel: replicated);
// the class token, position table and norms replicated; the projector column-parallel over TP
// whatever the encoder mode (ColumnParallelLinear with gather_output). Every pipeline stage
// loads it.
#include <fmt/format.h>

#include <cmath>
#include <set>

#include "config/config_fields.h"
#include "config/family_blocks.h"

namespace moeshard {
namespace {

constexpr const char* kPrefix = "language_model.";

// vision_config (absent: a text-only checkpoint). No defaults for the tower's sizes:
// transformers' Llama4VisionConfig defaults (hidden 768, vision_output_dim 7680, image 448) are
// not the released model's.
Status ParseVision(const ConfigFields& top, ModelConfig& c) {
  if (!top.Has("vision_config")) return Status::Ok();
  MOESHARD_ASSIGN_OR_RETURN(ConfigFields v, top.Object("vision_config"));
  VisionConfig& x = c.vision;
  MOESHARD_ASSIGN_OR_RETURN(x.num_layers, v.Int("num_hidden_layers", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.hidden_size, v.Int("hidden_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.intermediate_size, v.Int("intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.num_heads, v.Int("num_attention_heads", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.in_channels, v.Int("num_channels", 3, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.patch_size, v.Int("patch_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(int64_t image, v.Int("image_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.projector_input_dim, v.Int("projector_input_dim", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.projector_output_dim, v.Int("projector_output_dim", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(int64_t vision_out, v.Int("vision_output_dim", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.projector_bias, v.Bool("multi_modal_projector_bias", false));
  MOESHARD_ASSIGN_OR_RETURN(double ratio, v.Double("pixel_shuffle_ratio", 0.5));
  x.qkv_hidden_size = x.hidden_size;
  x.linear_bias = true;
  x.norm_bias = true;
  if (image % x.patch_size != 0) {
    return v.Error("image_size", fmt::format("a multiple of patch_size ({})", x.patch_size),
                   std::to_string(image));
  }
  const int64_t side = image / x.patch_size;
  x.num_positions = side * side + 1;  // the patches and the class token
  // The pixel shuffle merges 1 / ratio^2 patches (0.5: four).
  const double merge = ratio > 0 ? 1.0 / (ratio * ratio) : 0.0;
  if (!(ratio > 0 && ratio <= 1) || std::abs(merge - std::round(merge)) > 1e-9) {
    return v.Error("pixel_shuffle_ratio", "1 / n with n a whole number (0.5 in the releases)",
                   fmt::format("{}", ratio));
  }
  x.merge_tokens = static_cast<int64_t>(std::round(merge));
  if (x.hidden_size % x.num_heads != 0) {
    return v.Error("hidden_size",
                   fmt::format("a multiple of num_attention_heads ({})", x.num_heads),
                   std::to_string(x.hidden_size));
  }
  if (vision_out != x.projector_output_dim) {
    return v.Error("vision_output_dim",
                   fmt::format("projector_output_dim ({}): the adapter's output is the "
                               "projector's input",
                               x.projector_output_dim),
                   std::to_string(vision_out));
  }
  return Status::Ok();
}

// The vision tower, adapter and projector (see the file comment).
void AddVision(const ModelConfig& c, std::vector<TensorDef>& out) {
  const VisionConfig& v = c.vision;
  if (v.num_layers == 0) return;
  family::TensorList t(c, "");
  const auto rep = TpSplit::kReplicated, col = TpSplit::kColumn, row = TpSplit::kRow;
  const int64_t Hv = v.hidden_size, Iv = v.intermediate_size;
  const int64_t Pin = v.projector_input_dim, Pout = v.projector_output_dim;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, TpSplit split) {
    family::AddVisionTensor(t, name, std::move(shape), split, v.num_heads);
  };
  const std::string p = "vision_model.";
  add(p + "class_embedding", {Hv}, rep);
  add(p + "positional_embedding_vlm", {v.num_positions, Hv}, rep);
  add(p + "patch_embedding.linear.weight", {Hv, v.in_channels * v.patch_size * v.patch_size}, col);
  for (const char* norm : {"layernorm_pre", "layernorm_post"}) {
    add(p + norm + ".weight", {Hv}, rep);
    add(p + norm + ".bias", {Hv}, rep);
  }
  for (int64_t l = 0; l < v.num_layers; ++l) {
    const std::string k = fmt::format("{}model.layers.{}.", p, l);
    for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
      add(k + "self_attn." + proj + ".weight", {Hv, Hv}, col);
      add(k + "self_attn." + proj + ".bias", {Hv}, col);
    }
    add(k + "self_attn.o_proj.weight", {Hv, Hv}, row);
    add(k + "self_attn.o_proj.bias", {Hv}, rep);  // a row-parallel layer's bias, whole
    add(k + "mlp.fc1.weight", {Iv, Hv}, col);
    add(k + "mlp.fc1.bias", {Iv}, col);
    add(k + "mlp.fc2.weight", {Hv, Iv}, row);
    add(k + "mlp.fc2.bias", {Hv}, rep);
    for (const char* norm : {"input_layernorm", "post_attention_layernorm"}) {
      add(k + norm + ".weight", {Hv}, rep);
      add(k + norm + ".bias", {Hv}, rep);
    }
  }
  add(p + "vision_adapter.mlp.fc1.weight", {Pin, Iv}, col);
  add(p + "vision_adapter.mlp.fc2.weight", {Pout, Pin}, row);
  if (v.projector_bias) {
    add(p + "vision_adapter.mlp.fc1.bias", {Pin}, col);
    add(p + "vision_adapter.mlp.fc2.bias", {Pout}, rep);
  }
  // Column-parallel over TP in every encoder mode (heads 0: split whatever the vision heads).
  family::AddVisionTensor(t, "multi_modal_projector.linear_1.weight", {c.hidden_size, Pout}, col,
                          /*heads=*/0);
  for (TensorDef& d : t.Take()) out.push_back(std::move(d));
}

Status Parse(const ConfigFields& f, const ConfigFields& top, ModelConfig& c) {
  MOESHARD_RETURN_IF_ERROR(family::ParseGqa(f, c));
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size, f.Int("intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size_mlp", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts,
                            f.IntAlias({"num_local_experts", "num_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts_per_tok, f.Int("num_experts_per_tok", 1, 1));
  if (c.num_experts_per_tok != 1) {
    return f.Error("num_experts_per_tok",
                   "1 (Llama-4 applies the routing weight to the expert input, top-1 only)",
                   std::to_string(c.num_experts_per_tok));
  }
  MOESHARD_ASSIGN_OR_RETURN(int64_t step, f.Int("interleave_moe_layer_step", 1, 1));
  std::set<int64_t> moe_layers;
  if (f.Has("moe_layers")) {
    MOESHARD_ASSIGN_OR_RETURN(std::vector<int64_t> l, f.IntList("moe_layers", 0, c.num_layers - 1));
    moe_layers.insert(l.begin(), l.end());
  } else {
    for (int64_t i = step - 1; i < c.num_layers; i += step) moe_layers.insert(i);
  }
  MOESHARD_RETURN_IF_ERROR(f.Choice("hidden_act", "silu", {"silu"}).status());
  c.num_shared_experts = 1;
  c.shared_expert_intermediate_size = c.moe_intermediate_size;
  c.activation = ExpertActivation::kSwiGlu;
  c.scoring = ScoringFunc::kSigmoid;
  c.routing = RoutingMethod::kTopKThenSigmoid;
  c.router_weight_on_input = true;
  c.routed_expert_hidden_size = c.hidden_size;
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerSpec{});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    c.layers[static_cast<size_t>(i)].moe = moe_layers.count(i) > 0;
  }
  return ParseVision(top, c);
}

std::vector<TensorDef> Tensors(const ModelConfig& c) {
  family::TensorList t(c, kPrefix);
  const std::vector<int64_t> moe = family::MoeLayers(c);
  family::AddEmbeddingsAndHead(t);
  family::AddLayerNorms(t);
  family::AddGqaAttention(t, family::AllLayers(c), {});
  family::AddGatedMlp(t, "model.layers.{layer}.feed_forward", TensorCategory::kDenseMlp,
                      c.intermediate_size, family::DenseLayers(c));
  family::AddRouter(t, "model.layers.{layer}.feed_forward.router", moe);
  family::AddSharedExperts(t, "model.layers.{layer}.feed_forward.shared_expert", moe);
  std::vector<TensorDef> out = t.Take();
  AddVision(c, out);
  return out;
}

ExpertLayout Experts(const ModelConfig& /*c*/) {
  ExpertLayout x;
  const std::string base = std::string(kPrefix) + "model.layers.{layer}.feed_forward.experts.";
  x.rank_prefix = base;
  x.fused = true;
  x.fused_gate_up = base + "gate_up_proj";
  x.fused_down = base + "down_proj";
  x.gate_up_interleaved = false;
  x.fused_in_major = true;
  return x;
}

}  // namespace

const FamilyDescriptor& MoeshardFamily_llama4() {
  static const FamilyDescriptor d{
      .name = "llama4",
      .model_types = {"llama4"},
      .summary =
          "Llama-4: GQA, interleaved MoE, top-1 sigmoid on the expert input, shared expert, "
          "a ViT",
      .text_prefix = kPrefix,
      .nested_text_config = true,
      .parse = Parse,
      .tensors = Tensors,
      .experts = Experts,
  };
  return d;
}

}  // namespace moeshard
