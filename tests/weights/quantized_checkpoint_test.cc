// Quantized checkpoints in the layouts releases use (AWQ, GPTQ v1 and v2, compressed-tensors
// asymmetric int4 and NVFP4, ModelOpt NVFP4), written by hand (tests/weights/
// quantized_checkpoint.py: stdlib only, each layout's packing from its own reading of the
// formats), loaded over TP, EP and a hybrid: every quantized linear a rank holds -- attention,
// shared expert and routed experts -- dequantised from the rank's buffers (the rank layout's
// codes, scales, zero points and global scales) equals the script's dequantised values of the
// rank's slice, bit for bit.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>

#include "moeshard/config/config_loader.h"
#include "moeshard/kernels/reference.h"
#include "moeshard/plan/checkpoint_sizing.h"
#include "moeshard/weights/checkpoint.h"
#include "moeshard/weights/loader.h"
#include "weights/loader_test_util.h"
#include "weights/test_util.h"

namespace moeshard {
namespace {

struct Case {
  std::string preset;
  std::string layout;            // the script's name of the layout
  std::string config_edit = "";  // a GPTQ v2 variant: "checkpoint_format" set on the preset
};

struct Linear {
  std::string module;
  int64_t out = 0, in = 0;
  std::string format;  // the weight format (a layout may hold two: DeepSeek-V4)
};

// Every quantized linear of the model (at TP1), by checkpoint module name.
std::vector<Linear> QuantizedLinears(const ShardPlan& p) {
  std::vector<Linear> out;
  const WeightScheme& q = p.model.quant.scheme;
  const std::string leaf = "." + std::string(q.spec().weight_leaf);
  for (const TensorShard& s : p.ranks[0].tensors) {
    if (s.category == TensorCategory::kRoutedExperts || s.part != TensorPart::kWeight ||
        s.dtype != q.spec().weight_dtype) {
      continue;
    }
    std::vector<int64_t> at = {-1};
    if (!s.layers.empty()) at = s.layers.vec();
    for (int64_t l : at) {
      const std::string name = ExpandName(s.name, l);
      out.push_back({name.substr(0, name.size() - leaf.size()), s.logical_shape[0],
                     s.logical_shape[1] * (q.packed() ? 2 : 1),
                     std::string(WeightFormatName(q.format))});
    }
  }
  const ExpertLayout& x = p.experts;
  const int64_t I = p.intermediate.logical, H = p.hidden.logical;
  for (int64_t l = 0; l < p.model.num_layers; ++l) {
    if (!p.model.layers[static_cast<size_t>(l)].moe) continue;
    for (int64_t e = 0; e < p.model.num_experts; ++e) {
      const std::string f(WeightFormatName(p.expert_scheme.format));
      out.push_back({ExpandName(x.gate, l, e), I, H, f});
      out.push_back({ExpandName(x.up, l, e), I, H, f});
      out.push_back({ExpandName(x.down, l, e), H, I, f});
    }
  }
  return out;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.preset << " as " << c.layout; }

class QuantizedCheckpointTest : public ::testing::TestWithParam<Case> {};

TEST_P(QuantizedCheckpointTest, EveryRankDequantisesToTheWrittenValues) {
  if (std::system("python3 --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  const Case& c = GetParam();
  nlohmann::json cfg;
  for (const PresetInfo& p : ModelPresets()) {
    if (p.name == c.preset) cfg = nlohmann::json::parse(p.json);
  }
  ASSERT_FALSE(cfg.is_null()) << c.preset;
  if (!c.config_edit.empty()) cfg["quantization_config"]["checkpoint_format"] = c.config_edit;
  Result<ModelConfig> model = ParseModelConfig(cfg.dump(), "config.json", c.preset);
  ASSERT_TRUE(model.ok()) << model.status().message();
  Result<ShardPlan> plan1 = BuildShardPlan(*model, PlanOptions{.topology = {}, .backend = "cpu"});
  ASSERT_TRUE(plan1.ok()) << plan1.status().message();
  const WeightScheme& q = model->quant.scheme;

  // The spec: quantized linears by module, everything else by checkpoint tensor.
  const std::vector<Linear> linears = QuantizedLinears(*plan1);
  std::set<std::string> modules;
  nlohmann::json spec = {
      {"group", q.group}, {"plain", nlohmann::json::array()}, {"linears", nlohmann::json::array()}};
  for (const Linear& l : linears) {
    modules.insert(l.module);
    spec["linears"].push_back(
        {{"module", l.module}, {"out", l.out}, {"in", l.in}, {"format", l.format}});
  }
  Result<std::vector<SourceTensorSpec>> specs = ExpectedCheckpointTensors(*plan1);
  ASSERT_TRUE(specs.ok()) << specs.status().message();
  int quantized_sources = 0;
  std::set<std::string> quantized_leaves = {"weight_shape"};
  for (const WeightScheme* scheme : {&q, static_cast<const WeightScheme*>(&plan1->expert_scheme)}) {
    const QuantLeaves leaves = CheckpointLeaves(*scheme);
    for (std::string_view l : {leaves.weight, leaves.scale, leaves.zero, leaves.global}) {
      if (!l.empty()) quantized_leaves.insert(std::string(l));
    }
  }
  for (const SourceTensorSpec& s : *specs) {
    const size_t dot = s.name.rfind('.');
    if (modules.count(s.name.substr(0, dot)) && quantized_leaves.count(s.name.substr(dot + 1))) {
      ++quantized_sources;
      continue;
    }
    spec["plain"].push_back(
        {{"name", s.name}, {"dtype", std::string(DTypeName(s.dtype))}, {"shape", s.shape}});
  }
  // Weight and scales, plus zero points or a global scale where the format has them.
  const int parts = 2 + (q.has_zero_points() ? 1 : 0) + (q.has_global_scale() ? 1 : 0);
  ASSERT_GE(quantized_sources, parts * static_cast<int>(linears.size()));

  testing_util::ScratchDir dir;
  testing_util::WriteText(dir / "spec.json", spec.dump());
  const std::string cmd = fmt::format(
      "python3 {}/tests/weights/quantized_checkpoint.py {} {} {} {}", MOESHARD_SOURCE_DIR, c.layout,
      dir / "spec.json", dir / "ckpt", dir / "expected.safetensors");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto ckpt = Checkpoint::Open(dir / "ckpt");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  auto expected_ckpt = Checkpoint::Open(dir / "expected.safetensors");
  ASSERT_TRUE(expected_ckpt.ok()) << expected_ckpt.status().message();
  const testing_util::FullTensors expected = testing_util::FullCheckpointTensors(**expected_ckpt);
  auto want = [&](const std::string& module, int64_t row, int64_t col) {
    const testing_util::FullTensor& t = expected.at(module);
    float v;
    std::memcpy(&v, t.bytes.data() + (row * t.shape[1] + col) * 4, 4);
    return v;
  };

  // Sizing from the headers places every tensor (GPTQ's g_idx and ModelOpt's input_scale are
  // planned as the checkpoint stores them).
  {
    std::vector<CheckpointTensorInfo> infos;
    for (const auto& [name, entry] : (*ckpt)->tensors()) {
      infos.push_back({name, entry.info->dtype, entry.info->shape, entry.info->num_bytes()});
    }
    const CheckpointSizing sizing = SizeFromCheckpoint(*plan1, infos);
    EXPECT_TRUE(sizing.unplaced.empty())
        << sizing.unplaced.size() << " unplaced, e.g. " << sizing.unplaced.front();
    EXPECT_EQ(sizing.placed_bytes, sizing.total_bytes);
    // The rank's weights from the headers (converted parts at their rank-layout size) equal
    // the plan from config.json.
    EXPECT_EQ(sizing.RankTotal(0), plan1->ranks[0].WeightBytes());
  }

  for (const Topology& topo : {Topology{.tp = 2}, Topology{.tp = 2, .enable_ep = true},
                               Topology{.tp = 4, .moe_tp = 2, .moe_ep = 2}}) {
    Result<ShardPlan> plan =
        BuildShardPlan(*model, PlanOptions{.topology = topo, .backend = "cpu"});
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    {
      // Header sizing on this layout: every rank's weights equal the plan's (act-order: the
      // ranks of a split input keep every group's scales, from the headers too).
      std::vector<CheckpointTensorInfo> infos;
      for (const auto& [name, entry] : (*ckpt)->tensors()) {
        infos.push_back({name, entry.info->dtype, entry.info->shape, entry.info->num_bytes()});
      }
      const CheckpointSizing sizing = SizeFromCheckpoint(*plan, infos);
      for (int64_t rank = 0; rank < plan->topology.world; ++rank) {
        EXPECT_EQ(sizing.RankTotal(rank), plan->ranks[static_cast<size_t>(rank)].WeightBytes())
            << plan->topology.Label() << " rank " << rank;
      }
    }
    LoadOptions opts;
    opts.source = LoadOptions::Source::kCheckpoint;
    opts.checkpoint = ckpt->get();
    for (int64_t rank = 0; rank < plan->topology.world; ++rank) {
      SCOPED_TRACE(fmt::format("{} rank {}", plan->topology.Label(), rank));
      Result<RankWeights> w = LoadRankWeights(*plan, rank, opts);
      ASSERT_TRUE(w.ok()) << w.status().message();
      const RankPlan& rp = plan->ranks[static_cast<size_t>(rank)];
      int64_t checked = 0;
      // The sibling tensor of `weight` (name ending in the weight leaf) for another leaf.
      auto sibling = [&](const WeightScheme& sq, const std::string& weight,
                         std::string_view leaf) -> const void* {
        if (leaf.empty()) return nullptr;
        const std::string base = weight.substr(0, weight.size() - sq.spec().weight_leaf.size());
        const TensorBuffer* b = w->Find(base + std::string(leaf));
        EXPECT_NE(b, nullptr) << base << leaf;
        return b == nullptr ? nullptr : b->data.data();
      };
      // GPTQ's g_idx as written (i / g), each rank its slice of the input. Act-order g_idx
      // are shuffled: the dequantisation below reads them from the rank's buffers.
      for (const TensorShard& s : rp.tensors) {
        if (s.part != TensorPart::kGroupIndex || q.act_order) continue;
        for (int64_t l : s.layers.vec()) {
          const TensorBuffer* b = w->Find(ExpandName(s.name, l));
          ASSERT_NE(b, nullptr) << s.name;
          const auto* gi = b->data.as<int32_t>();
          const int64_t n = s.local_shape.back(), per = s.padded_shape.back();
          const int64_t begin = s.shard_dim >= 0 ? s.shard_begin : 0;
          for (int64_t i = 0; i < testing_util::NumElements(s.local_shape); ++i) {
            ASSERT_EQ(gi[(i / n) * per + i % n], (begin + i % n) / q.group) << s.name << " " << i;
          }
          ++checked;
        }
      }
      // Scale columns per row of the scales beside `weight` (act-order with a split input:
      // every group's), and its g_idx (act-order only).
      auto scale_cols = [&](const WeightScheme& sq, const std::string& weight, int64_t layer) {
        const std::string base = weight.substr(0, weight.size() - sq.spec().weight_leaf.size());
        for (const TensorShard& t : rp.tensors) {
          if (ExpandName(t.name, layer) == base + std::string(sq.spec().scale_leaf)) {
            return t.padded_shape.back();
          }
        }
        return int64_t{0};
      };
      auto group_index = [&](const WeightScheme& sq, const std::string& weight) {
        return sq.act_order ? static_cast<const int32_t*>(sibling(sq, weight, "g_idx")) : nullptr;
      };
      std::vector<float> row;
      for (const TensorShard& s : rp.tensors) {
        const WeightScheme& sq =
            s.category == TensorCategory::kRoutedExperts ? plan->expert_scheme : q;
        if (s.part != TensorPart::kWeight || s.dtype != sq.spec().weight_dtype) continue;
        for (int64_t l : s.layers.empty() ? std::vector<int64_t>{-1} : s.layers.vec()) {
          const std::string name = ExpandName(s.name, l);
          const TensorBuffer* b = w->Find(name);
          ASSERT_NE(b, nullptr) << name;
          const auto* scales = sibling(sq, name, sq.spec().scale_leaf);
          const auto* zeros = static_cast<const uint8_t*>(sibling(sq, name, sq.spec().zero_leaf));
          const auto* globals = static_cast<const float*>(sibling(sq, name, sq.spec().global_leaf));
          if (s.category != TensorCategory::kRoutedExperts) {
            const std::string module =
                name.substr(0, name.size() - sq.spec().weight_leaf.size() - 1);
            const int64_t per_byte = sq.packed() ? 2 : 1;
            const int64_t rows = s.local_shape[0], cols = s.local_shape[1] * per_byte;
            const int64_t r0 = s.shard_dim == 0 ? s.shard_begin : 0;
            const int64_t c0 = s.shard_dim == 1 ? s.shard_begin * per_byte : 0;
            row.resize(static_cast<size_t>(cols));
            const int32_t* gidx = group_index(sq, name);
            const int64_t scols = scale_cols(sq, name, l);
            for (int64_t r = 0; r < rows; ++r) {
              reference::DequantizeMatrixRow(sq, b->data.data(), scales, rows, cols, r, row.data(),
                                             zeros, globals ? *globals : 1.0f, gidx, scols);
              for (int64_t col = 0; col < cols; ++col) {
                ASSERT_EQ(row[static_cast<size_t>(col)], want(module, r0 + r, c0 + col))
                    << module << " [" << r0 + r << ", " << c0 + col << "]";
              }
            }
            ++checked;
            continue;
          }
          // Routed experts: w13 [El, 2 I_pad, H_pad] (gate rows, then up at I_pad), w2
          // [El, H_pad, I_pad]; the rank's slice [ib, ie) of I.
          const bool w13 = s.role == TensorRole::kExpertsW13;
          const int64_t rows = s.padded_shape[1], cols = s.padded_shape[2] * (sq.packed() ? 2 : 1);
          const int64_t Il = plan->intermediate.raw_local, Ip = plan->intermediate.padded_local;
          const int64_t H = plan->hidden.logical;
          const int64_t ib = rp.coords.moe_tp_rank * Il;
          row.resize(static_cast<size_t>(cols));
          // Act-order: g_idx w13 [El, 2, H_pad], w2 [El, I_pad]; w2's scales may hold every group.
          const int32_t* gidx = group_index(sq, name);
          const int64_t scols = sq.act_order ? scale_cols(sq, name, l) : sq.ScaleCols(cols);
          const int64_t scale_bytes = sq.ScaleRows(rows) * sq.ScaleRowBytes(scols * sq.group);
          for (size_t slot = 0; slot < rp.expert_slots.size(); ++slot) {
            const int64_t e = rp.expert_slots[slot];
            const auto* d = b->data.data() + slot * rows * sq.WeightRowBytes(cols);
            const auto* sc = static_cast<const std::byte*>(scales) + slot * scale_bytes;
            const uint8_t* z = zeros ? zeros + slot * sq.ScaleRows(rows) * scols : nullptr;
            for (int half = 0; half < (w13 ? 2 : 1); ++half) {
              const std::string module = ExpandName(
                  w13 ? (half ? plan->experts.up : plan->experts.gate) : plan->experts.down, l, e);
              const float gs = globals ? globals[w13 ? 2 * slot + half : slot] : 1.0f;
              const int32_t* gi = gidx == nullptr
                                      ? nullptr
                                      : gidx + (w13 ? (2 * static_cast<int64_t>(slot) + half) * cols
                                                    : static_cast<int64_t>(slot) * cols);
              for (int64_t r = 0; r < (w13 ? Il : H); ++r) {
                reference::DequantizeMatrixRow(sq, d, sc, rows, cols, (w13 ? half * Ip : 0) + r,
                                               row.data(), z, gs, gi, sq.act_order ? scols : 0);
                for (int64_t col = 0; col < (w13 ? H : Il); ++col) {
                  ASSERT_EQ(row[static_cast<size_t>(col)],
                            w13 ? want(module, ib + r, col) : want(module, r, ib + col))
                      << module << " row " << r << " col " << col;
                }
              }
            }
          }
          ++checked;
        }
      }
      EXPECT_GT(checked, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, QuantizedCheckpointTest,
                         ::testing::Values(Case{"tiny-qwen2-moe-awq", "awq"},
                                           Case{"tiny-qwen2-moe-gptq", "gptq"},
                                           Case{"tiny-qwen2-moe-gptq", "gptq_v2", "gptq_v2"},
                                           Case{"tiny-qwen2-moe-gptq-act", "gptq-act"},
                                           Case{"tiny-qwen2-moe-w4a16-asym", "ct-int4-asym"},
                                           Case{"tiny-qwen2-moe-nvfp4", "ct-nvfp4"},
                                           Case{"tiny-qwen2-moe-modelopt-nvfp4", "modelopt-nvfp4"},
                                           Case{"tiny-qwen2-moe-fp8-dynamic", "ct-fp8-channel"},
                                           Case{"tiny-qwen2-moe-modelopt-fp8", "modelopt-fp8"},
                                           Case{"tiny-deepseek-v4", "deepseek-v4"}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string n = info.param.layout;
                           for (char& ch : n) {
                             if (ch == '-') ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace moeshard
