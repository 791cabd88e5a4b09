// "Did you mean": the closest known name to a mistyped one, for every binary's usage errors
// (cli.h for the CLI11 mains; the static OCI hook, which parses its few words by hand).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace gpulet {

namespace internal {

// Edit distance, for suggestions only (names are short): written here because CLI11 has no
// suggestion feature and no Debian library for this is worth a dependency.
inline size_t Distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace internal

// The closest of `names` (known flags and commands) to `word` (empty when nothing is close); else
// the one name that `word` begins (--power for --power-mw: a unit left out is three edits).
inline std::string DidYouMean(const std::vector<std::string>& names, const std::string& word) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 4) + 1;
  for (const auto& n : names) {
    size_t d = internal::Distance(word, n);
    if (d < best_d) best_d = d, best = n;
  }
  if (!best.empty() || word.size() < 4) return best;
  for (const auto& n : names) {
    if (n.size() <= word.size() || n.compare(0, word.size(), word) != 0) continue;
    if (!best.empty()) return "";  // two names begin so: no guess
    best = n;
  }
  return best;
}

}  // namespace gpulet
