// One malformed file per validation rule of the safetensors header parser, plus the accepted
// edge cases (scalars, empty tensors, whitespace, out-of-order entries, every dtype).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "moeshard/weights/safetensors.h"
#include "weights/test_util.h"

namespace moeshard {
namespace {

using testing_util::RawSafetensors;

constexpr char kFile[] = "bad.safetensors";

Result<SafetensorsHeader> ParseBytes(const std::vector<uint8_t>& bytes) {
  return ParseSafetensorsHeader(bytes, static_cast<int64_t>(bytes.size()), kFile);
}

Result<SafetensorsHeader> Parse(const std::string& header, size_t data_bytes = 0) {
  return ParseBytes(RawSafetensors(header, std::vector<uint8_t>(data_bytes, 0)));
}

// Expects a kDataLoss error naming the file and containing every fragment.
void ExpectError(const Result<SafetensorsHeader>& r, std::initializer_list<std::string> fragments) {
  ASSERT_FALSE(r.ok()) << "expected an error containing '" << *fragments.begin() << "'";
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find(std::string("'") + kFile + "'"), std::string::npos) << m;
  for (const std::string& f : fragments)
    EXPECT_NE(m.find(f), std::string::npos) << "'" << f << "' in: " << m;
}

std::string Entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  int64_t begin, int64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}

TEST(SafetensorsHeaderTest, AcceptsAMinimalFile) {
  auto r = Parse("{" + Entry("w", "F32", "[2,3]", 0, 24) + "}", 24);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors.size(), 1u);
  const TensorInfo& t = r->tensors[0];
  EXPECT_EQ(t.name, "w");
  EXPECT_EQ(t.dtype, DType::kF32);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.data_begin, 0);
  EXPECT_EQ(t.data_end, 24);
  EXPECT_EQ(t.num_elements(), 6);
  EXPECT_EQ(r->data_offset, 8 + static_cast<int64_t>(r->header_bytes));
  EXPECT_EQ(r->data_bytes, 24);
  EXPECT_EQ(r->Find("w"), &r->tensors[0]);
  EXPECT_EQ(r->Find("v"), nullptr);
}

TEST(SafetensorsHeaderTest, Rule1FileShorterThanEightBytes) {
  for (size_t n : {0, 1, 7}) {
    ExpectError(ParseBytes(std::vector<uint8_t>(n, 0)), {"expected at least 8 bytes", "got a"});
  }
}

TEST(SafetensorsHeaderTest, Rule1HeaderLengthAboveLimit) {
  std::vector<uint8_t> bytes = RawSafetensors("{}", {});
  const uint64_t n = 100'000'001;
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  ExpectError(ParseBytes(bytes), {"at most 100000000", "got 100000001"});
  // The largest u64: must not wrap around when 8 is added.
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = 0xff;
  ExpectError(ParseBytes(bytes), {"at most 100000000", "18446744073709551615"});
}

TEST(SafetensorsHeaderTest, Rule1HeaderLongerThanFile) {
  std::vector<uint8_t> bytes = RawSafetensors("{}", {});
  bytes[0] = 3;  // claims 3 header bytes, file has 2
  ExpectError(ParseBytes(bytes), {"8 + 3 <= file size", "10-byte file"});
}

TEST(SafetensorsHeaderTest, Rule1PrefixShorterThanHeader) {
  std::vector<uint8_t> bytes = RawSafetensors("{}", {});
  auto r = ParseSafetensorsHeader(std::span(bytes).first(9), 10, kFile);
  ExpectError(r, {"expected the first 10 bytes", "got 9"});
}

TEST(SafetensorsHeaderTest, Rule2HeaderNotUtf8) {
  ExpectError(Parse("{\"w\xff\":{}}"), {"expected UTF-8", "0xff", "header byte 3"});
  ExpectError(Parse("{\"\xc0\xaf\":{}}"), {"expected UTF-8", "0xc0"});          // overlong '/'
  ExpectError(Parse("{\"\xed\xa0\x80\":{}}"), {"expected UTF-8", "0xed"});      // surrogate
  ExpectError(Parse("{\"\xf4\x90\x80\x80\":{}}"), {"expected UTF-8", "0xf4"});  // > U+10FFFF
}

