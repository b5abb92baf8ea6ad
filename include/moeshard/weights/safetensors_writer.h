// Writing safetensors files and other outputs atomically.
//
// SafetensorsWriter streams a file the reference implementation (huggingface/safetensors)
// accepts: the compact JSON header ("__metadata__" first, then the tensors in the order they
// were added) padded with spaces to a multiple of 8 bytes, then the tensors back to back in the
// same order. Tensors are added either as a pointer to their bytes (not copied; must stay valid
// until Finish) or as a fill callback that produces the bytes chunk by chunk, so a large file
// never needs to exist in memory twice. Everything the reader would reject (duplicate names, an
// unknown dtype, a rank above 8, dims above 2^48, a partial byte) is rejected at Add time.
//
// Finish writes to "<path>.tmp.<pid>", fsyncs, and renames over `path`: an interrupted or
// failed write leaves nothing at `path` (a crash may leave the temporary file behind, which is
// removed on failures the process survives).
//
// Thread safety: a writer is used from one thread. Fill callbacks run on the thread that calls
// Finish, in the order the tensors were added.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "moeshard/base/dtype.h"
#include "moeshard/base/status.h"

namespace moeshard {

// Produces tensor bytes [offset, offset + chunk.size()) into `chunk`. Chunks arrive in order,
// cover the tensor exactly once, and (except the last) are kSafetensorsWriteChunkBytes long.
using TensorFillFn = std::function<Status(int64_t offset, std::span<std::byte> chunk)>;
// 8 MiB: large enough that write(2) overhead vanishes, small enough to sit in L2/L3-ish memory
// without mattering next to the tensors themselves.
inline constexpr int64_t kSafetensorsWriteChunkBytes = int64_t{8} << 20;

class SafetensorsWriter {
 public:
  SafetensorsWriter() = default;

  // Replaces the "__metadata__" map (omitted from the header when empty).
  void SetMetadata(std::map<std::string, std::string> metadata) { metadata_ = std::move(metadata); }

  // Adds a tensor whose bytes are `data` (size must equal the shape's byte count).
  // The bytes are not copied: they must stay valid until Finish/Serialize returns.
  Status Add(std::string name, DType dtype, std::vector<int64_t> shape,
             std::span<const std::byte> data);
  // Adds a tensor whose bytes `fill` produces when the file is written.
  Status AddWithFill(std::string name, DType dtype, std::vector<int64_t> shape, TensorFillFn fill);

  int num_tensors() const { return static_cast<int>(tensors_.size()); }
  // Bytes of the whole file: 8 + padded header + data.
  Result<int64_t> FileBytes() const;

  // Writes the file atomically (temporary name, fsync, rename).
  Status Finish(const std::string& path) const;
  // The whole file in memory (for tests and the in-memory SafetensorsFile).
  Result<std::vector<uint8_t>> Serialize() const;

  // The padded header text (without the 8-byte length).
  Result<std::string> HeaderText() const;

 private:
  struct Pending {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    int64_t num_bytes;
    std::span<const std::byte> data;
    TensorFillFn fill;
  };
  Status Validate(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                  int64_t* num_bytes) const;
  // Streams the whole file to `sink`.
  Status Emit(const std::function<Status(std::span<const std::byte>)>& sink) const;

  std::map<std::string, std::string> metadata_;
  std::vector<Pending> tensors_;
  std::map<std::string, int, std::less<>> names_;
};

// Writes `bytes` to `path` atomically: "<path>.tmp.<pid>", fsync, rename. `producer` is called
// with a sink that appends bytes to the temporary file; on any error the temporary file is
// removed and `path` is untouched.
Status WriteFileAtomically(
    const std::string& path,
    const std::function<Status(const std::function<Status(std::span<const std::byte>)>& sink)>&
        producer);
// Convenience: a whole string.
Status WriteFileAtomically(const std::string& path, std::string_view contents);

}  // namespace moeshard
