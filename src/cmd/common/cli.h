// One command-line convention for every gpulet binary (issue 22): a usage error prints CLI11's
// message, a "did you mean" for a mistyped flag or command, and exits 2; --help and --version
// exit 0. Header-only: the three mains include it and nothing else does.
#pragma once

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace gpulet::cmd {

inline constexpr int kUsageError = 2;

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

// Every long flag and subcommand name reachable from `app`.
inline void Names(const CLI::App& app, std::vector<std::string>* out) {
  for (const CLI::Option* o : app.get_options())
    for (const auto& l : o->get_lnames()) out->push_back("--" + l);
  for (const CLI::App* sub : app.get_subcommands({})) {
    out->push_back(sub->get_name());
    Names(*sub, out);
  }
}

}  // namespace internal

// The closest of `names` (known flags and commands) to `word` (empty when nothing is close).
inline std::string DidYouMean(const std::vector<std::string>& names, const std::string& word) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 4) + 1;
  for (const auto& n : names) {
    size_t d = internal::Distance(word, n);
    if (d < best_d) best_d = d, best = n;
  }
  return best;
}

// Parses; returns the exit status when the program should stop here (help, version, usage error).
inline std::optional<int> Parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    if (rc == 0) return 0;
    // A word that is no known flag or command (a typo): name the closest known one.
    std::vector<std::string> names;
    internal::Names(app, &names);
    for (int i = 1; i < argc; ++i) {
      std::string word = argv[i];
      word = word.substr(0, word.find('='));
      bool flag = word.rfind("--", 0) == 0;
      bool command = i == 1 && !word.empty() && word[0] != '-' && !app.get_subcommands({}).empty();
      if (!flag && !command) continue;
      if (std::find(names.begin(), names.end(), word) != names.end()) continue;
      std::string hint = DidYouMean(names, word);
      if (!hint.empty()) {
        std::fprintf(stderr, "Did you mean %s?\n", hint.c_str());
        break;
      }
    }
    return kUsageError;
  }
  return std::nullopt;
}

}  // namespace gpulet::cmd
