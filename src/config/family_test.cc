// The family registry and descriptors: registration, name templates, and the facts of the
// released checkpoints each descriptor encodes (../shared/reference/checkpoints.md).
#include "moeshard/config/family.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "moeshard/config/config_loader.h"

namespace moeshard {
namespace {

ModelConfig Preset(const std::string& name) {
  Result<ModelConfig> r = LoadModelConfig(name);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return *std::move(r);
}

// By name; one name template may cover disjoint layer sets (Kimi-K3's MLA and KDA o_proj),
// then keyed "<name>@<first layer>" after the first.
std::map<std::string, TensorDef> ByName(const ModelConfig& c) {
  std::map<std::string, TensorDef> out;
  std::map<std::string, std::vector<int64_t>> layers;
  for (TensorDef& t : c.family->tensors(c)) {
    std::string key = t.name;
    for (int64_t l : t.layers) {
      EXPECT_EQ(std::count(layers[t.name].begin(), layers[t.name].end(), l), 0)
          << "listed twice on layer " << l << ": " << t.name;
    }
    layers[t.name].insert(layers[t.name].end(), t.layers.begin(), t.layers.end());
    if (out.count(key)) key += "@" + std::to_string(t.layers.front());
    EXPECT_TRUE(out.emplace(key, std::move(t)).second) << "listed twice: " << key;
  }
  return out;
}

TEST(FamilyTest, RegistryHoldsEveryFamilyOnce) {
  std::set<std::string_view> names, types;
  for (const FamilyDescriptor* f : Families()) {
    EXPECT_TRUE(names.insert(f->name).second) << f->name;
    for (std::string_view t : f->model_types) EXPECT_TRUE(types.insert(t).second) << t;
    EXPECT_NE(f->parse, nullptr);
    EXPECT_NE(f->tensors, nullptr);
    EXPECT_NE(f->experts, nullptr);
  }
  for (const char* t :
       {"deepseek_v3", "kimi_k2", "kimi_k25", "kimi_k3", "qwen3_moe", "mixtral", "gpt_oss"}) {
    EXPECT_NE(FindFamily(t), nullptr) << t;
  }
  EXPECT_EQ(FindFamily("llama"), nullptr);
}

TEST(FamilyTest, NameKeysRoundTrip) {
  for (const char* name :
       {"model.layers.12.mlp.experts.301.gate_proj.weight_packed",
        "language_model.model.layers.0.block_sparse_moe.experts.7.w2.weight_scale",
        "model.layers.3.self_attn.q_proj.weight", "model.embed_tokens.weight",
        "vision_tower.encoder.blocks.4.wqkv.weight"}) {
    const NameKey k = KeyOfName(name);
    EXPECT_EQ(ExpandName(k.key, k.layer, k.expert), name);
  }
  const NameKey k = KeyOfName("model.layers.12.mlp.experts.301.gate_proj.weight");
  EXPECT_EQ(k.key, "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight");
  EXPECT_EQ(k.layer, 12);
  EXPECT_EQ(k.expert, 301);
  // "sublayers.3" is not "layers.3"; fused expert tensors have no expert index.
  EXPECT_EQ(KeyOfName("x.sublayers.3.w").layer, -1);
  EXPECT_EQ(KeyOfName("model.layers.1.mlp.experts.gate_up_proj_blocks").expert, -1);
}

TEST(FamilyTest, EveryPresetListsDistinctWellFormedTensors) {
  for (const PresetInfo& p : ModelPresets()) {
    const ModelConfig c = Preset(p.name);
    for (const auto& [name, t] : ByName(c)) {
      EXPECT_FALSE(t.shape.empty()) << p.name << " " << name;
      for (int64_t d : t.shape) EXPECT_GT(d, 0) << p.name << " " << name;
      if (t.where == StagePlacement::kLayers) {
        EXPECT_FALSE(t.layers.empty()) << p.name << " " << name;
        EXPECT_NE(name.find("{layer}"), std::string::npos) << p.name << " " << name;
      }
      if (t.format.quantized()) {
        EXPECT_TRUE(t.linear) << name;
      }
    }
    const ExpertLayout x = c.family->experts(c);
    EXPECT_NE(x.rank_prefix.find("{layer}"), std::string::npos) << p.name;
  }
}

// The released Kimi-K3: the release's module names, dtypes and shapes (checkpoints.md).
TEST(FamilyTest, KimiK3AsReleased) {
  const ModelConfig c = Preset("kimi-k3");
  const auto t = ByName(c);
  const std::string L = "language_model.model.layers.{layer}.";
  auto has = [&](const std::string& n) { return t.count(n) == 1; };
  EXPECT_TRUE(has("language_model.lm_head.weight"));
  EXPECT_TRUE(has("language_model.model.output_attn_res_proj.weight"));
  EXPECT_TRUE(has(L + "self_attention_res_proj.weight"));
  EXPECT_EQ(t.at(L + "mlp_res_proj.weight").shape, (std::vector<int64_t>{1, 7168}));
  // KDA: full-rank gate, fp32 A_log [128] of which 96 are split, fp32 convs and o_norm.
  EXPECT_TRUE(has(L + "self_attn.g_proj"));
  EXPECT_FALSE(has(L + "self_attn.g_a_proj"));
  const TensorDef& a_log = t.at(L + "self_attn.A_log");
  EXPECT_EQ(a_log.dtype, DType::kF32);
  EXPECT_EQ(a_log.shape, (std::vector<int64_t>{128}));
  EXPECT_EQ(a_log.split_extent, 96);
  EXPECT_EQ(t.at(L + "self_attn.q_conv1d.weight").dtype, DType::kF32);
  EXPECT_EQ(t.at(L + "self_attn.o_norm.weight").dtype, DType::kF32);
  // MoE block: router, bias, BF16 latent projections although `ignore` does not name them.
  const TensorDef& down = t.at(L + "block_sparse_moe.routed_expert_down_proj");
  EXPECT_EQ(down.format.format, WeightFormat::kBf16);
  EXPECT_EQ(down.shape, (std::vector<int64_t>{3584, 7168}));
  EXPECT_EQ(down.role, TensorRole::kLatentDown);
  EXPECT_EQ(t.at(L + "block_sparse_moe.gate.e_score_correction_bias").dtype, DType::kF32);
  EXPECT_EQ(t.at(L + "block_sparse_moe.shared_experts.gate_proj").format.format,
            WeightFormat::kBf16);
  // Vision tower: 27 blocks of 6 tensors plus 5, all outside language_model.
  int vision = 0;
  for (const auto& [name, d] : t) {
    if (d.category == TensorCategory::kVision) {
      ++vision;
      EXPECT_EQ(name.rfind("language_model.", 0), std::string::npos) << name;
    }
  }
  // 27 blocks of 6, then final_layernorm, pos_emb, patch_embed.proj and the projector's
  // post_norm, proj.0, proj.2.
  EXPECT_EQ(vision, 27 * 6 + 6);
  EXPECT_EQ(t.at("vision_tower.encoder.blocks.0.wqkv.weight").shape,
            (std::vector<int64_t>{4608, 1024}));
  const ExpertLayout x = c.family->experts(c);
  EXPECT_EQ(x.gate, "language_model.model.layers.{layer}.block_sparse_moe.experts.{expert}.w1");
  EXPECT_EQ(x.down, "language_model.model.layers.{layer}.block_sparse_moe.experts.{expert}.w2");
  EXPECT_EQ(c.quant.scheme.format, WeightFormat::kMxfp4);
}

// OLMoE (transformers modular_olmoe.py): q_norm over the whole q projection, k_norm over the
// KV width, router mlp.gate, softmax top-k without renormalisation.
TEST(FamilyTest, Olmoe) {
  const ModelConfig c = Preset("olmoe-1b-7b");
  EXPECT_EQ(c.family_name(), "olmoe");
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.num_moe_layers(), 16);
  const auto t = ByName(c);
  EXPECT_EQ(t.at("model.layers.{layer}.self_attn.q_norm.weight").shape,
            (std::vector<int64_t>{2048}));
  EXPECT_EQ(t.at("model.layers.{layer}.mlp.gate").role, TensorRole::kRouter);
  EXPECT_EQ(c.family->experts(c).down, "model.layers.{layer}.mlp.experts.{expert}.down_proj");
}

}  // namespace
}  // namespace moeshard