TEST(SafetensorsHeaderTest, Rule2HeaderNotAnObject) {
  ExpectError(Parse("[]"), {"expected a JSON object starting with '{'", "got '['"});
  ExpectError(Parse("\xef\xbb\xbf{}"), {"expected a JSON object", "\\xef"});  // byte-order mark
  ExpectError(Parse("   "), {"got only whitespace"});
  ExpectError(Parse(""), {"got only whitespace"});
  ExpectError(Parse("{\"a\""), {"not valid JSON"});
  ExpectError(Parse("{} {}"), {"not valid JSON"});
  // NUL padding: nlohmann alone would stop at the first NUL and accept.
  ExpectError(Parse(std::string("{}\0\0\0\0\0\0", 8)), {"got a NUL byte at header byte 2"});
  ExpectError(Parse(std::string("{\0}", 3)), {"got a NUL byte at header byte 1"});
  ExpectError(Parse("{/*c*/}"), {"not valid JSON"});  // no comments
}

TEST(SafetensorsHeaderTest, Rule2WhitespaceAroundTheObjectIsAccepted) {
  auto r = Parse(" \n\t{" + Entry("w", "U8", "[4]", 0, 4) + "}  \r\n    ", 4);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors.size(), 1u);
}

TEST(SafetensorsHeaderTest, Rule2EntryShape) {
  ExpectError(Parse("{\"w\":[1]}"), {"tensor 'w'", "expected an object", "got an array"});
  ExpectError(Parse("{\"w\":3}"), {"tensor 'w'", "expected an object", "got the number 3"});
  ExpectError(Parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1),
              {"tensor 'w'", "expected a 'data_offsets' field, got none"});
  ExpectError(Parse("{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1),
              {"tensor 'w'", "expected a 'shape' field"});
  ExpectError(Parse("{\"w\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
              {"tensor 'w'", "expected a 'dtype' field"});
  ExpectError(Parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1),
              {"tensor 'w'", "expected only the fields dtype, shape, data_offsets", "got 'x'"});
}

TEST(SafetensorsHeaderTest, Rule2DType) {
  ExpectError(Parse("{" + Entry("w", "F17", "[1]", 0, 1) + "}", 1),
              {"tensor 'w'", "dtype: expected one of", "F8_E4M3", "got 'F17'"});
  ExpectError(Parse("{" + Entry("w", "bf16", "[1]", 0, 2) + "}", 2), {"got 'bf16'"});
  ExpectError(Parse("{\"w\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
              {"tensor 'w'", "dtype: expected a string", "got the number 5"});
}

TEST(SafetensorsHeaderTest, Rule2ShapeValues) {
  ExpectError(Parse("{" + Entry("w", "U8", "5", 0, 5) + "}", 5),
              {"tensor 'w'", "shape: expected an array of integers", "got the number 5"});
  ExpectError(Parse("{" + Entry("w", "U8", "[-1]", 0, 0) + "}"),
              {"tensor 'w'", "shape", "expected an integer in [0, 2^48]", "got -1"});
  ExpectError(Parse("{" + Entry("w", "U8", "[1.5]", 0, 0) + "}"),
              {"tensor 'w'", "shape", "got 1.5 (not an integer)"});
  ExpectError(Parse("{" + Entry("w", "U8", "[2.0]", 0, 2) + "}", 2), {"got 2.0 (not an integer)"});
  ExpectError(Parse("{" + Entry("w", "U8", "[1e3]", 0, 1000) + "}", 1000), {"not an integer"});
  ExpectError(Parse("{" + Entry("w", "U8", "[281474976710657]", 0, 0) + "}"),
              {"tensor 'w'", "got 281474976710657 (more than 2^48)"});
  ExpectError(Parse("{" + Entry("w", "U8", "[99999999999999999999999]", 0, 0) + "}"),
              {"tensor 'w'", "not an integer"});
  ExpectError(Parse("{" + Entry("w", "U8", "[\"4\"]", 0, 4) + "}", 4),
              {"tensor 'w'", "shape: expected a non-negative integer", "got a string"});
  ExpectError(Parse("{" + Entry("w", "U8", "[[1]]", 0, 1) + "}", 1),
              {"tensor 'w'", "shape: expected a non-negative integer", "got an array"});
  ExpectError(Parse("{" + Entry("w", "U8", "[null]", 0, 1) + "}", 1), {"got null"});
}

TEST(SafetensorsHeaderTest, Rule2RankAtMostEight) {
  ASSERT_TRUE(Parse("{" + Entry("w", "U8", "[1,1,1,1,1,1,1,2]", 0, 2) + "}", 2).ok());
  ExpectError(Parse("{" + Entry("w", "U8", "[1,1,1,1,1,1,1,1,2]", 0, 2) + "}", 2),
              {"tensor 'w'", "expected at most 8 dimensions"});
}

TEST(SafetensorsHeaderTest, Rule2DataOffsetsValues) {
  ExpectError(Parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1]}}", 1),
              {"tensor 'w'", "data_offsets: expected [begin, end], got 1 numbers"});
  ExpectError(Parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1),
              {"tensor 'w'", "got more than 2 numbers"});
  ExpectError(Parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":{}}}", 1),
              {"tensor 'w'", "data_offsets: expected [begin, end]", "got an object"});
  ExpectError(Parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[-1,-1]}}"),
              {"tensor 'w'", "data_offsets: expected an integer in [0, 2^48], got -1"});
  ExpectError(Parse("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0.0,0]}}"),
              {"tensor 'w'", "data_offsets", "not an integer"});
}

