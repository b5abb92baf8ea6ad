#include "moeshard/weights/safetensors_writer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "moeshard/base/math.h"
#include "moeshard/weights/safetensors.h"
#include "weights/weights_internal.h"

namespace moeshard {

using weights_internal::Printable;
using Sink = std::function<Status(std::span<const std::byte>)>;

namespace {

Status WriteError(std::string_view name, std::string message) {
  return InvalidArgumentError(
      fmt::format("write safetensors: '{}': {}", Printable(name), std::move(message)));
}

// JSON string literal, as nlohmann (and serde_json) write it.
std::string JsonString(const std::string& s) { return nlohmann::json(s).dump(); }

}  // namespace

Status SafetensorsWriter::Validate(const std::string& name, DType dtype,
                                   const std::vector<int64_t>& shape, int64_t* num_bytes) const {
  if (name == kSafetensorsMetadataKey) {
    return WriteError(name, "expected a tensor name, got the reserved key");
  }
  if (weights_internal::FirstInvalidUtf8(name) != name.size()) {
    return WriteError(name, "expected a UTF-8 tensor name");
  }
  if (names_.count(name) != 0)
    return WriteError(name, "expected a new tensor name, got a duplicate");
  if (shape.size() > static_cast<size_t>(kSafetensorsMaxRank)) {
    return WriteError(name, fmt::format("expected at most {} dimensions, got {}",
                                        kSafetensorsMaxRank, shape.size()));
  }
  int64_t elements = 1;
  for (int64_t d : shape) {
    std::optional<int64_t> next = CheckedMul(elements, d);
    if (d < 0 || d > kSafetensorsMaxNumber || !next) {
      return WriteError(name, fmt::format("expected dims in [0, 2^48] with a 64-bit element "
                                          "count, got shape {}",
                                          weights_internal::FormatDims(shape)));
    }
    elements = *next;
  }
  std::optional<int64_t> bytes = DTypeBytes(dtype, elements);
  if (!bytes) {
    return WriteError(name, fmt::format("expected a whole number of bytes, got {} elements of {}",
                                        elements, DTypeName(dtype)));
  }
  *num_bytes = *bytes;
  return Status::Ok();
}

Status SafetensorsWriter::Add(std::string name, DType dtype, std::vector<int64_t> shape,
                              std::span<const std::byte> data) {
  int64_t num_bytes = 0;
  MOESHARD_RETURN_IF_ERROR(Validate(name, dtype, shape, &num_bytes));
  if (static_cast<int64_t>(data.size()) != num_bytes) {
    return WriteError(name, fmt::format("shape {} {}: expected {} bytes of data, got {}",
                                        weights_internal::FormatDims(shape), DTypeName(dtype),
                                        num_bytes, data.size()));
  }
  names_.emplace(name, static_cast<int>(tensors_.size()));
  tensors_.push_back(Pending{std::move(name), dtype, std::move(shape), num_bytes, data, nullptr});
  return Status::Ok();
}

Status SafetensorsWriter::AddWithFill(std::string name, DType dtype, std::vector<int64_t> shape,
                                      TensorFillFn fill) {
  int64_t num_bytes = 0;
  MOESHARD_RETURN_IF_ERROR(Validate(name, dtype, shape, &num_bytes));
  if (!fill) return WriteError(name, "expected a fill function, got none");
  names_.emplace(name, static_cast<int>(tensors_.size()));
  tensors_.push_back(
      Pending{std::move(name), dtype, std::move(shape), num_bytes, {}, std::move(fill)});
  return Status::Ok();
}

Result<std::string> SafetensorsWriter::HeaderText() const {
  std::string h = "{";
  bool first = true;
  if (!metadata_.empty()) {
    h += JsonString(std::string(kSafetensorsMetadataKey)) + ":{";
    for (const auto& [k, v] : metadata_) {
      if (weights_internal::FirstInvalidUtf8(k) != k.size() ||
          weights_internal::FirstInvalidUtf8(v) != v.size()) {
        return WriteError(k, "__metadata__: expected UTF-8 keys and values");
      }
      if (!first) h += ',';
      first = false;
      h += JsonString(k) + ":" + JsonString(v);
    }
    h += "}";
  }
  int64_t offset = 0;
  for (const Pending& t : tensors_) {
    if (!h.ends_with('{')) h += ',';
    // Offsets: the sum of validated sizes; each is < 2^48 * 64 / 8 but the sum could overflow.
    std::optional<int64_t> end = CheckedAdd(offset, t.num_bytes);
    if (!end) return WriteError(t.name, "expected a data buffer under 2^63 bytes, got more");
    h += fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                     JsonString(t.name), DTypeName(t.dtype), fmt::join(t.shape, ","), offset, *end);
    offset = *end;
  }
  h += "}";
  // The reference pads with spaces so the data buffer starts 8-byte aligned in the file.
  h.append((8 - h.size() % 8) % 8, ' ');
  if (static_cast<int64_t>(h.size()) > kSafetensorsMaxHeaderBytes) {
    return WriteError("header", fmt::format("expected at most {} header bytes, got {}",
                                            kSafetensorsMaxHeaderBytes, h.size()));
  }
  return h;
}

