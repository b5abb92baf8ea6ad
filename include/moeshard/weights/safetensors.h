// safetensors: a strict reader for the Hugging Face safetensors format.
//
// File layout (all integers little-endian, nothing aligned):
//
//   0        8                      8+N                                          file size
//   +--------+----------------------+---------------------------------------------+
//   | u64 N  | N bytes UTF-8 JSON   | data buffer: tensors back to back, no gaps  |
//   +--------+----------------------+---------------------------------------------+
//
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end)} (offsets
// relative to the data buffer) plus an optional "__metadata__" string->string map.
// ParseSafetensorsHeader enforces every rule of the reference implementation
// (huggingface/safetensors) and more (see ../shared/reference/ecosystem.md):
//   1. file >= 8 bytes; N <= 100,000,000; 8 + N <= file size (no overflow);
//   2. the header is UTF-8 JSON: an object (JSON whitespace allowed around it) whose values are
//      tensor entries with exactly dtype (a known name), shape (<= 8 non-negative integers) and
//      data_offsets ([begin, end] integers, end >= begin), or "__metadata__" (string->string);
//   3. sorted by offsets, the first tensor begins at 0 and each begins where the previous ends;
//   4. elements x dtype bits (overflow-checked) is a whole number of bytes equal to end - begin;
//   5. the last tensor ends exactly at the end of the file;
//   plus: duplicate keys at any level, negative, fractional or > 2^48 numbers are rejected.
// Every count read from a file is treated as hostile until checked.
//
// SafetensorsFile serves a validated file's tensors from one of three sources: a read-only
// mmap, pread on a file descriptor, or an in-memory byte buffer (the in-memory fake for loader
// tests). A header-only open reads just the first 8 + N bytes, so planning can size a
// multi-terabyte checkpoint without touching its data. Reads copy with memcpy, so tensor data
// need not be aligned; each read adds the bytes it delivers to a per-file counter, which lets a
// test assert that a rank reads its share of a checkpoint and no more.
//
// Thread safety: the free functions are pure. A SafetensorsFile is immutable after opening
// except for its bytes-read counter, which is atomic: any number of threads may read from one
// file at the same time. If another process truncates a file while it is mapped, reads of the
// vanished pages raise SIGBUS (as with any mmap reader); use SafetensorsAccess::kPread where
// that matters.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moeshard/base/dtype.h"
#include "moeshard/base/status.h"

namespace moeshard {

// Limits of the format (rule 1) and of this reader (ranks, numbers).
inline constexpr int64_t kSafetensorsMaxHeaderBytes = 100'000'000;
inline constexpr int kSafetensorsMaxRank = 8;
inline constexpr int64_t kSafetensorsMaxNumber = int64_t{1} << 48;
inline constexpr std::string_view kSafetensorsMetadataKey = "__metadata__";

// One tensor of a safetensors file.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;  // empty for a scalar
  int64_t data_begin = 0;      // byte offset in the data buffer, inclusive
  int64_t data_end = 0;        // byte offset in the data buffer, exclusive

  int64_t num_bytes() const { return data_end - data_begin; }
  // Product of the dims (1 for a scalar). Validated not to overflow when parsed.
  int64_t num_elements() const;

  friend bool operator==(const TensorInfo&, const TensorInfo&) = default;
};

// A validated header.
struct SafetensorsHeader {
  std::string file_name;     // as given to the parser; used in error messages
  int64_t header_bytes = 0;  // N
  int64_t data_offset = 0;   // 8 + N: where the data buffer starts in the file
  int64_t data_bytes = 0;    // file size - 8 - N
  // Sorted by (data_begin, data_end, name): the order of the data buffer.
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
  std::map<std::string, int64_t, std::less<>> tensor_idx_by_name;  // name -> index in tensors

  int64_t file_size() const { return data_offset + data_bytes; }
  // nullptr when there is no such tensor.
  const TensorInfo* Find(std::string_view name) const;
};

// Rule 1: decodes the 8-byte length prefix of a file of `file_size` bytes and returns N.
// `prefix` holds at least the first 8 bytes of the file when the file has that many.
Result<int64_t> ParseSafetensorsHeaderSize(std::span<const uint8_t> prefix, int64_t file_size,
                                           std::string_view file_name);

// Validates the header of a file of `file_size` bytes whose first bytes are `prefix` (at least
// the first 8 + N bytes, possibly the whole file). Pure: the fuzz entry point. Errors are
// kDataLoss and name the file, the tensor, what was expected and what was found.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::span<const uint8_t> prefix, int64_t file_size,
                                                 std::string_view file_name);

