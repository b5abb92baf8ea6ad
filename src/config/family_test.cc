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
  for (const char* t : {"deepseek_v3", "kimi_k2", "kimi_k25", "kimi_k3", "qwen3_moe", "mixtral",
                        "gpt_oss", "olmoe", "deepseek_v2", "qwen2_moe", "glm4_moe", "minimax_m2",
                        "llama4", "qwen3_next", "qwen3_5_moe"}) {
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

// DeepSeek-V2 (modeling_deepseek.py; vLLM deepseek_v2.py): softmax scores, group-limited
// greedy by each group's best expert, no renormalisation, x16; V2-Lite: full-rank q, greedy.
TEST(FamilyTest, DeepseekV2) {
  const ModelConfig v2 = Preset("deepseek-v2");
  EXPECT_EQ(v2.family_name(), "deepseek_v2");
  EXPECT_EQ(v2.routing, RoutingMethod::kSoftmaxGroupedTopK);
  EXPECT_EQ(v2.n_group, 8);
  EXPECT_EQ(v2.topk_group, 3);
  EXPECT_FALSE(v2.norm_topk_prob);
  EXPECT_FALSE(v2.has_correction_bias);
  EXPECT_DOUBLE_EQ(v2.routed_scaling_factor, 16.0);
  EXPECT_EQ(v2.num_moe_layers(), 59);
  EXPECT_EQ(v2.shared_expert_intermediate_size, 2 * 1536);
  const ModelConfig lite = Preset("deepseek-v2-lite");
  EXPECT_EQ(lite.routing, RoutingMethod::kSoftmaxTopK);
  EXPECT_EQ(lite.mla.q_lora_rank, 0);
  const auto t = ByName(lite);
  EXPECT_EQ(t.at("model.layers.{layer}.self_attn.q_proj").shape,
            (std::vector<int64_t>{16 * (128 + 64), 2048}));
  EXPECT_EQ(t.count("model.layers.{layer}.self_attn.q_a_proj"), 0u);
  EXPECT_EQ(t.count("model.layers.{layer}.mlp.gate.e_score_correction_bias"), 0u);
}

// Qwen2-MoE (vLLM qwen2_moe.py): q/k/v biases without an o bias, a shared expert of
// shared_expert_intermediate_size behind a [1, H] sigmoid gate, softmax without renormalising.
TEST(FamilyTest, Qwen2Moe) {
  const ModelConfig c = Preset("qwen1.5-moe-a2.7b");
  EXPECT_EQ(c.family_name(), "qwen2_moe");
  EXPECT_TRUE(c.shared_expert_gate);
  EXPECT_EQ(c.shared_expert_intermediate_size, 5632);
  EXPECT_EQ(c.num_moe_layers(), 24);
  const auto t = ByName(c);
  EXPECT_EQ(t.at("model.layers.{layer}.mlp.shared_expert_gate").shape,
            (std::vector<int64_t>{1, 2048}));
  EXPECT_EQ(t.at("model.layers.{layer}.mlp.shared_expert_gate").role, TensorRole::kSharedGateProj);
  EXPECT_EQ(t.at("model.layers.{layer}.mlp.shared_expert.down_proj").shape,
            (std::vector<int64_t>{2048, 5632}));
  EXPECT_EQ(t.count("model.layers.{layer}.self_attn.k_proj.bias"), 1u);
  EXPECT_EQ(t.count("model.layers.{layer}.self_attn.o_proj.bias"), 0u);
}

// GLM-4.5-Air (vLLM glm4_moe.py): one dense layer, sigmoid noaux_tc with a correction bias on
// mlp.gate, q/k/v biases, no q/k norm in Air; the MTP layer is not planned.
TEST(FamilyTest, Glm4Moe) {
  const ModelConfig c = Preset("glm-4.5-air");
  EXPECT_EQ(c.family_name(), "glm4_moe");
  EXPECT_EQ(c.routing, RoutingMethod::kSigmoidGroupedTopK);
  EXPECT_EQ(c.num_moe_layers(), 45);
  EXPECT_EQ(c.num_mtp_layers, 1);
  const auto t = ByName(c);
  EXPECT_EQ(t.at("model.layers.{layer}.mlp.gate.e_score_correction_bias").dtype, DType::kF32);
  EXPECT_EQ(t.at("model.layers.{layer}.self_attn.q_proj").shape,
            (std::vector<int64_t>{96 * 128, 4096}));
  EXPECT_EQ(t.count("model.layers.{layer}.self_attn.q_norm.weight"), 0u);
  EXPECT_EQ(t.count("model.layers.{layer}.self_attn.v_proj.bias"), 1u);
}

// MiniMax-M2 (vLLM minimax_m2.py): F32 router, the routing bias on block_sparse_moe itself,
// full-width q/k norms, w1/w3/w2 experts, block fp8 with `fmt` float8_e4m3fn.
TEST(FamilyTest, MinimaxM2) {
  const ModelConfig c = Preset("minimax-m2");
  EXPECT_EQ(c.family_name(), "minimax_m2");
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.moe_intermediate_size, 1536);
  EXPECT_EQ(c.quant.scheme.format, WeightFormat::kFp8Block);
  const auto t = ByName(c);
  EXPECT_EQ(t.at("model.layers.{layer}.block_sparse_moe.gate").dtype, DType::kF32);
  EXPECT_EQ(t.at("model.layers.{layer}.block_sparse_moe.e_score_correction_bias").role,
            TensorRole::kCorrectionBias);
  EXPECT_EQ(t.at("model.layers.{layer}.self_attn.q_norm.weight").shape,
            (std::vector<int64_t>{48 * 128}));
  EXPECT_EQ(c.family->experts(c).up, "model.layers.{layer}.block_sparse_moe.experts.{expert}.w3");
}

