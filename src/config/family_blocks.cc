#include "config/family_blocks.h"

#include <fmt/format.h>

#include <functional>
#include <set>

#include "config/config_fields.h"

namespace moeshard::family {
namespace {

std::vector<int64_t> LayersWhere(const ModelConfig& c,
                                 const std::function<bool(const LayerSpec&)>& keep) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (keep(c.layers[static_cast<size_t>(i)])) out.push_back(i);
  }
  return out;
}

}  // namespace

std::vector<int64_t> AllLayers(const ModelConfig& c) {
  return LayersWhere(c, [](const LayerSpec&) { return true; });
}
std::vector<int64_t> MoeLayers(const ModelConfig& c) {
  return LayersWhere(c, [](const LayerSpec& l) { return l.moe; });
}
std::vector<int64_t> DenseLayers(const ModelConfig& c) {
  return LayersWhere(c, [](const LayerSpec& l) { return !l.moe; });
}
std::vector<int64_t> LayersOf(const ModelConfig& c, AttentionKind kind) {
  return LayersWhere(c, [kind](const LayerSpec& l) { return l.attention == kind; });
}

TensorDef& TensorList::Add(TensorDef t) {
  if (rename_ != nullptr) t.name = rename_(t.name);
  if (t.where == StagePlacement::kLayers && t.layers.empty()) {
    dropped_ = std::move(t);
    return dropped_;
  }
  out_.push_back(std::move(t));
  return out_.back();
}

TensorDef& TensorList::Linear(const std::string& module, TensorCategory cat, int64_t out,
                              int64_t in, TpSplit split, const std::vector<int64_t>& layers,
                              Quantizable q, TensorRole role) {
  TensorDef t;
  t.name = prefix_ + module;
  t.linear = true;
  t.role = role;
  t.category = cat;
  t.dtype = c_.dtype;
  t.shape = {out, in};
  t.split = split;
  t.layers = layers;
  // Its format is chosen per layer in Take(), once the ignore list has seen every layer's name.
  const bool quantizable = q == Quantizable::kYes && c_.quant.enabled() && !layers.empty();
  std::string module_template = t.name;
  TensorDef& added = Add(std::move(t));
  if (quantizable && &added != &dropped_) {
    quantizable_.emplace_back(out_.size() - 1, std::move(module_template));
  }
  return added;
}

std::vector<TensorDef> TensorList::Take() {
  // Back to front, so that inserting a split-off entry leaves the earlier indices valid.
  for (auto it = quantizable_.rbegin(); it != quantizable_.rend(); ++it) {
    TensorDef& def = out_[it->first];
    // Ignore lists name modules as the family's code does or as the checkpoint stores them
    // (they differ where a rename applies: Qwen3.5's model.language_model.*).
    auto ignored = [&](int64_t layer) {
      return c_.quant.IsIgnored(ExpandName(it->second, layer)) ||
             c_.quant.IsIgnored(ExpandName(def.name, layer));
    };
    const bool front_ignored = ignored(def.layers.front());
    std::vector<int64_t> same, other;
    for (int64_t layer : def.layers)
      (ignored(layer) == front_ignored ? same : other).push_back(layer);
    auto set_format = [&](TensorDef& d, bool is_ignored) {
      d.format = is_ignored ? WeightScheme{} : c_.quant.scheme;
      d.shape_meta = !is_ignored && c_.quant.weight_shape_meta;
    };
    set_format(def, front_ignored);
    if (other.empty()) continue;
    TensorDef split = def;
    def.layers = std::move(same);
    split.layers = std::move(other);
    set_format(split, !front_ignored);
    out_.insert(out_.begin() + static_cast<std::ptrdiff_t>(it->first) + 1, std::move(split));
  }
  quantizable_.clear();
  return std::move(out_);
}

TensorDef& TensorList::Vector(const std::string& name, TensorCategory cat,
                              std::vector<int64_t> shape, TpSplit split,
                              const std::vector<int64_t>& layers, DType dtype, TensorRole role) {
  TensorDef t;
  t.name = prefix_ + name;
  t.role = role;
  t.category = cat;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.split = split;
  t.layers = layers;
  return Add(std::move(t));
}

