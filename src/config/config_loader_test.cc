#include "moeshard/config/config_loader.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "moeshard/config/family.h"

namespace moeshard {
namespace {

ModelConfig Preset(const std::string& name) {
  Result<ModelConfig> r = LoadModelConfig(name);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return *std::move(r);
}

nlohmann::json PresetJson(const std::string& name) {
  for (const PresetInfo& p : ModelPresets()) {
    if (p.name == name) return nlohmann::json::parse(p.json);
  }
  ADD_FAILURE() << "no preset " << name;
  return {};
}

// Parses a preset after editing its JSON; returns the error message ("" if it parsed).
std::string ErrorAfterEdit(const std::string& preset,
                           const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = PresetJson(preset);
  edit(j);
  Result<ModelConfig> r = ParseModelConfig(j.dump(), "edited.json", "edited");
  return r.ok() ? "" : r.status().message();
}

TEST(ConfigTest, EveryPresetParses) {
  ASSERT_GE(ModelPresets().size(), 8u);
  for (const PresetInfo& p : ModelPresets()) {
    Result<ModelConfig> r = LoadModelConfig(p.name);
    EXPECT_TRUE(r.ok()) << p.name << ": " << r.status().ToString();
    EXPECT_FALSE(p.description.empty()) << p.name;
  }
}

// transformers 5 writes some families' expert counts under their attribute-map names
// (Qwen3-MoE: num_local_experts; MiniMax-M2 already does); both spellings read the same, and a
// contradiction between them is an error naming both.
TEST(ConfigTest, Transformers5SpellingsReadTheSame) {
  for (const auto& [preset, old_key, new_key] :
       {std::tuple{"qwen3-30b-a3b", "num_experts", "num_local_experts"},
        std::tuple{"qwen1.5-moe-a2.7b", "num_experts", "num_local_experts"},
        std::tuple{"minimax-m2", "num_local_experts", "num_experts"}}) {
    SCOPED_TRACE(preset);
    nlohmann::json j = PresetJson(preset);
    const int64_t experts = j[old_key];
    j.erase(old_key);
    j[new_key] = experts;
    Result<ModelConfig> r = ParseModelConfig(j.dump(), "t5.json", "t5");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->num_experts, experts);
    j[old_key] = experts + 1;
    r = ParseModelConfig(j.dump(), "t5.json", "t5");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(old_key), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(new_key), std::string::npos) << r.status().message();
  }
}

// A config without norm_topk_prob takes its family's transformers default: false for
// Qwen2MoeConfig and Qwen3MoeConfig, true for Qwen3NextConfig (tests/runtime/hf_reference_test.py
// found Qwen3-Next read as false).
TEST(ConfigTest, NormTopkProbDefaultsPerFamily) {
  for (const auto& [preset, expected] :
       {std::pair{"qwen1.5-moe-a2.7b", false}, std::pair{"qwen3-30b-a3b", false},
        std::pair{"qwen3-next-80b-a3b", true}}) {
    SCOPED_TRACE(preset);
    nlohmann::json j = PresetJson(preset);
    j.erase("norm_topk_prob");
    Result<ModelConfig> r = ParseModelConfig(j.dump(), "edited.json", "edited");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->norm_topk_prob, expected);
  }
}