// Qwen3-Next (vLLM qwen3_next.py, qwen_gdn_linear_attn.py): every fourth layer gated full
// attention (q_proj doubled for the gate), the rest Gated DeltaNet; the conv1d over [q, k, v]
// is split per block; (1 + w) norms; Qwen2-MoE's gated shared expert.
TEST(FamilyTest, Qwen3Next) {
  const ModelConfig c = Preset("qwen3-next-80b-a3b");
  EXPECT_EQ(c.family_name(), "qwen3_next");
  EXPECT_EQ(c.num_layers_of(AttentionKind::kGqa), 12);
  EXPECT_EQ(c.num_layers_of(AttentionKind::kGatedDeltaNet), 36);
  EXPECT_EQ(c.layers[3].attention, AttentionKind::kGqa);
  EXPECT_TRUE(c.norm_plus_one);
  EXPECT_TRUE(c.shared_expert_gate);
  const auto t = ByName(c);
  EXPECT_EQ(t.at("model.layers.{layer}.self_attn.q_proj").shape,
            (std::vector<int64_t>{2 * 16 * 256, 2048}));
  EXPECT_EQ(t.at("model.layers.{layer}.linear_attn.in_proj_qkvz").shape,
            (std::vector<int64_t>{2 * 2048 + 2 * 4096, 2048}));
  const TensorDef& conv = t.at("model.layers.{layer}.linear_attn.conv1d.weight");
  EXPECT_EQ(conv.shape, (std::vector<int64_t>{8192, 1, 4}));
  EXPECT_EQ(conv.section_sizes, (std::vector<int64_t>{2048, 2048, 4096}));
  EXPECT_EQ(t.at("model.layers.{layer}.linear_attn.out_proj").shape,
            (std::vector<int64_t>{2048, 4096}));
  EXPECT_EQ(t.at("model.layers.{layer}.mlp.shared_expert_gate").shape,
            (std::vector<int64_t>{1, 2048}));
}

// Qwen3.5-MoE (vLLM qwen3_5.py): Qwen3-Next's hybrid under model.language_model., with the
// DeltaNet projections apart (in_proj_qkv split per block) and bf16 experts fused out-major.
TEST(FamilyTest, Qwen35Moe) {
  const ModelConfig c = Preset("qwen3.5-35b-a3b");
  EXPECT_EQ(c.family_name(), "qwen3_5_moe");
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.num_moe_layers(), 40);
  EXPECT_EQ(c.num_layers_of(AttentionKind::kGqa), 10);
  const auto t = ByName(c);
  EXPECT_EQ(t.at("model.language_model.layers.{layer}.linear_attn.in_proj_qkv").section_sizes,
            (std::vector<int64_t>{2048, 2048, 4096}));
  EXPECT_EQ(t.at("model.language_model.layers.{layer}.linear_attn.in_proj_z").shape,
            (std::vector<int64_t>{4096, 2048}));
  EXPECT_EQ(t.count("model.language_model.embed_tokens.weight"), 1u);
  EXPECT_EQ(t.count("lm_head.weight"), 1u);
  const ExpertLayout x = c.family->experts(c);
  EXPECT_TRUE(x.fused && !x.fused_in_major && !x.gate_up_interleaved);
  EXPECT_EQ(x.fused_gate_up, "model.language_model.layers.{layer}.mlp.experts.gate_up_proj");
}

