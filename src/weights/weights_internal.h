// Helpers shared by the weights layer's sources (private): message quoting, UTF-8 checks,
// little-endian decoding, whole-file reads.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moeshard/base/status.h"

namespace moeshard::weights_internal {

// `text` made safe to print inside quotes in an error message: control and non-ASCII bytes
// escaped as \xNN, quotes and backslashes escaped, and cut to `max_chars` with "...".
std::string Printable(std::string_view text, size_t max_chars = 160);

// Offset of the first byte that is not part of well-formed UTF-8 (RFC 3629: no overlongs, no
// surrogates, nothing above U+10FFFF), or text.size() when all of it is well-formed.
size_t FirstInvalidUtf8(std::string_view text);

// JSON whitespace (RFC 8259): space, tab, line feed, carriage return.
constexpr bool IsJsonWhitespace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// "[a, b, c]".
std::string FormatDims(std::span<const int64_t> dims);

// Little-endian u64 from 8 bytes of any alignment.
uint64_t LoadLittleEndian64(const uint8_t* p);

// Reads a whole (small) file, e.g. an index. kNotFound when it does not exist.
Result<std::string> ReadWholeFile(const std::string& path, int64_t max_bytes);

// Reads exactly dst.size() bytes at `offset` of `fd`, retrying on EINTR and short reads.
// `what` names the file in errors.
Status PreadFully(int fd, int64_t offset, std::span<std::byte> dst, std::string_view what);

}  // namespace moeshard::weights_internal
