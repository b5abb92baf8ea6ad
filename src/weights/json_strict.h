// A JSON parser that rejects what nlohmann::json::parse silently accepts (private).
//
// nlohmann/json keeps the last of duplicate object keys and skips a UTF-8 byte-order mark; both
// hide malformed or tampered files. ParseStrictJson builds the same DOM but fails on a duplicate
// key at any depth, on nesting deeper than `max_depth`, and on anything but an object or array
// at the top level.
//
// Thread safety: pure function.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "moeshard/base/status.h"

namespace moeshard::weights_internal {

// On failure the Status is kDataLoss with message "<context>: <problem>", e.g.
// "checkpoint index: 'x.json': key 'weight_map': expected unique keys, got it twice".
Result<nlohmann::json> ParseStrictJson(std::string_view text, std::string_view context,
                                       int max_depth);

// "an object", "a string", "the number 3", ... for messages.
std::string JsonKind(const nlohmann::json& value);

}  // namespace moeshard::weights_internal
