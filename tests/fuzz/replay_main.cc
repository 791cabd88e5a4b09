// The main() of a fuzz target when it is not linked with libFuzzer (GCC builds, CI's ASan run):
// feeds LLVMFuzzerTestOneInput every seed file of the corpus directories given, then deterministic
// mutations of each seed, so every parser sees hostile input on every test run without clang.
// Coverage-guided fuzzing is `make fuzz` (clang + libFuzzer, preset "fuzz"); this replays and
// perturbs, it does not explore. Written by hand because libFuzzer's own driver needs clang's
// -fsanitize=fuzzer, which GCC does not have.
//
// One executable, fuzz_replay, holds every target (CMakeLists.txt compiles them in two translation
// units: the targets are a few lines each over the same heavy headers, and CI builds them twice).
//
// usage: fuzz_replay TARGET CORPUS_DIR... [--mutations N]   (default 2000 per seed; exit 0, or a
// crash). Environment: GPULET_FUZZ_LAST (see Run).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "tests/fuzz/replay.h"

namespace {

int (*target)(const uint8_t* data, size_t size) = nullptr;

// Tokens that broke parsers before (issue 14): huge numbers, deep nesting, bad UTF-8, types.
const char* const kTokens[] = {"1e999",
                               "-1",
                               "18446744073709551616",
                               "5e370551615",
                               "\xff\xfe",
                               "[[[[[[[[",
                               "{\"\":{",
                               "null",
                               "\"\"",
                               "0x7fffffff",
                               "-9223372036854775808",
                               "\n---\n",
                               "\t",
                               "%",
                               "'"};

std::string Mutate(const std::string& seed, std::mt19937_64& rng) {
  std::string s = seed;
  int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    size_t at = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 6) {
      case 0:  // flip a bit
        if (!s.empty()) s[at % s.size()] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:  // truncate
        s.resize(at);
        break;
      case 2:  // delete a run
        if (at < s.size()) s.erase(at, 1 + rng() % 16);
        break;
      case 3:  // insert a token
        s.insert(at, kTokens[rng() % std::size(kTokens)]);
        break;
      case 4:  // duplicate a chunk (repetition, nesting)
        if (at < s.size()) s.insert(at, s.substr(at, 1 + rng() % 64));
        break;
      case 5:  // overwrite a byte with a structural one
        if (!s.empty()) s[at % s.size()] = "{}[]:,\"\\-0"[rng() % 10];
        break;
    }
  }
  return s;
}

// With GPULET_FUZZ_LAST=FILE each input is written there before it runs, so the one that crashed
// (or hung, or ran out of memory) is left behind to replay: `fuzz_replay TARGET DIR_WITH_THAT_FILE
// --mutations 0`.
void Run(const std::string& input) {
  if (const char* last = std::getenv("GPULET_FUZZ_LAST")) {
    std::ofstream(last, std::ios::binary | std::ios::trunc) << input;
  }
  target(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

}  // namespace

int main(int argc, char** argv) {
  int mutations = 2000;
  std::vector<std::string> seeds;
  for (size_t t = 0; argc > 1 && t < kFuzzTargetCount; ++t)
    if (std::strcmp(argv[1], kFuzzTargets[t].name) == 0) target = kFuzzTargets[t].run;
  if (!target) {
    std::string names;
    for (size_t t = 0; t < kFuzzTargetCount; ++t) names += std::string(" ") + kFuzzTargets[t].name;
    std::fprintf(stderr, "usage: %s TARGET CORPUS_DIR... [--mutations N]; TARGET is one of:%s\n",
                 argv[0], names.c_str());
    return 2;
  }
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--mutations") == 0 && i + 1 < argc) {
      mutations = std::atoi(argv[++i]);
      continue;
    }
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(argv[i], ec)) {
      std::ifstream f(e.path(), std::ios::binary);
      seeds.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    if (ec) {
      std::fprintf(stderr, "%s: %s\n", argv[i], ec.message().c_str());
      return 2;
    }
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "usage: %s TARGET CORPUS_DIR... [--mutations N] (no seed files found)\n",
                 argv[0]);
    return 2;
  }
  Run("");
  // A 100000-deep array, as the review's scheduler crash: every JSON/YAML parser meets it.
  Run(std::string(100000, '['));
  std::mt19937_64 rng(20261126);
  size_t runs = 2;
  for (const auto& seed : seeds) {
    Run(seed);
    for (int m = 0; m < mutations; ++m) Run(Mutate(seed, rng));
    runs += 1 + static_cast<size_t>(mutations);
  }
  std::printf("%zu seeds, %zu inputs: no crash\n", seeds.size(), runs);
  return 0;
}
