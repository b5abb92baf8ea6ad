// The single-rank layer against an independent scalar reference: the sharded tests compare N
// ranks with one rank, so they cannot see a mistake both share (a wrong norm, a missing shared
// expert, the latent projection applied on the wrong side). Here the 1-rank runtime is checked
// against a direct transcription of the layer's formula (moe_runtime.h) in double precision,
// with the experts from the kernels' scalar oracle (reference::MoeExpertsForward) and the
// routing from reference::Route.
#include "tests/runtime/layer_reference.h"

#include <gtest/gtest.h>

#include "moeshard/config/config_loader.h"
#include "moeshard/kernels/kernel_backend.h"

namespace moeshard {
namespace {

// On every kernel backend (the CPU row-group layout on "cpu" only).
void CheckPreset(const std::string& preset, bool row_groups = false, int64_t moe_layer = 0) {
  auto model = LoadModelConfig(preset);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::vector<std::string> backends =
      row_groups ? std::vector<std::string>{"cpu"} : KernelBackendNames();
  for (const std::string& backend : backends) {
    SCOPED_TRACE(preset + (row_groups ? " row groups" : "") + " MoE layer " +
                 std::to_string(moe_layer) + " on kernel backend " + backend);
    CheckLayerAgainstReference(*model, row_groups, moe_layer, backend);
  }
}

TEST(RuntimeLayerReferenceTest, KimiK3) { CheckPreset("tiny-kimi-k3"); }
TEST(RuntimeLayerReferenceTest, DeepseekV3) { CheckPreset("tiny-deepseek-v3"); }
TEST(RuntimeLayerReferenceTest, Qwen3Moe) { CheckPreset("tiny-qwen3-moe"); }
TEST(RuntimeLayerReferenceTest, Qwen3MoeRowGroupLayout) { CheckPreset("tiny-qwen3-moe", true); }
TEST(RuntimeLayerReferenceTest, MixtralRowGroupLayout) { CheckPreset("tiny-mixtral", true); }
TEST(RuntimeLayerReferenceTest, Mixtral) { CheckPreset("tiny-mixtral"); }
TEST(RuntimeLayerReferenceTest, GptOss) { CheckPreset("tiny-gpt-oss"); }
TEST(RuntimeLayerReferenceTest, Olmoe) { CheckPreset("tiny-olmoe"); }
TEST(RuntimeLayerReferenceTest, DeepseekV2) { CheckPreset("tiny-deepseek-v2"); }
TEST(RuntimeLayerReferenceTest, Qwen2Moe) { CheckPreset("tiny-qwen2-moe"); }
// Every linear of the block quantized (shared expert and routed experts), per layout; the
// loader's conversion is checked by tests/weights/quantized_checkpoint_test.cc.
TEST(RuntimeLayerReferenceTest, Qwen2MoeAwq) { CheckPreset("tiny-qwen2-moe-awq"); }
TEST(RuntimeLayerReferenceTest, Qwen2MoeGptq) { CheckPreset("tiny-qwen2-moe-gptq"); }
// Act-order: each input channel's group from g_idx (the dummy source writes a shuffled one).
TEST(RuntimeLayerReferenceTest, Qwen2MoeGptqActOrder) { CheckPreset("tiny-qwen2-moe-gptq-act"); }
TEST(RuntimeLayerReferenceTest, Qwen2MoeW4a16Asym) { CheckPreset("tiny-qwen2-moe-w4a16-asym"); }
TEST(RuntimeLayerReferenceTest, Qwen2MoeNvfp4) { CheckPreset("tiny-qwen2-moe-nvfp4"); }
TEST(RuntimeLayerReferenceTest, Qwen2MoeModelOptNvfp4) {
  CheckPreset("tiny-qwen2-moe-modelopt-nvfp4");
}
TEST(RuntimeLayerReferenceTest, Qwen2MoeFp8PerChannel) {
  CheckPreset("tiny-qwen2-moe-fp8-dynamic");
}
TEST(RuntimeLayerReferenceTest, Qwen2MoeModelOptFp8) { CheckPreset("tiny-qwen2-moe-modelopt-fp8"); }
TEST(RuntimeLayerReferenceTest, Glm4Moe) { CheckPreset("tiny-glm4-moe"); }
TEST(RuntimeLayerReferenceTest, MinimaxM2) { CheckPreset("tiny-minimax-m2"); }
TEST(RuntimeLayerReferenceTest, Llama4) { CheckPreset("tiny-llama4"); }
TEST(RuntimeLayerReferenceTest, Qwen3Next) { CheckPreset("tiny-qwen3-next"); }
TEST(RuntimeLayerReferenceTest, Qwen35Moe) { CheckPreset("tiny-qwen3.5-moe"); }
// DeepSeek-V4: layer 0 routes by token id (tid2eid), layer 2 by sqrt(softplus) + bias; both with
// the clamped SwiGLU, fp8 shared expert and MXFP4 routed experts.
TEST(RuntimeLayerReferenceTest, DeepseekV4HashLayer) { CheckPreset("tiny-deepseek-v4", false, 0); }
TEST(RuntimeLayerReferenceTest, DeepseekV4ScoreLayer) { CheckPreset("tiny-deepseek-v4", false, 2); }

}  // namespace
}  // namespace moeshard