TEST(ConfigTest, KimiK3) {
  ModelConfig c = Preset("kimi-k3");
  EXPECT_EQ(c.family_name(), "kimi_k3");
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_layers, 93);
  EXPECT_EQ(c.num_moe_layers(), 92);  // first_k_dense_replace 1
  EXPECT_FALSE(c.layers[0].moe);
  EXPECT_EQ(c.intermediate_size, 33792);
  EXPECT_EQ(c.num_experts, 896);
  EXPECT_EQ(c.num_experts_per_tok, 16);
  EXPECT_EQ(c.moe_intermediate_size, 3072);
  EXPECT_EQ(c.num_shared_experts, 2);
  EXPECT_EQ(c.shared_expert_intermediate_size, 6144);
  EXPECT_TRUE(c.latent_moe);
  EXPECT_EQ(c.routed_expert_hidden_size, 3584);
  EXPECT_TRUE(c.latent_moe_use_norm);
  EXPECT_EQ(c.activation, ExpertActivation::kSitu);
  EXPECT_DOUBLE_EQ(c.situ_beta, 4.0);
  EXPECT_DOUBLE_EQ(c.situ_linear_beta, 25.0);
  EXPECT_EQ(c.routing, RoutingMethod::kSigmoidGroupedTopK);
  EXPECT_TRUE(c.has_correction_bias);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.num_attention_heads, 96);
  EXPECT_EQ(c.num_layers_of(AttentionKind::kMla), 24);
  EXPECT_EQ(c.num_layers_of(AttentionKind::kKda), 69);
  // MLA at 0-based 3, 7, ..., 91 and the last layer 92.
  for (int64_t i = 0; i < 93; ++i) {
    const bool mla = (i % 4 == 3) || i == 92;
    EXPECT_EQ(c.layers[i].attention == AttentionKind::kMla, mla) << i;
  }
  EXPECT_EQ(c.kda.low_rank_dim, 128);
  // The release's spellings: use_full_rank_gate, moe_renormalize, moe_router_activation_func,
  // num_expert_group, quantization_config inside text_config, and the vision tower.
  EXPECT_TRUE(c.kda.full_rank_gate);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.scoring, ScoringFunc::kSigmoid);
  EXPECT_EQ(c.attn_res_block_size, 12);
  EXPECT_EQ(c.vision.num_layers, 27);
  EXPECT_EQ(c.vision.hidden_size, 1024);
  EXPECT_EQ(c.vision.qkv_hidden_size, 1536);
  EXPECT_EQ(c.vision.merge_tokens, 4);
  EXPECT_TRUE(c.vision.projector_post_norm);
  EXPECT_FALSE(c.vision.linear_bias);
  EXPECT_EQ(c.vocab_size, 163840);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  EXPECT_EQ(c.min_moe_intermediate_per_partition, 256);
  EXPECT_EQ(c.quant.scheme.format, WeightFormat::kMxfp4);
  EXPECT_EQ(c.quant.scheme.group, 32);
  EXPECT_TRUE(
      c.quant.IsIgnored("language_model.model.layers.3.block_sparse_moe.shared_experts.down_proj"));
  EXPECT_TRUE(c.quant.IsIgnored("language_model.lm_head"));
  EXPECT_FALSE(c.quant.IsIgnored("language_model.model.layers.3.block_sparse_moe.experts.7.w2"));
}

TEST(ConfigErrorTest, KimiK3ReleaseSpellingsContradict) {
  // moe_renormalize and norm_topk_prob name the same quantity.
  std::string e =
      ErrorAfterEdit("kimi-k3", [](auto& j) { j["text_config"]["norm_topk_prob"] = false; });
  EXPECT_NE(e.find("'text_config.norm_topk_prob'"), std::string::npos) << e;
  EXPECT_NE(e.find("moe_renormalize"), std::string::npos) << e;
  // A family that nests its language model needs text_config.
  e = ErrorAfterEdit("kimi-k3", [](auto& j) { j.erase("text_config"); });
  EXPECT_NE(e.find("'text_config'"), std::string::npos) << e;
}

TEST(ConfigTest, DeepseekAndKimiK2) {
  ModelConfig d = Preset("deepseek-v3");
  EXPECT_EQ(d.family_name(), "deepseek_v3");
  EXPECT_EQ(d.num_moe_layers(), 58);
  EXPECT_EQ(d.num_experts, 256);
  EXPECT_EQ(d.n_group, 8);
  EXPECT_EQ(d.topk_group, 4);
  EXPECT_DOUBLE_EQ(d.routed_scaling_factor, 2.5);
  EXPECT_EQ(d.quant.scheme.format, WeightFormat::kFp8Block);
  EXPECT_EQ(d.quant.scheme.block_rows, 128);
  EXPECT_EQ(d.quant.scheme.group, 128);
  EXPECT_EQ(d.num_mtp_layers, 1);
  EXPECT_EQ(d.mla.kv_lora_rank, 512);
  EXPECT_EQ(d.vocab_size, 129280);

  ModelConfig k = Preset("kimi-k2");
  EXPECT_EQ(k.num_experts, 384);
  EXPECT_EQ(k.num_moe_layers(), 60);
  EXPECT_EQ(k.num_attention_heads, 64);
  EXPECT_DOUBLE_EQ(k.routed_scaling_factor, 2.827);
  EXPECT_EQ(k.quant.scheme.format, WeightFormat::kInt4);
  EXPECT_EQ(k.quant.scheme.group, 32);
  EXPECT_TRUE(k.quant.weight_shape_meta);
  EXPECT_TRUE(k.quant.IsIgnored("model.layers.1.self_attn.kv_b_proj"));
  EXPECT_TRUE(k.quant.IsIgnored("model.layers.0.mlp.down_proj"));  // dense MLP stays bf16
  EXPECT_FALSE(k.quant.IsIgnored("model.layers.1.mlp.experts.0.down_proj"));
}