TensorDef& TensorList::Global(const std::string& name, TensorCategory cat,
                              std::vector<int64_t> shape, TpSplit split, StagePlacement where,
                              DType dtype) {
  TensorDef t;
  t.name = prefix_ + name;
  t.category = cat;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.split = split;
  t.where = where;
  return Add(std::move(t));
}

TensorDef& TensorList::GlobalLinear(const std::string& module, TensorCategory cat, int64_t out,
                                    int64_t in, TpSplit split, StagePlacement where,
                                    Quantizable q) {
  TensorDef t;
  t.name = prefix_ + module;
  t.linear = true;
  t.category = cat;
  t.dtype = c_.dtype;
  t.shape = {out, in};
  t.split = split;
  t.where = where;
  const bool ignored =
      c_.quant.IsIgnored(t.name) || (rename_ != nullptr && c_.quant.IsIgnored(rename_(t.name)));
  if (q == Quantizable::kYes && c_.quant.enabled() && !ignored) {
    t.format = c_.quant.scheme;
    t.shape_meta = c_.quant.weight_shape_meta;
  }
  return Add(std::move(t));
}

void AddEmbeddingsAndHead(TensorList& t) {
  const ModelConfig& c = t.config();
  using C = TensorCategory;
  const int64_t V = c.vocab_size, H = c.hidden_size;
  const TensorDef& embed = t.Global("model.embed_tokens.weight", C::kEmbedding, {V, H},
                                    TpSplit::kColumn, StagePlacement::kFirstStage, c.dtype);
  const std::string embed_name = embed.name;
  TensorDef& head = t.Global("lm_head.weight", C::kLmHead, {V, H}, TpSplit::kColumn,
                             StagePlacement::kLastStage, c.dtype);
  if (c.tie_word_embeddings) head.tied_source = embed_name;
  t.Global("model.norm.weight", C::kNorm, {H}, TpSplit::kReplicated, StagePlacement::kLastStage,
           c.dtype);
}

void AddLayerNorms(TensorList& t) {
  const ModelConfig& c = t.config();
  const std::vector<int64_t> all = AllLayers(c);
  t.Vector("model.layers.{layer}.input_layernorm.weight", TensorCategory::kNorm, {c.hidden_size},
           TpSplit::kReplicated, all, c.dtype);
  t.Vector("model.layers.{layer}.post_attention_layernorm.weight", TensorCategory::kNorm,
           {c.hidden_size}, TpSplit::kReplicated, all, c.dtype, TensorRole::kPreMoeNorm);
}

void AddMlaAttention(TensorList& t, const std::vector<int64_t>& layers) {
  const ModelConfig& c = t.config();
  const MlaConfig& a = c.mla;
  using C = TensorCategory;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads;
  const int64_t qk = a.qk_nope_head_dim + a.qk_rope_head_dim;
  const std::string p = "model.layers.{layer}.self_attn.";
  if (a.q_lora_rank > 0) {
    t.Linear(p + "q_a_proj", C::kAttention, a.q_lora_rank, H, TpSplit::kReplicated, layers);
    t.Vector(p + "q_a_layernorm.weight", C::kAttention, {a.q_lora_rank}, TpSplit::kReplicated,
             layers, c.dtype);
    t.Linear(p + "q_b_proj", C::kAttention, nh * qk, a.q_lora_rank, TpSplit::kColumn, layers);
  } else {
    t.Linear(p + "q_proj", C::kAttention, nh * qk, H, TpSplit::kColumn, layers);
  }
  t.Linear(p + "kv_a_proj_with_mqa", C::kAttention, a.kv_lora_rank + a.qk_rope_head_dim, H,
           TpSplit::kReplicated, layers);
  t.Vector(p + "kv_a_layernorm.weight", C::kAttention, {a.kv_lora_rank}, TpSplit::kReplicated,
           layers, c.dtype);
  t.Linear(p + "kv_b_proj", C::kAttention, nh * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank,
           TpSplit::kColumn, layers);
  if (a.output_gate) {
    // Kimi-K3: sigmoid output gate, sharded like the attention output (SGLang
    // KimiK3MLAAttention: ColumnParallelLinear over attention TP).
    t.Linear(p + "g_proj", C::kAttention, nh * a.v_head_dim, H, TpSplit::kColumn, layers);
  }
  t.Linear(p + "o_proj", C::kAttention, H, nh * a.v_head_dim, TpSplit::kRow, layers);
}

