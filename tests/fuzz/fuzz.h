// Shared by the fuzz targets: the input as a string, and a scratch file for parsers that read a
// path (one per process; libFuzzer runs inputs one at a time in a process).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "spdlog/spdlog.h"

namespace gpulet::fuzz {

// Parsers that log what they reject would print a line per input: once, at the first input.
inline void QuietLogs() {
  static const bool once = [] {
    spdlog::set_level(spdlog::level::off);
    return true;
  }();
  (void)once;
}

inline std::string Input(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// A private directory under $TMPDIR made on first use and removed when the process exits.
struct ScratchDir {
  std::string path;
  ScratchDir() {
    std::string t = (std::filesystem::temp_directory_path() / "gpulet-fuzz.XXXXXX").string();
    if (::mkdtemp(t.data())) path = t;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

// This process's scratch directory.
inline const std::string& ScratchRoot() {
  static const ScratchDir scratch;
  return scratch.path;
}

// Writes `text` to <scratch dir>/<name> and returns the path.
inline std::string ScratchFile(const std::string& name, const std::string& text) {
  const std::string& dir = ScratchRoot();
  std::string path = dir + "/" + name;
  std::string parent = path.substr(0, path.rfind('/'));
  for (size_t i = dir.size() + 1; i <= parent.size(); ++i)
    if (i == parent.size() || parent[i] == '/') ::mkdir(parent.substr(0, i).c_str(), 0700);
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  return path;
}

}  // namespace gpulet::fuzz
