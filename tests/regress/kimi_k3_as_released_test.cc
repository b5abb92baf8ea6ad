// Kimi-K3 as released (shared/reference/checkpoints.md) could not be read: the release names the
// MoE module block_sparse_moe, the experts w1/w3/w2, the latent projections
// routed_expert_{down,up}_proj (stored BF16 though the quantization's ignore list does not name
// them), has a full-rank KDA g_proj, A_log F32 [128], attention-residual tensors on every layer,
// quantization_config inside text_config and its own routing key spellings. `plan` from the
// released config planned the latent projections as MXFP4 (2.34 instead of 8.80 GiB per rank).
#include <gtest/gtest.h>

#include "plan/plan_test_util.h"

namespace moeshard {
namespace {

using testing::Opts;
using testing::PlanOrDie;
using testing::PresetOrDie;

TEST(KimiK3AsReleasedRegression, LatentProjectionsAreBf16) {
  const ShardPlan p = PlanOrDie(PresetOrDie("kimi-k3"), Opts(8, 1, true));
  // 92 MoE layers x (down [3584, 7168] + up [7168, 3584]) x 2 bytes + norms [3584] x 2 bytes,
  // replicated on every rank.
  const int64_t want = 92 * (2 * 3584LL * 7168 * 2 + 3584 * 2);
  for (const RankPlan& r : p.ranks) {
    EXPECT_EQ(r.BytesOf(TensorCategory::kLatentProj), want) << r.coords.rank;  // 8.81 GiB
  }
}

TEST(KimiK3AsReleasedRegression, ReleaseNamesAndDtypes) {
  const ShardPlan p = PlanOrDie(PresetOrDie("kimi-k3"), Opts(8, 1, true));
  const RankPlan& r = p.ranks[3];
  auto find = [&](const std::string& name) -> const TensorShard* {
    for (const TensorShard& s : r.tensors) {
      if (s.name == name) return &s;
    }
    return nullptr;
  };
  const std::string L = "language_model.model.layers.{layer}.";
  const TensorShard* a_log = find(L + "self_attn.A_log");
  ASSERT_NE(a_log, nullptr);
  EXPECT_EQ(a_log->dtype, DType::kF32);
  EXPECT_EQ(a_log->logical_shape, (std::vector<int64_t>{128}));
  EXPECT_EQ(a_log->local_shape, (std::vector<int64_t>{12}));  // 96 heads / 8
  EXPECT_EQ(a_log->shard_begin, 3 * 12);
  ASSERT_NE(find(L + "self_attn.g_proj.weight"), nullptr);
  EXPECT_EQ(find(L + "self_attn.g_a_proj.weight"), nullptr);
  EXPECT_EQ(find(L + "self_attn.q_conv1d.weight")->dtype, DType::kF32);
  ASSERT_NE(find(L + "mlp_res_proj.weight"), nullptr);
  ASSERT_NE(find("language_model.model.output_attn_res_proj.weight"), nullptr);
  ASSERT_NE(find(L + "block_sparse_moe.routed_expert_norm.weight"), nullptr);
  ASSERT_NE(find(L + "block_sparse_moe.experts.w13_weight_packed"), nullptr);
  ASSERT_NE(find("language_model.lm_head.weight"), nullptr);
  ASSERT_NE(find("vision_tower.patch_embed.pos_emb.weight"), nullptr);
  EXPECT_GT(r.BytesOf(TensorCategory::kVision), 0);
}

}  // namespace
}  // namespace moeshard
