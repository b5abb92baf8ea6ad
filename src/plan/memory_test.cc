#include "moeshard/plan/memory.h"

#include <gtest/gtest.h>

#include "moeshard/base/units.h"
#include "moeshard/plan/advice.h"
#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

TEST(MemoryTest, Qwen3_235B_Bf16_TP8_WeightsByHand) {
  const ShardPlan p = PlanOrDie(PresetOrDie("qwen3-235b-a22b"), Opts(8));
  // triton aligns I to 64: 1536 / 8 = 192 is already aligned.
  EXPECT_EQ(p.intermediate.padded_local, 192);
  // Per layer, bf16 (2 bytes):
  const int64_t norms = 2 * 4096 * 2;                // input + post-attention RMSNorm
  const int64_t q = (64 * 128 / 8) * 4096 * 2;       // q_proj, column-parallel
  const int64_t kv = 2 * (1 * 128) * 4096 * 2;       // 4 KV heads < TP8: one head each
  const int64_t o = 4096 * (64 * 128 / 8) * 2;       // o_proj, row-parallel
  const int64_t qk_norm = 2 * 128 * 2;               // q_norm, k_norm
  const int64_t router = 128 * 4096 * 2;             // replicated
  const int64_t experts = 128 * 3 * 192 * 4096 * 2;  // all 128 experts, I/8 each
  const int64_t per_layer = norms + q + kv + o + qk_norm + router + experts;
  const int64_t vocab = 151936 / 8 * 4096 * 2;  // embedding and untied head
  const int64_t total = 94 * per_layer + 2 * vocab + 4096 * 2;
  EXPECT_EQ(total, 58'959'617'024);
  for (const RankPlan& r : p.ranks) EXPECT_EQ(r.WeightBytes(), total) << r.coords.rank;
  EXPECT_EQ(p.ranks[0].BytesOf(TensorCategory::kRoutedExperts), 94 * experts);

  MemoryOptions mo;
  mo.gpu = *FindGpu("h200");
  mo.max_model_len = 32768;
  const MemoryPlan mp = PlanMemory(p, mo);
  // KV per token per rank: 94 layers * K and V * 1 local KV head * 128 * 2 bytes.
  EXPECT_EQ(mp.ranks[0].kv_bytes_per_token, 94 * 2 * 1 * 128 * 2);
  EXPECT_TRUE(mp.fits) << mp.failure;
  EXPECT_EQ(mp.ranks[0].budget,
            static_cast<int64_t>(static_cast<double>(FindGpu("h200")->bytes) * 0.9));
  // The default engine is vLLM: its requested memory minus weights, the profile peak and the
  // non-torch increase (the 1782 MiB TP8 NVLink row of data/engines/memory_terms.json: H200s
  // are SXM boards; the CUDA context and NCCL sit outside its fraction), counted in whole
  // 16-token blocks. (Before engine profiles this subtracted a flat 2 GiB overhead and counted
  // single tokens.)
  EXPECT_EQ(mp.ranks[0].overhead, 1782 * kMiB);
  EXPECT_EQ(mp.ranks[0].kv_tokens,
            (mp.ranks[0].budget - total - mp.ranks[0].activations - mp.ranks[0].overhead) /
                (94 * 2 * 128 * 2 * 16) * 16);
  // The same GPUs on PCIe (--interconnect pcie) take the PCIe row, 215 MiB at TP8.
  MemoryOptions pcie = mo;
  pcie.gpu.nvlink = false;
  EXPECT_EQ(PlanMemory(p, pcie).ranks[0].overhead, 215 * kMiB);
  // fp8 KV halves the bytes per token.
  mo.kv_cache_dtype = KvCacheDtype::kFp8;
  EXPECT_EQ(PlanMemory(p, mo).ranks[0].kv_bytes_per_token, 94 * 2 * 128);
}

TEST(MemoryTest, KimiK3_Mxfp4_RoutedBytes) {
  const ModelConfig k3 = PresetOrDie("kimi-k3");
  // Per expert and layer, MXFP4: 3 matrices of 3072 x 3584 in the latent width at half a byte
  // per value plus one E8M0 byte per 32 values: 3 * 3072 * 3584 * (1/2 + 1/32) bytes.
  const int64_t per_expert = 3LL * 3072 * 3584 / 2 + 3LL * 3072 * 3584 / 32;
  EXPECT_EQ(per_expert, 17'547'264);

  // TP8 without EP: every rank holds all 896 experts at I/8 = 384 (marlin: 384 % 128 == 0).
  const ShardPlan tp8 = PlanOrDie(k3, Opts(8, 1, false, "marlin"));
  EXPECT_EQ(tp8.intermediate.padded_local, 384);
  EXPECT_EQ(tp8.ranks[0].BytesOf(TensorCategory::kRoutedExperts), 92 * 896 * per_expert / 8);
  EXPECT_EQ(92LL * 896 * per_expert / 8, 180'807'008'256);  // 168.4 GiB: not on an H200

  // TP32 with EP: 28 whole experts per rank, no padding.
  const ShardPlan ep32 = PlanOrDie(k3, Opts(32, 1, true, "marlin"));
  EXPECT_EQ(ep32.ranks[7].BytesOf(TensorCategory::kRoutedExperts), 92LL * 28 * per_expert);

  MemoryOptions mo;
  mo.gpu = *FindGpu("h200");
  const MemoryPlan fits = PlanMemory(ep32, mo);
  EXPECT_TRUE(fits.fits) << fits.failure;
  // MLA layers cache kv_lora_rank + rope = 576 values per token; 24 MLA layers, bf16.
  EXPECT_EQ(fits.ranks[0].kv_bytes_per_token, 24 * 576 * 2);
  // KDA state per sequence: 69 layers * (3 local heads * 128 * 128 fp32 + 3 convs * 384 * 3 bf16).
  EXPECT_EQ(fits.ranks[0].state_bytes_per_seq, 69LL * (3 * 128 * 128 * 4 + 3 * 384 * 3 * 2));

  const MemoryPlan no_fit = PlanMemory(tp8, mo);
  EXPECT_FALSE(no_fit.fits);
  EXPECT_NE(no_fit.failure.find("weight budget fails on rank"), std::string::npos)
      << no_fit.failure;
  EXPECT_NE(no_fit.failure.find("shortfall"), std::string::npos);
  EXPECT_NE(SmallestChangeThatFits(k3, Opts(8, 1, false, "marlin"), mo), "");
}

// Qwen3-Next at TP4: 12 gated full-attention layers cache K and V (2 KV heads < TP 4: one head
// per rank); the 36 Gated DeltaNet layers hold per sequence a [32/4, 128, 128] state and the
// conv tail over q, k, v ((2 * 2048 + 4096) / 4 channels x 3 steps), both bf16.
TEST(MemoryTest, Qwen3NextLinearAttentionState) {
  const ShardPlan p = PlanOrDie(PresetOrDie("qwen3-next-80b-a3b"), Opts(4));
  MemoryOptions mo;
  mo.gpu = *FindGpu("h200");
  const MemoryPlan m = PlanMemory(p, mo);
  EXPECT_EQ(m.ranks[0].kv_bytes_per_token, 12 * 2 * 1 * 256 * 2);
  EXPECT_EQ(m.ranks[0].state_bytes_per_seq, 36LL * (8 * 128 * 128 * 2 + 2048 * 3 * 2));
}

TEST(MemoryTest, KvCapacityIsPerDpRankAndKvDtypeMatters) {
  // Advice picks fp8 KV when only the KV budget fails.
  const ModelConfig q = PresetOrDie("qwen3-30b-a3b");
  MemoryOptions mo;
  mo.gpu = *FindGpu("h100");
  mo.max_model_len = 40960;
  const ShardPlan p = PlanOrDie(q, Opts(1));
  MemoryPlan mp = PlanMemory(p, mo);
  ASSERT_TRUE(mp.fits) << mp.failure;
  const int64_t tokens = mp.ranks[0].kv_tokens;
  mo.max_num_seqs = tokens / 40960 + 1;  // one sequence more than fits
  mp = PlanMemory(p, mo);
  EXPECT_FALSE(mp.fits);
  EXPECT_NE(mp.failure.find("KV budget fails"), std::string::npos) << mp.failure;
  EXPECT_EQ(SmallestChangeThatFits(q, Opts(1), mo), "--kv-cache-dtype fp8");

  // "auto" max_model_len picks the longest context that fits.
  mo.max_num_seqs = 1;
  mo.max_model_len = 0;
  mp = PlanMemory(p, mo);
  EXPECT_EQ(mp.max_model_len, 40960);  // capped by the model's max_position_embeddings
}

TEST(MemoryTest, ParseFlags) {
  EXPECT_EQ(*ParseMaxModelLen("128k"), 128000);
  EXPECT_EQ(*ParseMaxModelLen("128K"), 131072);
  EXPECT_EQ(*ParseMaxModelLen("1M"), 1048576);
  EXPECT_EQ(*ParseMaxModelLen("1m"), 1000000);
  EXPECT_EQ(*ParseMaxModelLen("4096"), 4096);
  EXPECT_EQ(*ParseMaxModelLen("auto"), 0);
  EXPECT_FALSE(ParseMaxModelLen("12x").ok());
  EXPECT_FALSE(ParseMaxModelLen("-5").ok());
  EXPECT_FALSE(ParseMaxModelLen("k").ok());
  EXPECT_EQ(*ParseKvCacheDtype("fp8_e5m2"), KvCacheDtype::kFp8);
  EXPECT_FALSE(ParseKvCacheDtype("int8").ok());
  EXPECT_FALSE(FindGpu("h300").ok());
  EXPECT_EQ(FindGpu("H200")->bytes, static_cast<int64_t>(139.81 * kGiB));  // PyTorch's total
}

TEST(MemoryTest, ParamCounts) {
  // Qwen3-235B-A22B: about 235B total, 22B active.
  ParamCounts q = CountParams(PlanOrDie(PresetOrDie("qwen3-235b-a22b"), Opts(8)));
  EXPECT_NEAR(q.total / 1e9, 235, 2);
  EXPECT_NEAR(q.active / 1e9, 22, 1);
  // DeepSeek-V3: 671B total (without the MTP layer), 37B active.
  ParamCounts d = CountParams(PlanOrDie(PresetOrDie("deepseek-v3"), Opts(8)));
  EXPECT_NEAR(d.total / 1e9, 671, 8);
  EXPECT_NEAR(d.active / 1e9, 37, 1.5);
  // DeepSeek-V4-Flash: 284B total (without the MTP block), 13B active (DeepSeek's model card).
  ParamCounts f = CountParams(PlanOrDie(PresetOrDie("deepseek-v4-flash"), Opts(8, 1, true)));
  EXPECT_NEAR(f.total / 1e9, 284, 1.5);
  EXPECT_NEAR(f.active / 1e9, 13, 1.0);  // 13.8B: the embedding and head counted whole
}

// DeepSeek-V4-Flash (bf16 KV): one 512-wide KV head per layer, the same on every TP rank.
//   per token: 21 ratio-4 layers cache a 512-wide entry and the indexer's 128-wide key per 4
//              tokens: 21 * (512 * 2 / 4 + 128 * 2 / 4); 20 ratio-128 layers 512 * 2 / 128.
//   per sequence: 43 windows of 128 tokens x 512 x 2 bytes; the compressors' fp32 kv and score
//              states: ratio 4 [2*4, 2*512] (+ the indexer's [2*4, 2*128]), ratio 128 [128, 512].
TEST(MemoryTest, DeepseekV4CompressedKvByHand) {
  const ShardPlan p = PlanOrDie(PresetOrDie("deepseek-v4-flash"), Opts(8, 1, true));
  MemoryOptions mo;
  mo.gpu = *FindGpu("h200");
  mo.max_model_len = 65536;
  mo.kv_cache_dtype = KvCacheDtype::kBf16;
  const MemoryPlan m = PlanMemory(p, mo);
  EXPECT_EQ(m.ranks[0].kv_bytes_per_token, 21 * (256 + 64) + 20 * 8);
  EXPECT_EQ(m.ranks[0].state_bytes_per_seq,
            43LL * 128 * 512 * 2 + 21LL * 2 * (8 * 1024 + 8 * 256) * 4 + 20LL * 2 * 128 * 512 * 4);
  EXPECT_EQ(m.ranks[5].kv_bytes_per_token, m.ranks[0].kv_bytes_per_token);
}

// The releases of issue 14 against their published sizes (tests/checkpoints/README.md).
TEST(MemoryTest, ParamCountsOfQwenHybridsAndLlama4) {
  // Llama-4-Scout: Hugging Face declares 108,641,793,536 BF16 parameters (Meta: "109B total,
  // 17B active"). Active: embeddings, head, every non-routed tensor of the 48 layers and one
  // 8192-wide expert per layer; the vision tower runs on images, not per token.
  ParamCounts s = CountParams(PlanOrDie(PresetOrDie("llama-4-scout-17b-16e"), Opts(8, 1, true)));
  EXPECT_EQ(s.total, 108'641'793'536);
  const int64_t H = 5120, V = 202048;
  const int64_t attn = H * (40 + 8 + 8) * 128 + 40 * 128 * H, shared = 3 * 8192 * H;
  EXPECT_EQ(s.active, 2 * V * H + H + 48 * (attn + 2 * H + 16 * H + shared + shared));
  EXPECT_NEAR(s.active / 1e9, 17.2, 0.05);
  // Maverick: Meta's "400B total, 17B active".
  ParamCounts m =
      CountParams(PlanOrDie(PresetOrDie("llama-4-maverick-17b-128e"), Opts(8, 1, true)));
  EXPECT_NEAR(m.total / 1e9, 401.6, 0.1);
  EXPECT_NEAR(m.active / 1e9, 17.2, 0.05);
  // Qwen3.5-35B-A3B: the release's header dump counts 35,951,822,704 parameters, of which the
  // MTP module (not planned) holds 844,640,768: fc [2048, 4096], three norms, and one layer of
  // attention 27,263,488, norms 4,096, router 524,288, shared expert and gate 3,147,776, and 256
  // experts of 3 x 512 x 2048.
  const int64_t q35_mtp =
      2048LL * 4096 + 3 * 2048 + 27'263'488 + 4096 + 524'288 + 3'147'776 + 256LL * 3 * 512 * 2048;
  EXPECT_EQ(q35_mtp, 844'640'768);
  ParamCounts q = CountParams(PlanOrDie(PresetOrDie("qwen3.5-35b-a3b"), Opts(4)));
  EXPECT_EQ(q.total, 35'951'822'704 - q35_mtp);
  // Active 3.45B here: moeshard counts the embedding table and the head (1.02B) as active;
  // the release's "A3B" is about 3B.
  EXPECT_NEAR(q.active / 1e9, 3.45, 0.01);
  // Qwen3-Next-80B-A3B: 81,324,862,720 in the dump, 1,650,471,424 of them the MTP module (the
  // same layer with 512 experts and a [512, 2048] router); NVIDIA's card: 3.9B active.
  const int64_t next_mtp =
      2048LL * 4096 + 3 * 2048 + 27'263'488 + 4096 + 1'048'576 + 3'147'776 + 512LL * 3 * 512 * 2048;
  EXPECT_EQ(next_mtp, 1'650'471'424);
  ParamCounts n = CountParams(PlanOrDie(PresetOrDie("qwen3-next-80b-a3b"), Opts(4)));
  EXPECT_EQ(n.total, 81'324'862'720 - next_mtp);
  EXPECT_NEAR(n.active / 1e9, 3.87, 0.01);
}

}  // namespace
}  // namespace moeshard