// The DeltaNet's A_log and gated norm as each release stores them (public header dumps,
// tests/checkpoints/README.md): BF16 in Qwen3-Next-80B-A3B, F32 in Qwen3.5-35B-A3B.
TEST(FamilyTest, QwenDeltaNetStoredDtypes) {
  const auto next = ByName(Preset("qwen3-next-80b-a3b"));
  EXPECT_EQ(next.at("model.layers.{layer}.linear_attn.A_log").dtype, DType::kBF16);
  EXPECT_EQ(next.at("model.layers.{layer}.linear_attn.norm.weight").dtype, DType::kBF16);
  const auto q35 = ByName(Preset("qwen3.5-35b-a3b"));
  const std::string L = "model.language_model.layers.{layer}.linear_attn.";
  EXPECT_EQ(q35.at(L + "A_log").dtype, DType::kF32);
  EXPECT_EQ(q35.at(L + "norm.weight").dtype, DType::kF32);
  EXPECT_EQ(q35.at(L + "dt_bias").dtype, DType::kBF16);
  EXPECT_EQ(q35.at(L + "conv1d.weight").dtype, DType::kBF16);
}

// Which checkpoint tensors are multi-token-prediction weights: DeepSeek's decoder layer past
// the last, Qwen's mtp.* (numbered after the decoder layers), nothing else.
TEST(FamilyTest, MtpTensors) {
  const ModelConfig ds = Preset("deepseek-v3");
  int64_t layer = -2;
  EXPECT_TRUE(IsMtpTensor(ds, "model.layers.61.eh_proj.weight", &layer));
  EXPECT_EQ(layer, 61);
  EXPECT_FALSE(IsMtpTensor(ds, "model.layers.60.mlp.gate.weight"));
  EXPECT_FALSE(IsMtpTensor(ds, "mtp.fc.weight"));
  const ModelConfig next = Preset("qwen3-next-80b-a3b");
  EXPECT_TRUE(IsMtpTensor(next, "mtp.layers.0.mlp.experts.511.down_proj.weight", &layer));
  EXPECT_EQ(layer, 48);
  layer = -2;
  EXPECT_TRUE(IsMtpTensor(next, "mtp.fc.weight", &layer));
  EXPECT_EQ(layer, -1);
  EXPECT_FALSE(IsMtpTensor(next, "model.layers.47.mlp.gate.weight"));
  EXPECT_FALSE(IsMtpTensor(next, "model.mtp.fc.weight"));
  EXPECT_TRUE(IsMtpTensor(Preset("qwen3.5-35b-a3b"), "mtp.norm.weight"));
  // A vision tower's own layers are not past the decoder stack (Llama-4 has no MTP).
  EXPECT_FALSE(
      IsMtpTensor(Preset("llama-4-scout-17b-16e"), "vision_model.model.layers.33.mlp.fc1.weight"));
}

