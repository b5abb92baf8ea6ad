#include "weights/weights_internal.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace moeshard::weights_internal {

std::string Printable(std::string_view text, size_t max_chars) {
  std::string out;
  size_t n = 0;
  for (char ch : text) {
    if (n >= max_chars) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\' || c == '\'') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c >= 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += ch;
    }
    ++n;
  }
  return out;
}

size_t FirstInvalidUtf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t min_cp = 0;
    uint32_t cp = 0;
    if ((c & 0xe0) == 0xc0) {
      len = 2, min_cp = 0x80, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3, min_cp = 0x800, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4, min_cp = 0x10000, cp = c & 0x07;
    } else {
      return i;
    }
    if (n - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    if (cp < min_cp || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += len;
  }
  return n;
}

std::string FormatDims(std::span<const int64_t> dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

uint64_t LoadLittleEndian64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

Result<std::string> ReadWholeFile(const std::string& path, int64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = fmt::format("read: '{}': {}", path, std::strerror(err));
    return err == ENOENT ? NotFoundError(msg) : InvalidArgumentError(msg);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(fmt::format("read: '{}': expected a regular file", path));
  }
  if (st.st_size > max_bytes) {
    ::close(fd);
    return OutOfRangeError(fmt::format("read: '{}': expected at most {} bytes, got {}", path,
                                       max_bytes, static_cast<int64_t>(st.st_size)));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  Status status = PreadFully(fd, 0, std::as_writable_bytes(std::span<char>(text)), path);
  ::close(fd);
  if (!status.ok()) return status;
  return text;
}

Status PreadFully(int fd, int64_t offset, std::span<std::byte> dst, std::string_view what) {
  size_t done = 0;
  while (done < dst.size()) {
    const ssize_t got = ::pread(fd, dst.data() + done, dst.size() - done,
                                static_cast<off_t>(offset + static_cast<int64_t>(done)));
    if (got < 0) {
      if (errno == EINTR) continue;
      return DataLossError(fmt::format("read: '{}': pread of {} bytes at offset {} failed: {}",
                                       Printable(what), dst.size() - done,
                                       offset + static_cast<int64_t>(done), std::strerror(errno)));
    }
    if (got == 0) {
      return DataLossError(fmt::format(
          "read: '{}': expected {} more bytes at offset {}, got end of file (file truncated "
          "while open?)",
          Printable(what), dst.size() - done, offset + static_cast<int64_t>(done)));
    }
    done += static_cast<size_t>(got);
  }
  return Status::Ok();
}

}  // namespace moeshard::weights_internal
