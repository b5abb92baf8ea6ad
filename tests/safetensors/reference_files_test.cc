// moeshard against an independent safetensors implementation (reference_safetensors.py, Python
// stdlib only): files it hand-builds must read identically here, files moeshard writes must be
// byte-identical to its own (same tensors, same order) and validate there, and both readers
// must accept and reject the same seed-corpus files.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "moeshard/weights/checkpoint.h"
#include "moeshard/weights/safetensors.h"
#include "moeshard/weights/safetensors_writer.h"
#include "weights/test_util.h"

namespace moeshard {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing_util::ScratchDir;

const std::string kScript = MOESHARD_SOURCE_DIR "/tests/safetensors/reference_safetensors.py";
const std::string kCorpus = MOESHARD_SOURCE_DIR "/src/weights/fuzz/corpus/safetensors_header";

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs the script with `args`; returns its stdout. Fails the test on a non-zero exit.
std::string RunScript(const std::vector<std::string>& args) {
  std::string cmd = Quote(MOESHARD_PYTHON3) + " " + Quote(kScript);
  for (const std::string& a : args) cmd += " " + Quote(a);
  FILE* p = ::popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr) << cmd;
  if (p == nullptr) return "";
  std::string out;
  char buf[65536];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  EXPECT_EQ(rc, 0) << cmd;
  return out;
}

// One JSON object per line.
std::vector<json> VerifyWithPython(const std::vector<std::string>& files) {
  std::vector<std::string> args = {"verify"};
  args.insert(args.end(), files.begin(), files.end());
  std::vector<json> lines;
  std::istringstream in(RunScript(args));
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  EXPECT_EQ(lines.size(), files.size());
  return lines;
}

std::string Hex(std::span<const uint8_t> bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

std::vector<uint8_t> Read(const SafetensorsFile& f, const TensorInfo& t) {
  std::vector<uint8_t> out(static_cast<size_t>(t.num_bytes()));
  EXPECT_TRUE(f.ReadTensor(t, std::as_writable_bytes(std::span(out))).ok());
  return out;
}

// moeshard's view of a file in the script's description format.
json Describe(const SafetensorsFile& f) {
  json d;
  d["metadata"] = json::object();
  for (const auto& [k, v] : f.header().metadata) d["metadata"][k] = v;
  d["header_bytes"] = f.header().header_bytes;
  d["tensors"] = json::array();
  for (const TensorInfo& t : f.tensors()) {
    d["tensors"].push_back({{"name", t.name},
                            {"dtype", std::string(DTypeName(t.dtype))},
                            {"shape", t.shape},
                            {"data_offsets", {t.data_begin, t.data_end}},
                            {"hex", Hex(Read(f, t))}});
  }
  return d;
}

std::vector<uint8_t> FileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)),
                              std::istreambuf_iterator<char>());
}

class ReferenceFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RunScript({"make", dir_.path().string()});
    std::ifstream m(dir_ / "manifest.json");
    manifest_ = json::parse(m);
    ASSERT_GE(manifest_.size(), 4u);
  }
  ScratchDir dir_;
  json manifest_;
};

TEST_F(ReferenceFilesTest, HandBuiltFilesReadIdentically) {
  for (const auto& [rel, want] : manifest_.items()) {
    for (auto access : {SafetensorsAccess::kMmap, SafetensorsAccess::kPread}) {
      auto file = SafetensorsFile::Open(dir_ / rel, access);
      ASSERT_TRUE(file.ok()) << rel << ": " << file.status().ToString();
      EXPECT_EQ(Describe(**file), want) << rel;
    }
  }
}

TEST_F(ReferenceFilesTest, HandBuiltShardedCheckpointOpens) {
  auto ckpt = Checkpoint::Open(dir_ / "sharded");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->num_shards(), 2);  // the garbage unreferenced file is ignored
  EXPECT_TRUE((*ckpt)->warnings().empty()) << (*ckpt)->warnings()[0];
  int seen = 0;
  for (const char* shard :
       {"sharded/model-00001-of-00002.safetensors", "sharded/model-00002-of-00002.safetensors"}) {
    for (const json& t : manifest_.at(shard).at("tensors")) {
      const Checkpoint::Entry* e = (*ckpt)->Find(t.at("name").get<std::string>());
      ASSERT_NE(e, nullptr) << t.at("name");
      EXPECT_EQ(Hex(Read(*e->file, *e->info)), t.at("hex"));
      ++seen;
    }
  }
  EXPECT_EQ(seen, 3);
  EXPECT_EQ(static_cast<int>((*ckpt)->tensors().size()), seen);
}