// Qwen3.5's vision tower (vLLM qwen3_vl.py Qwen3_VisionTransformer; the release's header dump:
// 333 tensors under model.visual.): Conv3d patch embedding, position table, 27 blocks of 12,
// the patch merger over 2 x 2 patches; split by head only when TP divides its 16 heads.
TEST(FamilyTest, Qwen35VisionTower) {
  const ModelConfig c = Preset("qwen3.5-35b-a3b");
  EXPECT_EQ(c.vision.num_layers, 27);
  EXPECT_EQ(c.vision.merge_tokens, 4);
  const auto t = ByName(c);
  int vision = 0;
  for (const auto& [name, d] : t) {
    if (d.category != TensorCategory::kVision) continue;
    ++vision;
    EXPECT_EQ(name.rfind("model.visual.", 0), 0u) << name;
    EXPECT_EQ(d.where, StagePlacement::kEveryStage) << name;
    EXPECT_EQ(d.split_heads, d.split == TpSplit::kReplicated ? 0 : 16) << name;
  }
  EXPECT_EQ(vision, 27 * 12 + 3 + 6);
  EXPECT_EQ(t.at("model.visual.patch_embed.proj.weight").shape,
            (std::vector<int64_t>{1152, 3, 2, 16, 16}));
  EXPECT_EQ(t.at("model.visual.pos_embed.weight").shape, (std::vector<int64_t>{2304, 1152}));
  const TensorDef& qkv = t.at("model.visual.blocks.26.attn.qkv.weight");
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{3456, 1152}));
  EXPECT_EQ(qkv.split, TpSplit::kColumn);
  EXPECT_EQ(qkv.sections, 3);
  EXPECT_EQ(t.at("model.visual.blocks.0.attn.proj.weight").split, TpSplit::kRow);
  EXPECT_EQ(t.at("model.visual.blocks.0.attn.proj.bias").split, TpSplit::kReplicated);
  EXPECT_EQ(t.at("model.visual.blocks.0.mlp.linear_fc1.bias").split, TpSplit::kColumn);
  EXPECT_EQ(t.at("model.visual.merger.linear_fc1.weight").shape,
            (std::vector<int64_t>{4608, 4608}));
  EXPECT_EQ(t.at("model.visual.merger.linear_fc2.weight").shape,
            (std::vector<int64_t>{2048, 4608}));
  EXPECT_EQ(t.at("model.visual.merger.linear_fc2.weight").split, TpSplit::kRow);
  EXPECT_EQ(c.family->mtp_prefix, "mtp.");
}

// Llama-4 Scout's vision tower (vLLM mllama4.py; names as the release stores them): 7 model-
// level tensors, 34 layers of 16, the pixel-shuffle adapter and the projector, which is
// column-parallel whatever the vision heads.
TEST(FamilyTest, Llama4ScoutVisionTower) {
  const ModelConfig c = Preset("llama-4-scout-17b-16e");
  EXPECT_EQ(c.num_moe_layers(), 48);
  EXPECT_EQ(c.num_experts, 16);
  EXPECT_EQ(c.vision.num_positions, 24 * 24 + 1);
  EXPECT_EQ(c.vision.merge_tokens, 4);
  const auto t = ByName(c);
  int vision = 0;
  for (const auto& [name, d] : t) {
    if (d.category == TensorCategory::kVision) ++vision;
  }
  EXPECT_EQ(vision, 7 + 34 * 16 + 2 + 1);
  EXPECT_EQ(t.at("vision_model.patch_embedding.linear.weight").shape,
            (std::vector<int64_t>{1408, 3 * 14 * 14}));
  EXPECT_EQ(t.at("vision_model.positional_embedding_vlm").shape, (std::vector<int64_t>{577, 1408}));
  const TensorDef& q = t.at("vision_model.model.layers.33.self_attn.q_proj.weight");
  EXPECT_EQ(q.split, TpSplit::kColumn);
  EXPECT_EQ(q.split_heads, 16);
  EXPECT_EQ(t.at("vision_model.model.layers.0.self_attn.o_proj.bias").split, TpSplit::kReplicated);
  EXPECT_EQ(t.at("vision_model.vision_adapter.mlp.fc1.weight").shape,
            (std::vector<int64_t>{4096, 5632}));
  EXPECT_EQ(t.at("vision_model.vision_adapter.mlp.fc2.weight").split, TpSplit::kRow);
  EXPECT_EQ(t.count("vision_model.vision_adapter.mlp.fc1.bias"), 0u);
  const TensorDef& proj = t.at("multi_modal_projector.linear_1.weight");
  EXPECT_EQ(proj.shape, (std::vector<int64_t>{5120, 4096}));
  EXPECT_EQ(proj.split, TpSplit::kColumn);
  EXPECT_EQ(proj.split_heads, 0);
  // Maverick: MoE on every second layer (1, 3, ..., 47), 128 experts, the same tower.
  const ModelConfig mv = Preset("llama-4-maverick-17b-128e");
  EXPECT_EQ(mv.num_moe_layers(), 24);
  EXPECT_FALSE(mv.layers[0].moe);
  EXPECT_TRUE(mv.layers[47].moe);
  EXPECT_EQ(mv.num_experts, 128);
  EXPECT_EQ(mv.vision.num_layers, 34);
}

