// Per-rank loading of the tiny presets over TP, EP, hybrid and PP topologies: every rank buffer
// equals an independent element-by-element slicing of the whole model (dummy or checkpoint),
// padding is zero, allocation equals the plan per category, and a rank reads exactly its share.
#include "moeshard/weights/loader.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "moeshard/config/config_loader.h"
#include "moeshard/weights/presharded.h"
#include "moeshard/weights/safetensors_writer.h"
#include "weights/loader_test_util.h"
#include "weights/presharded_manifest.h"
#include "weights/test_util.h"

namespace moeshard {
namespace {

using testing_util::FullTensors;
using testing_util::ReferenceRankTensor;

struct Case {
  std::string preset;
  Topology topology;
  std::string label;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.preset << " " << c.label; }

// bf16 (qwen3, mixtral), fp8 blocks (deepseek), MXFP4 (kimi-k3 latent, gpt-oss fused).
std::vector<Case> Cases() {
  std::vector<Case> out;
  for (const char* p :
       {"tiny-qwen3-moe", "tiny-mixtral", "tiny-deepseek-v3", "tiny-kimi-k3", "tiny-gpt-oss"}) {
    out.push_back({p, Topology{.tp = 1}, "tp1"});
    out.push_back({p, Topology{.tp = 2}, "tp2"});
    out.push_back({p, Topology{.tp = 2, .enable_ep = true}, "tp2-ep"});
    out.push_back({p, Topology{.tp = 4, .moe_tp = 2, .moe_ep = 2}, "tp4-moetp2-moeep2"});
  }
  // Uneven block shards (11 MXFP4 groups of I): short last ranks, at TP8 two empty ones; and
  // gate-then-up MXFP4 halves at MoE TP 16 (ranks 8-15 hold no rows).
  out.push_back({"tiny-gpt-oss-uneven", Topology{.tp = 2}, "tp2"});
  out.push_back({"tiny-gpt-oss-uneven", Topology{.tp = 4}, "tp4"});
  out.push_back({"tiny-gpt-oss-uneven", Topology{.tp = 8}, "tp8"});
  out.push_back({"tiny-gpt-oss-uneven", Topology{.tp = 4, .moe_tp = 2, .moe_ep = 2}, "tp4-hybrid"});
  out.push_back({"tiny-kimi-k3", Topology{.tp = 8, .dp = 2}, "dp2-tp8-moetp16"});
  out.push_back({"tiny-qwen3-moe", Topology{.tp = 2, .pp = 2}, "tp2-pp2"});
  out.push_back({"tiny-deepseek-v3", Topology{.tp = 1, .dp = 2, .enable_ep = true}, "dp2-ep"});
  return out;
}

ShardPlan MakePlan(const std::string& preset, const Topology& topo,
                   ExpertPlacement placement = ExpertPlacement::kLinear) {
  Result<ModelConfig> m = LoadModelConfig(preset);
  EXPECT_TRUE(m.ok()) << m.status().message();
  PlanOptions o;
  o.topology = topo;
  o.placement = placement;
  Result<ShardPlan> p = BuildShardPlan(*m, o);
  EXPECT_TRUE(p.ok()) << preset << ": " << p.status().message();
  return std::move(p).value();
}

int64_t LocalBytes(const TensorShard& s) {
  return *DTypeBytes(s.dtype, testing_util::NumElements(s.local_shape));
}

// Checks every buffer of `w` against the reference slicing of `full`, and the allocation
// against the plan. Returns the rank's unpadded bytes.
int64_t ExpectRankMatches(const ShardPlan& plan, int64_t rank, const RankWeights& w,
                          const FullTensors& full, const std::string& what) {
  const RankPlan& rp = plan.ranks[static_cast<size_t>(rank)];
  int64_t count = 0, local = 0;
  for (const TensorShard& s : rp.tensors) {
    std::vector<int64_t> layers = s.layers.vec();
    if (layers.empty()) layers.push_back(-1);
    for (int64_t l : layers) {
      std::string name = s.name;
      if (l >= 0) name.replace(name.find("{layer}"), 7, std::to_string(l));
      const TensorBuffer* b = w.Find(name);
      if (b == nullptr) {
        ADD_FAILURE() << what << " rank " << rank << ": missing " << name;
        continue;
      }
      ++count;
      local += LocalBytes(s);
      EXPECT_EQ(b->shape, s.padded_shape) << name;
      EXPECT_EQ(b->local_shape, s.local_shape) << name;
      const std::vector<std::byte> want = ReferenceRankTensor(plan, rank, s, l, full);
      if (b->data.size() != want.size()) {
        ADD_FAILURE() << name << ": " << b->data.size() << " bytes, expected " << want.size();
        continue;
      }
      if (std::memcmp(b->data.data(), want.data(), want.size()) != 0) {
        size_t i = 0;
        while (b->data.data()[i] == want[i]) ++i;
        ADD_FAILURE() << what << " rank " << rank << ": " << name << " differs from the "
                      << "reference slice first at byte " << i << " of " << want.size();
      }
    }
  }
  EXPECT_EQ(static_cast<int64_t>(w.tensors().size()), count) << what;
  for (TensorCategory c : kAllCategories) {
    EXPECT_EQ(w.BytesOf(c), rp.BytesOf(c))
        << what << " rank " << rank << " " << TensorCategoryName(c);
  }
  EXPECT_EQ(w.TotalBytes(), rp.WeightBytes()) << what;
  return local;
}

class LoaderCaseTest : public ::testing::TestWithParam<Case> {};

// Dummy weights of every rank are slices of one logical model (layout invariance), padding is
// zero, and allocation equals the plan.
TEST_P(LoaderCaseTest, DummyRanksAreSlicesOfOneLogicalModel) {
  const Case& c = GetParam();
  const ShardPlan plan = MakePlan(c.preset, c.topology);
  Result<std::vector<SourceTensorSpec>> specs = ExpectedCheckpointTensors(plan);
  ASSERT_TRUE(specs.ok()) << specs.status().message();
  const FullTensors full = testing_util::FullDummyTensors(*specs, 42);
  for (int64_t r = 0; r < plan.topology.world; ++r) {
    LoadStats st;
    Result<RankWeights> w = LoadRankWeights(
        plan, r, {.source = LoadOptions::Source::kDummy, .seed = 42, .num_threads = 2}, &st);
    ASSERT_TRUE(w.ok()) << w.status().message();
    const int64_t local = ExpectRankMatches(plan, r, *w, full, c.preset + " " + c.label);
    EXPECT_EQ(st.bytes_filled, local);
    EXPECT_EQ(st.bytes_read, 0);
    EXPECT_EQ(st.bytes_allocated, plan.ranks[static_cast<size_t>(r)].WeightBytes());
  }
}

// A checkpoint written by moeshard's writer: each rank equals the slicing of the full tensors
// read back, and reads exactly its unpadded share.
TEST_P(LoaderCaseTest, CheckpointRanksReadTheirShareOnly) {
  const Case& c = GetParam();
  const ShardPlan plan = MakePlan(c.preset, c.topology);
  Result<std::vector<SourceTensorSpec>> specs = ExpectedCheckpointTensors(plan);
  ASSERT_TRUE(specs.ok());
  // Values unlike the dummy generator's (the writer must not be tested against itself).
  FullTensors src;
  SafetensorsWriter writer;
  uint32_t seed = 1;
  for (const SourceTensorSpec& s : *specs) {
    testing_util::FullTensor t{s.dtype, s.shape, {}};
    const auto pat = testing_util::PatternBytes(
        static_cast<size_t>(testing_util::NumElements(s.shape) * DTypeBits(s.dtype) / 8), seed++);
    t.bytes.assign(reinterpret_cast<const std::byte*>(pat.data()),
                   reinterpret_cast<const std::byte*>(pat.data()) + pat.size());
    src.emplace(s.name, std::move(t));
  }
  for (const auto& [name, t] : src) ASSERT_TRUE(writer.Add(name, t.dtype, t.shape, t.bytes).ok());
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  files.push_back(
      std::move(SafetensorsFile::FromBytes("model.safetensors", *writer.Serialize())).value());
  auto ckpt = Checkpoint::FromFiles("mem", std::move(files));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  const FullTensors full = testing_util::FullCheckpointTensors(**ckpt);
  (*ckpt)->ResetBytesRead();

  LoadOptions o{
      .source = LoadOptions::Source::kCheckpoint, .checkpoint = ckpt->get(), .num_threads = 2};
  auto loader = WeightLoader::Create(plan, o);
  ASSERT_TRUE(loader.ok()) << loader.status().message();
  EXPECT_TRUE((*loader)->unplaced_tensors().empty());
  for (int64_t r = 0; r < plan.topology.world; ++r) {
    LoadStats st;
    Result<RankWeights> w = (*loader)->Load(r, &st);
    ASSERT_TRUE(w.ok()) << w.status().message();
    const int64_t local = ExpectRankMatches(plan, r, *w, full, c.preset + " " + c.label);
    EXPECT_EQ(st.bytes_read, local) << "rank " << r << " must read its share and no more";
    EXPECT_EQ(st.bytes_filled, local);
  }
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, LoaderCaseTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string n = i.param.preset + "_" + i.param.label;
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

// The same logical expert reassembled from three topologies is bitwise identical.
TEST(LoaderTest, ExpertReassemblesIdenticallyAcrossTopologies) {
  const int64_t expert = 5, layer = 1;
  auto gate_rows = [&](const Topology& topo) {
    const ShardPlan plan = MakePlan("tiny-qwen3-moe", topo);
    const int64_t H = plan.hidden.padded_local, Ir = plan.intermediate.raw_local;
    std::vector<uint16_t> out;  // [I, H] of the logical gate_proj, rows in order
    for (int64_t moe_tp = 0; moe_tp < plan.topology.moe_tp; ++moe_tp) {
      for (const RankPlan& rp : plan.ranks) {
        if (rp.coords.moe_tp_rank != moe_tp) continue;
        auto it = std::find(rp.expert_slots.begin(), rp.expert_slots.end(), expert);
        if (it == rp.expert_slots.end()) continue;
        const int64_t slot = it - rp.expert_slots.begin();
        auto w = LoadRankWeights(plan, rp.coords.rank, {.seed = 9});
        const TensorBuffer* b = w->FindLayer(layer, "mlp.experts.w13_weight");
        const auto* p = b->data.as<uint16_t>() + slot * b->shape[1] * b->shape[2];
        for (int64_t r = 0; r < Ir; ++r) out.insert(out.end(), p + r * H, p + r * H + 128);
        break;
      }
    }
    return out;
  };
  const auto tp1 = gate_rows(Topology{.tp = 1});
  ASSERT_EQ(tp1.size(), 96u * 128u);
  EXPECT_EQ(tp1, gate_rows(Topology{.tp = 2}));
  EXPECT_EQ(tp1, gate_rows(Topology{.tp = 4, .enable_ep = true}));
  EXPECT_EQ(tp1, gate_rows(Topology{.tp = 4, .moe_tp = 2, .moe_ep = 2}));
  EXPECT_NE(tp1, std::vector<uint16_t>(tp1.size(), 0));
}

// Round-robin over redundant slots where no rank gets a replica of its own expert: 12 experts
// + 4 redundant slots over EP8 (lcm(12, 8) = 24 >= 16 slots).
TEST(LoaderTest, RoundRobinAndRedundantSlotsHoldTheirExperts) {
  Result<ModelConfig> m = LoadModelConfig("tiny-qwen3-moe");
  ASSERT_TRUE(m.ok());
  PlanOptions o;
  o.topology = Topology{.tp = 8, .enable_ep = true};
  o.placement = ExpertPlacement::kRoundRobin;
  o.num_redundant_experts = 4;
  Result<ShardPlan> plan = BuildShardPlan(*m, o);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const FullTensors full = testing_util::FullDummyTensors(*ExpectedCheckpointTensors(*plan), 3);
  for (int64_t r = 0; r < 8; ++r) {
    auto w = LoadRankWeights(*plan, r, {.seed = 3});
    ASSERT_TRUE(w.ok());
    ExpectRankMatches(*plan, r, *w, full, "qwen3 round-robin eplb");
  }
}

// gpt-oss without quantization stores experts in-major ([E, H, 2I], [E, I, H]); the loader
// transposes the rank's window.
TEST(LoaderTest, GptOssBf16ExpertsAreTransposed) {
  const PresetInfo* info = nullptr;
  for (const PresetInfo& p : ModelPresets()) {
    if (p.name == "tiny-gpt-oss") info = &p;
  }
  ASSERT_NE(info, nullptr);
  std::string text(info->json);
  text = text.substr(0, text.find(",\n  \"quantization_config\"")) + "\n}\n";
  Result<ModelConfig> m = ParseModelConfig(text, "tiny-gpt-oss-bf16", "tiny-gpt-oss-bf16");
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_EQ(m->quant.scheme.format, WeightFormat::kBf16);
  for (const Topology& t : {Topology{.tp = 2}, Topology{.tp = 2, .enable_ep = true}}) {
    PlanOptions o;
    o.topology = t;
    Result<ShardPlan> plan = BuildShardPlan(*m, o);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    const FullTensors full = testing_util::FullDummyTensors(*ExpectedCheckpointTensors(*plan), 5);
    ASSERT_TRUE(full.count("model.layers.0.mlp.experts.gate_up_proj"));
    EXPECT_EQ(full.at("model.layers.0.mlp.experts.gate_up_proj").shape,
              (std::vector<int64_t>{8, 128, 512}));
    for (int64_t r = 0; r < 2; ++r) {
      auto w = LoadRankWeights(*plan, r, {.seed = 5});
      ASSERT_TRUE(w.ok()) << w.status().message();
      ExpectRankMatches(*plan, r, *w, full, "gpt-oss bf16");
    }
  }
}

TEST(LoaderTest, LayerRestrictionMatchesRestrictedPlan) {
  const ShardPlan plan = MakePlan("tiny-deepseek-v3", Topology{.tp = 2});
  const RankPlan& rp = plan.ranks[1];
  const std::vector<int64_t> layers = LayersToBuild(plan, rp, 1);
  EXPECT_EQ(layers, (std::vector<int64_t>{0, 1}));  // dense layer 0, first MoE layer 1
  LoadStats st;
  auto w = LoadRankWeights(plan, 1, {.max_moe_layers = 1}, &st);
  ASSERT_TRUE(w.ok()) << w.status().message();
  const auto planned = PlannedBytesByCategory(rp, layers);
  int64_t total = 0;
  for (TensorCategory c : kAllCategories) {
    EXPECT_EQ(w->BytesOf(c), planned.at(c)) << TensorCategoryName(c);
    total += planned.at(c);
  }
  EXPECT_LT(total, rp.WeightBytes());
  EXPECT_GT(w->BytesOf(TensorCategory::kRoutedExperts), 0);
  EXPECT_EQ(w->FindLayer(2, "mlp.experts.w13_weight"), nullptr);
  EXPECT_NE(w->FindLayer(1, "mlp.experts.w13_weight"), nullptr);
  EXPECT_EQ(PlannedBytesByCategory(rp, rp.layers).at(TensorCategory::kRoutedExperts),
            rp.BytesOf(TensorCategory::kRoutedExperts));
}

// Writes the full model of `specs` with a modification applied to one tensor, and opens it.
std::unique_ptr<Checkpoint> MakeCheckpoint(
    const std::vector<SourceTensorSpec>& specs,
    const std::function<void(SafetensorsWriter&, const SourceTensorSpec&, std::vector<std::byte>&)>&
        add) {
  SafetensorsWriter writer;
  std::vector<std::vector<std::byte>> keep;
  keep.reserve(specs.size() + 1);
  for (const SourceTensorSpec& s : specs) {
    keep.emplace_back(
        static_cast<size_t>(testing_util::NumElements(s.shape) * DTypeBits(s.dtype) / 8));
    add(writer, s, keep.back());
  }
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  files.push_back(
      std::move(SafetensorsFile::FromBytes("ckpt/model.safetensors", *writer.Serialize())).value());
  return std::move(Checkpoint::FromFiles("ckpt", std::move(files))).value();
}

TEST(LoaderTest, CheckpointErrorsNameTheTensor) {
  const ShardPlan plan = MakePlan("tiny-qwen3-moe", Topology{.tp = 2});
  const auto specs = *ExpectedCheckpointTensors(plan);
  const std::string victim = "model.layers.1.mlp.experts.7.down_proj.weight";
  // Missing tensor.
  auto missing = MakeCheckpoint(
      specs, [&](SafetensorsWriter& w, const SourceTensorSpec& s, std::vector<std::byte>& b) {
        if (s.name != victim) {
          ASSERT_TRUE(w.Add(s.name, s.dtype, s.shape, b).ok());
        }
      });
  auto r = WeightLoader::Create(
      plan, {.source = LoadOptions::Source::kCheckpoint, .checkpoint = missing.get()});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(victim), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("ckpt"), std::string::npos) << r.status().message();
  // Wrong shape, plus an extra tensor the plan cannot place.
  auto wrong = MakeCheckpoint(specs, [&](SafetensorsWriter& w, const SourceTensorSpec& s,
                                         std::vector<std::byte>& b) {
    std::vector<int64_t> shape = s.shape;
    if (s.name == victim) shape[1] /= 2;
    ASSERT_TRUE(w.Add(s.name, s.dtype, shape,
                      std::span<const std::byte>(b.data(), b.size() / (s.name == victim ? 2 : 1)))
                    .ok());
  });
  r = WeightLoader::Create(plan,
                           {.source = LoadOptions::Source::kCheckpoint, .checkpoint = wrong.get()});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(victim), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("[128, 48]"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("[128, 96]"), std::string::npos) << r.status().message();

  std::vector<std::byte> extra(4);
  auto more = MakeCheckpoint(specs, [&](SafetensorsWriter& w, const SourceTensorSpec& s,
                                        std::vector<std::byte>& b) {
    ASSERT_TRUE(w.Add(s.name, s.dtype, s.shape, b).ok());
    if (&s == &specs.front()) {
      ASSERT_TRUE(
          w.Add("model.layers.9.mlp.experts.0.gate_proj.weight", DType::kBF16, {2}, extra).ok());
    }
  });
  r = WeightLoader::Create(plan,
                           {.source = LoadOptions::Source::kCheckpoint, .checkpoint = more.get()});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)->unplaced_tensors(),
            (std::vector<std::string>{"model.layers.9.mlp.experts.0.gate_proj.weight"}));
}

