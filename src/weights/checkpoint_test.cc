// Sharded checkpoints: index parsing, path safety, shard discovery and the one-shard-per-tensor
// rule, header-only opening and reads through the unified view.
#include "moeshard/weights/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include "moeshard/weights/safetensors_writer.h"
#include "weights/test_util.h"

namespace moeshard {
namespace {

using testing_util::AsBytes;
using testing_util::PatternBytes;
using testing_util::ScratchDir;

void ExpectError(const Status& s, StatusCode code, std::initializer_list<std::string> fragments) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  for (const std::string& f : fragments) {
    EXPECT_NE(s.message().find(f), std::string::npos) << "'" << f << "' in: " << s.message();
  }
}

// Writes a shard holding `names` (U8 [n] tensors with distinct patterned bytes).
void WriteShard(const std::string& path, const std::vector<std::string>& names) {
  SafetensorsWriter w;
  std::vector<std::vector<uint8_t>> data;
  for (const std::string& n : names)
    data.push_back(PatternBytes(n.size() + 3, static_cast<uint32_t>(n[0])));
  for (size_t i = 0; i < names.size(); ++i) {
    ASSERT_TRUE(
        w.Add(names[i], DType::kU8, {static_cast<int64_t>(data[i].size())}, AsBytes(data[i])).ok());
  }
  ASSERT_TRUE(w.Finish(path).ok());
}

std::vector<uint8_t> ExpectedBytes(const std::string& name) {
  return PatternBytes(name.size() + 3, static_cast<uint32_t>(name[0]));
}

std::string IndexJson(const std::map<std::string, std::string>& map,
                      std::optional<int64_t> total = std::nullopt) {
  return SerializeCheckpointIndex(CheckpointIndex{.total_size = total, .weight_map = map});
}

// Two shards plus an unreferenced (and malformed) file the index must ignore.
class ShardedCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteShard(dir_ / "model-00001-of-00002.safetensors", {"embed", "layers.0.w"});
    WriteShard(dir_ / "model-00002-of-00002.safetensors", {"layers.1.w", "head"});
    testing_util::WriteText(dir_ / "consolidated.safetensors", "not a safetensors file");
    map_ = {{"embed", "model-00001-of-00002.safetensors"},
            {"layers.0.w", "model-00001-of-00002.safetensors"},
            {"layers.1.w", "model-00002-of-00002.safetensors"},
            {"head", "model-00002-of-00002.safetensors"}};
  }
  void WriteIndex(const std::map<std::string, std::string>& map,
                  std::optional<int64_t> total = std::nullopt) {
    testing_util::WriteText(dir_ / std::string(kCheckpointIndexFileName), IndexJson(map, total));
  }
  ScratchDir dir_;
  std::map<std::string, std::string> map_;
};

TEST_F(ShardedCheckpointTest, OpensTheShardsTheIndexNames) {
  const int64_t total = 8 + 13 + 13 + 7;
  WriteIndex(map_, total);
  auto ckpt = Checkpoint::Open(dir_.path().string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->num_shards(), 2);
  EXPECT_EQ((*ckpt)->tensors().size(), 4u);
  EXPECT_EQ((*ckpt)->total_tensor_bytes(), total);
  EXPECT_TRUE((*ckpt)->warnings().empty());
  ASSERT_TRUE((*ckpt)->index().has_value());
  const Checkpoint::Entry* e = (*ckpt)->Find("head");
  ASSERT_NE(e, nullptr);
  EXPECT_NE(e->file->path().find("model-00002-of-00002.safetensors"), std::string::npos);
  std::vector<uint8_t> got(7);
  ASSERT_TRUE((*ckpt)->ReadTensor("head", std::as_writable_bytes(std::span(got))).ok());
  EXPECT_EQ(got, ExpectedBytes("head"));
  std::vector<uint8_t> part(3);
  ASSERT_TRUE((*ckpt)->ReadRange("layers.1.w", 5, std::as_writable_bytes(std::span(part))).ok());
  const std::vector<uint8_t> layer1 = ExpectedBytes("layers.1.w");
  EXPECT_EQ(part, std::vector<uint8_t>(layer1.begin() + 5, layer1.begin() + 8));
  std::vector<uint8_t> cols(4);
  ASSERT_TRUE((*ckpt)
                  ->ReadSlice2D(
                      "embed",
                      {.row_bytes = 4, .row_begin = 0, .row_end = 2, .col_begin = 1, .col_end = 3},
                      std::as_writable_bytes(std::span(cols)))
                  .ok());
  const std::vector<uint8_t> embed = ExpectedBytes("embed");
  EXPECT_EQ(cols, (std::vector<uint8_t>{embed[1], embed[2], embed[5], embed[6]}));
  EXPECT_EQ((*ckpt)->bytes_read(), 7 + 3 + 4);
  (*ckpt)->ResetBytesRead();
  EXPECT_EQ((*ckpt)->bytes_read(), 0);
  ExpectError((*ckpt)->ReadTensor("nope", {}), StatusCode::kNotFound, {"tensor 'nope'"});
}

