// The safetensors header parser: a SAX state machine over nlohmann/json's tokenizer.
//
// Why SAX and not nlohmann::json::parse: the DOM parser keeps the last of duplicate keys
// silently, and building a DOM for a hostile 100 MB header costs ~10x its size in memory. The
// state machine accepts exactly the shape of a safetensors header, stops at the first
// deviation, and holds only the tensors it has seen.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "base/check.h"
#include "moeshard/base/math.h"
#include "moeshard/weights/safetensors.h"
#include "weights/weights_internal.h"

namespace moeshard {
namespace {

using weights_internal::FormatDims;
using weights_internal::Printable;

Status HeaderError(std::string_view file_name, std::string_view message) {
  return DataLossError(fmt::format("safetensors: '{}': {}", Printable(file_name), message));
}

// Field bits of a tensor entry.
constexpr int kFieldDType = 1;
constexpr int kFieldShape = 2;
constexpr int kFieldOffsets = 4;

class HeaderSax {
 public:
  using json = nlohmann::json;

  // Where the next event lands.
  enum class State {
    kStart,          // before the top-level value
    kTop,            // in the top-level object, expecting a key or its end
    kTopValue,       // expecting the value of a top-level key
    kMetadata,       // in __metadata__, expecting a key or its end
    kMetadataValue,  // expecting a metadata string value
    kTensor,         // in a tensor entry, expecting a key or its end
    kTensorValue,    // expecting the value of a tensor field
    kShape,          // in a shape array
    kOffsets,        // in a data_offsets array
    kDone,           // after the top-level object
  };

  struct Entry {
    std::string name;
    DType dtype = DType::kU8;
    std::vector<int64_t> shape;
    std::vector<int64_t> offsets;
  };

  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
  std::string error;  // set when an event was rejected

  bool null() { return Value("null"); }
  bool boolean(bool) { return Value("a boolean"); }
  bool number_integer(json::number_integer_t v) {
    if (v < 0) return Number(fmt::format("{}", v), -1);
    return Number(fmt::format("{}", v), v);
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (v > static_cast<uint64_t>(kSafetensorsMaxNumber)) {
      return Number(fmt::format("{} (more than 2^48)", v), -1);
    }
    return Number(fmt::format("{}", v), static_cast<int64_t>(v));
  }
  bool number_float(json::number_float_t, const std::string& raw) {
    return Number(fmt::format("{} (not an integer)", raw), -1);
  }
  bool string(std::string& v) {
    if (state_ == State::kMetadataValue) {
      metadata.emplace(key_, std::move(v));
      state_ = State::kMetadata;
      return true;
    }
    if (state_ == State::kTensorValue && field_ == kFieldDType) {
      std::optional<DType> dtype = ParseDType(v);
      if (!dtype) {
        return Fail(fmt::format(
            "tensor '{}': dtype: expected one of BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, "
            "F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, I16, U16, F16, BF16, I32, U32, F32, "
            "C64, F64, I64, U64, got '{}'",
            Printable(entries.back().name), Printable(v)));
      }
      entries.back().dtype = *dtype;
      state_ = State::kTensor;
      return true;
    }
    return Value("a string");
  }
  bool binary(json::binary_t&) { return Value("binary data"); }

  bool start_object(std::size_t) {
    switch (state_) {
      case State::kStart: state_ = State::kTop; return true;
      case State::kTopValue:
        if (key_ == kSafetensorsMetadataKey) {
          if (seen_metadata_) return Fail("'__metadata__': expected it once, got it twice");
          seen_metadata_ = true;
          metadata_keys_.clear();
          state_ = State::kMetadata;
        } else {
          entries.emplace_back();
          entries.back().name = key_;
          fields_ = 0;
          state_ = State::kTensor;
        }
        return true;
      case State::kTop:
      case State::kMetadata:
      case State::kMetadataValue:
      case State::kTensor:
      case State::kTensorValue:
      case State::kShape:
      case State::kOffsets:
      case State::kDone: return Value("an object");
    }
    return Value("an object");
  }

