// The weight-source seam: `--load-format`'s one parser (every spelling accepted, every refused
// combination with --checkpoint and per command), its help text, the registry, the one
// compatibility check of a stored tensor against the model's, and the origin of a pre-sharded
// directory read through the registry.
#include "weights/tensor_source.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>

#include "moeshard/config/config_loader.h"
#include "moeshard/weights/loader.h"
#include "moeshard/weights/presharded.h"
#include "weights/presharded_manifest.h"
#include "weights/test_util.h"

namespace moeshard {
namespace {

using internal::CheckCheckpointTensor;
using testing_util::ScratchDir;

// A directory `auto` reads as pre-sharded (a manifest.json; its content is read only on load).
void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

std::string Parsed(const std::string& load_format, const std::string& checkpoint,
                   LoadFormatScope scope = LoadFormatScope::kAny) {
  Result<std::string> r = ParseLoadFormat(load_format, checkpoint, scope);
  return r.ok() ? *r : "error: " + r.status().message();
}

TEST(LoadFormatTest, AcceptsEverySpelling) {
  ScratchDir dir;
  const std::string ckpt = dir / "ckpt";
  const std::string pre = dir / "pre";
  std::filesystem::create_directories(ckpt);
  std::filesystem::create_directories(pre);
  WriteFile(pre + "/manifest.json", "{}");
  // auto, also spelled "" (run's old default): the source the --checkpoint value names.
  for (const char* a : {"auto", ""}) {
    EXPECT_EQ(Parsed(a, ""), "dummy") << a;
    EXPECT_EQ(Parsed(a, ckpt), "safetensors") << a;
    EXPECT_EQ(Parsed(a, pre), "presharded") << a;
    EXPECT_EQ(Parsed(a, dir / "model.safetensors"), "safetensors") << a;  // need not exist yet
    EXPECT_EQ(Parsed(a, "", LoadFormatScope::kCheckpointTensors), "dummy") << a;
    EXPECT_EQ(Parsed(a, ckpt, LoadFormatScope::kCheckpointTensors), "safetensors") << a;
  }
  EXPECT_EQ(Parsed("dummy", ""), "dummy");
  EXPECT_EQ(Parsed("safetensors", ckpt), "safetensors");
  // An explicit value wins over what auto would pick.
  EXPECT_EQ(Parsed("safetensors", pre), "safetensors");
  EXPECT_EQ(Parsed("presharded", pre), "presharded");
  EXPECT_EQ(Parsed("dummy", "", LoadFormatScope::kCheckpointTensors), "dummy");
  EXPECT_EQ(Parsed("safetensors", ckpt, LoadFormatScope::kCheckpointTensors), "safetensors");
  // The built-in names code picks sources by.
  EXPECT_EQ(Parsed(LoadOptions::Source::kDummy, ""), LoadOptions::Source::kDummy);
  EXPECT_EQ(Parsed(LoadOptions::Source::kCheckpoint, ckpt), LoadOptions::Source::kCheckpoint);
  EXPECT_EQ(Parsed(LoadOptions::Source::kPresharded, pre), LoadOptions::Source::kPresharded);
}

TEST(LoadFormatTest, AutoWithoutCheckpointIgnoresAManifestInTheWorkingDirectory) {
  // IsPreshardedDir("") would look for ./manifest.json: auto without --checkpoint is dummy.
  ScratchDir dir;
  WriteFile(dir / "manifest.json", "{}");
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  const std::string got = Parsed("auto", "");
  std::filesystem::current_path(cwd);
  EXPECT_EQ(got, "dummy");
}

TEST(LoadFormatTest, RefusesBadValuesNamingTheExpectedOnes) {
  EXPECT_EQ(Parsed("gguf", ""),
            "error: '--load-format gguf': expected auto, dummy, safetensors, presharded");
  EXPECT_EQ(Parsed("Dummy", ""),
            "error: '--load-format Dummy': expected auto, dummy, safetensors, presharded");
  EXPECT_EQ(Parsed("presharded ", "d"),
            "error: '--load-format presharded ': expected auto, dummy, safetensors, presharded");
  // A command's own list.
  EXPECT_EQ(Parsed("gguf", "", LoadFormatScope::kCheckpointTensors),
            "error: '--load-format gguf': expected auto, dummy, safetensors");
  const Result<std::string> r = ParseLoadFormat("x", "");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST(LoadFormatTest, RefusesEachIncompatibleCombination) {
  ScratchDir dir;
  const std::string pre = dir / "pre";
  std::filesystem::create_directories(pre);
  WriteFile(pre + "/manifest.json", "{}");
  // A checkpoint given to a source that reads none.
  EXPECT_EQ(Parsed("dummy", "ckpt/"),
            "error: '--load-format dummy': expected no --checkpoint, got 'ckpt/'");
  // None given to sources that read one.
  EXPECT_EQ(Parsed("safetensors", ""),
            "error: '--load-format safetensors': expected --checkpoint DIR");
  EXPECT_EQ(Parsed("presharded", ""),
            "error: '--load-format presharded': expected --checkpoint DIR");
  // A pre-sharded directory is not sharded again, named explicitly or found by auto.
  EXPECT_EQ(Parsed("presharded", pre, LoadFormatScope::kCheckpointTensors),
            "error: '--load-format presharded': this command reads auto, dummy, safetensors, not "
            "presharded (--checkpoint " +
                pre + ")");
  EXPECT_EQ(Parsed("auto", pre, LoadFormatScope::kCheckpointTensors),
            "error: '--load-format auto': this command reads auto, dummy, safetensors, not "
            "presharded (--checkpoint " +
                pre + ")");
  EXPECT_EQ(Parsed("", pre, LoadFormatScope::kCheckpointTensors),
            "error: '--load-format auto': this command reads auto, dummy, safetensors, not "
            "presharded (--checkpoint " +
                pre + ")");
  EXPECT_EQ(Parsed("presharded", "", LoadFormatScope::kCheckpointTensors),
            "error: '--load-format presharded': this command reads auto, dummy, safetensors, not "
            "presharded (--checkpoint not given)");
}

TEST(LoadFormatTest, HelpAndDescriptionsComeFromTheRegistry) {
  EXPECT_EQ(LoadFormatHelp(),
            "auto (default: dummy without --checkpoint, presharded for a directory written by "
            "`moeshard shard`, else safetensors), dummy, safetensors, presharded");
  EXPECT_EQ(LoadFormatHelp(LoadFormatScope::kCheckpointTensors),
            "auto (default: dummy without --checkpoint, else safetensors), dummy, safetensors");
  EXPECT_EQ(DescribeLoadSource({.source = "dummy", .seed = 3}), "dummy weights (seed 3)");
  EXPECT_EQ(DescribeLoadSource({.source = "safetensors", .checkpoint_dir = "ck"}), "checkpoint ck");
  EXPECT_EQ(DescribeLoadSource({.source = "presharded", .checkpoint_dir = "ps"}),
            "pre-sharded checkpoint ps");
}

TEST(TensorSourceRegistryTest, EveryEntryIsComplete) {
  std::set<std::string> names;
  for (const internal::TensorSourceFormat& f : internal::TensorSourceFormats()) {
    SCOPED_TRACE(f.name);
    EXPECT_TRUE(names.insert(f.name).second) << "registered twice";
    EXPECT_NE(f.auto_claims, nullptr);
    EXPECT_NE(f.describe, nullptr);
    EXPECT_NE(f.open, nullptr);
    EXPECT_NE(std::string(f.auto_help), "");
    EXPECT_EQ(internal::FindTensorSourceFormat(f.name), &f);
  }
  EXPECT_EQ(names, (std::set<std::string>{"dummy", "safetensors", "presharded"}));
  EXPECT_EQ(internal::FindTensorSourceFormat("gguf"), nullptr);
  EXPECT_EQ(internal::FormatNames(internal::TensorSourceFormatsIn(LoadFormatScope::kAny)),
            "dummy, safetensors or presharded");
}

TEST(TensorSourceRegistryTest, TheLoaderRefusesAnUnregisteredSource) {
  Result<ModelConfig> m = LoadModelConfig("tiny-qwen3-moe");
  ASSERT_TRUE(m.ok()) << m.status().message();
  Result<ShardPlan> plan = BuildShardPlan(*m, PlanOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  auto r = WeightLoader::Create(*plan, {.source = "gguf"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "load: source 'gguf': expected one of dummy, safetensors, presharded (the sources "
            "registered in src/weights/tensor_source.cc)");
}

SourceTensorSpec Spec(DType dtype, std::vector<int64_t> shape,
                      SourceEncoding encoding = SourceEncoding::kDirect) {
  SourceTensorSpec s("model.layers.0.mlp.experts.3.down_proj.weight", dtype, std::move(shape),
                     DummyKind::kWeight);
  s.encoding = encoding;
  return s;
}

TensorInfo Stored(DType dtype, std::vector<int64_t> shape) {
  TensorInfo t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  return t;
}

bool Accepts(const SourceTensorSpec& want, const TensorInfo& got) {
  return CheckCheckpointTensor(want, got, "f.safetensors").ok();
}

TEST(CheckpointTensorCheckTest, AcceptsTheSpellingsCheckpointsUse) {
  EXPECT_TRUE(Accepts(Spec(DType::kBF16, {4, 8}), Stored(DType::kBF16, {4, 8})));
  // One value as a scalar where [1] is expected (ModelOpt).
  EXPECT_TRUE(Accepts(Spec(DType::kF32, {1}), Stored(DType::kF32, {})));
  // Per-tensor F32 values, as [] or [1], whatever shape the view has.
  for (SourceEncoding e :
       {SourceEncoding::kScalarF32, SourceEncoding::kReciprocalF32, SourceEncoding::kTensorScale}) {
    SCOPED_TRACE(SourceEncodingName(e));
    EXPECT_TRUE(Accepts(Spec(DType::kF32, {1}, e), Stored(DType::kF32, {})));
    EXPECT_TRUE(Accepts(Spec(DType::kF32, {1}, e), Stored(DType::kF32, {1})));
  }
  // E8M0 scales stored as F8_E8M0 where U8 is expected.
  EXPECT_TRUE(Accepts(Spec(DType::kU8, {4, 2}), Stored(DType::kF8E8M0, {4, 2})));
  // Packed 4-bit codes as I32 [.., n / 4] (compressed-tensors pack-quantized).
  EXPECT_TRUE(Accepts(Spec(DType::kU8, {4, 16}), Stored(DType::kI32, {4, 4})));
}

TEST(CheckpointTensorCheckTest, RefusesEveryOtherCombination) {
  struct Refused {
    SourceTensorSpec want;
    TensorInfo got;
    const char* why;
  };
  const std::vector<Refused> cases = {
      {Spec(DType::kBF16, {4, 8}), Stored(DType::kF16, {4, 8}), "dtype differs"},
      {Spec(DType::kBF16, {4, 8}), Stored(DType::kBF16, {4, 4}), "shape differs"},
      {Spec(DType::kBF16, {4, 8}), Stored(DType::kBF16, {8, 4}), "transposed"},
      {Spec(DType::kBF16, {32}), Stored(DType::kBF16, {4, 8}), "rank differs"},
      {Spec(DType::kF32, {}), Stored(DType::kF32, {1}), "[1] where a scalar is expected"},
      {Spec(DType::kF32, {1}), Stored(DType::kF16, {}), "scalar of another dtype"},
      {Spec(DType::kF32, {1}, SourceEncoding::kScalarF32), Stored(DType::kF16, {}),
       "per-tensor value not F32"},
      {Spec(DType::kF32, {1}, SourceEncoding::kTensorScale), Stored(DType::kF32, {2}),
       "per-tensor value with two elements"},
      {Spec(DType::kU8, {4, 2}), Stored(DType::kF8E8M0, {4, 4}), "E8M0 of another shape"},
      {Spec(DType::kF32, {4, 2}), Stored(DType::kF8E8M0, {4, 2}), "E8M0 where F32 is stored"},
      {Spec(DType::kU8, {4, 16}), Stored(DType::kI32, {4, 16}), "I32 not packed by 4"},
      {Spec(DType::kU8, {4, 16}), Stored(DType::kI32, {4, 2, 2}), "I32 of another rank"},
      {Spec(DType::kU8, {4, 6}), Stored(DType::kI32, {4, 1}), "U8 columns not a multiple of 4"},
      {Spec(DType::kU8, {}), Stored(DType::kI32, {}), "scalar U8 as I32"},
      {Spec(DType::kI8, {4, 16}), Stored(DType::kI32, {4, 4}), "packing applies to U8 only"},
  };
  for (const Refused& c : cases) {
    const Status s = CheckCheckpointTensor(c.want, c.got, "f.safetensors");
    EXPECT_FALSE(s.ok()) << c.why;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.why;
  }
}

TEST(CheckpointTensorCheckTest, OneWordingWithOrWithoutTheRank) {
  const SourceTensorSpec want = Spec(DType::kBF16, {7168, 3072});
  const TensorInfo got = Stored(DType::kBF16, {7168, 2048});
  EXPECT_EQ(CheckCheckpointTensor(want, got, "ckpt/model-00002.safetensors").message(),
            "load: 'model.layers.0.mlp.experts.3.down_proj.weight' in "
            "ckpt/model-00002.safetensors: BF16 [7168, 2048] does not match config BF16 [7168, "
            "3072] (wrong config.json for this checkpoint?)");
  EXPECT_EQ(
      CheckCheckpointTensor(want, got, "ckpt/model-00002.safetensors", "[rank 3/8]").message(),
      "[rank 3/8] load: 'model.layers.0.mlp.experts.3.down_proj.weight' in "
      "ckpt/model-00002.safetensors: BF16 [7168, 2048] does not match config BF16 [7168, "
      "3072] (wrong config.json for this checkpoint?)");
}

// A manifest that ReadPreshardedManifest accepts, made from `source`.
std::string MinimalPresharded(const ScratchDir& dir, const std::string& source) {
  std::string out = dir / "ps";
  std::filesystem::create_directories(out);
  WriteFile(out + "/rank-00000-of-00001.safetensors", "");
  WriteFile(out + "/manifest.json",
            "{\"format\": \"moeshard-presharded\", \"version\": 1, \"world\": 1, \"files\": "
            "[\"rank-00000-of-00001.safetensors\"], \"plan\": {}, \"source\": " +
                source + "}");
  return out;
}

TEST(PreshardedOriginTest, ReadsItsSourceThroughTheRegistry) {
  {
    ScratchDir dir;
    auto o = PreshardedOrigin(
        MinimalPresharded(dir, R"({"load_format": "dummy", "checkpoint": "", "seed": 9})"));
    ASSERT_TRUE(o.ok()) << o.status().message();
    EXPECT_EQ(o->source, "dummy");
    EXPECT_EQ(o->seed, 9u);
    EXPECT_EQ(o->checkpoint_dir, "");
  }
  {
    ScratchDir dir;
    const std::string ckpt = dir / "ckpt";
    std::filesystem::create_directories(ckpt);
    auto o = PreshardedOrigin(MinimalPresharded(
        dir, R"({"load_format": "safetensors", "checkpoint": ")" + ckpt + R"(", "seed": 0})"));
    ASSERT_TRUE(o.ok()) << o.status().message();
    EXPECT_EQ(o->source, "safetensors");
    EXPECT_EQ(o->checkpoint_dir, ckpt);
  }
  {
    ScratchDir dir;
    auto o = PreshardedOrigin(MinimalPresharded(
        dir, R"({"load_format": "safetensors", "checkpoint": "/nonexistent/ckpt"})"));
    ASSERT_FALSE(o.ok());
    EXPECT_EQ(o.status().code(), StatusCode::kNotFound);
    EXPECT_NE(o.status().message().find("made from checkpoint '/nonexistent/ckpt', which is not "
                                        "there"),
              std::string::npos)
        << o.status().message();
  }
  // A pre-sharded directory made from a pre-sharded one cannot be: its origin is refused.
  for (const char* bad : {"presharded", "auto", "gguf"}) {
    ScratchDir dir;
    auto o = PreshardedOrigin(
        MinimalPresharded(dir, std::string(R"({"load_format": ")") + bad + R"("})"));
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_EQ(o.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(o.status().message().find(std::string("'source.load_format': expected dummy or "
                                                    "safetensors, got \"") +
                                        bad + "\""),
              std::string::npos)
        << o.status().message();
  }
}

}  // namespace
}  // namespace moeshard