TEST_F(ShardedCheckpointTest, IndexFilePathWorksLikeItsDirectory) {
  WriteIndex(map_);
  auto ckpt = Checkpoint::Open(dir_ / std::string(kCheckpointIndexFileName));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->tensors().size(), 4u);
}

TEST_F(ShardedCheckpointTest, HeaderOnlyOpenSizesEverything) {
  WriteIndex(map_);
  auto ckpt = Checkpoint::Open(dir_.path().string(), SafetensorsAccess::kHeaderOnly);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->Find("layers.0.w")->info->num_bytes(), 13);
  std::vector<uint8_t> got(7);
  ExpectError((*ckpt)->ReadTensor("head", std::as_writable_bytes(std::span(got))),
              StatusCode::kFailedPrecondition, {"header-only"});
}

TEST_F(ShardedCheckpointTest, NamesEveryMissingShard) {
  map_["extra.a"] = "model-00003-of-00004.safetensors";
  map_["extra.b"] = "model-00004-of-00004.safetensors";
  WriteIndex(map_);
  auto ckpt = Checkpoint::Open(dir_.path().string());
  ExpectError(ckpt.status(), StatusCode::kNotFound,
              {"got 2 missing", "'model-00003-of-00004.safetensors'",
               "'model-00004-of-00004.safetensors'", kCheckpointIndexFileName.data()});
}

TEST_F(ShardedCheckpointTest, RejectsShardNamesThatLeaveTheDirectory) {
  for (const std::string bad :
       {"../model-00001-of-00002.safetensors", "/etc/passwd", "sub/model.safetensors", "..", ".",
        "a\\b.safetensors", "", "x..safetensors"}) {
    map_["head"] = bad;
    WriteIndex(map_);
    auto ckpt = Checkpoint::Open(dir_.path().string());
    ExpectError(ckpt.status(), StatusCode::kDataLoss,
                {"expected a plain file name", "refusing to leave the directory"});
  }
}

TEST_F(ShardedCheckpointTest, RejectsATensorInTwoShards) {
  WriteShard(dir_ / "model-00002-of-00002.safetensors", {"layers.1.w", "head", "embed"});
  WriteIndex(map_);
  auto ckpt = Checkpoint::Open(dir_.path().string());
  ExpectError(ckpt.status(), StatusCode::kDataLoss,
              {"tensor 'embed'", "exactly one shard", "model-00001-of-00002.safetensors",
               "model-00002-of-00002.safetensors"});
}

TEST_F(ShardedCheckpointTest, RejectsAnIndexPointingAtTheWrongShard) {
  map_["head"] = "model-00001-of-00002.safetensors";
  WriteIndex(map_);
  ExpectError(Checkpoint::Open(dir_.path().string()).status(), StatusCode::kDataLoss,
              {"tensor 'head'", "the index places it in 'model-00001-of-00002.safetensors'",
               "got it in", "model-00002-of-00002.safetensors"});
}

TEST_F(ShardedCheckpointTest, RejectsAnIndexedTensorNoShardHolds) {
  map_["ghost"] = "model-00001-of-00002.safetensors";
  WriteIndex(map_);
  ExpectError(Checkpoint::Open(dir_.path().string()).status(), StatusCode::kDataLoss,
              {"tensor 'ghost'", "got no shard holding it"});
}

TEST_F(ShardedCheckpointTest, RejectsAShardTensorTheIndexOmits) {
  map_.erase("layers.0.w");
  WriteIndex(map_);
  ExpectError(Checkpoint::Open(dir_.path().string()).status(), StatusCode::kDataLoss,
              {"tensor 'layers.0.w'", "unlisted", "stale index"});
}