  bool key(std::string& k) {
    switch (state_) {
      case State::kTop:
        if (!top_keys_.insert(k).second) {
          return Fail(fmt::format("key '{}': expected unique keys, got it twice", Printable(k)));
        }
        key_ = std::move(k);
        state_ = State::kTopValue;
        return true;
      case State::kMetadata:
        if (!metadata_keys_.insert(k).second) {
          return Fail(fmt::format("__metadata__ key '{}': expected unique keys, got it twice",
                                  Printable(k)));
        }
        key_ = std::move(k);
        state_ = State::kMetadataValue;
        return true;
      case State::kTensor: {
        int field = 0;
        if (k == "dtype") field = kFieldDType;
        if (k == "shape") field = kFieldShape;
        if (k == "data_offsets") field = kFieldOffsets;
        if (field == 0) {
          return Fail(fmt::format(
              "tensor '{}': expected only the fields dtype, shape, data_offsets, got '{}'",
              Printable(entries.back().name), Printable(k)));
        }
        if (fields_ & field) {
          return Fail(fmt::format("tensor '{}': field '{}': expected once, got it twice",
                                  Printable(entries.back().name), k));
        }
        fields_ |= field;
        field_ = field;
        state_ = State::kTensorValue;
        return true;
      }
      case State::kStart:
      case State::kTopValue:
      case State::kMetadataValue:
      case State::kTensorValue:
      case State::kShape:
      case State::kOffsets:
      case State::kDone: break;
    }
    return Fail("internal: unexpected key event");
  }

  bool end_object() {
    switch (state_) {
      case State::kTop: state_ = State::kDone; return true;
      case State::kMetadata: state_ = State::kTop; return true;
      case State::kTensor: {
        const Entry& e = entries.back();
        for (auto [bit, name] : {std::pair{kFieldDType, "dtype"}, std::pair{kFieldShape, "shape"},
                                 std::pair{kFieldOffsets, "data_offsets"}}) {
          if (!(fields_ & bit)) {
            return Fail(fmt::format("tensor '{}': expected a '{}' field, got none",
                                    Printable(e.name), name));
          }
        }
        state_ = State::kTop;
        return true;
      }
      case State::kStart:
      case State::kTopValue:
      case State::kMetadataValue:
      case State::kTensorValue:
      case State::kShape:
      case State::kOffsets:
      case State::kDone: break;
    }
    return Fail("internal: unexpected end of object");
  }

  bool start_array(std::size_t) {
    if (state_ == State::kTensorValue && field_ == kFieldShape) {
      state_ = State::kShape;
      return true;
    }
    if (state_ == State::kTensorValue && field_ == kFieldOffsets) {
      state_ = State::kOffsets;
      return true;
    }
    return Value("an array");
  }

  bool end_array() {
    Entry& e = entries.back();
    if (state_ == State::kOffsets && e.offsets.size() != 2) {
      return Fail(fmt::format("tensor '{}': data_offsets: expected [begin, end], got {} numbers",
                              Printable(e.name), e.offsets.size()));
    }
    state_ = State::kTensor;
    return true;
  }

  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) {
    return Fail(fmt::format("header is not valid JSON (near header byte {}): {}", position,
                            Printable(ex.what(), 300)));
  }

 private:
  bool Fail(std::string message) {
    if (error.empty()) error = std::move(message);
    return false;
  }