void AddGqaAttention(TensorList& t, const std::vector<int64_t>& layers, const GqaOptions& o) {
  const ModelConfig& c = t.config();
  using C = TensorCategory;
  const int64_t H = c.hidden_size;
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  const std::string p = "model.layers.{layer}.self_attn.";
  t.Linear(p + "q_proj", C::kAttention, o.q_gate ? 2 * q : q, H, TpSplit::kColumn, layers, o.quant);
  t.Linear(p + "k_proj", C::kAttention, kv, H, TpSplit::kKvColumn, layers, o.quant).unit =
      c.head_dim;
  t.Linear(p + "v_proj", C::kAttention, kv, H, TpSplit::kKvColumn, layers, o.quant).unit =
      c.head_dim;
  t.Linear(p + "o_proj", C::kAttention, H, q, TpSplit::kRow, layers, o.quant);
  if (o.bias || o.qkv_bias) {
    t.Vector(p + "q_proj.bias", C::kAttention, {q}, TpSplit::kColumn, layers, c.dtype);
    t.Vector(p + "k_proj.bias", C::kAttention, {kv}, TpSplit::kKvColumn, layers, c.dtype).unit =
        c.head_dim;
    t.Vector(p + "v_proj.bias", C::kAttention, {kv}, TpSplit::kKvColumn, layers, c.dtype).unit =
        c.head_dim;
  }
  if (o.bias) {
    t.Vector(p + "o_proj.bias", C::kAttention, {H}, TpSplit::kReplicated, layers, c.dtype);
  }
  if (o.sinks) {
    t.Vector(p + "sinks", C::kAttention, {c.num_attention_heads}, TpSplit::kColumn, layers,
             c.dtype);
  }
  if (o.qk_norm) {
    t.Vector(p + "q_norm.weight", C::kAttention, {c.head_dim}, TpSplit::kReplicated, layers,
             c.dtype);
    t.Vector(p + "k_norm.weight", C::kAttention, {c.head_dim}, TpSplit::kReplicated, layers,
             c.dtype);
  }
}

void AddGatedMlp(TensorList& t, const std::string& module, TensorCategory cat, int64_t width,
                 const std::vector<int64_t>& layers, TensorRole gate_role, TensorRole up_role,
                 TensorRole down_role) {
  const int64_t H = t.config().hidden_size;
  t.Linear(module + ".gate_proj", cat, width, H, TpSplit::kColumn, layers, Quantizable::kYes,
           gate_role);
  t.Linear(module + ".up_proj", cat, width, H, TpSplit::kColumn, layers, Quantizable::kYes,
           up_role);
  t.Linear(module + ".down_proj", cat, H, width, TpSplit::kRow, layers, Quantizable::kYes,
           down_role);
}

void AddRouter(TensorList& t, const std::string& module, const std::vector<int64_t>& layers,
               const RouterOptions& o) {
  const ModelConfig& c = t.config();
  using C = TensorCategory;
  TensorDef& w = t.Linear(module, C::kRouter, c.num_experts, c.hidden_size, TpSplit::kReplicated,
                          layers, Quantizable::kNo, TensorRole::kRouter);
  if (o.weight_dtype) w.dtype = *o.weight_dtype;
  if (c.router_bias) {
    t.Vector(module + ".bias", C::kRouter, {c.num_experts}, TpSplit::kReplicated, layers, c.dtype,
             TensorRole::kRouterBias);
  }
  if (c.has_correction_bias) {
    // fp32 in the releases (transformers keeps e_score_correction_bias in fp32).
    const std::string& at = o.correction_bias_module.empty() ? module : o.correction_bias_module;
    t.Vector(at + ".e_score_correction_bias", C::kRouter, {c.num_experts}, TpSplit::kReplicated,
             layers, DType::kF32, TensorRole::kCorrectionBias);
  }
}