TEST(SafetensorsHeaderTest, DuplicateKeysAreRejected) {
  ExpectError(
      Parse("{" + Entry("w", "U8", "[1]", 0, 1) + "," + Entry("w", "U8", "[1]", 1, 2) + "}", 2),
      {"key 'w'", "expected unique keys, got it twice"});
  ExpectError(
      Parse("{\"w\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
      {"tensor 'w'", "field 'dtype': expected once, got it twice"});
  ExpectError(Parse("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}"),
              {"__metadata__ key 'a'", "expected unique keys"});
  ExpectError(Parse("{\"__metadata__\":{},\"__metadata__\":{}}"),
              {"key '__metadata__'", "expected unique keys"});
}

TEST(SafetensorsHeaderTest, MetadataIsStringToString) {
  auto ok = Parse("{\"__metadata__\":{\"format\":\"pt\",\"b\":\"\"}}");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->metadata.at("format"), "pt");
  EXPECT_EQ(ok->metadata.at("b"), "");
  EXPECT_TRUE(ok->tensors.empty());
  ExpectError(Parse("{\"__metadata__\":{\"a\":1}}"),
              {"__metadata__ 'a'", "expected a string value", "got the number 1"});
  ExpectError(Parse("{\"__metadata__\":{\"a\":{\"b\":\"c\"}}}"),
              {"__metadata__ 'a'", "got an object"});
  ExpectError(Parse("{\"__metadata__\":{\"a\":[\"c\"]}}"), {"__metadata__ 'a'", "got an array"});
  ExpectError(Parse("{\"__metadata__\":{\"a\":null}}"), {"__metadata__ 'a'", "got null"});
  ExpectError(Parse("{\"__metadata__\":\"x\"}"),
              {"'__metadata__': expected an object of strings", "got a string"});
}

TEST(SafetensorsHeaderTest, Rule3EndBeforeBegin) {
  ExpectError(Parse("{" + Entry("w", "U8", "[0]", 4, 0) + "}", 4),
              {"tensor 'w'", "expected end >= begin", "got [4, 0]"});
}

TEST(SafetensorsHeaderTest, Rule3FirstTensorStartsAtZero) {
  ExpectError(Parse("{" + Entry("w", "U8", "[4]", 2, 6) + "}", 6),
              {"tensor 'w'", "expected begin 0", "the first tensor starts the data buffer", "got 2",
               "a gap of 2 bytes"});
}

TEST(SafetensorsHeaderTest, Rule3GapBetweenTensors) {
  ExpectError(
      Parse("{" + Entry("a", "U8", "[4]", 0, 4) + "," + Entry("b", "U8", "[4]", 5, 9) + "}", 9),
      {"tensor 'b'", "expected begin 4", "where tensor 'a' ends", "got 5", "a gap of 1"});
}

TEST(SafetensorsHeaderTest, Rule3OverlappingTensors) {
  ExpectError(
      Parse("{" + Entry("a", "U8", "[4]", 0, 4) + "," + Entry("b", "U8", "[4]", 2, 6) + "}", 6),
      {"tensor 'b'", "expected begin 4", "got 2", "an overlap of 2"});
  // Two tensors claiming the same bytes.
  ExpectError(
      Parse("{" + Entry("a", "U8", "[4]", 0, 4) + "," + Entry("b", "U8", "[4]", 0, 4) + "}", 4),
      {"tensor 'b'", "expected begin 4", "an overlap of 4"});
}

TEST(SafetensorsHeaderTest, Rule4ElementCountOverflow) {
  ExpectError(Parse("{" + Entry("w", "U8", "[281474976710656,281474976710656]", 0, 0) + "}"),
              {"tensor 'w'", "element count that fits in 64 bits"});
}

TEST(SafetensorsHeaderTest, Rule4BitCountOverflow) {
  // 2^48 * 2^14 = 2^62 elements fit; times 64 bits does not.
  ExpectError(Parse("{" + Entry("w", "F64", "[281474976710656,16384]", 0, 0) + "}"),
              {"tensor 'w'", "bit count that fits in 64 bits"});
}