TEST(ConfigTest, QwenMixtralGptOss) {
  ModelConfig q = Preset("qwen3-235b-a22b");
  EXPECT_EQ(q.hidden_size, 4096);
  EXPECT_EQ(q.num_layers, 94);
  EXPECT_EQ(q.num_moe_layers(), 94);
  EXPECT_EQ(q.moe_intermediate_size, 1536);
  EXPECT_EQ(q.num_kv_heads, 4);
  EXPECT_TRUE(q.norm_topk_prob);
  EXPECT_FALSE(q.quant.enabled());

  ModelConfig m = Preset("mixtral-8x7b");
  EXPECT_EQ(m.num_experts, 8);
  EXPECT_EQ(m.num_experts_per_tok, 2);
  EXPECT_EQ(m.moe_intermediate_size, 14336);
  EXPECT_EQ(m.head_dim, 128);

  ModelConfig g = Preset("gpt-oss-120b");
  EXPECT_EQ(g.family_name(), "gpt_oss");
  EXPECT_EQ(g.num_experts, 128);
  EXPECT_EQ(g.num_experts_per_tok, 4);
  EXPECT_EQ(g.activation, ExpertActivation::kSwiGluOai);
  EXPECT_EQ(g.routing, RoutingMethod::kTopKThenSoftmax);
  EXPECT_TRUE(g.expert_bias);
  EXPECT_TRUE(g.layers[0].sliding);
  EXPECT_FALSE(g.layers[1].sliding);
  EXPECT_EQ(g.quant.scheme.format, WeightFormat::kMxfp4);
  EXPECT_TRUE(g.quant.IsIgnored("model.layers.7.self_attn"));
  EXPECT_TRUE(g.quant.IsIgnored("model.layers.7.self_attn.q_proj"));
  EXPECT_TRUE(g.quant.IsIgnored("model.layers.7.mlp.router"));
  EXPECT_FALSE(g.quant.IsIgnored("model.layers.7.mlp.experts"));
  EXPECT_EQ(Preset("gpt-oss-20b").num_experts, 32);
}

