#include "weights/json_strict.h"

#include <fmt/format.h>

#include <vector>

#include "weights/weights_internal.h"

namespace moeshard::weights_internal {
namespace {

using json = nlohmann::json;

// Modeled on nlohmann's json_sax_dom_parser, plus duplicate and depth checks.
class StrictDomSax {
 public:
  explicit StrictDomSax(int max_depth) : max_depth_(max_depth) {}

  json root;
  std::string error;

  bool null() { return Put(json(nullptr)); }
  bool boolean(bool v) { return Put(json(v)); }
  bool number_integer(json::number_integer_t v) { return Put(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return Put(json(v)); }
  bool number_float(json::number_float_t v, const std::string&) { return Put(json(v)); }
  bool string(std::string& v) { return Put(json(std::move(v))); }
  bool binary(json::binary_t&) { return Fail("unexpected binary value"); }

  bool start_object(std::size_t) { return Open(json::object()); }
  bool start_array(std::size_t) { return Open(json::array()); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(std::string& k) {
    json& obj = *stack_.back();
    if (obj.contains(k)) {
      return Fail(fmt::format("key '{}': expected unique keys, got it twice", Printable(k)));
    }
    slot_ = &obj[k];
    return true;
  }

  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) {
    return Fail(
        fmt::format("not valid JSON (near byte {}): {}", position, Printable(ex.what(), 300)));
  }

 private:
  bool Fail(std::string message) {
    if (error.empty()) error = std::move(message);
    return false;
  }

  // Stores `value` where the parser is; returns its address.
  json* Place(json&& value) {
    if (stack_.empty()) {
      root = std::move(value);
      return &root;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    *slot_ = std::move(value);
    return slot_;
  }

  bool Put(json&& value) {
    if (stack_.empty()) return Fail("expected an object or array at the top level");
    Place(std::move(value));
    return true;
  }

  bool Open(json&& container) {
    if (static_cast<int>(stack_.size()) >= max_depth_) {
      return Fail(fmt::format("expected nesting at most {} deep, got deeper", max_depth_));
    }
    stack_.push_back(Place(std::move(container)));
    return true;
  }

  bool Close() {
    stack_.pop_back();
    return true;
  }

  int max_depth_;
  std::vector<json*> stack_;
  json* slot_ = nullptr;
};

}  // namespace

Result<nlohmann::json> ParseStrictJson(std::string_view text, std::string_view context,
                                       int max_depth) {
  auto error = [&](std::string_view problem) {
    return DataLossError(fmt::format("{}: {}", context, problem));
  };
  // nlohmann's lexer reads a NUL byte as the end of input; JSON text never holds a raw NUL.
  if (size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return error(fmt::format("expected JSON text, got a NUL byte at byte {}", nul));
  }
  size_t first = 0;
  while (first < text.size() && IsJsonWhitespace(text[first])) ++first;
  if (first == text.size()) return error("expected JSON, got only whitespace");
  if (text[first] != '{' && text[first] != '[') {
    return error(
        fmt::format("expected a JSON object, got '{}' first", Printable(text.substr(first, 1))));
  }
  StrictDomSax sax(max_depth);
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &sax, json::input_format_t::json,
                         /*strict=*/true, /*ignore_comments=*/false);
  } catch (const std::exception& e) {
    return error(Printable(e.what(), 300));
  }
  if (!ok || !sax.error.empty()) return error(sax.error.empty() ? "invalid JSON" : sax.error);
  return std::move(sax.root);
}

std::string JsonKind(const nlohmann::json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string:
      return fmt::format("the string \"{}\"", Printable(value.get_ref<const std::string&>(), 60));
    case json::value_t::boolean: return value.get<bool>() ? "true" : "false";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return fmt::format("the number {}", value.dump());
    case json::value_t::binary: return "binary data";
    case json::value_t::discarded: return "a discarded value";
  }
  return "an unknown value";
}

}  // namespace moeshard::weights_internal
