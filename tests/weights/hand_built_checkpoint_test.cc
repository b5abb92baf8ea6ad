// A checkpoint written by hand (tests/weights/hand_built_checkpoint.py: stdlib struct + json, two
// shards and an index, the family's expert naming re-derived from config.json) and the same
// tensors written by moeshard's SafetensorsWriter load identically, rank by rank, over TP, EP
// and hybrid plans, for bf16 (tiny-qwen3-moe), fp8 block (tiny-deepseek-v3) and MXFP4
// (tiny-kimi-k3) experts, fused input-major gate-then-up bf16 experts (tiny-llama4) and gpt-oss's
// fused MXFP4 experts in uneven block shards (tiny-gpt-oss-uneven, up to TP8) -- and
// both equal the independent reference slicing.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "moeshard/config/config_loader.h"
#include "moeshard/weights/loader.h"
#include "moeshard/weights/safetensors_writer.h"
#include "weights/loader_test_util.h"
#include "weights/test_util.h"

namespace moeshard {
namespace {

// The script's formula: byte k of tensor n = (sum of n's bytes + 7k + k / 256) mod 256.
std::vector<std::byte> FormulaBytes(const std::string& name, int64_t n) {
  uint32_t s = 0;
  for (char c : name) s += static_cast<uint8_t>(c);
  std::vector<std::byte> out(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    out[static_cast<size_t>(k)] =
        static_cast<std::byte>((s + 7 * static_cast<uint64_t>(k) + (k >> 8)) & 0xff);
  }
  return out;
}

class HandBuiltCheckpointTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HandBuiltCheckpointTest, LoadsIdenticallyToMoeshardWrittenOne) {
  if (std::system("python3 --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  const std::string preset = GetParam();
  Result<ModelConfig> model = LoadModelConfig(preset);
  ASSERT_TRUE(model.ok());
  PlanOptions base;
  base.topology = Topology{.tp = 2};
  Result<ShardPlan> plan0 = BuildShardPlan(*model, base);
  ASSERT_TRUE(plan0.ok()) << plan0.status().message();
  Result<std::vector<SourceTensorSpec>> specs = ExpectedCheckpointTensors(*plan0);
  ASSERT_TRUE(specs.ok());

  testing_util::ScratchDir dir;
  nlohmann::json spec = nlohmann::json::array();
  SafetensorsWriter writer;
  std::vector<std::vector<std::byte>> keep;
  keep.reserve(specs->size());
  for (const SourceTensorSpec& s : *specs) {
    spec.push_back(
        {{"name", s.name}, {"dtype", std::string(DTypeName(s.dtype))}, {"shape", s.shape}});
    keep.push_back(
        FormulaBytes(s.name, testing_util::NumElements(s.shape) * DTypeBits(s.dtype) / 8));
    ASSERT_TRUE(writer.Add(s.name, s.dtype, s.shape, keep.back()).ok());
  }
  std::filesystem::create_directory(dir / "ours");
  ASSERT_TRUE(writer.Finish(dir / "ours/model.safetensors").ok());
  testing_util::WriteText(dir / "spec.json", spec.dump());
  testing_util::WriteText(dir / "config.json", std::string([&] {
                            for (const PresetInfo& p : ModelPresets()) {
                              if (p.name == preset) return p.json;
                            }
                            return std::string_view("{}");
                          }()));
  const std::string cmd =
      fmt::format("python3 {}/tests/weights/hand_built_checkpoint.py {} {} {}", MOESHARD_SOURCE_DIR,
                  dir / "config.json", dir / "spec.json", dir / "hand");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  auto hand = Checkpoint::Open(dir / "hand");
  auto ours = Checkpoint::Open(dir / "ours");
  ASSERT_TRUE(hand.ok()) << hand.status().message();
  ASSERT_TRUE(ours.ok()) << ours.status().message();
  EXPECT_EQ((*hand)->num_shards(), 2);
  const testing_util::FullTensors full = testing_util::FullCheckpointTensors(**hand);

  std::vector<Topology> topologies = {Topology{.tp = 2}, Topology{.tp = 2, .enable_ep = true},
                                      Topology{.tp = 4, .moe_tp = 2, .moe_ep = 2}};
  if (preset == "tiny-gpt-oss-uneven") {  // uneven block shards: short and empty last ranks
    topologies.push_back(Topology{.tp = 4});
    topologies.push_back(Topology{.tp = 8});
  }
  for (const Topology& topo : topologies) {
    PlanOptions o;
    o.topology = topo;
    Result<ShardPlan> plan = BuildShardPlan(*model, o);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    auto from_hand = WeightLoader::Create(
        *plan, {.source = LoadOptions::Source::kCheckpoint, .checkpoint = hand->get()});
    auto from_ours = WeightLoader::Create(
        *plan, {.source = LoadOptions::Source::kCheckpoint, .checkpoint = ours->get()});
    ASSERT_TRUE(from_hand.ok()) << from_hand.status().message();
    ASSERT_TRUE(from_ours.ok()) << from_ours.status().message();
    EXPECT_TRUE((*from_hand)->unplaced_tensors().empty());
    for (int64_t r = 0; r < plan->topology.world; ++r) {
      LoadStats sh, so;
      auto a = (*from_hand)->Load(r, &sh);
      auto b = (*from_ours)->Load(r, &so);
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(sh.bytes_read, sh.bytes_filled) << "rank " << r << " reads its share only";
      EXPECT_EQ(sh.bytes_read, so.bytes_read);
      ASSERT_EQ(a->tensors().size(), b->tensors().size());
      for (const TensorBuffer& t : a->tensors()) {
        const TensorBuffer* u = b->Find(t.name);
        ASSERT_NE(u, nullptr);
        ASSERT_EQ(0, std::memcmp(t.data.data(), u->data.data(), t.data.size())) << t.name;
      }
      for (const TensorShard& s : plan->ranks[static_cast<size_t>(r)].tensors) {
        std::vector<int64_t> layers = s.layers.vec();
        if (layers.empty()) layers.push_back(-1);
        for (int64_t l : layers) {
          std::string name = s.name;
          if (l >= 0) name.replace(name.find("{layer}"), 7, std::to_string(l));
          const auto want = testing_util::ReferenceRankTensor(*plan, r, s, l, full);
          const TensorBuffer* t = a->Find(name);
          ASSERT_NE(t, nullptr) << name;
          ASSERT_EQ(t->data.size(), want.size());
          EXPECT_EQ(0, std::memcmp(t->data.data(), want.data(), want.size()))
              << preset << " " << topo.tp << " rank " << r << " " << name;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, HandBuiltCheckpointTest,
                         ::testing::Values("tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-kimi-k3",
                                           "tiny-llama4", "tiny-qwen3-next", "tiny-qwen3.5-moe",
                                           "tiny-gpt-oss-uneven"),
                         [](const auto& i) {
                           std::string n = i.param;
                           for (char& c : n) {
                             if (c == '-' || c == '.') c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace moeshard
