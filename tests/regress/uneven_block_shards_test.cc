// gpt-oss-120b at TP4 and TP8 without EP was refused ("per-rank moe intermediate 720: expected a
// multiple of the mxfp4 quantization group (32)"), though vLLM serves it: its loader cuts I into
// ceil(90 groups / tp) groups per rank, the last rank short, and allocates every rank at the
// backend's padded width with zeros beyond the slice (issue 16; docs/uneven-shards.md, which
// cites vLLM gpt_oss.py GptOssModel.load_weights, FusedMoE.__init__ / weight_loader and
// mxfp4.py Mxfp4MoEMethod.create_weights). The byte counts below are written from vLLM's
// create_weights shapes, not from moeshard's descriptor.
#include <gtest/gtest.h>

#include "moeshard/plan/invariants.h"
#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::FindTensor;
using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

// vLLM's routed-expert bytes per rank for gpt-oss (E = 128, 36 layers): create_weights'
// w13_weight U8 [E, 2 Ip, Hp / 2], w13_weight_scale U8 [E, 2 Ip, Hp / 32], w13_bias BF16
// [E, 2 Ip], w2_weight U8 [E, Hp, Ip / 2], w2_weight_scale U8 [E, Hp, Ip / 32], w2_bias BF16
// [E, Hp].
int64_t VllmRoutedBytes(int64_t ip, int64_t hp) {
  const int64_t per_expert =
      2 * ip * (hp / 2) + 2 * ip * (hp / 32) + 2 * ip * 2 + hp * (ip / 2) + hp * (ip / 32) + hp * 2;
  return 128LL * 36 * per_expert;
}

// The rows of I rank r holds, read from its w2 weight's split (packed: two values per byte).
std::pair<int64_t, int64_t> SliceOf(const ShardPlan& p, int64_t rank) {
  const TensorShard* w2 = FindTensor(p.ranks[static_cast<size_t>(rank)],
                                     "model.layers.{layer}.mlp.experts.w2_weight_packed");
  if (w2 == nullptr) return {-1, -1};
  return {w2->shard_begin * 2, w2->shard_end * 2};
}