// Llama-4 (vLLM llama4.py): top-1 sigmoid applied to the expert input, MoE every
// interleave_moe_layer_step layers, fused input-major experts with gate columns first.
TEST(FamilyTest, Llama4) {
  const ModelConfig c = Preset("tiny-llama4");
  EXPECT_EQ(c.family_name(), "llama4");
  EXPECT_TRUE(c.router_weight_on_input);
  EXPECT_EQ(c.routing, RoutingMethod::kTopKThenSigmoid);
  EXPECT_EQ(c.num_moe_layers(), 2);
  EXPECT_FALSE(c.layers[0].moe);
  EXPECT_TRUE(c.layers[1].moe);
  const auto t = ByName(c);
  EXPECT_EQ(t.at("language_model.model.layers.{layer}.feed_forward.gate_proj").shape,
            (std::vector<int64_t>{256, 128}));
  EXPECT_EQ(t.at("language_model.model.layers.{layer}.feed_forward.shared_expert.gate_proj").shape,
            (std::vector<int64_t>{64, 128}));
  const ExpertLayout x = c.family->experts(c);
  EXPECT_TRUE(x.fused && x.fused_in_major && !x.gate_up_interleaved);
  EXPECT_EQ(x.fused_gate_up,
            "language_model.model.layers.{layer}.feed_forward.experts.gate_up_proj");
}