  // A non-number, non-container value (or a container in the wrong place) arrived.
  bool Value(std::string_view kind) {
    switch (state_) {
      case State::kStart: return Fail(fmt::format("header: expected a JSON object, got {}", kind));
      case State::kTopValue:
        if (key_ == kSafetensorsMetadataKey) {
          return Fail(fmt::format("'__metadata__': expected an object of strings, got {}", kind));
        }
        return Fail(
            fmt::format("tensor '{}': expected an object with dtype, shape, data_offsets, "
                        "got {}",
                        Printable(key_), kind));
      case State::kMetadataValue:
        return Fail(fmt::format("__metadata__ '{}': expected a string value, got {}",
                                Printable(key_), kind));
      case State::kTensorValue: {
        const char* what = field_ == kFieldDType   ? "dtype: expected a string"
                           : field_ == kFieldShape ? "shape: expected an array of integers"
                                                   : "data_offsets: expected [begin, end]";
        return Fail(
            fmt::format("tensor '{}': {}, got {}", Printable(entries.back().name), what, kind));
      }
      case State::kShape:
      case State::kOffsets:
        return Fail(fmt::format("tensor '{}': {}: expected a non-negative integer, got {}",
                                Printable(entries.back().name),
                                state_ == State::kShape ? "shape" : "data_offsets", kind));
      case State::kTop:
      case State::kMetadata:
      case State::kTensor:
      case State::kDone: break;
    }
    return Fail(fmt::format("internal: unexpected {}", kind));
  }

  // A number arrived; `value` < 0 marks one outside [0, 2^48] or not an integer.
  bool Number(const std::string& text, int64_t value) {
    if (state_ != State::kShape && state_ != State::kOffsets) {
      return Value(fmt::format("the number {}", text));
    }
    Entry& e = entries.back();
    const bool shape = state_ == State::kShape;
    if (value < 0) {
      return Fail(fmt::format("tensor '{}': {}: expected an integer in [0, 2^48], got {}",
                              Printable(e.name), shape ? "shape" : "data_offsets", text));
    }
    if (shape) {
      if (e.shape.size() >= static_cast<size_t>(kSafetensorsMaxRank)) {
        return Fail(fmt::format("tensor '{}': shape: expected at most {} dimensions, got more",
                                Printable(e.name), kSafetensorsMaxRank));
      }
      e.shape.push_back(value);
    } else {
      if (e.offsets.size() >= 2) {
        return Fail(
            fmt::format("tensor '{}': data_offsets: expected [begin, end], got more than "
                        "2 numbers",
                        Printable(e.name)));
      }
      e.offsets.push_back(value);
    }
    return true;
  }

  State state_ = State::kStart;
  std::string key_;
  int field_ = 0;
  int fields_ = 0;
  bool seen_metadata_ = false;
  std::set<std::string, std::less<>> top_keys_;
  std::set<std::string, std::less<>> metadata_keys_;
};

}  // namespace

int64_t TensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) {
    std::optional<int64_t> next = CheckedMul(n, d);
    MOESHARD_CHECK(next.has_value(), "tensor '{}': element count overflows (unvalidated shape)",
                   name);
    n = *next;
  }
  return n;
}

const TensorInfo* SafetensorsHeader::Find(std::string_view name) const {
  auto it = tensor_idx_by_name.find(name);
  return it == tensor_idx_by_name.end() ? nullptr : &tensors[static_cast<size_t>(it->second)];
}

int64_t Slice2D::DstBytesNeeded() const {
  const int64_t rows = row_end - row_begin;
  const int64_t cols = col_end - col_begin;
  if (rows <= 0 || cols <= 0) return 0;
  const int64_t stride = dst_row_stride == 0 ? cols : dst_row_stride;
  return (rows - 1) * stride + cols;
}

Result<int64_t> ParseSafetensorsHeaderSize(std::span<const uint8_t> prefix, int64_t file_size,
                                           std::string_view file_name) {
  if (file_size < 8) {
    return HeaderError(file_name, fmt::format("expected at least 8 bytes (the header length), got "
                                              "a {}-byte file",
                                              file_size));
  }
  if (prefix.size() < 8) {
    return HeaderError(file_name, fmt::format("expected the first 8 bytes, got {}", prefix.size()));
  }
  const uint64_t n = weights_internal::LoadLittleEndian64(prefix.data());
  if (n > static_cast<uint64_t>(kSafetensorsMaxHeaderBytes)) {
    return HeaderError(file_name, fmt::format("header length: expected at most {} bytes, got {} "
                                              "(not a safetensors file?)",
                                              kSafetensorsMaxHeaderBytes, n));
  }
  // n <= 1e8, so 8 + n cannot overflow.
  if (static_cast<int64_t>(n) + 8 > file_size) {
    return HeaderError(file_name, fmt::format("header length: expected 8 + {} <= file size, got a "
                                              "{}-byte file (truncated file?)",
                                              n, file_size));
  }
  return static_cast<int64_t>(n);
}

