// Test helpers around expositions: run `promtool check metrics` on one, read family names, types
// and label names back out of the text format, and inflate a gzip-encoded scrape (independent
// readers, not our writer).
#pragma once

#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>

namespace gpulet::testing_metrics {

inline bool HavePromtool() { return system("command -v promtool >/dev/null 2>&1") == 0; }

struct ToolResult {
  int rc = -1;
  std::string output;
};

// Runs a shell command, capturing stdout+stderr.
inline ToolResult RunCommand(const std::string& cmd) {
  ToolResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// promtool check metrics: rc 0 = clean, 3 = lint findings, 1 = parse error.
inline ToolResult PromtoolCheckMetrics(const std::string& exposition) {
  char path[] = "/tmp/gpulet-expo-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return {};
  ssize_t w = write(fd, exposition.data(), exposition.size());
  close(fd);
  if (w != static_cast<ssize_t>(exposition.size())) return {};
  ToolResult r = RunCommand(std::string("promtool check metrics < ") + path);
  unlink(path);
  return r;
}

struct FamilyShape {
  std::string type;
  std::set<std::string> labels;  // union over the family's samples
  int samples = 0;
};

// Family name -> type and label names, from text format 0.0.4.
inline std::map<std::string, FamilyShape> ReadShapes(const std::string& text) {
  std::map<std::string, FamilyShape> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      out[name].type = type;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    size_t end = line.find_first_of("{ ");
    std::string name = line.substr(0, end);
    FamilyShape& f = out[name];
    ++f.samples;
    if (end == std::string::npos || line[end] != '{') continue;
    size_t i = end + 1;
    while (i < line.size() && line[i] != '}') {
      size_t eq = line.find('=', i);
      f.labels.insert(line.substr(i, eq - i));
      i = eq + 2;  // past ="
      while (i < line.size() && line[i] != '"') i += line[i] == '\\' ? 2 : 1;
      i += 1;  // closing quote
      if (i < line.size() && line[i] == ',') ++i;
    }
  }
  return out;
}

inline std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Inflates a gzip stream with zlib (an independent decoder); "" unless it is exactly one complete
// member with nothing after it.
inline std::string Gunzip(std::string_view gz) {
  z_stream z{};
  if (inflateInit2(&z, 15 + 16) != Z_OK) return "";
  std::string out(8 << 20, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gz.data()));
  z.avail_in = static_cast<uInt>(gz.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  int r = inflate(&z, Z_FINISH);
  out.resize(z.total_out);
  bool whole = r == Z_STREAM_END && z.avail_in == 0;
  inflateEnd(&z);
  return whole ? out : "";
}

}  // namespace gpulet::testing_metrics