TEST_F(ShardedCheckpointTest, TotalSizeIsAdvisory) {
  WriteIndex(map_, 12345);
  auto ckpt = Checkpoint::Open(dir_.path().string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  ASSERT_EQ((*ckpt)->warnings().size(), 1u);
  EXPECT_NE((*ckpt)->warnings()[0].find("12345"), std::string::npos);
  EXPECT_NE((*ckpt)->warnings()[0].find("41"), std::string::npos);
}

TEST_F(ShardedCheckpointTest, MalformedReferencedShardIsAnError) {
  map_["head"] = "consolidated.safetensors";
  WriteIndex(map_);
  ExpectError(Checkpoint::Open(dir_.path().string()).status(), StatusCode::kDataLoss,
              {"consolidated.safetensors", "header length"});
}

TEST(CheckpointOpenTest, WithoutAnIndexPrefersModelSafetensors) {
  ScratchDir dir;
  WriteShard(dir / "model.safetensors", {"a"});
  WriteShard(dir / "other.safetensors", {"a"});  // would conflict if it were used
  auto ckpt = Checkpoint::Open(dir.path().string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->num_shards(), 1);
  EXPECT_FALSE((*ckpt)->index().has_value());
}

TEST(CheckpointOpenTest, WithoutAnIndexUsesEverySafetensorsFile) {
  ScratchDir dir;
  WriteShard(dir / "b.safetensors", {"y"});
  WriteShard(dir / "a.safetensors", {"x"});
  testing_util::WriteText(dir / "notes.txt", "ignored");
  auto ckpt = Checkpoint::Open(dir.path().string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->num_shards(), 2);
  EXPECT_NE((*ckpt)->shard(0).path().find("a.safetensors"), std::string::npos);
  EXPECT_NE((*ckpt)->Find("y"), nullptr);
  WriteShard(dir / "c.safetensors", {"x"});
  ExpectError(Checkpoint::Open(dir.path().string()).status(), StatusCode::kDataLoss,
              {"tensor 'x'", "a.safetensors", "c.safetensors"});
}

TEST(CheckpointOpenTest, FollowsSymlinksLikeTheHuggingFaceCache) {
  // snapshots/<rev>/<shard> -> ../../blobs/<hash>, as huggingface_hub lays out its cache.
  ScratchDir dir;
  std::filesystem::create_directories(dir.path() / "blobs");
  std::filesystem::create_directories(dir.path() / "snapshots" / "rev");
  WriteShard(dir / "blobs/1111", {"a"});
  WriteShard(dir / "blobs/2222", {"b"});
  std::filesystem::create_symlink("../../blobs/1111", dir.path() / "snapshots/rev/s1.safetensors");
  std::filesystem::create_symlink("../../blobs/2222", dir.path() / "snapshots/rev/s2.safetensors");
  testing_util::WriteText(dir.path() / "snapshots/rev" / std::string(kCheckpointIndexFileName),
                          IndexJson({{"a", "s1.safetensors"}, {"b", "s2.safetensors"}}));
  auto ckpt = Checkpoint::Open((dir.path() / "snapshots/rev").string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->tensors().size(), 2u);
}

TEST(CheckpointOpenTest, RejectsAFifoWithoutBlocking) {
  ScratchDir dir;
  ASSERT_EQ(::mkfifo((dir / "pipe.safetensors").c_str(), 0600), 0);
  auto r = SafetensorsFile::Open(dir / "pipe.safetensors");
  ExpectError(r.status(), StatusCode::kInvalidArgument, {"expected a regular file"});
}

TEST(CheckpointOpenTest, OpensASingleFile) {
  ScratchDir dir;
  WriteShard(dir / "one.safetensors", {"w"});
  auto ckpt = Checkpoint::Open(dir / "one.safetensors");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->tensors().size(), 1u);
}

TEST(CheckpointOpenTest, ReportsEmptyAndMissingPaths) {
  ScratchDir dir;
  ExpectError(Checkpoint::Open(dir.path().string()).status(), StatusCode::kNotFound,
              {"*.safetensors", "got none"});
  ExpectError(Checkpoint::Open(dir / "nope").status(), StatusCode::kNotFound,
              {"nope", "got nothing at that path"});
}

TEST(CheckpointOpenTest, FromFilesBuildsAnInMemoryCheckpoint) {
  auto make = [](const std::string& name, const std::vector<std::string>& tensors) {
    SafetensorsWriter w;
    std::vector<std::vector<uint8_t>> data;
    for (const std::string& t : tensors) data.push_back(ExpectedBytes(t));
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_TRUE(
          w.Add(tensors[i], DType::kU8, {static_cast<int64_t>(data[i].size())}, AsBytes(data[i]))
              .ok());
    }
    return std::move(SafetensorsFile::FromBytes(name, *w.Serialize())).value();
  };
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  files.push_back(make("mem/s1.safetensors", {"a", "b"}));
  files.push_back(make("mem/s2.safetensors", {"c"}));
  files.push_back(make("mem/unused.safetensors", {"a"}));
  CheckpointIndex index{
      .total_size = std::nullopt,
      .weight_map = {{"a", "s1.safetensors"}, {"b", "s1.safetensors"}, {"c", "s2.safetensors"}}};
  auto ckpt = Checkpoint::FromFiles("mem", std::move(files), index);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->num_shards(), 2);
  std::vector<uint8_t> got(4);
  ASSERT_TRUE((*ckpt)->ReadTensor("c", std::as_writable_bytes(std::span(got))).ok());
  EXPECT_EQ(got, ExpectedBytes("c"));

  std::vector<std::unique_ptr<SafetensorsFile>> one;
  one.push_back(make("mem/s1.safetensors", {"a", "b"}));
  ExpectError(Checkpoint::FromFiles("mem", std::move(one), index).status(), StatusCode::kNotFound,
              {"'s2.safetensors'"});
}

