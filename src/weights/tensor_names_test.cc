#include "moeshard/weights/tensor_names.h"

#include <gtest/gtest.h>

namespace moeshard {
namespace {

TEST(TensorNamesTest, ParsesLayerExpertModuleAndLeaf) {
  TensorNameParts p = ParseTensorName("model.layers.3.mlp.experts.17.down_proj.weight");
  EXPECT_EQ(p.layer_idx, 3);
  EXPECT_EQ(p.expert_idx, 17);
  EXPECT_TRUE(p.in_experts);
  EXPECT_FALSE(p.in_shared_experts);
  EXPECT_EQ(p.module, "down_proj");
  EXPECT_EQ(p.leaf, "weight");

  p = ParseTensorName("model.layers.5.block_sparse_moe.experts.2.w1.weight");
  EXPECT_EQ(p.layer_idx, 5);
  EXPECT_EQ(p.expert_idx, 2);
  EXPECT_EQ(p.module, "w1");

  p = ParseTensorName("model.layers.0.mlp.experts.gate_up_proj_blocks");
  EXPECT_EQ(p.layer_idx, 0);
  EXPECT_FALSE(p.expert_idx.has_value());
  EXPECT_TRUE(p.in_experts);
  EXPECT_EQ(p.module, "gate_up_proj_blocks");
  EXPECT_EQ(p.leaf, "gate_up_proj_blocks");

  p = ParseTensorName("model.layers.12.mlp.shared_experts.up_proj.weight_scale_inv");
  EXPECT_EQ(p.layer_idx, 12);
  EXPECT_TRUE(p.in_shared_experts);
  EXPECT_FALSE(p.in_experts);
  EXPECT_EQ(p.leaf, "weight_scale_inv");

  p = ParseTensorName("language_model.model.layers.60.self_attn.q_proj.weight");
  EXPECT_EQ(p.layer_idx, 60);

  p = ParseTensorName("lm_head.weight");
  EXPECT_FALSE(p.layer_idx.has_value());
  EXPECT_EQ(p.leaf, "weight");

  // Not indices: non-numeric, too long, trailing.
  EXPECT_FALSE(ParseTensorName("model.layers.x.w").layer_idx.has_value());
  EXPECT_FALSE(ParseTensorName("model.layers.12345678901.w").layer_idx.has_value());
  EXPECT_FALSE(ParseTensorName("model.layers").layer_idx.has_value());
  EXPECT_EQ(ParseTensorName("").leaf, "");
  EXPECT_EQ(ParseTensorName("a..b.").leaf, "");
}

std::vector<TensorInfo> Tensors(
    const std::vector<std::tuple<std::string, DType, std::vector<int64_t>>>& specs) {
  std::vector<TensorInfo> out;
  int64_t off = 0;
  for (const auto& [name, dtype, shape] : specs) {
    TensorInfo t{.name = name, .dtype = dtype, .shape = shape, .data_begin = off, .data_end = off};
    t.data_end = off + *DTypeBytes(dtype, t.num_elements());
    off = t.data_end;
    out.push_back(t);
  }
  return out;
}

CheckpointStructure Summarize(const std::vector<TensorInfo>& tensors) {
  std::vector<const TensorInfo*> ptrs;
  for (const TensorInfo& t : tensors) ptrs.push_back(&t);
  return SummarizeCheckpoint(ptrs);
}

TEST(TensorNamesTest, SummarizesPerExpertFp8Checkpoints) {
  std::vector<std::tuple<std::string, DType, std::vector<int64_t>>> specs = {
      {"model.embed_tokens.weight", DType::kBF16, {16, 8}},
      {"model.layers.0.mlp.gate_proj.weight", DType::kBF16, {8, 8}},  // dense layer
  };
  for (int layer = 1; layer <= 2; ++layer) {
    for (int e = 0; e < 3; ++e) {
      const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts." +
                            std::to_string(e) + ".down_proj.";
      specs.push_back({p + "weight", DType::kF8E4M3, {8, 4}});
      specs.push_back({p + "weight_scale_inv", DType::kF32, {1, 1}});
    }
    specs.push_back({"model.layers." + std::to_string(layer) + ".mlp.shared_experts.w.weight",
                     DType::kBF16,
                     {4}});
  }
  const auto tensors = Tensors(specs);
  const CheckpointStructure s = Summarize(tensors);
  EXPECT_EQ(s.num_tensors, static_cast<int64_t>(specs.size()));
  EXPECT_EQ(s.num_layers, 3);
  EXPECT_EQ(s.max_layer_idx, 2);
  EXPECT_EQ(s.experts_per_layer, (std::map<int64_t, int64_t>{{1, 3}, {2, 3}}));
  EXPECT_EQ(s.num_moe_layers(), 2);
  EXPECT_FALSE(s.fused_experts);
  EXPECT_TRUE(s.shared_experts);
  EXPECT_EQ(s.quantization, std::vector<ExpertQuantization>{ExpertQuantization::kFp8BlockScale});
  EXPECT_EQ(s.bytes_by_dtype.at(DType::kF8E4M3), 2 * 3 * 32);
  EXPECT_EQ(s.bytes_by_dtype.at(DType::kF32), 2 * 3 * 4);
  EXPECT_EQ(s.bytes_by_dtype.at(DType::kBF16), 256 + 128 + 2 * 8);
  EXPECT_EQ(s.tensors_by_dtype.at(DType::kF32), 6);
  int64_t total = 0;
  for (const auto& [d, b] : s.bytes_by_dtype) total += b;
  EXPECT_EQ(s.total_bytes, total);
}

TEST(TensorNamesTest, SummarizesFusedMxfp4Experts) {
  const auto tensors = Tensors({
      {"model.layers.0.mlp.router.weight", DType::kBF16, {32, 8}},
      {"model.layers.0.mlp.experts.gate_up_proj_blocks", DType::kU8, {32, 16, 1, 16}},
      {"model.layers.0.mlp.experts.gate_up_proj_scales", DType::kU8, {32, 16, 1}},
      {"model.layers.0.mlp.experts.gate_up_proj_bias", DType::kBF16, {32, 16}},
      {"model.layers.1.mlp.experts.down_proj_blocks", DType::kU8, {32, 8, 1, 16}},
      {"model.layers.1.mlp.experts.down_proj_scales", DType::kU8, {32, 8, 1}},
  });
  const CheckpointStructure s = Summarize(tensors);
  EXPECT_TRUE(s.fused_experts);
  EXPECT_TRUE(s.gate_up_fused);
  EXPECT_EQ(s.experts_per_layer, (std::map<int64_t, int64_t>{{0, 32}, {1, 32}}));
  EXPECT_EQ(s.quantization, std::vector<ExpertQuantization>{ExpertQuantization::kMxfp4Blocks});
}

TEST(TensorNamesTest, SummarizesPackedWeightScaleAndMixtral) {
  const auto tensors = Tensors({
      {"model.layers.0.block_sparse_moe.experts.0.w1.weight_packed", DType::kI32, {4, 2}},
      {"model.layers.0.block_sparse_moe.experts.0.w1.weight_scale", DType::kBF16, {4, 1}},
      {"model.layers.0.block_sparse_moe.experts.7.w1.weight_packed", DType::kI32, {4, 2}},
      {"model.layers.0.block_sparse_moe.experts.7.w1.weight_scale", DType::kBF16, {4, 1}},
  });
  const CheckpointStructure s = Summarize(tensors);
  EXPECT_EQ(s.experts_per_layer, (std::map<int64_t, int64_t>{{0, 2}}));  // distinct indices
  EXPECT_EQ(s.quantization,
            std::vector<ExpertQuantization>{ExpertQuantization::kPackedWeightScale});
  EXPECT_FALSE(s.gate_up_fused);
  EXPECT_FALSE(s.shared_experts);
}

TEST(TensorNamesTest, EmptyCheckpoint) {
  const CheckpointStructure s = Summarize({});
  EXPECT_EQ(s.num_tensors, 0);
  EXPECT_EQ(s.num_layers, 0);
  EXPECT_FALSE(s.max_layer_idx.has_value());
  EXPECT_TRUE(s.quantization.empty());
}

}  // namespace
}  // namespace moeshard
