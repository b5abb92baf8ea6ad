// Numbers a deployer can check by hand, for every preset: per-rank routed-expert bytes with the
// arithmetic written out.
#include <gtest/gtest.h>

#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

int64_t Routed(const char* preset, const PlanOptions& o, int64_t rank = 0) {
  return PlanOrDie(PresetOrDie(preset), o).ranks[rank].BytesOf(TensorCategory::kRoutedExperts);
}

TEST(PresetNumbersTest, DeepseekV3Fp8Tp8Ep) {
  // 256 experts / EP 8 = 32 per rank; 58 MoE layers. Per expert, fp8 (1 byte) weights plus one
  // fp32 scale per 128 x 128 block:
  //   gate_up [4096, 7168] = 29,360,128 B + scales [32, 56] * 4 = 7,168 B
  //   down    [7168, 2048] = 14,680,064 B + scales [56, 16] * 4 = 3,584 B
  const int64_t per_expert = 4096LL * 7168 + 32 * 56 * 4 + 7168LL * 2048 + 56 * 16 * 4;
  EXPECT_EQ(per_expert, 44'050'944);
  EXPECT_EQ(Routed("deepseek-v3", Opts(8, 1, true)), 32 * 58 * per_expert);
}

TEST(PresetNumbersTest, KimiK2Int4Tp8Ep) {
  // 384 experts / 8 = 48 per rank; 60 MoE layers; int4 = half a byte, bf16 scale per 32:
  //   gate_up [4096, 7168]: 4096 * 3584 + 4096 * 224 * 2;  down [7168, 2048]: 7168 * 1024 + 7168 *
  //   64 * 2
  // plus compressed-tensors' weight_shape, I64 [2], for each of gate, up and down: 3 * 16 B.
  const int64_t per_expert =
      4096LL * 3584 + 4096 * 224 * 2 + 7168LL * 1024 + 7168 * 64 * 2 + 3 * 16;
  EXPECT_EQ(per_expert, 24'772'656);
  EXPECT_EQ(Routed("kimi-k2", Opts(8, 1, true)), 48 * 60 * per_expert);
}