// shard -> build: a pre-sharded checkpoint reproduces exactly the same rank buffers, and only
// serves the plan it was made for.
TEST(LoaderTest, PreshardedRoundTripIsByteIdentical) {
  testing_util::ScratchDir dir;
  const ShardPlan plan = MakePlan("tiny-kimi-k3", Topology{.tp = 2, .enable_ep = true});
  auto dummy = WeightLoader::Create(plan, {.seed = 77});
  ASSERT_TRUE(dummy.ok());
  const std::string out = dir / "sharded";
  int64_t ranks_written = 0;
  ASSERT_TRUE(
      WritePreshardedCheckpoint(**dummy, out,
                                {.extra = {{"model", {{"spec", "tiny-kimi-k3"}}}},
                                 .on_rank = [&](int64_t, const LoadStats&) { ++ranks_written; }})
          .ok());
  EXPECT_EQ(ranks_written, 2);
  EXPECT_TRUE(IsPreshardedDir(out));
  auto manifest = ReadPreshardedManifest(out);
  ASSERT_TRUE(manifest.ok()) << manifest.status().message();
  EXPECT_EQ((*manifest)["model"]["spec"], "tiny-kimi-k3");
  auto pre = WeightLoader::Create(
      plan, {.source = LoadOptions::Source::kPresharded, .checkpoint_dir = out});
  ASSERT_TRUE(pre.ok()) << pre.status().message();
  for (int64_t r = 0; r < 2; ++r) {
    auto a = (*dummy)->Load(r);
    LoadStats st;
    auto b = (*pre)->Load(r, &st);
    ASSERT_TRUE(a.ok() && b.ok()) << b.status().message();
    ASSERT_EQ(a->tensors().size(), b->tensors().size());
    for (const TensorBuffer& t : a->tensors()) {
      const TensorBuffer* u = b->Find(t.name);
      ASSERT_NE(u, nullptr) << t.name;
      ASSERT_EQ(t.data.size(), u->data.size());
      EXPECT_EQ(0, std::memcmp(t.data.data(), u->data.data(), t.data.size())) << t.name;
    }
    EXPECT_EQ(st.bytes_read, b->TotalBytes());
  }
  // Refuses to overwrite, and refuses another plan.
  EXPECT_EQ(WritePreshardedCheckpoint(**dummy, out).code(), StatusCode::kFailedPrecondition);
  const ShardPlan other = MakePlan("tiny-kimi-k3", Topology{.tp = 2});
  auto bad = WeightLoader::Create(
      other, {.source = LoadOptions::Source::kPresharded, .checkpoint_dir = out});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("different plan"), std::string::npos);
}

}  // namespace
}  // namespace moeshard