TEST(ConfigErrorTest, NamesFieldAndFile) {
  std::string e =
      ErrorAfterEdit("qwen3-30b-a3b", [](auto& j) { j.erase("moe_intermediate_size"); });
  EXPECT_NE(e.find("'moe_intermediate_size'"), std::string::npos) << e;
  EXPECT_NE(e.find("edited.json"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;

  e = ErrorAfterEdit("kimi-k3", [](auto& j) { j["text_config"].erase("num_experts"); });
  EXPECT_NE(e.find("'text_config.num_experts'"), std::string::npos) << e;

  e = ErrorAfterEdit("qwen3-30b-a3b", [](auto& j) { j["model_type"] = "dbrx"; });
  EXPECT_NE(e.find("'model_type'"), std::string::npos) << e;
  EXPECT_NE(e.find("dbrx"), std::string::npos) << e;
  EXPECT_NE(e.find("qwen3_moe"), std::string::npos) << e;  // lists what is supported

  e = ErrorAfterEdit("qwen3-30b-a3b", [](auto& j) { j["hidden_size"] = "2048"; });
  EXPECT_NE(e.find("expected an integer"), std::string::npos) << e;

  e = ErrorAfterEdit("qwen3-30b-a3b", [](auto& j) { j["hidden_size"] = -5; });
  EXPECT_NE(e.find("'hidden_size'"), std::string::npos) << e;
}

TEST(ConfigErrorTest, Contradictions) {
  std::string e = ErrorAfterEdit("qwen3-30b-a3b", [](auto& j) { j["num_experts_per_tok"] = 129; });
  EXPECT_NE(e.find("'num_experts_per_tok'"), std::string::npos) << e;
  EXPECT_NE(e.find("128"), std::string::npos) << e;

  e = ErrorAfterEdit("kimi-k3", [](auto& j) { j["text_config"]["num_experts_per_tok"] = 8; });
  EXPECT_NE(e.find("contradict"), std::string::npos) << e;

  e = ErrorAfterEdit("qwen3-30b-a3b", [](auto& j) { j["num_key_value_heads"] = 5; });
  EXPECT_NE(e.find("'num_key_value_heads'"), std::string::npos) << e;

  e = ErrorAfterEdit("deepseek-v3", [](auto& j) { j["topk_group"] = 9; });
  EXPECT_NE(e.find("'topk_group'"), std::string::npos) << e;

  e = ErrorAfterEdit("deepseek-v3", [](auto& j) { j["n_group"] = 7; });
  EXPECT_NE(e.find("'n_group'"), std::string::npos) << e;

  e = ErrorAfterEdit("kimi-k3", [](auto& j) {
    j["text_config"]["linear_attn_config"]["kda_layers"].push_back(4);  // also in full_attn_layers
  });
  EXPECT_NE(e.find("listed twice"), std::string::npos) << e;

  e = ErrorAfterEdit("kimi-k3",
                     [](auto& j) { j["text_config"]["routed_expert_hidden_size"] = 9000; });
  EXPECT_NE(e.find("'text_config.routed_expert_hidden_size'"), std::string::npos) << e;

  e = ErrorAfterEdit("gpt-oss-20b", [](auto& j) { j["layer_types"].erase(0); });
  EXPECT_NE(e.find("'layer_types'"), std::string::npos) << e;
}

// The vision_config of Qwen3.5 and Llama-4: what the towers cannot be is an error naming the
// field (the merger / projector feed the text model; Qwen3.5 has no deepstack mergers).
TEST(ConfigErrorTest, VisionConfigs) {
  std::string e = ErrorAfterEdit("qwen3.5-35b-a3b",
                                 [](auto& j) { j["vision_config"]["out_hidden_size"] = 3584; });
  EXPECT_NE(e.find("'vision_config.out_hidden_size'"), std::string::npos) << e;
  EXPECT_NE(e.find("2048"), std::string::npos) << e;
  e = ErrorAfterEdit("qwen3.5-35b-a3b", [](auto& j) {
    j["vision_config"]["deepstack_visual_indexes"] = {8, 16, 24};
  });
  EXPECT_NE(e.find("'vision_config.deepstack_visual_indexes'"), std::string::npos) << e;
  e = ErrorAfterEdit("qwen3.5-35b-a3b", [](auto& j) { j["vision_config"]["num_heads"] = 7; });
  EXPECT_NE(e.find("'vision_config.hidden_size'"), std::string::npos) << e;
  // Absent: transformers' defaults (out_hidden_size 3584), which do not fit this text model.
  e = ErrorAfterEdit("qwen3.5-35b-a3b",
                     [](auto& j) { j["vision_config"] = nlohmann::json::object(); });
  EXPECT_NE(e.find("'vision_config.out_hidden_size'"), std::string::npos) << e;
  EXPECT_EQ(ErrorAfterEdit("qwen3.5-35b-a3b", [](auto& j) { j.erase("vision_config"); }), "");

  e = ErrorAfterEdit("llama-4-scout-17b-16e",
                     [](auto& j) { j["vision_config"]["vision_output_dim"] = 7680; });
  EXPECT_NE(e.find("'vision_config.vision_output_dim'"), std::string::npos) << e;
  EXPECT_NE(e.find("4096"), std::string::npos) << e;
  e = ErrorAfterEdit("llama-4-scout-17b-16e",
                     [](auto& j) { j["vision_config"]["pixel_shuffle_ratio"] = 0.3; });
  EXPECT_NE(e.find("'vision_config.pixel_shuffle_ratio'"), std::string::npos) << e;
  e = ErrorAfterEdit("llama-4-scout-17b-16e",
                     [](auto& j) { j["vision_config"]["image_size"] = 340; });
  EXPECT_NE(e.find("'vision_config.image_size'"), std::string::npos) << e;
  e = ErrorAfterEdit("llama-4-scout-17b-16e",
                     [](auto& j) { j["vision_config"].erase("num_hidden_layers"); });
  EXPECT_NE(e.find("'vision_config.num_hidden_layers'"), std::string::npos) << e;
  EXPECT_EQ(ErrorAfterEdit("llama-4-scout-17b-16e", [](auto& j) { j.erase("vision_config"); }), "");
}

TEST(ConfigErrorTest, Quantization) {
  std::string e = ErrorAfterEdit(
      "deepseek-v3", [](auto& j) { j["quantization_config"].erase("weight_block_size"); });
  EXPECT_NE(e.find("weight_block_size"), std::string::npos) << e;
  e = ErrorAfterEdit("kimi-k2", [](auto& j) { j["quantization_config"]["quant_method"] = "gguf"; });
  EXPECT_NE(e.find("'quantization_config.quant_method'"), std::string::npos) << e;
  e = ErrorAfterEdit("kimi-k3", [](auto& j) {
    j["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] =
        16;
  });
  EXPECT_NE(e.find("group_size"), std::string::npos) << e;
  EXPECT_NE(e.find("32"), std::string::npos) << e;
}

// Every quantization_config spelling of the int4-with-zero-points and NVFP4 releases: the
// format, group and checkpoint layout each one gives, and the error naming the field for what
// is not supported.
TEST(ConfigTest, QuantizationMethods) {
  struct Case {
    const char* preset;
    WeightFormat format;
    int64_t group;
    QuantLayout layout;
  };
  for (const Case& c :
       {Case{"tiny-qwen2-moe-awq", WeightFormat::kInt4Zp, 32, QuantLayout::kAwq},
        Case{"tiny-qwen2-moe-gptq", WeightFormat::kInt4Zp, 32, QuantLayout::kGptq},
        Case{"tiny-qwen2-moe-w4a16-asym", WeightFormat::kInt4Zp, 32,
             QuantLayout::kCompressedTensors},
        Case{"tiny-qwen2-moe-nvfp4", WeightFormat::kNvfp4, 16, QuantLayout::kCompressedTensors},
        Case{"tiny-qwen2-moe-modelopt-nvfp4", WeightFormat::kNvfp4, 16, QuantLayout::kModelOpt},
        Case{"tiny-qwen2-moe-fp8-dynamic", WeightFormat::kFp8Block, kFp8RowUniformGroup,
             QuantLayout::kFp8PerChannel},
        Case{"tiny-qwen2-moe-modelopt-fp8", WeightFormat::kFp8Block, kFp8RowUniformGroup,
             QuantLayout::kFp8PerTensor},
        // The released checkpoints' config.json files (models/README.md).
        Case{"qwen1.5-moe-a2.7b-chat-gptq-int4", WeightFormat::kInt4Zp, 128, QuantLayout::kGptq},
        Case{"mixtral-8x7b-instruct-v0.1-awq", WeightFormat::kInt4Zp, 128, QuantLayout::kAwq},
        Case{"kimi-k2.5", WeightFormat::kInt4, 32, QuantLayout::kNative},
        Case{"qwen3-235b-a22b-nvfp4", WeightFormat::kNvfp4, 16, QuantLayout::kModelOpt},
        Case{"minimax-m2.5-nvfp4", WeightFormat::kNvfp4, 16, QuantLayout::kModelOpt},
        Case{"llama-4-scout-17b-16e-instruct-fp8-dynamic", WeightFormat::kFp8Block,
             kFp8RowUniformGroup, QuantLayout::kFp8PerChannel}}) {
    SCOPED_TRACE(c.preset);
    const ModelConfig m = Preset(c.preset);
    EXPECT_EQ(m.quant.scheme.format, c.format);
    EXPECT_EQ(m.quant.scheme.group, c.group);
    EXPECT_EQ(m.quant.scheme.layout, c.layout);
  }
  auto edited = [](const char* preset, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = PresetJson(preset);
    edit(j["quantization_config"]);
    Result<ModelConfig> r = ParseModelConfig(j.dump(), "edited.json", "edited");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->quant : QuantizationConfig{};
  };
  // quant_config.json spellings of AutoAWQ (w_bit, q_group_size), vLLM awq.py reads both.
  QuantizationConfig q = edited("tiny-qwen2-moe-awq", [](auto& j) {
    j.erase("bits");
    j.erase("group_size");
    j["w_bit"] = 4;
    j["q_group_size"] = 64;
    j["version"] = "GEMM";
  });
  EXPECT_EQ(q.scheme, (WeightScheme{WeightFormat::kInt4Zp, 64, 1, QuantLayout::kAwq}));
  // AWQ's modules_to_not_convert match anywhere in the name (AutoAWQ / vLLM: `key in name`).
  q = edited("tiny-qwen2-moe-awq", [](auto& j) {
    j["modules_to_not_convert"] = {"shared_expert.", "layers.1.mlp.experts"};
  });
  EXPECT_TRUE(q.IsIgnored("model.layers.0.mlp.shared_expert.up_proj"));
  EXPECT_TRUE(q.IsIgnored("model.layers.1.mlp.experts.3.down_proj"));
  EXPECT_FALSE(q.IsIgnored("model.layers.0.mlp.experts.3.down_proj"));
  EXPECT_FALSE(q.IsIgnored("model.layers.0.mlp.shared_expert_gate"));  // '.' is literal
  // GPTQModel's v2 format stores zero points as they are.
  q = edited("tiny-qwen2-moe-gptq", [](auto& j) { j["checkpoint_format"] = "gptq_v2"; });
  EXPECT_EQ(q.scheme.layout, QuantLayout::kGptqV2);
  // Act-order: each input channel's group is read from g_idx.
  EXPECT_FALSE(Preset("tiny-qwen2-moe-gptq").quant.scheme.act_order);
  EXPECT_TRUE(Preset("tiny-qwen2-moe-gptq-act").quant.scheme.act_order);
  // GPTQModel's `dynamic` rules: "-:" leaves modules unquantized (re.match on the module name).
  q = edited("tiny-qwen2-moe-gptq", [](auto& j) {
    j["dynamic"] = {{"-:.*shared_expert.*", nlohmann::json::object()},
                    {"+:.*experts.*", {{"bits", 4}, {"group_size", 32}}}};
  });
  EXPECT_TRUE(q.IsIgnored("model.layers.0.mlp.shared_expert.up_proj"));
  EXPECT_FALSE(q.IsIgnored("model.layers.0.mlp.experts.3.up_proj"));
  // ModelOpt with quant_algo at the top (config.json's quantization_config), modelopt_fp4.
  q = edited("tiny-qwen2-moe-modelopt-nvfp4", [](auto& j) {
    j = {{"quant_method", "modelopt_fp4"},
         {"quant_algo", "NVFP4"},
         {"group_size", 16},
         {"exclude_modules", {"lm_head", "model.layers.0.mlp.shared_expert"}}};
  });
  EXPECT_EQ(q.scheme.format, WeightFormat::kNvfp4);
  EXPECT_TRUE(q.IsIgnored("model.layers.0.mlp.shared_expert.up_proj"));
  EXPECT_FALSE(q.IsIgnored("model.layers.1.mlp.shared_expert.up_proj"));
  // compressed-tensors symmetric int4 stays the symmetric format.
  q = edited("tiny-qwen2-moe-w4a16-asym",
             [](auto& j) { j["config_groups"]["group_0"]["weights"]["symmetric"] = true; });
  EXPECT_EQ(q.scheme, (WeightScheme{WeightFormat::kInt4, 32, 1}));
  // compressed-tensors fp8 per tensor and per block.
  q = edited("tiny-qwen2-moe-fp8-dynamic",
             [](auto& j) { j["config_groups"]["group_0"]["weights"]["strategy"] = "tensor"; });
  EXPECT_EQ(q.scheme.layout, QuantLayout::kFp8PerTensor);
  q = edited("tiny-qwen2-moe-fp8-dynamic", [](auto& j) {
    j["config_groups"]["group_0"]["weights"]["strategy"] = "block";
    j["config_groups"]["group_0"]["weights"]["block_structure"] = {128, 64};
  });
  EXPECT_EQ(q.scheme,
            (WeightScheme{WeightFormat::kFp8Block, 64, 128, QuantLayout::kCompressedTensors}));
  EXPECT_EQ(CheckpointLeaves(q.scheme).scale, "weight_scale");
}

// Which linears each released quantized config leaves unquantized, in the spelling the release
// uses: GPTQ's modules_in_block_to_quantize (the routers are not listed), AWQ's
// modules_to_not_convert substring, compressed-tensors `re:` regexes, ModelOpt's module names
// (hf_quant_config.json's exclude_modules) and globs (config.json's ignore).
TEST(ConfigTest, ReleasedQuantizationIgnoreLists) {
  struct Case {
    const char* preset;
    std::vector<const char*> quantized, unquantized;
  };
  const std::vector<Case> cases = {
      {"qwen1.5-moe-a2.7b-chat-gptq-int4",
       {"model.layers.0.self_attn.q_proj", "model.layers.23.self_attn.o_proj",
        "model.layers.0.mlp.shared_expert.down_proj", "model.layers.5.mlp.experts.59.gate_proj"},
       {"model.layers.0.mlp.gate", "model.layers.0.mlp.shared_expert_gate"}},
      {"mixtral-8x7b-instruct-v0.1-awq",
       {"model.layers.0.self_attn.q_proj", "model.layers.0.block_sparse_moe.experts.0.w1"},
       {"model.layers.0.block_sparse_moe.gate"}},
      {"kimi-k2.5",
       {"language_model.model.layers.1.mlp.experts.0.gate_proj"},
       {"language_model.model.layers.1.self_attn.q_a_proj",
        "language_model.model.layers.1.mlp.shared_experts.down_proj",
        "language_model.model.layers.0.mlp.gate_proj"}},
      {"qwen3-235b-a22b-nvfp4",
       {"model.layers.0.self_attn.q_proj", "model.layers.93.self_attn.o_proj"},
       {"model.layers.0.mlp.gate", "model.layers.93.mlp.gate", "lm_head"}},
      {"llama-4-scout-17b-16e-instruct-fp8-dynamic",
       {"language_model.model.layers.0.feed_forward.shared_expert.down_proj",
        "language_model.model.layers.47.feed_forward.shared_expert.gate_proj"},
       {"language_model.model.layers.0.self_attn.q_proj",
        "language_model.model.layers.47.self_attn.o_proj",
        "language_model.model.layers.3.feed_forward.router", "language_model.lm_head",
        "vision_model.model.layers.0.self_attn.q_proj"}},
      {"minimax-m2.5-nvfp4",
       {"model.layers.0.block_sparse_moe.experts.0.w1"},
       {"model.layers.0.self_attn.q_proj", "model.layers.61.self_attn.o_proj",
        "model.layers.3.block_sparse_moe.gate"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.preset);
    const ModelConfig m = Preset(c.preset);
    for (const char* n : c.quantized) EXPECT_FALSE(m.quant.IsIgnored(n)) << n;
    for (const char* n : c.unquantized) EXPECT_TRUE(m.quant.IsIgnored(n)) << n;
  }
}

TEST(ConfigErrorTest, UnsupportedQuantizationNamesTheField) {
  struct Case {
    const char* preset;
    std::function<void(nlohmann::json&)> edit;
    std::vector<const char*> want;  // substrings of the message
  };
  const std::vector<Case> cases = {
      {"tiny-qwen2-moe-gptq",
       [](auto& j) { j["desc_act"] = "yes"; },
       {"'quantization_config.desc_act'", "expected true or false", "got \"yes\""}},
      {"tiny-qwen2-moe-gptq",
       [](auto& j) { j["bits"] = 8; },
       {"'quantization_config.bits'", "expected 4", "got 8"}},
      {"tiny-qwen2-moe-gptq",
       [](auto& j) { j["group_size"] = -1; },
       {"'quantization_config.group_size'", "multiple of 32", "got -1", "per-channel"}},
      {"tiny-qwen2-moe-gptq",
       [](auto& j) {
         j["dynamic"] = {{"+:.*down_proj.*", {{"bits", 8}}}};
       },
       {"'quantization_config.dynamic'", "+:.*down_proj.*", "bits to 8", "checkpoint-wide 4",
        "overrides are not supported"}},
      {"tiny-qwen2-moe-gptq",
       [](auto& j) { j["checkpoint_format"] = "marlin"; },
       {"'quantization_config.checkpoint_format'", "gptq_v2", "marlin"}},
      {"tiny-qwen2-moe-awq",
       [](auto& j) { j["version"] = "gemv"; },
       {"'quantization_config.version'", "\"gemm\"", "\"gemv\""}},
      {"tiny-qwen2-moe-awq",
       [](auto& j) { j["zero_point"] = false; },
       {"'quantization_config.zero_point'", "expected true"}},
      {"tiny-qwen2-moe-modelopt-nvfp4",
       [](auto& j) { j["quantization"]["quant_algo"] = "W4A8_AWQ"; },
       {"'quantization_config.quantization.quant_algo'", "\"NVFP4\"", "\"FP8\"", "W4A8_AWQ"}},
      {"tiny-qwen2-moe-fp8-dynamic",
       [](auto& j) { j["config_groups"]["group_0"]["weights"]["strategy"] = "token"; },
       {"group_0.weights.strategy'", "\"channel\"", "\"block\"", "\"token\""}},
      {"tiny-qwen2-moe-fp8-dynamic",
       [](auto& j) { j["format"] = "pack-quantized"; },
       {"'quantization_config.format'", "float-quantized", "pack-quantized"}},
      {"tiny-qwen2-moe-nvfp4",
       [](auto& j) { j["config_groups"]["group_0"]["weights"]["group_size"] = 32; },
       {"group_0.weights.group_size'", "16 for nvfp4", "got 32"}},
      {"tiny-qwen2-moe-nvfp4",
       [](auto& j) { j["config_groups"]["group_0"]["weights"]["num_bits"] = 8; },
       {"'quantization_config.format'", "float-quantized", "nvfp4-pack-quantized"}},
      {"tiny-qwen2-moe-w4a16-asym",
       [](auto& j) { j["config_groups"]["group_0"]["weights"]["num_bits"] = 8; },
       {"num_bits'", "expected 4", "got 8", "int8"}},
      {"qwen1.5-moe-a2.7b-chat-gptq-int4",
       [](auto& j) {
         j["modules_in_block_to_quantize"] = {{"self_attn.q_proj"}, {"mlp.shared_expert.up_proj"}};
       },
       {"'quantization_config.modules_in_block_to_quantize'", "routed experts",
        "no routed expert module", "unquantized routed experts are not supported"}},
      {"qwen1.5-moe-a2.7b-chat-gptq-int4",
       [](auto& j) {
         j["modules_in_block_to_quantize"] =
             nlohmann::json::array({nlohmann::json::array({"self_attn.q_proj", 3})});
       },
       {"'quantization_config.modules_in_block_to_quantize'", "lists of module names", "got 3"}},
      {"tiny-qwen2-moe-awq",
       [](auto& j) { j["quant_method"] = "bitsandbytes"; },
       {"'quantization_config.quant_method'", "\"awq\"", "\"gptq\"", "\"modelopt\"",
        "\"bitsandbytes\""}},
  };
  for (const Case& c : cases) {
    const std::string e =
        ErrorAfterEdit(c.preset, [&](nlohmann::json& j) { c.edit(j["quantization_config"]); });
    for (const char* w : c.want) EXPECT_NE(e.find(w), std::string::npos) << w << " in: " << e;
  }
  // The architecture is checked before the quantization: an unknown family with an unknown
  // method names the family first.
  const std::string e = ErrorAfterEdit("tiny-qwen2-moe-awq", [](auto& j) {
    j["model_type"] = "dbrx";
    j["quantization_config"]["quant_method"] = "bitsandbytes";
  });
  EXPECT_NE(e.find("model_type"), std::string::npos) << e;
}

TEST(ConfigErrorTest, MalformedJson) {
  Result<ModelConfig> r = ParseModelConfig("{\"model_type\": \"mixtral\",", "bad.json", "x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("bad.json"), std::string::npos);
  EXPECT_NE(r.status().message().find("not valid JSON"), std::string::npos);

  r = ParseModelConfig(R"({"model_type": "mixtral", "model_type": "qwen3_moe"})", "dup.json", "x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'model_type' appears twice"), std::string::npos)
      << r.status().message();

  r = ParseModelConfig("[1, 2]", "arr.json", "x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("object"), std::string::npos);
}

TEST(ConfigLoaderTest, FileDirectoryAndUnknown) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("moeshard_cfg_" + std::to_string(getpid()));
  fs::create_directories(dir);
  {
    std::ofstream out(dir / "config.json");
    out << PresetJson("mixtral-8x7b").dump();
  }
  Result<ModelConfig> from_dir = LoadModelConfig(dir.string());
  ASSERT_TRUE(from_dir.ok()) << from_dir.status().ToString();
  EXPECT_EQ(from_dir->num_experts, 8);
  EXPECT_EQ(from_dir->source, (dir / "config.json").string());
  Result<ModelConfig> from_file = LoadModelConfig((dir / "config.json").string());
  ASSERT_TRUE(from_file.ok());
  fs::remove(dir / "config.json");
  Result<ModelConfig> empty_dir = LoadModelConfig(dir.string());
  ASSERT_FALSE(empty_dir.ok());
  EXPECT_NE(empty_dir.status().message().find("config.json"), std::string::npos);
  fs::remove_all(dir);

  Result<ModelConfig> unknown = LoadModelConfig("kimi-k4");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("kimi-k3"), std::string::npos);  // lists presets
}

// ModelOpt 0.29 and earlier write the quantization to hf_quant_config.json, beside a config.json
// without quantization_config (nvidia/Qwen3-235B-A22B-NVFP4). A checkpoint directory and its
// config.json read with it, as vLLM does; a quantization_config in config.json wins; an error in
// the file names the file and the field.
TEST(ConfigLoaderTest, HfQuantConfigBesideConfig) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("moeshard_hfq_" + std::to_string(getpid()));
  fs::create_directories(dir);
  nlohmann::json config = PresetJson("qwen3-235b-a22b-nvfp4");
  nlohmann::json hf = config["quantization_config"];
  config.erase("quantization_config");
  auto write = [&](const char* file, const nlohmann::json& j) {
    std::ofstream out(dir / file);
    out << j.dump(2);
  };
  write("config.json", config);
  Result<ModelConfig> bf16 = LoadModelConfig(dir.string());
  ASSERT_TRUE(bf16.ok()) << bf16.status().ToString();
  EXPECT_FALSE(bf16->quant.enabled());
  write("hf_quant_config.json", hf);
  for (const std::string& spec : {dir.string(), (dir / "config.json").string()}) {
    Result<ModelConfig> q = LoadModelConfig(spec);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    EXPECT_EQ(q->quant.quant_method, "modelopt");
    EXPECT_EQ(q->quant.scheme,
              (WeightScheme{WeightFormat::kNvfp4, 16, 1, QuantLayout::kModelOpt, true}));
    EXPECT_TRUE(q->quant.IsIgnored("model.layers.7.mlp.gate"));
    EXPECT_FALSE(q->quant.IsIgnored("model.layers.7.self_attn.q_proj"));
  }
  hf["quantization"]["quant_algo"] = "W4A8_AWQ";
  write("hf_quant_config.json", hf);
  Result<ModelConfig> bad = LoadModelConfig(dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'quantization.quant_algo' in " +
                                        (dir / "hf_quant_config.json").string()),
            std::string::npos)
      << bad.status().message();
  // config.json's own quantization_config (ModelOpt 0.31 and later; nvidia/MiniMax-M2.5-NVFP4
  // ships both files) is the one read.
  write("config.json", PresetJson("minimax-m2.5-nvfp4"));
  Result<ModelConfig> inline_q = LoadModelConfig(dir.string());
  ASSERT_TRUE(inline_q.ok()) << inline_q.status().ToString();
  EXPECT_EQ(inline_q->quant.scheme.format, WeightFormat::kNvfp4);
  fs::remove_all(dir);
}

// An ignore list that names one layer's module leaves that layer unquantized and the others in
// the checkpoint's scheme (each layer is looked up, not only the first the tensor is on).
TEST(ConfigTest, IgnoreListIsReadPerLayer) {
  for (const char* ignored_layer : {"0", "1"}) {
    SCOPED_TRACE(ignored_layer);
    nlohmann::json j = PresetJson("tiny-qwen2-moe-modelopt-nvfp4");
    j["quantization_config"]["quantization"]["exclude_modules"] = {
        "lm_head", std::string("model.layers.") + ignored_layer + ".mlp.shared_expert"};
    Result<ModelConfig> r = ParseModelConfig(j.dump(), "edited.json", "edited");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::map<int64_t, WeightFormat> format_by_layer;
    for (const TensorDef& t : r->family->tensors(*r)) {
      if (t.name != "model.layers.{layer}.mlp.shared_expert.up_proj") continue;
      for (int64_t layer : t.layers) {
        EXPECT_TRUE(format_by_layer.emplace(layer, t.format.format).second) << layer;
      }
    }
    const int64_t bf16_layer = std::stoll(ignored_layer);
    ASSERT_EQ(format_by_layer.size(), 2u);
    for (const auto& [layer, format] : format_by_layer) {
      EXPECT_EQ(format, layer == bf16_layer ? WeightFormat::kBf16 : WeightFormat::kNvfp4) << layer;
    }
  }
}

}  // namespace
}  // namespace moeshard
