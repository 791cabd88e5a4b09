// JSON helpers every reader of outside JSON shares. JsonErrorText: nlohmann::json's exceptions as
// a user reads them: "FILE:LINE:COLUMN: LABEL: what" for a syntax
// error, "FILE: LABEL: what" otherwise (no "LABEL: " when it is empty), without the library's
// "[json.exception.parse_error.101] parse error at line 1, column 1: " prefix (an internal code,
// and the position in its own words). Header-only: it needs no library but the one whose exceptions
// it reads.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gpulet {

inline std::string JsonErrorText(const std::string& where, const std::string& what,
                                 const std::string& label = "") {
  const std::string l = label.empty() ? "" : label + ": ";
  absl::string_view w(what);
  if (absl::StartsWith(w, "[json.exception.")) {
    size_t close = w.find("] ");
    if (close != absl::string_view::npos) w.remove_prefix(close + 2);
  }
  // "parse error at line L, column C: rest" (also "parse error at L: rest" for a byte offset).
  if (absl::ConsumePrefix(&w, "parse error at line ")) {
    size_t comma = w.find(", column "), colon = w.find(": ");
    int line = 0, column = 0;
    if (comma != absl::string_view::npos && colon != absl::string_view::npos && comma < colon &&
        absl::SimpleAtoi(w.substr(0, comma), &line) &&
        absl::SimpleAtoi(w.substr(comma + 9, colon - comma - 9), &column)) {
      return absl::StrCat(where, ":", line, ":", column, ": ", l, w.substr(colon + 2));
    }
  }
  absl::ConsumePrefix(&w, "parse error: ");
  return absl::StrCat(where, ": ", l, w);
}

// Deepest array/object nesting of `text`, counting until `stop_above` is exceeded (then that
// depth is returned at once): a check that costs no allocation, made before a DOM is built (the
// DOM of hostile text costs up to ~30x its size, and the parser recurses).
inline int JsonDepth(std::string_view text, int stop_above) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > stop_above) return deepest;
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace gpulet
