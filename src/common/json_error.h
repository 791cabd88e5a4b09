// nlohmann::json's exceptions as a user reads them: "FILE:LINE:COLUMN: LABEL: what" for a syntax
// error, "FILE: LABEL: what" otherwise (no "LABEL: " when it is empty), without the library's
// "[json.exception.parse_error.101] parse error at line 1, column 1: " prefix (an internal code,
// and the position in its own words). Header-only: it needs no library but the one whose exceptions
// it reads.
#pragma once

#include <string>

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

}  // namespace gpulet