TEST_F(ReferenceFilesTest, WriterReproducesHandBuiltFilesByteForByte) {
  int compared = 0;
  for (const auto& [rel, want] : manifest_.items()) {
    const std::vector<uint8_t> original = FileBytes(dir_ / rel);
    auto file = SafetensorsFile::FromBytes(rel, original);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    // The script pads every file but misaligned.safetensors (unpadded on purpose).
    if ((*file)->header().header_bytes % 8 != 0) continue;
    SafetensorsWriter w;
    w.SetMetadata((*file)->header().metadata);
    std::vector<std::vector<uint8_t>> data;
    for (const TensorInfo& t : (*file)->tensors()) data.push_back(Read(**file, t));
    for (size_t i = 0; i < data.size(); ++i) {
      const TensorInfo& t = (*file)->tensors()[i];
      ASSERT_TRUE(w.Add(t.name, t.dtype, t.shape, std::as_bytes(std::span(data[i]))).ok());
    }
    auto written = w.Serialize();
    ASSERT_TRUE(written.ok());
    EXPECT_EQ(*written, original) << rel;
    ++compared;
  }
  EXPECT_GE(compared, 3);
}

TEST_F(ReferenceFilesTest, IndependentReaderAcceptsMoeshardFiles) {
  SafetensorsWriter w;
  std::vector<std::vector<uint8_t>> data;
  uint32_t seed = 7;
  for (DType d : kAllDTypes) data.push_back(testing_util::PatternBytes(*DTypeBytes(d, 40), seed++));
  for (size_t i = 0; i < std::size(kAllDTypes); ++i) {
    ASSERT_TRUE(w.Add("moeshard." + std::string(DTypeName(kAllDTypes[i])), kAllDTypes[i], {5, 8},
                      std::as_bytes(std::span(data[i])))
                    .ok());
  }
  ASSERT_TRUE(w.AddWithFill("filled \"\xe2\x82\xac\"", DType::kBF16, {3, 3},
                            [](int64_t off, std::span<std::byte> chunk) {
                              for (size_t i = 0; i < chunk.size(); ++i) {
                                chunk[i] = static_cast<std::byte>(off + static_cast<int64_t>(i));
                              }
                              return Status::Ok();
                            })
                  .ok());
  ASSERT_TRUE(w.Add("empty", DType::kF64, {0}, {}).ok());
  w.SetMetadata({{"format", "pt"}, {"\xc3\xa9", "\n\t"}});
  const std::string path = dir_ / "moeshard.safetensors";
  ASSERT_TRUE(w.Finish(path).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const std::vector<json> lines = VerifyWithPython({path});
  ASSERT_EQ(lines.size(), 1u);
  ASSERT_TRUE(lines[0].at("ok").get<bool>()) << lines[0].dump();
  EXPECT_EQ(lines[0].at("description"), Describe(**file));
}

TEST(ReferenceReaderAgreementTest, BothReadersAcceptAndRejectTheSameCorpusFiles) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(kCorpus)) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 30u);
  const std::vector<json> lines = VerifyWithPython(files);
  ASSERT_EQ(lines.size(), files.size());
  int accepted = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::vector<uint8_t> bytes = FileBytes(files[i]);
    auto ours = SafetensorsFile::FromBytes(files[i], bytes);
    const bool theirs = lines[i].at("ok").get<bool>();
    ASSERT_EQ(ours.ok(), theirs) << files[i] << "\n moeshard: "
                                 << (ours.ok() ? "accepted" : ours.status().ToString())
                                 << "\n reference: " << lines[i].dump();
    if (ours.ok()) {
      EXPECT_EQ(Describe(**ours), lines[i].at("description")) << files[i];
      ++accepted;
    }
    // The corpus names files by what they should do.
    const bool named_valid = fs::path(files[i]).filename().string().starts_with("valid_");
    EXPECT_EQ(ours.ok(), named_valid) << files[i];
  }
  EXPECT_GE(accepted, 5);
}

}  // namespace
}  // namespace moeshard
