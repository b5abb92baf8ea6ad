// SafetensorsFile: serves the bytes of a validated safetensors file from mmap, pread or memory.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/check.h"
#include "moeshard/base/math.h"
#include "moeshard/weights/safetensors.h"
#include "weights/weights_internal.h"

namespace moeshard {

using weights_internal::Printable;

// Reads file bytes [offset, offset + dst.size()). The caller has checked the range lies in the
// file as it was validated.
class SafetensorsFile::Source {
 public:
  virtual ~Source() = default;
  virtual Status Read(int64_t offset, std::span<std::byte> dst) const = 0;
};

namespace {

class MemorySource final : public SafetensorsFile::Source {
 public:
  explicit MemorySource(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
  Status Read(int64_t offset, std::span<std::byte> dst) const override {
    if (!dst.empty()) std::memcpy(dst.data(), bytes_.data() + offset, dst.size());
    return Status::Ok();
  }
  std::span<const uint8_t> bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class MmapSource final : public SafetensorsFile::Source {
 public:
  MmapSource(const uint8_t* base, size_t size) : base_(base), size_(size) {}
  ~MmapSource() override { ::munmap(const_cast<uint8_t*>(base_), size_); }
  Status Read(int64_t offset, std::span<std::byte> dst) const override {
    if (!dst.empty()) std::memcpy(dst.data(), base_ + offset, dst.size());
    return Status::Ok();
  }

 private:
  const uint8_t* base_;
  size_t size_;
};

class PreadSource final : public SafetensorsFile::Source {
 public:
  PreadSource(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PreadSource() override { ::close(fd_); }
  Status Read(int64_t offset, std::span<std::byte> dst) const override {
    return weights_internal::PreadFully(fd_, offset, dst, path_);
  }

 private:
  int fd_;
  std::string path_;
};

// Closes a descriptor unless released.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

Status ReadError(const TensorInfo& tensor, std::string_view file, std::string message) {
  return OutOfRangeError(
      fmt::format("read: '{}' in '{}': {}", Printable(tensor.name), Printable(file), message));
}

// Opens `path` read-only, checks it is a regular file, reads and validates its header.
Result<SafetensorsHeader> OpenAndParse(const std::string& path, int fd, int64_t* file_size) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return DataLossError(
        fmt::format("safetensors: '{}': fstat failed: {}", Printable(path), std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgumentError(
        fmt::format("safetensors: '{}': expected a regular file", Printable(path)));
  }
  *file_size = static_cast<int64_t>(st.st_size);
  std::vector<uint8_t> prefix(static_cast<size_t>(std::min<int64_t>(8, *file_size)));
  MOESHARD_RETURN_IF_ERROR(
      weights_internal::PreadFully(fd, 0, std::as_writable_bytes(std::span(prefix)), path));
  MOESHARD_ASSIGN_OR_RETURN(const int64_t n, ParseSafetensorsHeaderSize(prefix, *file_size, path));
  prefix.resize(static_cast<size_t>(8 + n));
  MOESHARD_RETURN_IF_ERROR(weights_internal::PreadFully(
      fd, 8, std::as_writable_bytes(std::span(prefix).subspan(8)), path));
  return ParseSafetensorsHeader(prefix, *file_size, path);
}

// O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then rejects it. It has no
// effect on regular files.
Result<int> OpenReadOnly(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    const std::string msg =
        fmt::format("safetensors: '{}': cannot open: {}", Printable(path), std::strerror(err));
    return err == ENOENT ? NotFoundError(msg) : InvalidArgumentError(msg);
  }
  return fd;
}

}  // namespace

Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  MOESHARD_ASSIGN_OR_RETURN(const int fd, OpenReadOnly(path));
  FdCloser closer{fd};
  int64_t file_size = 0;
  return OpenAndParse(path, fd, &file_size);
}

SafetensorsFile::SafetensorsFile(SafetensorsHeader header, SafetensorsAccess access,
                                 std::unique_ptr<Source> source)
    : header_(std::move(header)), access_(access), source_(std::move(source)) {}

SafetensorsFile::~SafetensorsFile() = default;

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path,
                                                               SafetensorsAccess access) {
  MOESHARD_ASSIGN_OR_RETURN(const int fd, OpenReadOnly(path));
  FdCloser closer{fd};
  int64_t file_size = 0;
  MOESHARD_ASSIGN_OR_RETURN(SafetensorsHeader header, OpenAndParse(path, fd, &file_size));
  std::unique_ptr<Source> source;
  switch (access) {
    case SafetensorsAccess::kMmap: {
      void* base = ::mmap(nullptr, static_cast<size_t>(file_size), PROT_READ, MAP_SHARED, fd, 0);
      if (base == MAP_FAILED) {
        return DataLossError(fmt::format("safetensors: '{}': mmap of {} bytes failed: {}",
                                         Printable(path), file_size, std::strerror(errno)));
      }
      source = std::make_unique<MmapSource>(static_cast<const uint8_t*>(base),
                                            static_cast<size_t>(file_size));
      break;
    }
    case SafetensorsAccess::kPread:
      source = std::make_unique<PreadSource>(closer.release(), path);
      break;
    case SafetensorsAccess::kHeaderOnly: break;
  }
  return std::unique_ptr<SafetensorsFile>(
      new SafetensorsFile(std::move(header), access, std::move(source)));
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(const std::string& name,
                                                                    std::vector<uint8_t> bytes) {
  MOESHARD_ASSIGN_OR_RETURN(
      SafetensorsHeader header,
      ParseSafetensorsHeader(bytes, static_cast<int64_t>(bytes.size()), name));
  return std::unique_ptr<SafetensorsFile>(
      new SafetensorsFile(std::move(header), SafetensorsAccess::kMmap,
                          std::make_unique<MemorySource>(std::move(bytes))));
}

Result<const TensorInfo*> SafetensorsFile::Get(std::string_view name) const {
  const TensorInfo* t = Find(name);
  if (t == nullptr) {
    return NotFoundError(fmt::format("read: '{}': expected a tensor of that name in '{}', got none",
                                     Printable(name), Printable(path())));
  }
  return t;
}

void SafetensorsFile::CheckOwns(const TensorInfo& tensor) const {
  const TensorInfo* first = header_.tensors.data();
  MOESHARD_CHECK(&tensor >= first && &tensor < first + header_.tensors.size(),
                 "tensor '{}' does not belong to '{}' (pass a TensorInfo from this file)",
                 tensor.name, path());
}

Status SafetensorsFile::ReadData(const TensorInfo& tensor, int64_t pos,
                                 std::span<std::byte> dst) const {
  if (source_ == nullptr) {
    return FailedPreconditionError(
        fmt::format("read: '{}': '{}' was opened header-only (open it with kMmap or kPread to read "
                    "data)",
                    Printable(tensor.name), Printable(path())));
  }
  MOESHARD_RETURN_IF_ERROR(source_->Read(header_.data_offset + tensor.data_begin + pos, dst));
  bytes_read_.fetch_add(static_cast<int64_t>(dst.size()), std::memory_order_relaxed);
  return Status::Ok();
}

Status SafetensorsFile::ReadTensor(const TensorInfo& tensor, std::span<std::byte> dst) const {
  CheckOwns(tensor);
  if (static_cast<int64_t>(dst.size()) != tensor.num_bytes()) {
    return ReadError(tensor, path(),
                     fmt::format("expected a destination of {} bytes (the whole tensor), got {}",
                                 tensor.num_bytes(), dst.size()));
  }
  return ReadData(tensor, 0, dst);
}

Status SafetensorsFile::ReadRange(const TensorInfo& tensor, int64_t offset,
                                  std::span<std::byte> dst) const {
  CheckOwns(tensor);
  std::optional<int64_t> end = CheckedAdd(offset, static_cast<int64_t>(dst.size()));
  if (!end || *end > tensor.num_bytes()) {
    return ReadError(tensor, path(),
                     fmt::format("expected a byte range within [0, {}), got offset {} + {} bytes",
                                 tensor.num_bytes(), offset, dst.size()));
  }
  return ReadData(tensor, offset, dst);
}

Status SafetensorsFile::ReadSlice2D(const TensorInfo& tensor, const Slice2D& s,
                                    std::span<std::byte> dst) const {
  CheckOwns(tensor);
  const std::string window =
      fmt::format("slice rows [{}, {}) x byte columns [{}, {}) of a [rows, {}] view at byte {}",
                  s.row_begin, s.row_end, s.col_begin, s.col_end, s.row_bytes, s.base_offset);
  if (s.row_bytes <= 0 || s.base_offset < 0 || s.row_begin < 0 || s.row_end < s.row_begin ||
      s.col_begin < 0 || s.col_end < s.col_begin || s.col_end > s.row_bytes ||
      s.dst_row_stride < 0) {
    return ReadError(tensor, path(),
                     fmt::format("{}: expected 0 <= begin <= end, columns within the row and a "
                                 "positive row size",
                                 window));
  }
  const int64_t num_rows = s.row_end - s.row_begin;
  const int64_t num_cols = s.col_end - s.col_begin;
  const int64_t stride = s.dst_row_stride == 0 ? num_cols : s.dst_row_stride;
  if (stride < num_cols) {
    return ReadError(tensor, path(),
                     fmt::format("{}: expected a destination row stride >= {} bytes, got {}",
                                 window, num_cols, stride));
  }
  std::optional<int64_t> view_end = CheckedMul(s.row_end, s.row_bytes);
  if (view_end) view_end = CheckedAdd(*view_end, s.base_offset);
  if (!view_end || *view_end > tensor.num_bytes()) {
    return ReadError(tensor, path(),
                     fmt::format("{}: expected the view to end within the tensor's {} bytes",
                                 window, tensor.num_bytes()));
  }
  if (num_rows == 0 || num_cols == 0) return Status::Ok();
  // The tensor fits in the file, so (num_rows - 1) * stride is only bounded by the caller.
  std::optional<int64_t> needed = CheckedMul(num_rows - 1, stride);
  if (needed) needed = CheckedAdd(*needed, num_cols);
  if (!needed || *needed > static_cast<int64_t>(dst.size())) {
    return ReadError(tensor, path(),
                     fmt::format("{}: expected a destination of at least {} bytes, got {}", window,
                                 needed.value_or(-1), dst.size()));
  }
  const int64_t src0 = s.base_offset + s.row_begin * s.row_bytes + s.col_begin;
  if (num_cols == s.row_bytes && stride == s.row_bytes) {
    // Whole rows, tightly packed: one contiguous read.
    return ReadData(tensor, src0, dst.first(static_cast<size_t>(num_rows * num_cols)));
  }
  for (int64_t r = 0; r < num_rows; ++r) {
    MOESHARD_RETURN_IF_ERROR(
        ReadData(tensor, src0 + r * s.row_bytes,
                 dst.subspan(static_cast<size_t>(r * stride), static_cast<size_t>(num_cols))));
  }
  return Status::Ok();
}

}  // namespace moeshard