// DeepSeek-V4-Flash as its config.json and vLLM's / DeepSeek's model code give it (descriptor
// src/config/families/deepseek_v4.cc).
TEST(FamilyTest, DeepseekV4Flash) {
  const ModelConfig c = Preset("deepseek-v4-flash");
  EXPECT_EQ(c.family_name(), "deepseek_v4");
  EXPECT_EQ(c.num_layers, 43);
  EXPECT_EQ(c.num_moe_layers(), 43);  // every layer MoE, no dense prefix
  EXPECT_EQ(c.num_layers_of(AttentionKind::kCompressedMqa), 43);
  EXPECT_EQ(c.num_hash_layers(), 3);
  EXPECT_TRUE(c.layers[2].hash_routing);
  EXPECT_FALSE(c.layers[3].hash_routing);
  // compress_ratios [0, 0, 4, 128, ..., 4, 0]: the 44th entry is the MTP block's.
  EXPECT_EQ(c.layers[0].compress_ratio, 0);
  EXPECT_EQ(c.layers[1].compress_ratio, 0);
  EXPECT_EQ(c.layers[2].compress_ratio, 4);
  EXPECT_EQ(c.layers[3].compress_ratio, 128);
  EXPECT_EQ(c.layers[42].compress_ratio, 4);
  EXPECT_EQ(c.num_mtp_layers, 1);
  EXPECT_EQ(c.routing, RoutingMethod::kSqrtSoftplusTopK);
  EXPECT_TRUE(c.has_correction_bias);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_EQ(c.activation, ExpertActivation::kSwiGluClamp);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 10.0);
  EXPECT_EQ(c.hc.hc_mult, 4);
  EXPECT_EQ(c.cmqa.index_topk, 512);
  // fp8 128 x 128 linears, MXFP4 experts (expert_dtype "fp4").
  EXPECT_EQ(c.quant.scheme.format, WeightFormat::kFp8Block);
  EXPECT_EQ(c.expert_scheme().format, WeightFormat::kMxfp4);
  EXPECT_EQ(c.expert_scheme().group, 32);

  const auto t = ByName(c);
  const int64_t H = 4096;
  EXPECT_EQ(t.at("layers.{layer}.attn.wq_a").shape, (std::vector<int64_t>{1024, H}));
  EXPECT_EQ(t.at("layers.{layer}.attn.wq_b").shape, (std::vector<int64_t>{64 * 512, 1024}));
  EXPECT_EQ(t.at("layers.{layer}.attn.wq_b").split, TpSplit::kColumn);
  EXPECT_EQ(t.at("layers.{layer}.attn.wkv").shape, (std::vector<int64_t>{512, H}));
  EXPECT_EQ(t.at("layers.{layer}.attn.wkv").split, TpSplit::kReplicated);
  EXPECT_EQ(t.at("layers.{layer}.attn.wo_a").shape, (std::vector<int64_t>{8 * 1024, 64 * 512 / 8}));
  EXPECT_EQ(t.at("layers.{layer}.attn.wo_b").shape, (std::vector<int64_t>{H, 8 * 1024}));
  EXPECT_EQ(t.at("layers.{layer}.attn.wo_b").split, TpSplit::kRow);
  EXPECT_EQ(t.at("layers.{layer}.attn.attn_sink").dtype, DType::kF32);
  EXPECT_EQ(t.at("layers.{layer}.attn.wq_a").format.format, WeightFormat::kFp8Block);
  // Compressors: ratio 4 overlaps two windows (2 x 512 wide), ratio 128 one; both unquantized.
  const TensorDef& c4 = t.at("layers.{layer}.attn.compressor.wkv");
  const TensorDef& c128 = t.at("layers.{layer}.attn.compressor.wkv@3");
  EXPECT_EQ(c4.shape, (std::vector<int64_t>{1024, H}));
  EXPECT_EQ(c4.layers.size(), 21u);
  EXPECT_EQ(c4.format.format, WeightFormat::kBf16);
  EXPECT_EQ(c128.shape, (std::vector<int64_t>{512, H}));
  EXPECT_EQ(c128.layers.size(), 20u);
  EXPECT_EQ(t.at("layers.{layer}.attn.compressor.ape").shape, (std::vector<int64_t>{4, 1024}));
  EXPECT_EQ(t.at("layers.{layer}.attn.compressor.ape@3").shape, (std::vector<int64_t>{128, 512}));
  // The lightning indexer on the ratio-4 layers only.
  const TensorDef& iq = t.at("layers.{layer}.attn.indexer.wq_b");
  EXPECT_EQ(iq.shape, (std::vector<int64_t>{64 * 128, 1024}));
  EXPECT_EQ(iq.layers, c4.layers);
  EXPECT_EQ(t.at("layers.{layer}.attn.indexer.weights_proj").shape, (std::vector<int64_t>{64, H}));
  EXPECT_EQ(t.at("layers.{layer}.attn.indexer.compressor.wkv").shape,
            (std::vector<int64_t>{256, H}));
  EXPECT_EQ(t.count("layers.{layer}.attn.indexer.wq_b@3"), 0u);
  // mHC: (2 + 4) * 4 = 24 mixes over 4 streams of H, fp32.
  EXPECT_EQ(t.at("layers.{layer}.hc_ffn_fn").shape, (std::vector<int64_t>{24, 4 * H}));
  EXPECT_EQ(t.at("layers.{layer}.hc_ffn_fn").dtype, DType::kF32);
  EXPECT_EQ(t.at("hc_head_fn").shape, (std::vector<int64_t>{4, 4 * H}));
  // The MoE block: router everywhere, bias on score layers, tid2eid on the 3 hash layers.
  EXPECT_EQ(t.at("layers.{layer}.ffn_norm.weight").role, TensorRole::kPreMoeNorm);
  EXPECT_EQ(t.at("layers.{layer}.ffn.gate").shape, (std::vector<int64_t>{256, H}));
  EXPECT_EQ(t.at("layers.{layer}.ffn.gate").layers.size(), 43u);
  const TensorDef& bias = t.at("layers.{layer}.ffn.gate.bias");
  EXPECT_EQ(bias.role, TensorRole::kCorrectionBias);
  EXPECT_EQ(bias.layers.front(), 3);
  EXPECT_EQ(bias.layers.size(), 40u);
  const TensorDef& table = t.at("layers.{layer}.ffn.gate.tid2eid");
  EXPECT_EQ(table.role, TensorRole::kHashTable);
  EXPECT_EQ(table.dtype, DType::kI64);  // as the release stores it
  EXPECT_EQ(table.shape, (std::vector<int64_t>{129280, 6}));
  EXPECT_EQ(table.layers, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(t.at("layers.{layer}.ffn.shared_experts.w1").shape, (std::vector<int64_t>{2048, H}));
  EXPECT_EQ(t.at("layers.{layer}.ffn.shared_experts.w2").role, TensorRole::kSharedDown);
  EXPECT_EQ(t.at("embed.weight").shape, (std::vector<int64_t>{129280, H}));
  EXPECT_EQ(t.at("head.weight").category, TensorCategory::kLmHead);
  const ExpertLayout x = c.family->experts(c);
  EXPECT_EQ(x.gate, "layers.{layer}.ffn.experts.{expert}.w1");
  EXPECT_EQ(x.up, "layers.{layer}.ffn.experts.{expert}.w3");
  EXPECT_EQ(x.down, "layers.{layer}.ffn.experts.{expert}.w2");
}