Result<int64_t> SafetensorsWriter::FileBytes() const {
  MOESHARD_ASSIGN_OR_RETURN(const std::string header, HeaderText());
  int64_t total = 8 + static_cast<int64_t>(header.size());
  for (const Pending& t : tensors_) {
    std::optional<int64_t> next = CheckedAdd(total, t.num_bytes);
    if (!next) return WriteError(t.name, "file size overflows");
    total = *next;
  }
  return total;
}

Status SafetensorsWriter::Emit(const Sink& sink) const {
  MOESHARD_ASSIGN_OR_RETURN(const std::string header, HeaderText());
  std::array<std::byte, 8> len{};
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[static_cast<size_t>(i)] = static_cast<std::byte>(n >> (8 * i));
  MOESHARD_RETURN_IF_ERROR(sink(len));
  MOESHARD_RETURN_IF_ERROR(sink(std::as_bytes(std::span(header))));
  std::vector<std::byte> chunk;
  for (const Pending& t : tensors_) {
    if (!t.fill) {
      MOESHARD_RETURN_IF_ERROR(sink(t.data));
      continue;
    }
    for (int64_t off = 0; off < t.num_bytes; off += kSafetensorsWriteChunkBytes) {
      const int64_t len_bytes = std::min(kSafetensorsWriteChunkBytes, t.num_bytes - off);
      chunk.assign(static_cast<size_t>(len_bytes), std::byte{0});
      Status s = t.fill(off, chunk);
      if (!s.ok()) return s.WithContext(fmt::format("write safetensors: '{}'", Printable(t.name)));
      MOESHARD_RETURN_IF_ERROR(sink(chunk));
    }
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> SafetensorsWriter::Serialize() const {
  std::vector<uint8_t> out;
  MOESHARD_ASSIGN_OR_RETURN(const int64_t total, FileBytes());
  out.reserve(static_cast<size_t>(total));
  MOESHARD_RETURN_IF_ERROR(Emit([&](std::span<const std::byte> bytes) {
    const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
    out.insert(out.end(), p, p + bytes.size());
    return Status::Ok();
  }));
  return out;
}

Status SafetensorsWriter::Finish(const std::string& path) const {
  return WriteFileAtomically(path, [&](const Sink& sink) { return Emit(sink); });
}

Status WriteFileAtomically(const std::string& path,
                           const std::function<Status(const Sink& sink)>& producer) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return InvalidArgumentError(
        fmt::format("write: '{}': cannot create: {}", Printable(tmp), std::strerror(errno)));
  }
  auto fail = [&](Status s) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };
  Status status = producer([&](std::span<const std::byte> bytes) -> Status {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return DataLossError(fmt::format("write: '{}': {}", Printable(tmp),
                                         n < 0 ? std::strerror(errno) : "wrote nothing"));
      }
      done += static_cast<size_t>(n);
    }
    return Status::Ok();
  });
  if (!status.ok()) return fail(status);
  if (::fsync(fd) != 0) {
    return fail(DataLossError(
        fmt::format("write: '{}': fsync failed: {}", Printable(tmp), std::strerror(errno))));
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return DataLossError(
        fmt::format("write: '{}': close failed: {}", Printable(tmp), std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return InvalidArgumentError(fmt::format("write: '{}': rename from '{}' failed: {}",
                                            Printable(path), Printable(tmp), std::strerror(err)));
  }
  // Make the rename itself durable (best effort: the file is complete either way).
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    (void)::fsync(dir_fd);
    ::close(dir_fd);
  }
  return Status::Ok();
}

Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  return WriteFileAtomically(
      path, [&](const Sink& sink) { return sink(std::as_bytes(std::span(contents))); });
}

}  // namespace moeshard