void AddSharedExperts(TensorList& t, const std::string& module,
                      const std::vector<int64_t>& layers) {
  const ModelConfig& c = t.config();
  if (c.num_shared_experts == 0) return;
  AddGatedMlp(t, module, TensorCategory::kSharedExperts, c.shared_expert_intermediate_size, layers,
              TensorRole::kSharedGate, TensorRole::kSharedUp, TensorRole::kSharedDown);
}

void AddSharedExpertGate(TensorList& t, const std::string& module,
                         const std::vector<int64_t>& layers) {
  const ModelConfig& c = t.config();
  if (c.num_shared_experts == 0 || !c.shared_expert_gate) return;
  t.Linear(module, TensorCategory::kSharedExperts, 1, c.hidden_size, TpSplit::kReplicated, layers,
           Quantizable::kNo, TensorRole::kSharedGateProj);
}

void AddGatedDeltaNet(TensorList& t, const std::vector<int64_t>& layers, const GdnOptions& o) {
  const ModelConfig& c = t.config();
  const GdnConfig& g = c.gdn;
  using C = TensorCategory;
  const int64_t H = c.hidden_size, kd = g.key_dim(), vd = g.value_dim();
  const std::string p = "model.layers.{layer}.linear_attn.";
  if (o.split_projections) {
    // Qwen3.5: [q, k, v] in one projection (split per block), z, b and a apart.
    t.Linear(p + "in_proj_qkv", C::kAttention, 2 * kd + vd, H, TpSplit::kColumn, layers)
        .section_sizes = {kd, kd, vd};
    t.Linear(p + "in_proj_z", C::kAttention, vd, H, TpSplit::kColumn, layers);
    t.Linear(p + "in_proj_b", C::kAttention, g.num_v_heads, H, TpSplit::kColumn, layers);
    t.Linear(p + "in_proj_a", C::kAttention, g.num_v_heads, H, TpSplit::kColumn, layers);
  } else {
    // Qwen3-Next: q, k, v, z (and b, a) interleaved per key-head group, so a contiguous split
    // gives each rank whole groups.
    t.Linear(p + "in_proj_qkvz", C::kAttention, 2 * kd + 2 * vd, H, TpSplit::kColumn, layers);
    t.Linear(p + "in_proj_ba", C::kAttention, 2 * g.num_v_heads, H, TpSplit::kColumn, layers);
  }
  t.Vector(p + "conv1d.weight", C::kAttention, {2 * kd + vd, 1, g.conv_kernel}, TpSplit::kColumn,
           layers, c.dtype)
      .section_sizes = {kd, kd, vd};
  t.Vector(p + "dt_bias", C::kAttention, {g.num_v_heads}, TpSplit::kColumn, layers, c.dtype);
  t.Vector(p + "A_log", C::kAttention, {g.num_v_heads}, TpSplit::kColumn, layers,
           o.a_log_dtype.value_or(c.dtype));
  t.Vector(p + "norm.weight", C::kAttention, {g.v_head_dim}, TpSplit::kReplicated, layers,
           o.norm_dtype.value_or(c.dtype));
  t.Linear(p + "out_proj", C::kAttention, H, vd, TpSplit::kRow, layers);
}

void AddQwenHybridTensors(TensorList& t, const GdnOptions& o) {
  const ModelConfig& c = t.config();
  const std::vector<int64_t> moe = MoeLayers(c);
  AddEmbeddingsAndHead(t);
  AddLayerNorms(t);
  AddGqaAttention(t, LayersOf(c, AttentionKind::kGqa),
                  {.qk_norm = true, .q_gate = c.attn_output_gate});
  AddGatedDeltaNet(t, LayersOf(c, AttentionKind::kGatedDeltaNet), o);
  AddGatedMlp(t, "model.layers.{layer}.mlp", TensorCategory::kDenseMlp, c.intermediate_size,
              DenseLayers(c));
  AddRouter(t, "model.layers.{layer}.mlp.gate", moe);
  AddSharedExperts(t, "model.layers.{layer}.mlp.shared_expert", moe);
  AddSharedExpertGate(t, "model.layers.{layer}.mlp.shared_expert_gate", moe);
}