TEST(CheckpointIndexTest, ParsesAndRoundTrips) {
  const std::string text = R"({"metadata": {"total_size": 1234, "total_parameters": 99},
      "weight_map": {"a": "x.safetensors", "b": "y.safetensors", "c": "x.safetensors"},
      "extra": [1, {"nested": null}]})";
  auto index = ParseCheckpointIndex(text, "i.json");
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->total_size, 1234);
  EXPECT_EQ(index->weight_map.size(), 3u);
  EXPECT_EQ(index->ShardFiles(), (std::vector<std::string>{"x.safetensors", "y.safetensors"}));
  auto again = ParseCheckpointIndex(SerializeCheckpointIndex(*index), "again");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->weight_map, index->weight_map);
  EXPECT_EQ(again->total_size, index->total_size);
  auto no_meta = ParseCheckpointIndex(R"({"weight_map": {}})", "i.json");
  ASSERT_TRUE(no_meta.ok());
  EXPECT_FALSE(no_meta->total_size.has_value());
}

TEST(CheckpointIndexTest, RejectsMalformedIndexes) {
  auto expect = [](const std::string& text, std::initializer_list<std::string> fragments) {
    auto r = ParseCheckpointIndex(text, "idx.json");
    ASSERT_FALSE(r.ok()) << text;
    ExpectError(r.status(), StatusCode::kDataLoss, fragments);
    EXPECT_NE(r.status().message().find("'idx.json'"), std::string::npos) << r.status().message();
  };
  expect(R"({"weight_map": {"a": "x", "a": "y"}})", {"key 'a'", "expected unique keys"});
  expect(R"({"weight_map": {}, "weight_map": {}})", {"key 'weight_map'", "unique"});
  expect(R"({"metadata": {"total_size": 1, "total_size": 2}, "weight_map": {}})",
         {"key 'total_size'"});
  expect(R"({"metadata": {}})", {"expected a 'weight_map' object, got none"});
  expect(R"({"weight_map": []})", {"weight_map: expected an object, got an array"});
  expect(R"({"weight_map": {"a": 3}})",
         {"weight_map 'a'", "expected a shard file name", "got the number 3"});
  expect(R"({"metadata": [], "weight_map": {}})", {"metadata: expected an object"});
  expect(R"({"metadata": {"total_size": -1}, "weight_map": {}})",
         {"total_size", "got the number -1"});
  expect(R"({"metadata": {"total_size": 1.5}, "weight_map": {}})", {"got the number 1.5"});
  expect(R"({"metadata": {"total_size": "7"}, "weight_map": {}})", {"got the string \"7\""});
  expect(R"([])", {"expected a JSON object, got an array"});
  expect(R"(  )", {"only whitespace"});
  expect("\xef\xbb\xbf{\"weight_map\": {}}", {"expected a JSON object"});
  expect(std::string("{\"weight_map\": {}}\0", 19), {"NUL byte"});
  expect(R"({"weight_map": {}} x)", {"not valid JSON"});
  expect("{\"metadata\": " + std::string(40, '[') + std::string(40, ']') + ", \"weight_map\": {}}",
         {"nesting at most 32 deep"});
  expect(R"({"weight_map": {"a": "../x.safetensors"}})", {"shard '../x.safetensors'"});
}

TEST(CheckpointIndexTest, WriteIndexIsAtomicAndValidated) {
  ScratchDir dir;
  CheckpointIndex index{.total_size = 10, .weight_map = {{"a", "s.safetensors"}}};
  const std::string path = dir / std::string(kCheckpointIndexFileName);
  ASSERT_TRUE(WriteCheckpointIndex(path, index).ok());
  auto text = std::ifstream(path);
  std::string s((std::istreambuf_iterator<char>(text)), std::istreambuf_iterator<char>());
  auto parsed = ParseCheckpointIndex(s, path);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->weight_map, index.weight_map);
  index.weight_map["b"] = "../evil";
  EXPECT_FALSE(WriteCheckpointIndex(dir / "other.json", index).ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "other.json"));
}

}  // namespace
}  // namespace moeshard
