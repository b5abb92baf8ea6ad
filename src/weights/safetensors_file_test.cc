// SafetensorsFile: whole-tensor, range and 2-D slice reads from mmap, pread and memory, the
// bytes-read counter, header-only opens and unaligned data.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cstring>
#include <thread>

#include "moeshard/weights/safetensors.h"
#include "moeshard/weights/safetensors_writer.h"
#include "weights/test_util.h"

namespace moeshard {
namespace {

using testing_util::AsBytes;
using testing_util::PatternBytes;
using testing_util::RawSafetensors;
using testing_util::ScratchDir;

// A file with a 3-byte tensor first so the F32 one after it is misaligned in memory.
struct Fixture {
  std::vector<uint8_t> odd = PatternBytes(3, 1);
  std::vector<uint8_t> mat = PatternBytes(6 * 10 * 2, 2);     // [6, 10] BF16: 20-byte rows
  std::vector<uint8_t> experts = PatternBytes(4 * 3 * 8, 3);  // [4, 3, 8] U8
  std::vector<uint8_t> Serialize() const {
    SafetensorsWriter w;
    EXPECT_TRUE(w.Add("odd", DType::kU8, {3}, AsBytes(odd)).ok());
    EXPECT_TRUE(w.Add("mat", DType::kBF16, {6, 10}, AsBytes(mat)).ok());
    EXPECT_TRUE(w.Add("experts", DType::kU8, {4, 3, 8}, AsBytes(experts)).ok());
    return *w.Serialize();
  }
};

std::vector<std::byte> Bytes(size_t n, uint8_t fill) {
  return std::vector<std::byte>(n, static_cast<std::byte>(fill));
}

std::vector<uint8_t> ToU8(std::span<const std::byte> b) {
  const auto* p = reinterpret_cast<const uint8_t*>(b.data());
  return std::vector<uint8_t>(p, p + b.size());
}

class SafetensorsFileTest : public ::testing::TestWithParam<SafetensorsAccess> {
 protected:
  void SetUp() override {
    path_ = dir_ / "f.safetensors";
    testing_util::WriteBytes(path_, fx_.Serialize());
    auto f = SafetensorsFile::Open(path_, GetParam());
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    file_ = std::move(f).value();
  }
  ScratchDir dir_;
  std::string path_;
  Fixture fx_;
  std::unique_ptr<SafetensorsFile> file_;
};

TEST_P(SafetensorsFileTest, ReadsWholeTensorsAndCountsBytes) {
  EXPECT_EQ(file_->path(), path_);
  EXPECT_EQ(file_->bytes_read(), 0);
  for (auto [name, want] : {std::pair{"odd", &fx_.odd}, std::pair{"mat", &fx_.mat},
                            std::pair{"experts", &fx_.experts}}) {
    const TensorInfo* t = *file_->Get(name);
    std::vector<std::byte> got = Bytes(want->size(), 0);
    ASSERT_TRUE(file_->ReadTensor(*t, got).ok());
    EXPECT_EQ(ToU8(got), *want) << name;
  }
  EXPECT_EQ(file_->bytes_read(), static_cast<int64_t>(3 + 120 + 96));
  file_->ResetBytesRead();
  EXPECT_EQ(file_->bytes_read(), 0);
}

TEST_P(SafetensorsFileTest, ReadsRanges) {
  const TensorInfo* t = *file_->Get("experts");
  // Expert 2 of [4, 3, 8]: 24 contiguous bytes at 48.
  std::vector<std::byte> got = Bytes(24, 0);
  ASSERT_TRUE(file_->ReadRange(*t, 48, got).ok());
  EXPECT_EQ(ToU8(got), std::vector<uint8_t>(fx_.experts.begin() + 48, fx_.experts.begin() + 72));
  EXPECT_EQ(file_->bytes_read(), 24);

  std::vector<std::byte> too_long = Bytes(25, 0);
  Status s = file_->ReadRange(*t, 72, too_long);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("'experts'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("within [0, 96), got offset 72 + 25 bytes"), std::string::npos)
      << s.message();
  EXPECT_EQ(file_->ReadRange(*t, -1, got).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(file_->ReadRange(*t, INT64_MAX, got).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(file_->bytes_read(), 24);  // failed reads count nothing
}

TEST_P(SafetensorsFileTest, ReadsRowSlices) {
  const TensorInfo* t = *file_->Get("mat");
  Slice2D s{.row_bytes = 20, .row_begin = 2, .row_end = 5, .col_begin = 0, .col_end = 20};
  std::vector<std::byte> got = Bytes(static_cast<size_t>(s.DstBytesNeeded()), 0);
  ASSERT_EQ(got.size(), 60u);
  ASSERT_TRUE(file_->ReadSlice2D(*t, s, got).ok());
  EXPECT_EQ(ToU8(got), std::vector<uint8_t>(fx_.mat.begin() + 40, fx_.mat.begin() + 100));
  EXPECT_EQ(file_->bytes_read(), 60);
}

TEST_P(SafetensorsFileTest, ReadsStridedColumnSlicesIntoPaddedRows) {
  const TensorInfo* t = *file_->Get("mat");
  // Columns 3..7 (elements) = bytes [6, 14) of every row, into rows padded to 12 bytes.
  Slice2D s{.row_bytes = 20,
            .row_begin = 0,
            .row_end = 6,
            .col_begin = 6,
            .col_end = 14,
            .dst_row_stride = 12};
  EXPECT_EQ(s.DstBytesNeeded(), 5 * 12 + 8);
  std::vector<std::byte> got = Bytes(6 * 12, 0xee);
  ASSERT_TRUE(file_->ReadSlice2D(*t, s, got).ok());
  for (int r = 0; r < 6; ++r) {
    for (int c = 0; c < 12; ++c) {
      const uint8_t v =
          static_cast<uint8_t>(got[static_cast<size_t>(r) * 12 + static_cast<size_t>(c)]);
      if (c < 8) {
        EXPECT_EQ(v, fx_.mat[static_cast<size_t>(r * 20 + 6 + c)]) << r << "," << c;
      } else {
        EXPECT_EQ(v, 0xee) << "padding must be left untouched at " << r << "," << c;
      }
    }
  }
  EXPECT_EQ(file_->bytes_read(), 6 * 8);  // the slice and nothing else
}

TEST_P(SafetensorsFileTest, ReadsSlicesOfOneExpertOfAFusedTensor) {
  const TensorInfo* t = *file_->Get("experts");
  // Expert 3 of [4, 3, 8], rows 1..3, byte columns 2..5.
  Slice2D s{.base_offset = 3 * 24,
            .row_bytes = 8,
            .row_begin = 1,
            .row_end = 3,
            .col_begin = 2,
            .col_end = 5};
  std::vector<std::byte> got = Bytes(6, 0);
  ASSERT_TRUE(file_->ReadSlice2D(*t, s, got).ok());
  std::vector<uint8_t> want;
  for (int r = 1; r < 3; ++r) {
    for (int c = 2; c < 5; ++c)
      want.push_back(fx_.experts[72 + static_cast<size_t>(r) * 8 + static_cast<size_t>(c)]);
  }
  EXPECT_EQ(ToU8(got), want);
  EXPECT_EQ(file_->bytes_read(), 6);
}

TEST_P(SafetensorsFileTest, RejectsSlicesOutsideTheTensor) {
  const TensorInfo* t = *file_->Get("mat");
  std::vector<std::byte> big = Bytes(1000, 0);
  auto expect = [&](Slice2D s, const std::string& fragment) {
    Status st = file_->ReadSlice2D(*t, s, big);
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << fragment;
    EXPECT_NE(st.message().find(fragment), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("'mat'"), std::string::npos) << st.message();
  };
  expect({.row_bytes = 20, .row_begin = 0, .row_end = 7, .col_begin = 0, .col_end = 20},
         "end within the tensor's 120 bytes");
  expect({.base_offset = 20,
          .row_bytes = 20,
          .row_begin = 0,
          .row_end = 6,
          .col_begin = 0,
          .col_end = 20},
         "end within the tensor");
  expect({.row_bytes = 20, .row_begin = 0, .row_end = 1, .col_begin = 0, .col_end = 21},
         "columns within the row");
  expect({.row_bytes = 20, .row_begin = 3, .row_end = 2, .col_begin = 0, .col_end = 1},
         "0 <= begin <= end");
  expect({.row_bytes = 0, .row_begin = 0, .row_end = 0, .col_begin = 0, .col_end = 0},
         "positive row size");
  expect({.row_bytes = 20,
          .row_begin = 0,
          .row_end = 2,
          .col_begin = 0,
          .col_end = 8,
          .dst_row_stride = 4},
         "row stride >= 8 bytes, got 4");
  expect({.row_bytes = INT64_MAX / 2, .row_begin = 0, .row_end = 3, .col_begin = 0, .col_end = 1},
         "end within the tensor");
  std::vector<std::byte> small = Bytes(59, 0);
  Status st = file_->ReadSlice2D(
      *t, {.row_bytes = 20, .row_begin = 2, .row_end = 5, .col_begin = 0, .col_end = 20}, small);
  EXPECT_NE(st.message().find("at least 60 bytes, got 59"), std::string::npos) << st.message();
  EXPECT_EQ(file_->bytes_read(), 0);
}

TEST_P(SafetensorsFileTest, ReadsFromManyThreads) {
  const TensorInfo* t = *file_->Get("mat");
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 100; ++k) {
        std::vector<std::byte> got = Bytes(120, 0);
        if (!file_->ReadTensor(*t, got).ok() || ToU8(got) != fx_.mat) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(file_->bytes_read(), 4 * 100 * 120);
}

INSTANTIATE_TEST_SUITE_P(Access, SafetensorsFileTest,
                         ::testing::Values(SafetensorsAccess::kMmap, SafetensorsAccess::kPread),
                         [](const auto& info) {
                           return info.param == SafetensorsAccess::kMmap ? "Mmap" : "Pread";
                         });

TEST(SafetensorsFileOpenTest, InMemoryFileMatchesTheFileOnDisk) {
  Fixture fx;
  auto mem = SafetensorsFile::FromBytes("memory.safetensors", fx.Serialize());
  ASSERT_TRUE(mem.ok()) << mem.status().ToString();
  EXPECT_EQ((*mem)->path(), "memory.safetensors");
  const TensorInfo* t = *(*mem)->Get("mat");
  std::vector<std::byte> got = Bytes(120, 0);
  ASSERT_TRUE((*mem)->ReadTensor(*t, got).ok());
  EXPECT_EQ(ToU8(got), fx.mat);
  EXPECT_EQ((*mem)->bytes_read(), 120);
  auto missing = (*mem)->Get("nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("'nope'"), std::string::npos);
  EXPECT_NE(missing.status().message().find("'memory.safetensors'"), std::string::npos);
}

TEST(SafetensorsFileOpenTest, InMemoryFileRejectsMalformedBytes) {
  auto r = SafetensorsFile::FromBytes("mem", RawSafetensors("{}", {1}));
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("'mem'"), std::string::npos);
}

TEST(SafetensorsFileOpenTest, ReadsUnalignedTensorData) {
  // No header padding and a 1-byte tensor first: the F32/F64 data sit at odd file offsets.
  const std::vector<uint8_t> f32 = PatternBytes(12, 4);
  const std::vector<uint8_t> f64 = PatternBytes(16, 5);
  std::vector<uint8_t> data = {0x42};
  data.insert(data.end(), f32.begin(), f32.end());
  data.insert(data.end(), f64.begin(), f64.end());
  const std::string h =
      "{\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
      "\"f\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[1,13]},"
      "\"d\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[13,29]}}";
  ASSERT_NE((8 + h.size() + 1) % 4, 0u);
  auto file = SafetensorsFile::FromBytes("unaligned", RawSafetensors(h, data));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  float floats[3];
  ASSERT_TRUE(
      (*file)->ReadTensor(**(*file)->Get("f"), std::as_writable_bytes(std::span(floats))).ok());
  float want[3];
  std::memcpy(want, f32.data(), 12);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(std::bit_cast<uint32_t>(floats[i]), std::bit_cast<uint32_t>(want[i]));
  // An unaligned destination works too.
  std::vector<std::byte> dst = Bytes(17, 0);
  ASSERT_TRUE((*file)->ReadTensor(**(*file)->Get("d"), std::span(dst).subspan(1)).ok());
  EXPECT_EQ(ToU8(std::span(dst).subspan(1)), f64);
}

TEST(SafetensorsFileOpenTest, HeaderOnlyOpenReadsNoData) {
  ScratchDir dir;
  Fixture fx;
  testing_util::WriteBytes(dir / "f.safetensors", fx.Serialize());
  auto file = SafetensorsFile::Open(dir / "f.safetensors", SafetensorsAccess::kHeaderOnly);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_FALSE((*file)->has_data());
  EXPECT_EQ((*file)->tensors().size(), 3u);
  std::vector<std::byte> got = Bytes(3, 0);
  Status s = (*file)->ReadTensor(**(*file)->Get("odd"), got);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("header-only"), std::string::npos) << s.message();
}

TEST(SafetensorsFileOpenTest, SizesAHugeSparseFileFromItsHeaderAlone) {
  // A 1 TiB tensor: a sparse file, so only the header occupies disk. Sizing it must read only
  // the header (a full read would take hours).
  ScratchDir dir;
  const int64_t tib = int64_t{1} << 40;
  const std::string h = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[549755813888],\"data_offsets\":[0," +
                        std::to_string(tib) + "]}}";
  const std::string path = dir / "huge.safetensors";
  testing_util::WriteBytes(path, RawSafetensors(h, {}));
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  if (::ftruncate(fd, static_cast<off_t>(8 + h.size()) + tib) != 0) {
    ::close(fd);
    GTEST_FAIL() << "the scratch filesystem cannot hold a 1 TiB sparse file";
  }
  ::close(fd);
  auto header = ReadSafetensorsHeader(path);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(header->tensors[0].num_bytes(), tib);
  auto file = SafetensorsFile::Open(path, SafetensorsAccess::kPread);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  // The last row of a [2^20, 2^19] BF16 view: sparse zeros, read with one pread.
  std::vector<std::byte> row = Bytes(1 << 20, 0xff);
  ASSERT_TRUE((*file)->ReadRange((*file)->tensors()[0], tib - (1 << 20), row).ok());
  EXPECT_EQ(row, Bytes(1 << 20, 0));
}

TEST(SafetensorsFileOpenTest, ReportsMissingAndNonRegularFiles) {
  ScratchDir dir;
  auto missing = SafetensorsFile::Open(dir / "nope.safetensors");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.safetensors"), std::string::npos);
  auto directory = SafetensorsFile::Open(dir.path().string());
  EXPECT_EQ(directory.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(directory.status().message().find("expected a regular file"), std::string::npos);
  auto header = ReadSafetensorsHeader(dir / "nope.safetensors");
  EXPECT_EQ(header.status().code(), StatusCode::kNotFound);
}

TEST(SafetensorsFileOpenTest, PreadReportsAFileTruncatedAfterOpening) {
  ScratchDir dir;
  Fixture fx;
  const std::string path = dir / "f.safetensors";
  const std::vector<uint8_t> bytes = fx.Serialize();
  testing_util::WriteBytes(path, bytes);
  auto file = SafetensorsFile::Open(path, SafetensorsAccess::kPread);
  ASSERT_TRUE(file.ok());
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(bytes.size() - 10)), 0);
  std::vector<std::byte> got = Bytes(96, 0);
  Status s = (*file)->ReadTensor(**(*file)->Get("experts"), got);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
}

TEST(SafetensorsFileOpenTest, MalformedFileOnDiskNamesThePath) {
  ScratchDir dir;
  const std::string path = dir / "bad.safetensors";
  testing_util::WriteBytes(path, RawSafetensors("{\"w\":{}}", {}));
  for (auto access :
       {SafetensorsAccess::kMmap, SafetensorsAccess::kPread, SafetensorsAccess::kHeaderOnly}) {
    auto r = SafetensorsFile::Open(path, access);
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("tensor 'w'"), std::string::npos);
  }
}

}  // namespace
}  // namespace moeshard