ExpertLayout PerExpertLayout(const ModelConfig& c, const std::string& prefix,
                             const std::string& moe_module, const std::string& gate,
                             const std::string& up, const std::string& down) {
  ExpertLayout x;
  const std::string base = prefix + moe_module + ".experts.";
  x.rank_prefix = base;
  if (c.gated()) x.gate = base + "{expert}." + gate;
  x.up = base + "{expert}." + up;
  x.down = base + "{expert}." + down;
  return x;
}

}  // namespace moeshard::family

namespace moeshard::family {

Status ParseGqa(const ConfigFields& f, ModelConfig& c, bool head_dim_required,
                bool attention_bias_default) {
  MOESHARD_ASSIGN_OR_RETURN(c.num_attention_heads, f.Int("num_attention_heads", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_kv_heads, f.Int("num_key_value_heads", c.num_attention_heads, 1));
  std::optional<int64_t> head_dim;
  if (!head_dim_required) head_dim = c.hidden_size / c.num_attention_heads;
  MOESHARD_ASSIGN_OR_RETURN(c.head_dim, f.Int("head_dim", head_dim, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.attention_bias, f.Bool("attention_bias", attention_bias_default));
  return Status::Ok();
}

Status ParseQwenMoe(const ConfigFields& f, ModelConfig& c, bool norm_topk_prob_default) {
  MOESHARD_RETURN_IF_ERROR(ParseGqa(f, c));
  MOESHARD_ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size,
                            f.Int("moe_intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts,
                            f.IntAlias({"num_experts", "num_local_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts_per_tok,
                            f.IntAlias({"num_experts_per_tok"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool("norm_topk_prob", norm_topk_prob_default));
  MOESHARD_ASSIGN_OR_RETURN(int64_t step, f.Int("decoder_sparse_step", 1, 1));
  std::set<int64_t> mlp_only;
  if (f.Has("mlp_only_layers")) {
    MOESHARD_ASSIGN_OR_RETURN(std::vector<int64_t> l,
                              f.IntList("mlp_only_layers", 0, c.num_layers - 1));
    mlp_only.insert(l.begin(), l.end());
  }
  MOESHARD_RETURN_IF_ERROR(f.Choice("hidden_act", "silu", {"silu"}).status());
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

Status ParseQwenHybrid(const ConfigFields& f, ModelConfig& c) {
  MOESHARD_ASSIGN_OR_RETURN(c.shared_expert_intermediate_size,
                            f.Int("shared_expert_intermediate_size", 0));
  c.num_shared_experts = c.shared_expert_intermediate_size > 0 ? 1 : 0;
  c.shared_expert_gate = c.num_shared_experts > 0;
  MOESHARD_ASSIGN_OR_RETURN(c.attn_output_gate, f.Bool("attn_output_gate", true));
  c.qk_norm = true;
  c.norm_plus_one = true;
  GdnConfig& g = c.gdn;
  MOESHARD_ASSIGN_OR_RETURN(g.num_k_heads, f.Int("linear_num_key_heads", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(g.num_v_heads, f.Int("linear_num_value_heads", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(g.k_head_dim, f.Int("linear_key_head_dim", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(g.v_head_dim, f.Int("linear_value_head_dim", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(g.conv_kernel, f.Int("linear_conv_kernel_dim", 4, 1));
  if (g.num_v_heads % g.num_k_heads != 0) {
    return f.Error("linear_num_value_heads",
                   fmt::format("a multiple of linear_num_key_heads ({})", g.num_k_heads),
                   std::to_string(g.num_v_heads));
  }
  // Layer kinds: an explicit `layer_types` (transformers 5) or every interval-th layer full.
  if (f.Has("layer_types")) {
    const nlohmann::json& lt = f.Raw("layer_types");
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.num_layers) {
      return f.Error("layer_types", fmt::format("an array of {} layer kinds", c.num_layers),
                     lt.dump());
    }
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const nlohmann::json& e = lt[static_cast<size_t>(i)];
      if (e != "linear_attention" && e != "full_attention") {
        return f.Error("layer_types", "\"linear_attention\" or \"full_attention\"", e.dump());
      }
      c.layers[static_cast<size_t>(i)].attention =
          e == "full_attention" ? AttentionKind::kGqa : AttentionKind::kGatedDeltaNet;
    }
  } else {
    MOESHARD_ASSIGN_OR_RETURN(int64_t interval, f.Int("full_attention_interval", 4, 1));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      c.layers[static_cast<size_t>(i)].attention =
          (i + 1) % interval == 0 ? AttentionKind::kGqa : AttentionKind::kGatedDeltaNet;
    }
  }
  return Status::Ok();
}

Status ParseMla(const ConfigFields& f, ModelConfig& c) {
  MOESHARD_ASSIGN_OR_RETURN(c.mla.q_lora_rank, f.Int("q_lora_rank", 0));
  MOESHARD_ASSIGN_OR_RETURN(c.mla.kv_lora_rank, f.Int("kv_lora_rank", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.mla.qk_nope_head_dim, f.Int("qk_nope_head_dim", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.mla.qk_rope_head_dim, f.Int("qk_rope_head_dim", std::nullopt, 0));
  MOESHARD_ASSIGN_OR_RETURN(c.mla.v_head_dim, f.Int("v_head_dim", std::nullopt, 1));
  return Status::Ok();
}

Status ParseDeepseekRouting(const ConfigFields& f, ModelConfig& c, const DeepseekDefaults& d) {
  MOESHARD_ASSIGN_OR_RETURN(
      std::string scoring,
      f.StringAlias({"scoring_func", "moe_router_activation_func"}, std::string(d.scoring)));
  MOESHARD_ASSIGN_OR_RETURN(std::string topk_method,
                            f.Choice("topk_method", std::string(d.topk_method),
                                     {"noaux_tc", "greedy", "group_limited_greedy"}));
  if (scoring == "sigmoid") {
    c.scoring = ScoringFunc::kSigmoid;
    c.routing = RoutingMethod::kSigmoidGroupedTopK;
    c.has_correction_bias = topk_method == "noaux_tc";
  } else if (scoring == "softmax") {
    // DeepSeek-V2: `greedy` is plain top-k, `group_limited_greedy` keeps the topk_group groups
    // with the best single expert (modeling_deepseek.py MoEGate; vLLM grouped_topk).
    c.scoring = ScoringFunc::kSoftmax;
    c.routing = topk_method == "group_limited_greedy" ? RoutingMethod::kSoftmaxGroupedTopK
                                                      : RoutingMethod::kSoftmaxTopK;
  } else {
    const char* key = f.Has("scoring_func") ? "scoring_func" : "moe_router_activation_func";
    return f.Error(key, "\"sigmoid\" or \"softmax\"", "\"" + scoring + "\"");
  }
  MOESHARD_ASSIGN_OR_RETURN(c.n_group, f.IntAlias({"n_group", "num_expert_group"}, 1, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.topk_group, f.Int("topk_group", 1, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.norm_topk_prob,
                            f.BoolAlias({"norm_topk_prob", "moe_renormalize"}, d.norm_topk_prob));
  MOESHARD_ASSIGN_OR_RETURN(c.routed_scaling_factor, f.Double("routed_scaling_factor", 1.0));
  return Status::Ok();
}

Status ParseDeepseekText(const ConfigFields& f, ModelConfig& c, const DeepseekDefaults& d) {
  MOESHARD_ASSIGN_OR_RETURN(c.num_attention_heads, f.Int("num_attention_heads", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_kv_heads, f.Int("num_key_value_heads", c.num_attention_heads, 1));
  MOESHARD_RETURN_IF_ERROR(ParseMla(f, c));
  MOESHARD_ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.moe_intermediate_size,
                            f.Int("moe_intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts,
                            f.IntAlias({"n_routed_experts", "num_experts"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_experts_per_tok,
                            f.IntAlias({"num_experts_per_tok"}, std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_shared_experts, f.IntAlias({"n_shared_experts"}, 0));
  c.shared_expert_intermediate_size = c.num_shared_experts * c.moe_intermediate_size;
  MOESHARD_ASSIGN_OR_RETURN(c.first_k_dense_replace, f.Int("first_k_dense_replace", 0));
  MOESHARD_ASSIGN_OR_RETURN(int64_t freq, f.Int("moe_layer_freq", 1, 1));
  MOESHARD_ASSIGN_OR_RETURN(c.num_mtp_layers, f.Int("num_nextn_predict_layers", 0));
  MOESHARD_RETURN_IF_ERROR(ParseDeepseekRouting(f, c, d));
  MOESHARD_RETURN_IF_ERROR(f.Choice("hidden_act", "silu", {"silu"}).status());
  c.activation = ExpertActivation::kSwiGlu;
  c.routed_expert_hidden_size = c.hidden_size;
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerSpec{});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    c.layers[static_cast<size_t>(i)].attention = AttentionKind::kMla;
    c.layers[static_cast<size_t>(i)].moe = i >= c.first_k_dense_replace && (i % freq == 0);
  }
  return Status::Ok();
}

void AddDeepseekTextTensors(TensorList& t) {
  const ModelConfig& c = t.config();
  const std::vector<int64_t> moe = MoeLayers(c);
  AddEmbeddingsAndHead(t);
  AddLayerNorms(t);
  AddMlaAttention(t, AllLayers(c));
  AddGatedMlp(t, "model.layers.{layer}.mlp", TensorCategory::kDenseMlp, c.intermediate_size,
              DenseLayers(c));
  AddRouter(t, "model.layers.{layer}.mlp.gate", moe);
  AddSharedExperts(t, "model.layers.{layer}.mlp.shared_experts", moe);
}

ExpertLayout DeepseekExperts(const ModelConfig& c, const std::string& prefix) {
  return PerExpertLayout(c, prefix, "model.layers.{layer}.mlp", "gate_proj", "up_proj",
                         "down_proj");
}

}  // namespace moeshard::family

namespace moeshard::family {

Status ParseMoonVit(const ConfigFields& top, ModelConfig& c) {
  if (!top.Has("vision_config")) return Status::Ok();
  MOESHARD_ASSIGN_OR_RETURN(ConfigFields v, top.Object("vision_config"));
  VisionConfig& x = c.vision;
  MOESHARD_ASSIGN_OR_RETURN(x.num_layers, v.Int("vt_num_hidden_layers", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.hidden_size, v.Int("vt_hidden_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.intermediate_size, v.Int("vt_intermediate_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.num_heads, v.Int("vt_num_attention_heads", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.qkv_hidden_size, v.Int("qkv_hidden_size", x.hidden_size, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.patch_size, v.Int("patch_size", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.pos_emb_height, v.Int("init_pos_emb_height", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.pos_emb_width, v.Int("init_pos_emb_width", std::nullopt, 1));
  MOESHARD_ASSIGN_OR_RETURN(x.linear_bias, v.Bool("linear_bias", true));
  MOESHARD_ASSIGN_OR_RETURN(std::string norm,
                            v.Choice("norm_type", "layernorm", {"layernorm", "rmsnorm"}));
  x.norm_bias = norm == "layernorm";
  MOESHARD_ASSIGN_OR_RETURN(std::string projector, v.Choice("mm_projector_type", "patchmerger",
                                                            {"patchmerger", "patchmergerv2"}));
  x.projector_post_norm = projector == "patchmergerv2";
  x.merge_tokens = 1;
  if (v.Has("merge_kernel_size")) {
    MOESHARD_ASSIGN_OR_RETURN(std::vector<int64_t> k, v.IntList("merge_kernel_size", 1, 64));
    for (int64_t d : k) x.merge_tokens *= d;
  }
  MOESHARD_ASSIGN_OR_RETURN(int64_t text_hidden, v.Int("text_hidden_size", c.hidden_size, 1));
  if (text_hidden != c.hidden_size) {
    return v.Error("text_hidden_size",
                   fmt::format("the language model's hidden_size ({})", c.hidden_size),
                   std::to_string(text_hidden));
  }
  if (x.qkv_hidden_size % x.num_heads != 0) {
    return v.Error("qkv_hidden_size",
                   fmt::format("a multiple of vt_num_attention_heads ({})", x.num_heads),
                   std::to_string(x.qkv_hidden_size));
  }
  return Status::Ok();
}

TensorDef& AddVisionTensor(TensorList& t, const std::string& name, std::vector<int64_t> shape,
                           TpSplit split, int64_t heads, int64_t sections) {
  TensorDef& d = t.Global(name, TensorCategory::kVision, std::move(shape), split,
                          StagePlacement::kEveryStage, t.config().dtype);
  if (split != TpSplit::kReplicated) {
    d.split_heads = heads;
    d.sections = sections;
  }
  return d;
}

void AddMoonVit(const ModelConfig& c, std::vector<TensorDef>& out) {
  const VisionConfig& v = c.vision;
  if (v.num_layers == 0) return;
  TensorList t(c, "");
  const auto rep = TpSplit::kReplicated;
  const int64_t Hv = v.hidden_size, Q = v.qkv_hidden_size, Iv = v.intermediate_size;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, TpSplit split,
                 int64_t sections = 1) {
    AddVisionTensor(t, name, std::move(shape), split, v.num_heads, sections);
  };
  auto norm = [&](const std::string& module, int64_t width) {
    add(module + ".weight", {width}, rep);
    if (v.norm_bias) add(module + ".bias", {width}, rep);
  };
  for (int64_t b = 0; b < v.num_layers; ++b) {
    const std::string p = fmt::format("vision_tower.encoder.blocks.{}.", b);
    add(p + "wqkv.weight", {3 * Q, Hv}, TpSplit::kColumn, 3);
    add(p + "wo.weight", {Hv, Q}, TpSplit::kRow);
    add(p + "mlp.fc0.weight", {Iv, Hv}, TpSplit::kColumn);
    add(p + "mlp.fc1.weight", {Hv, Iv}, TpSplit::kRow);
    if (v.linear_bias) {
      add(p + "wqkv.bias", {3 * Q}, TpSplit::kColumn, 3);
      add(p + "wo.bias", {Hv}, rep);  // a row-parallel layer's bias is added once, whole
      add(p + "mlp.fc0.bias", {Iv}, TpSplit::kColumn);
      add(p + "mlp.fc1.bias", {Hv}, rep);
    }
    norm(p + "norm0", Hv);
    norm(p + "norm1", Hv);
  }
  norm("vision_tower.encoder.final_layernorm", Hv);
  add("vision_tower.patch_embed.pos_emb.weight", {v.pos_emb_height, v.pos_emb_width, Hv}, rep);
  add("vision_tower.patch_embed.proj.weight", {Hv, 3, v.patch_size, v.patch_size}, rep);
  if (v.linear_bias) add("vision_tower.patch_embed.proj.bias", {Hv}, rep);
  const int64_t M = Hv * v.merge_tokens;
  if (v.projector_post_norm) {
    add("mm_projector.post_norm.weight", {c.hidden_size}, rep);
  } else {
    norm("mm_projector.pre_norm", Hv);
  }
  add("mm_projector.proj.0.weight", {M, M}, rep);
  add("mm_projector.proj.2.weight", {c.hidden_size, M}, rep);
  if (!v.projector_post_norm) {
    add("mm_projector.proj.0.bias", {M}, rep);
    add("mm_projector.proj.2.bias", {c.hidden_size}, rep);
  }
  for (TensorDef& d : t.Take()) out.push_back(std::move(d));
}

}  // namespace moeshard::family