TEST(SafetensorsHeaderTest, Rule4WholeBytes) {
  ExpectError(Parse("{" + Entry("w", "F4", "[3]", 0, 2) + "}", 2),
              {"tensor 'w'", "expected a whole number of bytes", "3 elements x 4 bits = 12 bits"});
  ExpectError(Parse("{" + Entry("w", "F6_E2M3", "[2]", 0, 2) + "}", 2), {"tensor 'w'", "12 bits"});
  ASSERT_TRUE(Parse("{" + Entry("w", "F6_E3M2", "[4]", 0, 3) + "}", 3).ok());
  ASSERT_TRUE(Parse("{" + Entry("w", "F4", "[2,3]", 0, 3) + "}", 3).ok());
}

TEST(SafetensorsHeaderTest, Rule4SizeMatchesOffsets) {
  ExpectError(Parse("{" + Entry("w", "BF16", "[2,2]", 0, 6) + "}", 6),
              {"tensor 'w'", "shape [2, 2] BF16", "expected data_offsets to span 8 bytes",
               "got [0, 6] = 6 bytes"});
}

TEST(SafetensorsHeaderTest, Rule5LastTensorEndsAtEndOfFile) {
  ExpectError(Parse("{" + Entry("w", "U8", "[4]", 0, 4) + "}", 5),
              {"expected a data buffer of 4 bytes", "the end of tensor 'w'", "got 5 bytes",
               "trailing bytes"});
  ExpectError(Parse("{" + Entry("w", "U8", "[4]", 0, 4) + "}", 3),
              {"expected a data buffer of 4 bytes", "got 3 bytes", "truncated"});
  ExpectError(Parse("{}", 1), {"expected a data buffer of 0 bytes", "no tensors"});
}

TEST(SafetensorsHeaderTest, NumbersOutsideArraysAreRejected) {
  ExpectError(Parse("{\"w\":true}"), {"tensor 'w'", "got a boolean"});
  ExpectError(Parse("{\"w\":null}"), {"tensor 'w'", "got null"});
}

TEST(SafetensorsHeaderTest, ErrorsQuoteHostileNamesSafely) {
  auto r = Parse("{\"a\\u0007b\\nc\":1}");
  ExpectError(r, {"tensor 'a\\x07b\\x0ac'"});
}

TEST(SafetensorsHeaderTest, AcceptsScalarsEmptyTensorsAndAnyOrder) {
  // Header order differs from data order; zero-size tensors sit anywhere.
  const std::string h = "{" + Entry("c", "F32", "[]", 6, 10) + "," +
                        Entry("a", "BF16", "[3]", 0, 6) + "," + Entry("z", "F32", "[0,5]", 6, 6) +
                        "," + Entry("e", "I64", "[2,0]", 10, 10) + "}";
  auto r = Parse(h, 10);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors.size(), 4u);
  EXPECT_EQ(r->tensors[0].name, "a");
  EXPECT_EQ(r->tensors[1].name, "z");
  EXPECT_EQ(r->tensors[2].name, "c");
  EXPECT_EQ(r->tensors[2].num_elements(), 1);
  EXPECT_EQ(r->tensors[3].name, "e");
  EXPECT_EQ(r->tensors[3].num_elements(), 0);
}

TEST(SafetensorsHeaderTest, AcceptsAnEmptyFile) {
  auto r = Parse("{}");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->tensors.empty());
  EXPECT_EQ(r->data_bytes, 0);
}

TEST(SafetensorsHeaderTest, EveryDTypeNameParsesWithItsSize) {
  for (DType d : kAllDTypes) {
    // 8 elements: a whole number of bytes for every width (4, 6, 8, ... bits).
    const int64_t bytes = DTypeBits(d);  // 8 elements * bits / 8
    auto r = Parse("{" + Entry("t", std::string(DTypeName(d)), "[2,4]", 0, bytes) + "}",
                   static_cast<size_t>(bytes));
    ASSERT_TRUE(r.ok()) << DTypeName(d) << ": " << r.status().ToString();
    EXPECT_EQ(r->tensors[0].dtype, d);
    EXPECT_EQ(r->tensors[0].num_bytes(), bytes);
  }
}

TEST(SafetensorsHeaderTest, PrefixMayBeTheHeaderOnly) {
  // Planning reads only 8 + N bytes of a file that is much larger.
  const std::string h = "{" + Entry("w", "F32", "[1000,1000]", 0, 4'000'000) + "}";
  std::vector<uint8_t> prefix = RawSafetensors(h, {});
  auto r = ParseSafetensorsHeader(prefix, static_cast<int64_t>(prefix.size()) + 4'000'000, kFile);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->data_bytes, 4'000'000);
  EXPECT_EQ(r->file_size(), static_cast<int64_t>(prefix.size()) + 4'000'000);
}

}  // namespace
}  // namespace moeshard
