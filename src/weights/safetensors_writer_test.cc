// SafetensorsWriter: round trips for every dtype, the header format the reference writes,
// streaming fill callbacks, atomic replacement, and rejection of what the reader would reject.
#include "moeshard/weights/safetensors_writer.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "moeshard/weights/safetensors.h"
#include "weights/test_util.h"

namespace moeshard {
namespace {

using testing_util::AsBytes;
using testing_util::PatternBytes;
using testing_util::ScratchDir;
namespace fs = std::filesystem;

std::vector<uint8_t> ReadBack(const SafetensorsFile& f, const TensorInfo& t) {
  std::vector<uint8_t> out(static_cast<size_t>(t.num_bytes()));
  EXPECT_TRUE(f.ReadTensor(t, std::as_writable_bytes(std::span(out))).ok());
  return out;
}

std::vector<std::string> DirEntries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(SafetensorsWriterTest, RoundTripsEveryDType) {
  ScratchDir dir;
  SafetensorsWriter w;
  std::vector<std::vector<uint8_t>> data;
  uint32_t seed = 1;
  for (DType d : kAllDTypes) {
    // [3, 8] has a whole number of bytes for every width; sub-byte types pack.
    data.push_back(PatternBytes(static_cast<size_t>(*DTypeBytes(d, 24)), seed++));
  }
  for (size_t i = 0; i < std::size(kAllDTypes); ++i) {
    ASSERT_TRUE(
        w.Add("t." + std::string(DTypeName(kAllDTypes[i])), kAllDTypes[i], {3, 8}, AsBytes(data[i]))
            .ok());
  }
  w.SetMetadata({{"format", "pt"}, {"producer", "moeshard"}});
  const std::string path = dir / "all.safetensors";
  ASSERT_TRUE(w.Finish(path).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_EQ((*file)->tensors().size(), std::size(kAllDTypes));
  for (size_t i = 0; i < std::size(kAllDTypes); ++i) {
    const TensorInfo* t = *(*file)->Get("t." + std::string(DTypeName(kAllDTypes[i])));
    EXPECT_EQ(t->dtype, kAllDTypes[i]);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{3, 8}));
    EXPECT_EQ(ReadBack(**file, *t), data[i]) << DTypeName(kAllDTypes[i]);
  }
  EXPECT_EQ((*file)->header().metadata.at("producer"), "moeshard");
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(path)), *w.FileBytes());
  // In memory: the same bytes.
  auto mem = w.Serialize();
  ASSERT_TRUE(mem.ok());
  EXPECT_EQ(mem->size(), fs::file_size(path));
}

TEST(SafetensorsWriterTest, WritesTheReferenceHeaderFormat) {
  SafetensorsWriter w;
  const std::vector<uint8_t> a = PatternBytes(2, 1), b = PatternBytes(4, 2);
  ASSERT_TRUE(w.Add("b", DType::kF16, {1}, AsBytes(a)).ok());
  ASSERT_TRUE(w.Add("a\"\n\xc3\xa9", DType::kF32, {}, AsBytes(b)).ok());
  w.SetMetadata({{"k", "v"}});
  auto header = w.HeaderText();
  ASSERT_TRUE(header.ok());
  // __metadata__ first, then tensors in insertion order; compact; JSON escapes; padded with
  // spaces to a multiple of 8.
  const std::string want =
      "{\"__metadata__\":{\"k\":\"v\"},\"b\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":"
      "[0,2]},\"a\\\"\\n\xc3\xa9\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[2,6]}}";
  ASSERT_EQ(header->substr(0, want.size()), want);
  EXPECT_EQ(header->size() % 8, 0u);
  EXPECT_LT(header->size() - want.size(), 8u);
  EXPECT_EQ(header->find_first_not_of(' ', want.size()), std::string::npos);
  auto bytes = w.Serialize();
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ((*bytes)[0], header->size());
  for (int i = 1; i < 8; ++i) EXPECT_EQ((*bytes)[static_cast<size_t>(i)], 0);
  auto parsed = SafetensorsFile::FromBytes("x", *bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_NE((*parsed)->Find("a\"\n\xc3\xa9"), nullptr);
}

TEST(SafetensorsWriterTest, StreamsFillCallbacksInChunks) {
  ScratchDir dir;
  SafetensorsWriter w;
  // 2 full chunks and a partial one.
  const int64_t n = 2 * kSafetensorsWriteChunkBytes + 1234;
  std::vector<int64_t> offsets;
  ASSERT_TRUE(
      w.AddWithFill("big", DType::kU8, {n}, [&](int64_t offset, std::span<std::byte> chunk) {
         offsets.push_back(offset);
         for (size_t i = 0; i < chunk.size(); ++i) {
           chunk[i] = static_cast<std::byte>((offset + static_cast<int64_t>(i)) % 253);
         }
         return Status::Ok();
       }).ok());
  const std::vector<uint8_t> small = PatternBytes(5, 3);
  ASSERT_TRUE(w.Add("small", DType::kI8, {5}, AsBytes(small)).ok());
  ASSERT_TRUE(w.Finish(dir / "s.safetensors").ok());
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, kSafetensorsWriteChunkBytes,
                                           2 * kSafetensorsWriteChunkBytes}));
  auto file = SafetensorsFile::Open(dir / "s.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const std::vector<uint8_t> big = ReadBack(**file, **(*file)->Get("big"));
  ASSERT_EQ(static_cast<int64_t>(big.size()), n);
  for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(big[static_cast<size_t>(i)], i % 253) << i;
  EXPECT_EQ(big.back(), (n - 1) % 253);
  EXPECT_EQ(ReadBack(**file, **(*file)->Get("small")), small);
}