// expert_dtype "fp8" (DeepSeek-V4-Flash-Base) keeps the experts in the fp8 scheme; no
// quantization_config means bf16 throughout; no swiglu_limit means a plain SwiGLU.
TEST(FamilyTest, DeepseekV4ExpertDtypeAndDefaults) {
  auto parse = [](const std::string& edit_from, const std::string& edit_to) {
    std::string json;
    for (const PresetInfo& p : ModelPresets()) {
      if (p.name == "tiny-deepseek-v4") json = p.json;
    }
    const size_t at = json.find(edit_from);
    EXPECT_NE(at, std::string::npos) << edit_from;
    if (at != std::string::npos) json.replace(at, edit_from.size(), edit_to);
    return ParseModelConfig(json, "edited tiny-deepseek-v4", "t");
  };
  auto fp8 = parse(R"("expert_dtype": "fp4")", R"("expert_dtype": "fp8")");
  ASSERT_TRUE(fp8.ok()) << fp8.status().ToString();
  EXPECT_EQ(fp8->expert_scheme().format, WeightFormat::kFp8Block);
  auto nolimit = parse(R"("swiglu_limit": 10.0,)", "");
  ASSERT_TRUE(nolimit.ok()) << nolimit.status().ToString();
  EXPECT_EQ(nolimit->activation, ExpertActivation::kSwiGlu);
  auto notopk = parse(R"("topk_method": "noaux_tc",)", "");
  ASSERT_TRUE(notopk.ok()) << notopk.status().ToString();
  EXPECT_FALSE(notopk->has_correction_bias);  // vLLM builds it only for noaux_tc
  auto bf16 = parse(R"("quant_method": "fp8",)", R"("quant_method": "none",)");
  EXPECT_FALSE(bf16.ok());  // an unknown quant_method is still an error
  auto tiny = parse(R"("expert_dtype": "fp4")", R"("expert_dtype": "fp4")");
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  EXPECT_EQ(tiny->expert_scheme().format, WeightFormat::kMxfp4);
}

// What DeepSeek-V4 configs moeshard cannot take: each error names the field, the value and what
// is supported.
TEST(FamilyTest, DeepseekV4UnsupportedValuesNameTheFieldTheValueAndTheChoices) {
  std::string tiny;
  for (const PresetInfo& p : ModelPresets()) {
    if (p.name == "tiny-deepseek-v4") tiny = p.json;
  }
  ASSERT_FALSE(tiny.empty());
  struct Bad {
    std::string from, to;
    std::vector<std::string> want;  // substrings of the message
  };
  const std::vector<Bad> cases = {
      {R"("scoring_func": "sqrtsoftplus")",
       R"("scoring_func": "sigmoid")",
       {"scoring_func", "sigmoid", "sqrtsoftplus"}},
      {R"("compress_ratios": [0, 4, 128, 4, 0])",
       R"("compress_ratios": [0, 4, 8, 4, 0])",
       {"compress_ratios", "8 for layer 2", "128"}},
      {R"("compress_ratios": [0, 4, 128, 4, 0])",
       R"("compress_ratios": [0, 4, 128])",
       {"compress_ratios", "3 entries", "4 at least"}},
      {R"("num_key_value_heads": 1)",
       R"("num_key_value_heads": 2)",
       {"num_key_value_heads", "2", "one shared KV head"}},
      {R"("expert_dtype": "fp4")",
       R"("expert_dtype": "int4")",
       {"expert_dtype", "int4", "fp4", "fp8"}},
      {R"("topk_method": "noaux_tc")",
       R"("topk_method": "greedy")",
       {"topk_method", "greedy", "noaux_tc"}},
      {R"("num_hash_layers": 2)",
       R"("num_hash_layers": 9)",
       {"num_hash_layers", "9", "<= num_hidden_layers (4)"}},
      {R"("o_groups": 8)", R"("o_groups": 3)", {"o_groups", "3", "divisor"}},
      {R"("hidden_act": "silu")", R"("hidden_act": "gelu")", {"hidden_act", "gelu", "silu"}},
  };
  for (const Bad& b : cases) {
    std::string json = tiny;
    const size_t at = json.find(b.from);
    ASSERT_NE(at, std::string::npos) << b.from;
    json.replace(at, b.from.size(), b.to);
    const Result<ModelConfig> r = ParseModelConfig(json, "edited", "t");
    ASSERT_FALSE(r.ok()) << b.to;
    for (const std::string& w : b.want) {
      EXPECT_NE(r.status().ToString().find(w), std::string::npos)
          << b.to << ": '" << w << "' not in " << r.status().ToString();
    }
  }
}

}  // namespace
}  // namespace moeshard