namespace {

// Rule 2, before the parser sees the text: UTF-8, no NUL, an object (nlohmann would silently
// skip a UTF-8 byte-order mark, which the reference rejects, hence the explicit first-character
// check).
Status CheckHeaderText(std::string_view text, std::string_view file_name) {
  if (size_t bad = weights_internal::FirstInvalidUtf8(text); bad != text.size()) {
    return HeaderError(file_name, fmt::format("header: expected UTF-8, got byte 0x{:02x} at header "
                                              "byte {}",
                                              static_cast<unsigned char>(text[bad]), bad));
  }
  // nlohmann's lexer reads a NUL byte as the end of input and would accept "{}\0\0"; JSON text
  // never holds a raw NUL (strings must escape it), and the reference rejects NUL padding.
  if (size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return HeaderError(file_name, fmt::format("header: expected JSON text, got a NUL byte at "
                                              "header byte {} (padding must be spaces)",
                                              nul));
  }
  size_t first = 0;
  while (first < text.size() && weights_internal::IsJsonWhitespace(text[first])) ++first;
  if (first == text.size()) {
    return HeaderError(file_name, "header: expected a JSON object, got only whitespace");
  }
  if (text[first] != '{') {
    return HeaderError(file_name,
                       fmt::format("header: expected a JSON object starting with '{{', got '{}'",
                                   Printable(text.substr(first, 1))));
  }
  return Status::Ok();
}

// Runs the state machine over the header JSON; `sax` holds what it read.
Status ParseHeaderJson(std::string_view text, std::string_view file_name, HeaderSax& sax) {
  bool parsed = false;
  try {
    parsed = nlohmann::json::sax_parse(text.begin(), text.end(), &sax,
                                       nlohmann::json::input_format_t::json, /*strict=*/true,
                                       /*ignore_comments=*/false);
  } catch (const std::exception& e) {
    return HeaderError(file_name, fmt::format("header: {}", Printable(e.what(), 300)));
  }
  if (!parsed || !sax.error.empty()) {
    return HeaderError(file_name, sax.error.empty() ? "header: invalid JSON" : sax.error);
  }
  return Status::Ok();
}

// The header of what `sax` read (header length n), tensors in data-buffer order.
SafetensorsHeader MakeHeader(HeaderSax& sax, int64_t n, int64_t file_size,
                             std::string_view file_name) {
  SafetensorsHeader header;
  header.file_name = std::string(file_name);
  header.header_bytes = n;
  header.data_offset = 8 + n;
  header.data_bytes = file_size - 8 - n;
  header.metadata = std::move(sax.metadata);
  header.tensors.reserve(sax.entries.size());
  for (HeaderSax::Entry& e : sax.entries) {
    header.tensors.push_back(TensorInfo{.name = std::move(e.name),
                                        .dtype = e.dtype,
                                        .shape = std::move(e.shape),
                                        .data_begin = e.offsets[0],
                                        .data_end = e.offsets[1]});
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return std::tie(a.data_begin, a.data_end, a.name) <
                     std::tie(b.data_begin, b.data_end, b.name);
            });
  return header;
}