TEST(SafetensorsWriterTest, FailedWriteLeavesNothingAndKeepsTheOldFile) {
  ScratchDir dir;
  const std::string path = dir / "model.safetensors";
  testing_util::WriteText(path, "old contents");
  SafetensorsWriter w;
  ASSERT_TRUE(w.AddWithFill("t", DType::kU8, {100}, [](int64_t, std::span<std::byte>) {
                 return DataLossError("generator exploded");
               }).ok());
  Status s = w.Finish(path);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("generator exploded"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'t'"), std::string::npos) << s.message();
  EXPECT_EQ(DirEntries(dir.path()), std::vector<std::string>{"model.safetensors"});
  std::ifstream f(path);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "old contents");
}

TEST(SafetensorsWriterTest, FailedWriteToANewPathLeavesNoFile) {
  ScratchDir dir;
  SafetensorsWriter w;
  ASSERT_TRUE(w.AddWithFill("t", DType::kU8, {1}, [](int64_t, std::span<std::byte>) {
                 return InternalError("boom");
               }).ok());
  EXPECT_FALSE(w.Finish(dir / "new.safetensors").ok());
  EXPECT_TRUE(DirEntries(dir.path()).empty());
}

TEST(SafetensorsWriterTest, ReplacesAnExistingFileAtomically) {
  ScratchDir dir;
  const std::string path = dir / "m.safetensors";
  testing_util::WriteText(path, "old");
  SafetensorsWriter w;
  const std::vector<uint8_t> d = PatternBytes(4, 9);
  ASSERT_TRUE(w.Add("x", DType::kU8, {4}, AsBytes(d)).ok());
  ASSERT_TRUE(w.Finish(path).ok());
  EXPECT_EQ(DirEntries(dir.path()), std::vector<std::string>{"m.safetensors"});
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(ReadBack(**f, **(*f)->Get("x")), d);
}

TEST(SafetensorsWriterTest, RejectsWhatTheReaderWouldReject) {
  SafetensorsWriter w;
  const std::vector<uint8_t> four(4);
  auto expect = [](const Status& s, const std::string& fragment) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << fragment;
    EXPECT_NE(s.message().find(fragment), std::string::npos) << s.message();
  };
  ASSERT_TRUE(w.Add("a", DType::kU8, {4}, AsBytes(four)).ok());
  expect(w.Add("a", DType::kU8, {4}, AsBytes(four)), "duplicate");
  expect(w.Add("__metadata__", DType::kU8, {4}, AsBytes(four)), "reserved");
  expect(w.Add("b", DType::kU8, {1, 1, 1, 1, 1, 1, 1, 1, 4}, AsBytes(four)),
         "at most 8 dimensions, got 9");
  expect(w.Add("c", DType::kU8, {-4}, AsBytes(four)), "dims in [0, 2^48]");
  expect(w.Add("c", DType::kU8, {int64_t{1} << 49}, AsBytes(four)), "dims in [0, 2^48]");
  expect(w.Add("d", DType::kF4, {3}, AsBytes(four)), "whole number of bytes, got 3 elements of F4");
  expect(w.Add("e", DType::kF32, {2}, AsBytes(four)), "expected 8 bytes of data, got 4");
  expect(w.Add("\xff", DType::kU8, {4}, AsBytes(four)), "UTF-8");
  expect(w.AddWithFill("f", DType::kU8, {4}, nullptr), "fill function");
  EXPECT_EQ(w.num_tensors(), 1);
  w.SetMetadata({{"k", "\xc0"}});
  expect(w.Serialize().status(), "UTF-8");
}

TEST(SafetensorsWriterTest, EmptyFileRoundTrips) {
  SafetensorsWriter w;
  auto bytes = w.Serialize();
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), 16u);  // "{}" padded to 8
  auto f = SafetensorsFile::FromBytes("empty", *bytes);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE((*f)->tensors().empty());
}

TEST(SafetensorsWriterTest, WriteFileAtomicallyReportsUnwritableDirectories) {
  Status s = WriteFileAtomically("/nonexistent-dir/x.json", "{}");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("/nonexistent-dir/x.json.tmp."), std::string::npos) << s.message();
}

}  // namespace
}  // namespace moeshard