TEST(UnevenBlockShardsRegression, GptOss120bTp4AndTp8PlanAsVllmAllocates) {
  const ModelConfig m = PresetOrDie("gpt-oss-120b");
  // TP4: vLLM's loader stride cdiv(2880 / 32, 4) * 32 = 736; rows 736, 736, 736, 672; I // tp =
  // 720 padded to 768 (Marlin round_up(720, 128), Triton round_up(720, 64)).
  // TP8: stride 384 (12 groups); 7 x 384 + 192; 360 padded to 384.
  struct Case {
    int64_t tp, stride, padded;
    std::vector<std::pair<int64_t, int64_t>> slices;
  };
  const std::vector<Case> cases = {
      {4, 736, 768, {{0, 736}, {736, 1472}, {1472, 2208}, {2208, 2880}}},
      {8,
       384,
       384,
       {{0, 384},
        {384, 768},
        {768, 1152},
        {1152, 1536},
        {1536, 1920},
        {1920, 2304},
        {2304, 2688},
        {2688, 2880}}},
  };
  for (const Case& c : cases) {
    for (const char* backend : {"marlin", "triton"}) {
      SCOPED_TRACE(std::string(backend) + " tp " + std::to_string(c.tp));
      Result<ShardPlan> r = BuildShardPlan(m, Opts(c.tp, 1, false, backend));
      ASSERT_TRUE(r.ok()) << r.status().message();
      const ShardPlan& p = *r;
      EXPECT_TRUE(p.intermediate.uneven);
      EXPECT_EQ(p.intermediate.raw_local, c.stride);
      EXPECT_EQ(p.intermediate.padded_local, c.padded);
      const int64_t hp = std::string(backend) == "marlin" ? 3072 : 2880;  // H round_up 256 / none
      for (int64_t rank = 0; rank < c.tp; ++rank) {
        EXPECT_EQ(SliceOf(p, rank), c.slices[static_cast<size_t>(rank)]) << "rank " << rank;
        // Every rank allocates vLLM's bytes, the short last one too.
        EXPECT_EQ(p.ranks[static_cast<size_t>(rank)].BytesOf(TensorCategory::kRoutedExperts),
                  VllmRoutedBytes(c.padded, hp))
            << "rank " << rank;
      }
      // The last rank's extra padding is its missing rows: w13 (2 x 64 rows at TP4) and w2.
      const RankPlan& last = p.ranks.back();
      const TensorShard* w13 =
          FindTensor(last, "model.layers.{layer}.mlp.experts.w13_weight_packed");
      ASSERT_NE(w13, nullptr);
      EXPECT_EQ(w13->local_shape[1], 2 * (c.slices.back().second - c.slices.back().first));
      EXPECT_EQ(w13->padded_shape[1], 2 * c.padded);
      EXPECT_TRUE(CheckPlan(p).empty()) << CheckPlan(p).front().detail;
    }
  }
  // The numbers, spelled out for TP4 (docs/uneven-shards.md): 16.18 GiB on Marlin, 15.17 on
  // Triton's allocation, every rank.
  EXPECT_EQ(VllmRoutedBytes(768, 3072), 17'369'137'152);
  EXPECT_EQ(VllmRoutedBytes(768, 2880), 16'284'450'816);
}

TEST(UnevenBlockShardsRegression, GptOss120bTp4WholeRankEqualsVllmModules) {
  // The rest of a TP4 rank from vLLM's gpt_oss.py modules (bf16): VocabParallelEmbedding and
  // ParallelLMHead 201088 / 4 rows of 2880; per layer QKVParallelLinear (16 + 2 + 2 heads of 64)
  // x 2880 with bias, RowParallelLinear o_proj 2880 x 1024 with a whole bias, 16 sinks, the
  // router nn.Linear(2880, 128) with bias, two RMSNorms; the final RMSNorm.
  const ShardPlan p = PlanOrDie(PresetOrDie("gpt-oss-120b"), Opts(4, 1, false, "marlin"));
  const int64_t H = 2880, vocab_rows = 201088 / 4, qkv = (16 + 2 + 2) * 64;
  const int64_t per_layer =
      (qkv * H + qkv) * 2 + (H * 1024 + H) * 2 + 16 * 2 + (128 * H + 128) * 2 + 2 * H * 2;
  const int64_t rest = 2 * vocab_rows * H * 2 + H * 2 + 36 * per_layer;
  for (const RankPlan& r : p.ranks) {
    EXPECT_EQ(r.WeightBytes(), rest + VllmRoutedBytes(768, 3072)) << "rank " << r.coords.rank;
  }
}

TEST(UnevenBlockShardsRegression, ShortLastRankIsAKindOfItsOwn) {
  // The report groups ranks into kinds and prints the first of each: the short last rank (21 of
  // 90 groups, padded to the same 768 rows) has the same bytes but more padding, so it must not
  // hide behind rank 0 (its padding column and tensor table would show rank 0's).
  const ShardPlan p = PlanOrDie(PresetOrDie("gpt-oss-120b"), Opts(4, 1, false, "marlin"));
  const std::vector<std::vector<int64_t>> kinds = p.RoutedRankKinds();
  ASSERT_EQ(kinds, (std::vector<std::vector<int64_t>>{{0, 1, 2}, {3}}));
  EXPECT_GT(p.ranks[3].PaddingBytesOf(TensorCategory::kRoutedExperts),
            p.ranks[0].PaddingBytesOf(TensorCategory::kRoutedExperts));
  EXPECT_EQ(p.ranks[3].BytesOf(TensorCategory::kRoutedExperts),
            p.ranks[0].BytesOf(TensorCategory::kRoutedExperts));
}

TEST(UnevenBlockShardsRegression, OtherBlockFormatsStayRefused) {
  // vLLM refuses fp8 block shards that split a 128-row block; so does the plan (DeepSeek-V3 at
  // MoE TP 32: 2048 / 32 = 64).
  Result<ShardPlan> r = BuildShardPlan(PresetOrDie("deepseek-v3"), Opts(32));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("quantization group (128), got 64"), std::string::npos);
}

TEST(UnevenBlockShardsRegression, EmptyRanksAndGateUpHalvesOfATinyModel) {
  // tiny-gpt-oss-uneven: I 352 = 11 groups. TP8: 5 x 64, 32, then two empty ranks.
  const ShardPlan p = PlanOrDie(PresetOrDie("tiny-gpt-oss-uneven"), Opts(8, 1, false, "cpu"));
  ASSERT_TRUE(p.intermediate.uneven);
  EXPECT_EQ(SliceOf(p, 5), (std::pair<int64_t, int64_t>{320, 352}));
  EXPECT_EQ(SliceOf(p, 6), (std::pair<int64_t, int64_t>{352, 352}));
  EXPECT_EQ(SliceOf(p, 7), (std::pair<int64_t, int64_t>{352, 352}));
  const TensorShard* w2 =
      FindTensor(p.ranks[7], "model.layers.{layer}.mlp.experts.w2_weight_packed");
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(w2->local_shape[2], 0);
  EXPECT_EQ(w2->padded_shape[2], 32);  // 64 columns, two per byte: all padding
  EXPECT_TRUE(CheckPlan(p).empty());

  // Gate-then-up MXFP4 experts (tiny-kimi-k3, I 256 = 8 groups, MoE TP 16): ranks 0-7 hold 32
  // rows of each half, ranks 8-15 none; each half is padded on its own.
  const ShardPlan k = PlanOrDie(PresetOrDie("tiny-kimi-k3"), Opts(8, 2, false, "cpu"));
  ASSERT_TRUE(k.intermediate.uneven);
  for (const RankPlan& r : k.ranks) {
    for (const TensorShard& t : r.tensors) {
      if (t.role != TensorRole::kExpertsW13 || t.part != TensorPart::kWeight) continue;
      EXPECT_EQ(t.sections, 2) << t.name;
      EXPECT_EQ(t.local_shape[1], r.coords.moe_tp_rank < 8 ? 64 : 0) << t.name;
      EXPECT_EQ(t.padded_shape[1], 2 * k.intermediate.padded_local) << t.name;
    }
  }
  EXPECT_TRUE(CheckPlan(k).empty());
}

TEST(UnevenBlockShardsRegression, CheckCatchesABrokenUnevenSlice) {
  ShardPlan p = PlanOrDie(PresetOrDie("gpt-oss-120b"), Opts(4, 1, false, "marlin"));
  // An even split of the last rank's rows ([2160, 2880), as if I / tp were whole groups): the
  // rows [2208, 2160) overlap rank 2's and the local shape is no longer the slice.
  for (TensorShard& t : p.ranks[3].tensors) {
    if (t.name == "model.layers.{layer}.mlp.experts.w2_weight_packed") t.shard_begin = 2160 / 2;
  }
  std::vector<Violation> v = CheckPlan(p);
  ASSERT_FALSE(v.empty());
  bool named = false;
  for (const Violation& x : v) named |= x.detail.find("w2_weight_packed") != std::string::npos;
  EXPECT_TRUE(named) << v.front().detail;

  // A slice that stops short of I: a gap at the end.
  ShardPlan q = PlanOrDie(PresetOrDie("gpt-oss-120b"), Opts(4, 1, false, "marlin"));
  for (TensorShard& t : q.ranks[3].tensors) {
    if (t.name == "model.layers.{layer}.mlp.experts.w13_bias") {
      t.shard_end -= 64;
      t.local_shape[1] -= 64;
    }
  }
  v = CheckPlan(q);
  ASSERT_FALSE(v.empty());
  EXPECT_NE(v.front().detail.find("slices end at 5696 of 5760"), std::string::npos)
      << v.front().detail;
}

}  // namespace
}  // namespace moeshard