TEST(PresetNumbersTest, Qwen3_30B_Bf16SingleGpu) {
  // 48 layers x 128 experts x 3 matrices of 768 x 2048 in bf16 = 54 GiB on one GPU.
  EXPECT_EQ(Routed("qwen3-30b-a3b", Opts(1)), 48LL * 128 * 3 * 768 * 2048 * 2);
  EXPECT_EQ(48LL * 128 * 3 * 768 * 2048 * 2, 57'982'058'496);
}

TEST(PresetNumbersTest, Mixtral8x7bTp2) {
  // 32 layers x 8 experts, each expert's 14336 columns split in two: 3 x 7168 x 4096 bf16.
  EXPECT_EQ(Routed("mixtral-8x7b", Opts(2), 1), 32LL * 8 * 3 * 7168 * 4096 * 2);
}

TEST(PresetNumbersTest, GptOssMxfp4WithBiases) {
  // On the plain CPU backend (no padding), per expert: gate_up [5760, 2880] MXFP4 = 5760 * 1440
  // + scales 5760 * 90; down [2880, 2880] = 2880 * 1440 + 2880 * 90; bf16 biases 5760 + 2880.
  const int64_t per_expert =
      5760LL * 1440 + 5760 * 90 + 2880LL * 1440 + 2880 * 90 + (5760 + 2880) * 2;
  EXPECT_EQ(per_expert, 13'236'480);
  EXPECT_EQ(Routed("gpt-oss-120b", Opts(1, 1, false, "cpu")), 128LL * 36 * per_expert);  // 56.8 GiB
  EXPECT_EQ(Routed("gpt-oss-20b", Opts(1, 1, false, "cpu")), 32LL * 24 * per_expert);
  // Marlin pads H 2880 -> 3072 and I 2880 -> 2944: per expert gate_up [5888, 3072], down
  // [3072, 2944], biases [5888] and [3072].
  const int64_t marlin = 5888LL * 1536 + 5888 * 96 + 3072LL * 1472 + 3072 * 92 + (5888 + 3072) * 2;
  EXPECT_EQ(Routed("gpt-oss-120b", Opts(1, 1, false, "marlin")), 128LL * 36 * marlin);
}

TEST(PresetNumbersTest, Qwen3_235B_Tp8NoEpAndEp) {
  // 94 layers x 128 experts x 3 x 1536 x 4096 bf16 = 441 GiB in all, 1/8 on each rank either way.
  const int64_t all = 94LL * 128 * 3 * 1536 * 4096 * 2;
  EXPECT_EQ(Routed("qwen3-235b-a22b", Opts(8)), all / 8);
  EXPECT_EQ(Routed("qwen3-235b-a22b", Opts(8, 1, true)), all / 8);
}

TEST(PresetNumbersTest, DeepseekV2LiteBf16MatchesVllmLog) {
  // 26 MoE layers x 64 experts x 3 matrices of 1408 x 2048 in bf16 = 26.81 GiB routed.
  EXPECT_EQ(Routed("deepseek-v2-lite", Opts(1)), 26LL * 64 * 3 * 1408 * 2048 * 2);
  // vLLM logged 29.30 GiB of weights for DeepSeek-V2-Lite bf16 at TP1 (issue "The MoE families
  // and quantization formats people deploy"); the whole plan is within 0.5 % of it.
  const ShardPlan p = PlanOrDie(PresetOrDie("deepseek-v2-lite"), Opts(1));
  const double gib = static_cast<double>(p.ranks[0].WeightBytes()) / (1LL << 30);
  EXPECT_NEAR(gib, 29.30, 29.30 * 0.005);
}

TEST(PresetNumbersTest, Qwen2MoeSharedExpertAndGate) {
  // Qwen1.5-MoE-A2.7B at TP2: the shared expert [5632 x 2048] x 3 split in two, its [1, 2048]
  // gate replicated, on each of 24 layers.
  const ShardPlan p = PlanOrDie(PresetOrDie("qwen1.5-moe-a2.7b"), Opts(2));
  EXPECT_EQ(p.ranks[1].BytesOf(TensorCategory::kSharedExperts),
            24LL * (3 * 5632 / 2 * 2048 * 2 + 2048 * 2));
}

TEST(PresetNumbersTest, Qwen3NextConvSplitPerBlock) {
  // TP4: rank 2 holds rows [1024, 1536) of q, of k ([2048, 4096) + 1024...) and [2048, 3072) of
  // v ([4096, 8192)): 512 + 512 + 1024 channels of the [8192, 1, 4] conv.
  const ShardPlan p = PlanOrDie(PresetOrDie("qwen3-next-80b-a3b"), Opts(4));
  for (const TensorShard& s : p.ranks[2].tensors) {
    if (s.name != "model.layers.{layer}.linear_attn.conv1d.weight") continue;
    EXPECT_EQ(s.local_shape, (std::vector<int64_t>{2048, 1, 4}));
    EXPECT_EQ(s.shard_begin, 1024);
    EXPECT_EQ(s.shard_end, 1536);
    EXPECT_EQ(s.section_sizes, (std::vector<int64_t>{2048, 2048, 4096}));
    EXPECT_EQ(s.bytes, 36LL * 2048 * 4 * 2);
    return;
  }
  ADD_FAILURE() << "no conv1d shard on rank 2";
}

TEST(PresetNumbersTest, DeepseekV4FlashMxfp4ExpertsFp8SharedTp8Ep) {
  // 256 experts / EP 8 = 32 per rank on each of 43 layers, MXFP4: half a byte per value plus one
  // E8M0 byte per 32 values (cpu backend: no padding).
  //   gate_up [4096, 4096] = 4096 * 2048 + 4096 * 128;  down [4096, 2048] = 4096 * 1024 + 4096 * 64
  const int64_t per_expert = 4096LL * 2048 + 4096 * 128 + 4096LL * 1024 + 4096 * 64;
  EXPECT_EQ(per_expert, 13'369'344);
  EXPECT_EQ(Routed("deepseek-v4-flash", Opts(8, 1, true, "cpu")), 32LL * 43 * per_expert);
  // The shared expert stays fp8 (F32 block scales), split over TP 8: gate/up [256, 4096] and
  // down [4096, 256] per rank, each with [2, 32] / [32, 2] scales.
  const ShardPlan p = PlanOrDie(PresetOrDie("deepseek-v4-flash"), Opts(8, 1, true, "cpu"));
  EXPECT_EQ(p.ranks[3].BytesOf(TensorCategory::kSharedExperts),
            43LL * (3 * 256 * 4096 + 3 * 2 * 32 * 4));
}

TEST(PresetNumbersTest, Llama4ScoutVisionTp8) {
  // 16 vision heads divide TP 8: q/k/v (with biases), fc1 (with bias), the patch embedding and
  // the adapter's fc1 by column, o_proj, fc2 and the adapter's fc2 by row, an eighth each; the
  // projector [5120, 4096] column-parallel; class token, position table [577, 1408], norms and
  // row-parallel biases whole. BF16.
  const int64_t Hv = 1408, Iv = 5632;
  const int64_t per_layer =
      3 * (Hv * Hv + Hv) / 8 + Hv * Hv / 8 + Hv + (Iv * Hv + Iv) / 8 + Hv * Iv / 8 + Hv + 4 * Hv;
  const int64_t rest =
      Hv + 577 * Hv + Hv * 588 / 8 + 4 * Hv + 4096 * Iv / 8 + 4096 * 4096 / 8 + 5120 * 4096 / 8;
  const ShardPlan p = PlanOrDie(PresetOrDie("llama-4-scout-17b-16e"), Opts(8, 1, true));
  for (const RankPlan& r : p.ranks) {
    EXPECT_EQ(r.BytesOf(TensorCategory::kVision), 2 * (34 * per_layer + rest));
  }
  // At TP 1 the whole tower: 871,932,416 parameters.
  const ShardPlan one = PlanOrDie(PresetOrDie("llama-4-scout-17b-16e"), Opts(1, 1, true));
  EXPECT_EQ(one.ranks[0].BytesOf(TensorCategory::kVision), 2 * 871'932'416LL);
}

TEST(PresetNumbersTest, Qwen35VisionTp4) {
  // 16 heads divide TP 4: qkv [3456, 1152] (and its bias) a quarter of each of q, k and v,
  // linear_fc1 [4304, 1152] and its bias, the merger's linear_fc1 [4608, 4608] and its bias by
  // column; proj, linear_fc2 and the merger's linear_fc2 [2048, 4608] by row; patch embedding
  // [1152, 3, 2, 16, 16] and its bias, pos_embed [2304, 1152], LayerNorms and row biases whole.
  const int64_t Hv = 1152, Iv = 4304, M = 4608;
  const int64_t per_block = (3 * Hv * Hv + 3 * Hv) / 4 + Hv * Hv / 4 + Hv + (Iv * Hv + Iv) / 4 +
                            Hv * Iv / 4 + Hv + 4 * Hv;
  const int64_t rest =
      Hv * 3 * 2 * 16 * 16 + Hv + 2304 * Hv + 2 * Hv + (M * M + M) / 4 + 2048 * M / 4 + 2048;
  const ShardPlan p = PlanOrDie(PresetOrDie("qwen3.5-35b-a3b"), Opts(4));
  EXPECT_EQ(p.ranks[3].BytesOf(TensorCategory::kVision), 2 * (27 * per_block + rest));
}

// The presets copied from quantized releases' config.json (models/README.md): per-rank routed
// bytes in the format each config is read as, and the TP / EP layouts each one plans on.

TEST(PresetNumbersTest, KimiK25Int4MatchesTheReleasesTensorBytes) {
  // 384 experts / EP 8 = 48 per rank on 60 MoE layers; int4 with a bf16 scale per 32 as
  // Kimi-K2, but compressed-tensors' weight_shape is I32 [2] here: 3 x 8 B per expert.
  const int64_t per_expert = 4096LL * 3584 + 4096 * 224 * 2 + 7168LL * 1024 + 7168 * 64 * 2 + 3 * 8;
  EXPECT_EQ(Routed("kimi-k2.5", Opts(8, 1, true)), 48 * 60 * per_expert);
  // At TP 1 one rank holds every tensor of the release: 595,148,192,736 bytes, the total of
  // the header-exact copy (tests/checkpoints; the public header dump says 554.27 GiB).
  EXPECT_EQ(PlanOrDie(PresetOrDie("kimi-k2.5"), Opts(1)).ranks[0].WeightBytes(), 595'148'192'736);
}

TEST(PresetNumbersTest, ModelOptNvfp4ReleasesTp8Ep) {
  // NVFP4: half a byte per value, one E4M3 byte per 16, F32 weight_scale_2 and input_scale per
  // linear (gate and up kept apart: 2 + 2 in w13, 1 + 1 in w2).
  // Qwen3-235B-A22B: 128 experts / 8 = 16 per rank on 94 layers; w13 [3072, 4096], w2 [4096, 1536].
  const int64_t qwen = 3072LL * 2048 + 3072 * 256 + 4 * 4 + 4096LL * 768 + 4096 * 96 + 2 * 4;
  EXPECT_EQ(qwen, 10'616'856);
  EXPECT_EQ(Routed("qwen3-235b-a22b-nvfp4", Opts(8, 1, true)), 16 * 94 * qwen);
  // MiniMax-M2.5: 256 experts / 8 = 32 per rank on 62 layers; w13 [3072, 3072], w2 [3072, 1536].
  const int64_t minimax = 3072LL * 1536 + 3072 * 192 + 4 * 4 + 3072LL * 768 + 3072 * 96 + 2 * 4;
  EXPECT_EQ(Routed("minimax-m2.5-nvfp4", Opts(8, 1, true)), 32 * 62 * minimax);
}

TEST(PresetNumbersTest, MixtralAwqTp2) {
  // AWQ int4 with zero points (as moeshard holds it: U8 codes, F16 scales, U8 zero points per
  // 128): each of the 8 experts' 14336 columns split in two on 32 layers.
  //   w13 [2 x 7168, 4096]: 14336 * 2048 + 14336 * 32 * (2 + 1);  w2 [4096, 7168]: 4096 * 3584 +
  //   4096 * 56 * 3
  const int64_t per_expert = 14336LL * 2048 + 14336 * 32 * 3 + 4096LL * 3584 + 4096 * 56 * 3;
  EXPECT_EQ(Routed("mixtral-8x7b-instruct-v0.1-awq", Opts(2), 1), 8 * 32 * per_expert);
  // casper-hansen (vLLM issue 2243) loads the same quantization of this model "in ~24 GB
  // VRAM": the plan's weights on one GPU are 24.8 GB (23.13 GiB).
  const double gb =
      PlanOrDie(PresetOrDie("mixtral-8x7b-instruct-v0.1-awq"), Opts(1)).ranks[0].WeightBytes() /
      1e9;
  EXPECT_NEAR(gb, 24.8, 0.1);
}

TEST(PresetNumbersTest, QwenMoeGptqGroupsOfTheRelease) {
  // GPTQ int4, group 128, g_idx I32 per input channel: per expert w13 [2816, 2048] and w2
  // [2048, 1408], 60 experts on 24 layers at TP 1.
  const int64_t per_expert =
      2816LL * 1024 + 2816 * 16 * 3 + 2 * 2048 * 4 + 2048LL * 704 + 2048 * 11 * 3 + 1408 * 4;
  EXPECT_EQ(Routed("qwen1.5-moe-a2.7b-chat-gptq-int4", Opts(1)), 60 * 24 * per_expert);
  // moe_intermediate_size 1408 is 11 groups of 128: no MoE TP but 11 keeps groups whole, so TP
  // needs EP; the shared expert's 5632 (44 groups) splits over TP 2 and 4, not 8.
  const ModelConfig m = PresetOrDie("qwen1.5-moe-a2.7b-chat-gptq-int4");
  Result<ShardPlan> tp2 = BuildShardPlan(m, Opts(2));
  ASSERT_FALSE(tp2.ok());
  EXPECT_NE(tp2.status().message().find("valid MoE TP sizes: 1, 11; or use -ep"), std::string::npos)
      << tp2.status().message();
  EXPECT_TRUE(BuildShardPlan(m, Opts(2, 1, true)).ok());
  EXPECT_TRUE(BuildShardPlan(m, Opts(4, 2, true)).ok());
  EXPECT_TRUE(BuildShardPlan(m, Opts(1, 8, true)).ok());
  Result<ShardPlan> tp8 = BuildShardPlan(m, Opts(8, 1, true));
  ASSERT_FALSE(tp8.ok());
  EXPECT_NE(tp8.status().message().find("TP sizes that keep it whole: 1, 2, 4"), std::string::npos)
      << tp8.status().message();
}

TEST(PresetNumbersTest, Llama4ScoutFp8DynamicPerChannel) {
  // Compressed-tensors fp8 per channel, held as fp8 with 1-row blocks 2048 wide (one F32 scale
  // per row repeated per block). TP 4 splits I 8192: per expert w13 [2 x 2048, 5120] with
  // scales [4096, 3], w2 [5120, 2048] with scales [5120, 1]; 16 experts on 48 layers.
  const int64_t per_expert = 4096LL * 5120 + 4096 * 3 * 4 + 5120LL * 2048 + 5120 * 1 * 4;
  EXPECT_EQ(Routed("llama-4-scout-17b-16e-instruct-fp8-dynamic", Opts(4)), 16 * 48 * per_expert);
}

TEST(PresetNumbersTest, ActOrderGptqKeepsEveryGroupOfASplitInput) {
  // tiny-qwen2-moe-gptq(-act): H 256, I 256, group 32, 12 experts, 2 layers, TP 2 splits I.
  // w13 [2 x 128, 256]: codes 256 x 128 B, 8 groups a row of F16 scale + U8 zero, g_idx 2 x 256
  // I32. w2 [256, 128]: codes 256 x 64 B, g_idx 128 I32, and per row 4 groups (its slice) or,
  // with act-order, all 8 (a slice of the input can hold channels of any group).
  const int64_t w13 = 256 * 128 + 256 * 8 * 3 + 2 * 256 * 4;
  EXPECT_EQ(Routed("tiny-qwen2-moe-gptq", Opts(2)),
            12 * 2 * (w13 + 256 * 64 + 256 * 4 * 3 + 128 * 4));
  EXPECT_EQ(Routed("tiny-qwen2-moe-gptq-act", Opts(2)),
            12 * 2 * (w13 + 256 * 64 + 256 * 8 * 3 + 128 * 4));
}

TEST(PresetNumbersTest, QuantizedReleasesPlanOnTpAndEpLayouts) {
  struct Layout {
    int64_t tp, dp;
    bool ep;
  };
  const std::vector<Layout> layouts = {{1, 1, false}, {2, 1, false}, {4, 1, false},
                                       {8, 1, false}, {8, 1, true},  {1, 8, true}};
  for (const char* preset :
       {"kimi-k2.5", "qwen3-235b-a22b-nvfp4", "minimax-m2.5-nvfp4",
        "mixtral-8x7b-instruct-v0.1-awq", "llama-4-scout-17b-16e-instruct-fp8-dynamic"}) {
    const ModelConfig m = PresetOrDie(preset);
    for (const Layout& l : layouts) {
      SCOPED_TRACE(std::string(preset) + " tp " + std::to_string(l.tp) + " dp " +
                   std::to_string(l.dp) + (l.ep ? " ep" : ""));
      Result<ShardPlan> r = BuildShardPlan(m, Opts(l.tp, l.dp, l.ep));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->expert_scheme, m.expert_scheme());
      EXPECT_TRUE(m.expert_scheme().quantized());
    }
  }
}

}  // namespace
}  // namespace moeshard