// Rule 4 for one tensor: its shape and dtype fill exactly its data_offsets.
Status CheckTensorBytes(const TensorInfo& t, std::string_view file_name) {
  const std::string name = Printable(t.name);
  int64_t elements = 1;
  for (int64_t d : t.shape) {
    std::optional<int64_t> next = CheckedMul(elements, d);
    if (!next) {
      return HeaderError(file_name, fmt::format("tensor '{}': shape {}: expected an element count "
                                                "that fits in 64 bits, got an overflow",
                                                name, FormatDims(t.shape)));
    }
    elements = *next;
  }
  std::optional<int64_t> bits = CheckedMul(elements, DTypeBits(t.dtype));
  if (!bits) {
    return HeaderError(file_name, fmt::format("tensor '{}': shape {} {}: expected a bit count that "
                                              "fits in 64 bits, got an overflow",
                                              name, FormatDims(t.shape), DTypeName(t.dtype)));
  }
  if (*bits % 8 != 0) {
    return HeaderError(
        file_name, fmt::format("tensor '{}': shape {} {}: expected a whole number of bytes, got "
                               "{} elements x {} bits = {} bits",
                               name, FormatDims(t.shape), DTypeName(t.dtype), elements,
                               DTypeBits(t.dtype), *bits));
  }
  if (*bits / 8 != t.num_bytes()) {
    return HeaderError(file_name, fmt::format("tensor '{}': shape {} {}: expected data_offsets to "
                                              "span {} bytes, got [{}, {}] = {} bytes",
                                              name, FormatDims(t.shape), DTypeName(t.dtype),
                                              *bits / 8, t.data_begin, t.data_end, t.num_bytes()));
  }
  return Status::Ok();
}

// Rules 3 to 5 over the sorted tensors: each starts where the previous one ends, fills its
// bytes, and the last one ends the data buffer.
Status CheckDataLayout(const SafetensorsHeader& header, std::string_view file_name) {
  int64_t expected_begin = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : header.tensors) {
    const std::string name = Printable(t.name);
    if (t.data_end < t.data_begin) {
      return HeaderError(file_name, fmt::format("tensor '{}': data_offsets: expected end >= begin, "
                                                "got [{}, {}]",
                                                name, t.data_begin, t.data_end));
    }
    if (t.data_begin != expected_begin) {
      const std::string where = prev ? fmt::format("where tensor '{}' ends", Printable(prev->name))
                                     : std::string("the first tensor starts the data buffer");
      return HeaderError(
          file_name,
          fmt::format("tensor '{}': data_offsets: expected begin {} ({}), got {} ({} of {} bytes)",
                      name, expected_begin, where, t.data_begin,
                      t.data_begin > expected_begin ? "a gap" : "an overlap",
                      t.data_begin > expected_begin ? t.data_begin - expected_begin
                                                    : expected_begin - t.data_begin));
    }
    MOESHARD_RETURN_IF_ERROR(CheckTensorBytes(t, file_name));
    expected_begin = t.data_end;
    prev = &t;
  }
  if (expected_begin != header.data_bytes) {
    const std::string last = prev ? fmt::format("the end of tensor '{}'", Printable(prev->name))
                                  : std::string("no tensors");
    return HeaderError(
        file_name,
        fmt::format("expected a data buffer of {} bytes ({}), got {} bytes ({})", expected_begin,
                    last, header.data_bytes,
                    header.data_bytes > expected_begin ? "trailing bytes after the last tensor"
                                                       : "truncated file?"));
  }
  return Status::Ok();
}

}  // namespace

Result<SafetensorsHeader> ParseSafetensorsHeader(std::span<const uint8_t> prefix, int64_t file_size,
                                                 std::string_view file_name) {
  MOESHARD_ASSIGN_OR_RETURN(const int64_t n,
                            ParseSafetensorsHeaderSize(prefix, file_size, file_name));
  if (prefix.size() < static_cast<size_t>(8 + n)) {
    return HeaderError(file_name, fmt::format("expected the first {} bytes (8 + header), got {}",
                                              8 + n, prefix.size()));
  }
  const std::string_view text(reinterpret_cast<const char*>(prefix.data()) + 8,
                              static_cast<size_t>(n));
  MOESHARD_RETURN_IF_ERROR(CheckHeaderText(text, file_name));
  HeaderSax sax;
  MOESHARD_RETURN_IF_ERROR(ParseHeaderJson(text, file_name, sax));
  SafetensorsHeader header = MakeHeader(sax, n, file_size, file_name);
  MOESHARD_RETURN_IF_ERROR(CheckDataLayout(header, file_name));
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    header.tensor_idx_by_name.emplace(header.tensors[i].name, static_cast<int64_t>(i));
  }
  return header;
}

}  // namespace moeshard