// Reads and validates only the header of the file at `path` (two preads and an fstat).
Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);

// Where a SafetensorsFile gets tensor data from.
enum class SafetensorsAccess {
  kMmap,        // map the whole file read-only (default)
  kPread,       // keep the descriptor open and pread each requested range
  kHeaderOnly,  // read the header only; data reads fail with kFailedPrecondition
};

// A 2-D byte window of a tensor, for row slices and strided column slices:
//
//   tensor bytes [base_offset, base_offset + num_rows * row_bytes) viewed as [num_rows, row_bytes]
//
//            col_begin     col_end
//   row_begin  +-------------+        copied row by row to dst; destination row i starts at
//              |   window    |        dst[i * dst_row_stride] and padding bytes between rows
//   row_end    +-------------+        (dst_row_stride > col_end - col_begin) are left untouched.
//
// base_offset selects e.g. one expert of a fused [num_experts, rows, cols] tensor. Columns are
// in bytes: for sub-byte dtypes the caller converts element columns (DTypeBytes).
struct Slice2D {
  int64_t base_offset = 0;     // bytes into the tensor where row 0 of the view starts
  int64_t row_bytes = 0;       // bytes per row of the view (> 0)
  int64_t row_begin = 0;       // first row copied
  int64_t row_end = 0;         // one past the last row copied
  int64_t col_begin = 0;       // first byte of each row copied
  int64_t col_end = 0;         // one past the last byte of each row copied
  int64_t dst_row_stride = 0;  // bytes between destination rows; 0 means col_end - col_begin

  // Bytes a destination buffer must hold: (rows - 1) * stride + cols, or 0 for an empty window.
  int64_t DstBytesNeeded() const;
};

class SafetensorsFile {
 public:
  // Opens and validates the file at `path` (read-only).
  static Result<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path, SafetensorsAccess access = SafetensorsAccess::kMmap);
  // An in-memory file (the fake for loader tests). `name` appears in error messages.
  static Result<std::unique_ptr<SafetensorsFile>> FromBytes(const std::string& name,
                                                            std::vector<uint8_t> bytes);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return header_.file_name; }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  SafetensorsAccess access() const { return access_; }
  bool has_data() const { return access_ != SafetensorsAccess::kHeaderOnly; }

  // nullptr when absent.
  const TensorInfo* Find(std::string_view name) const { return header_.Find(name); }
  // kNotFound naming the file when absent.
  Result<const TensorInfo*> Get(std::string_view name) const;

  // The read functions take a TensorInfo of this file (REQUIRES: from tensors()/Find/Get).
  // Out-of-range requests return kOutOfRange naming the tensor and the numbers.

  // Copies the whole tensor. REQUIRES-ish: dst.size() == tensor.num_bytes() (else kOutOfRange).
  Status ReadTensor(const TensorInfo& tensor, std::span<std::byte> dst) const;
  // Copies tensor bytes [offset, offset + dst.size()).
  Status ReadRange(const TensorInfo& tensor, int64_t offset, std::span<std::byte> dst) const;
  // Copies a 2-D window (see Slice2D). dst.size() must be >= slice.DstBytesNeeded().
  Status ReadSlice2D(const TensorInfo& tensor, const Slice2D& slice,
                     std::span<std::byte> dst) const;

  // Tensor data bytes delivered by the reads above since opening or the last reset.
  int64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }
  void ResetBytesRead() { bytes_read_.store(0, std::memory_order_relaxed); }

  class Source;  // where the bytes come from (mmap, pread, memory); private to the library

 private:
  SafetensorsFile(SafetensorsHeader header, SafetensorsAccess access,
                  std::unique_ptr<Source> source);
  // Reads file bytes [data_offset + pos, + dst.size()) and counts them.
  Status ReadData(const TensorInfo& tensor, int64_t pos, std::span<std::byte> dst) const;
  void CheckOwns(const TensorInfo& tensor) const;

  SafetensorsHeader header_;
  SafetensorsAccess access_;
  std::unique_ptr<Source> source_;
  mutable std::atomic<int64_t> bytes_read_{0};
};

}  // namespace moeshard
