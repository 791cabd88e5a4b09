#include "runtime/engine_config.h"

#include <fnmatch.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "toml++/toml.h"

namespace gpulet::runtime {
namespace {

std::string DirOf(const std::string& p) {
  size_t s = p.rfind('/');
  return s == std::string::npos ? "." : (s == 0 ? "/" : p.substr(0, s));
}

// Whether an annotation pass-through entry (a containerd glob, a CRI-O key prefix) lets a pod's
// `cdi.k8s.io/*` annotations into the container config: the shim trusts those as the device
// plugin's (docs/runtime.md, Security), so any pod could then name any GPU.
bool PassesCdiAnnotations(const std::string& p) {
  return ::fnmatch(p.c_str(), "cdi.k8s.io/x", 0) == 0 || absl::StartsWith(p, "cdi.k8s.io") ||
         absl::StartsWith("cdi.k8s.io/", p);
}

// Removes such entries from the copied runc options (`keys`: the engine's pass-through options);
// other entries stay. A note says what was dropped.
void DropCdiPassThrough(toml::table& entry, std::initializer_list<const char*> keys,
                        const std::string& where, std::vector<std::string>* notes) {
  for (const char* key : keys) {
    toml::array* list = entry[key].as_array();
    if (!list) continue;
    toml::array kept;
    std::vector<std::string> dropped;
    for (const auto& e : *list) {
      auto s = e.value<std::string>();
      if (s && PassesCdiAnnotations(*s))
        dropped.push_back(*s);
      else
        kept.push_back(e);
    }
    if (dropped.empty()) continue;
    if (kept.empty())
      entry.erase(key);
    else
      entry.insert_or_assign(key, kept);
    if (notes)
      notes->push_back(absl::StrCat(where, ": not copied into the gpulet runtime's ", key, ": ",
                                    absl::StrJoin(dropped, ", "),
                                    " (pods could set cdi.k8s.io/* annotations and name any GPU)"));
  }
}

// The current content of `path`, or nothing when it does not exist.
absl::StatusOr<FileChange> Current(const std::string& path) {
  FileChange c;
  c.path = path;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return c;
  ASSIGN_OR_RETURN(c.before, ReadFileToString(path));
  c.existed = true;
  c.after = c.before;
  return c;
}

absl::StatusOr<toml::table> ParseToml(const std::string& text, const std::string& path) {
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ":", e.source().begin.line, ": invalid TOML: ", std::string(e.description())));
  }
}

std::string TomlText(const toml::table& t) {
  std::ostringstream out;
  out << t;
  return out.str() + "\n";
}

// The drop-in must be a file of its own: equal to the main config, the main file would import
// itself and the rewrite would lose the runtime entry (it used to, with exit 0).
absl::Status NotTheConfigItself(const ConfigureOptions& o, const std::string& cfg,
                                const std::string& drop) {
  namespace fs = std::filesystem;
  std::error_code e1, e2;
  const fs::path a = fs::weakly_canonical(o.root + cfg, e1);
  const fs::path b = fs::weakly_canonical(o.root + drop, e2);
  const bool same = fs::path(cfg).lexically_normal() == fs::path(drop).lexically_normal() ||
                    (!e1 && !e2 && a == b);
  if (!same) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--drop-in-config ", drop, " is the engine config --config ", cfg,
                   " itself: it would import itself; give a file of its own (default ", DirOf(cfg),
                   o.engine == Engine::kCrio ? "/crio.conf.d/" : "/conf.d/", "99-gpulet.toml)"));
}

// The main file's text with `drop` added to its top-level `imports`, the rest as the user wrote
// it (comments, order, layout): the array is replaced where it stands, or a new `imports` line
// goes first (top-level keys come before any table). Empty when the edit cannot be made in place
// (the caller then rewrites the file, keeping a backup).
std::string WithImport(const std::string& text, const toml::table& top, const std::string& drop) {
  toml::array imports;
  std::string edited;
  if (const toml::array* old = top["imports"].as_array()) {
    imports = *old;
    imports.push_back(drop);
    const toml::source_region& r = old->source();
    // Line/column (1-based) to offsets.
    auto offset = [&text](toml::source_position p) -> size_t {
      size_t at = 0;
      for (uint32_t line = 1; line < p.line && at != std::string::npos; ++line)
        at = text.find('\n', at) == std::string::npos ? std::string::npos : text.find('\n', at) + 1;
      return at == std::string::npos ? at : at + p.column - 1;
    };
    size_t begin = offset(r.begin), end = offset(r.end);
    if (begin == std::string::npos || end == std::string::npos || end <= begin || end > text.size())
      return "";
    std::ostringstream a;
    a << imports;
    edited = text.substr(0, begin) + a.str() + text.substr(end);
  } else {
    imports.push_back(drop);
    std::ostringstream a;
    a << imports;
    edited = "imports = " + a.str() + "  # added by `gpulet runtime configure`\n" + text;
  }
  // Kept only when it reads back as the same config plus the import.
  try {
    toml::table back = toml::parse(edited);
    toml::table want = top;
    want.insert_or_assign("imports", imports);
    if (back == want) return edited;
  } catch (const toml::parse_error&) {
  }
  return "";
}

// t[k1][k2]... as a table, created when missing; nullptr when a key holds a non-table.
toml::table* Path(toml::table& t, std::initializer_list<std::string> keys) {
  toml::table* cur = &t;
  for (const auto& k : keys) {
    if (!cur->contains(k)) cur->insert(k, toml::table{});
    cur = (*cur)[k].as_table();
    if (!cur) return nullptr;
  }
  return cur;
}

absl::StatusOr<std::vector<FileChange>> Containerd(const ConfigureOptions& o,
                                                   std::vector<std::string>* notes) {
  std::string cfg = o.config_path.empty() ? "/etc/containerd/config.toml" : o.config_path;
  std::string drop =
      o.drop_in_path.empty() ? DirOf(cfg) + "/conf.d/99-gpulet.toml" : o.drop_in_path;
  RETURN_IF_ERROR(NotTheConfigItself(o, cfg, drop));
  ASSIGN_OR_RETURN(FileChange main, Current(o.root + cfg));
  toml::table top;
  if (main.existed) {
    ASSIGN_OR_RETURN(top, ParseToml(main.before, cfg));
  }
  int64_t version = 2;  // no file or an empty one: version 2, as containerd 1.x reads it
  if (main.existed && !top.empty()) {
    auto v = top["version"].value<int64_t>();
    if (!v)
      return absl::FailedPreconditionError(absl::StrCat(
          cfg,
          ": containerd config version 1 (no \"version\" key) is not supported; migrate it "
          "with `containerd config migrate`"));
    version = *v;
  }
  if (version != 2 && version != 3)
    return absl::FailedPreconditionError(
        absl::StrCat(cfg, ": unsupported containerd config version ", version, " (2 or 3)"));
  const std::string cri =
      version == 2 ? "io.containerd.grpc.v1.cri" : "io.containerd.cri.v1.runtime";

  // The drop-in starts from a copy of the main file's CRI section: containerd before 2.1 replaces
  // a plugin's section from an imported file instead of merging it (containerd#5837).
  toml::table d;
  d.insert("version", version);
  toml::table* cri_in = Path(d, {"plugins", cri});
  if (auto* src = top["plugins"][cri].as_table()) *cri_in = *src;
  toml::table* runtimes = Path(*cri_in, {"containerd", "runtimes"});
  if (!runtimes)
    return absl::FailedPreconditionError(
        absl::StrCat(cfg, ": plugins.\"", cri, "\".containerd.runtimes is not a table"));
  toml::table entry;
  if (auto* runc = (*runtimes)["runc"].as_table())
    entry = *runc;  // keep the operator's runc options
  DropCdiPassThrough(entry, {"pod_annotations"}, cfg, notes);
  // Container annotations, unlike pod annotations, are written by the kubelet (a device plugin's
  // Allocate answer among them), never by the pod author: containerd 1.6 passes only those listed
  // here to the OCI spec, so the device plugin's cdi-annotations strategy needs cdi.k8s.io/*.
  {
    toml::array* list = entry["container_annotations"].as_array();
    bool passes = false;
    if (list)
      for (const auto& e : *list)
        if (auto s = e.value<std::string>(); s && PassesCdiAnnotations(*s)) passes = true;
    if (!passes) {
      if (!list) {
        entry.insert_or_assign("container_annotations", toml::array{});
        list = entry["container_annotations"].as_array();
      }
      list->push_back("cdi.k8s.io/*");
    }
  }
  entry.insert_or_assign("runtime_type", "io.containerd.runc.v2");
  toml::table* opts = Path(entry, {"options"});
  if (!opts)
    return absl::FailedPreconditionError(absl::StrCat(cfg, ": runc options are not a table"));
  opts->insert_or_assign("BinaryName", o.runtime_path);
  runtimes->insert_or_assign(o.runtime_name, entry);
  if (o.set_as_default)
    Path(*cri_in, {"containerd"})->insert_or_assign("default_runtime_name", o.runtime_name);
  if (o.enable_cdi) {
    cri_in->insert_or_assign("enable_cdi", true);
    if (!cri_in->contains("cdi_spec_dirs"))
      cri_in->insert("cdi_spec_dirs", toml::array{"/etc/cdi", "/var/run/cdi"});
  }
  ASSIGN_OR_RETURN(FileChange dropin, Current(o.root + drop));
  dropin.after =
      absl::StrCat("# Written by `gpulet runtime configure`; edit with it.\n", TomlText(d));

  // The main file imports the drop-in and states its version.
  const toml::table as_written = top;
  bool imported = false;
  if (auto* imports = top["imports"].as_array()) {
    for (const auto& i : *imports) imported |= i.value<std::string>() == drop;
    if (!imported) imports->push_back(drop);
  } else if (top.contains("imports")) {
    return absl::FailedPreconditionError(absl::StrCat(cfg, ": \"imports\" is not an array"));
  } else {
    top.insert("imports", toml::array{drop});
  }
  if (!imported || !as_written.contains("version")) {
    top.insert_or_assign("version", version);
    // An existing file gets the import in place, its comments and layout kept; a new or empty one
    // (or one the in-place edit cannot be made in) is written whole, the original kept as .bak.
    std::string in_place = main.existed && as_written.contains("version")
                               ? WithImport(main.before, as_written, drop)
                               : std::string();
    if (!in_place.empty()) {
      main.after = in_place;
    } else {
      main.after = TomlText(top);
      if (main.existed && notes)
        notes->push_back(absl::StrCat(cfg,
                                      " is rewritten to add \"imports\": comments in it are not "
                                      "kept (the original is saved as ",
                                      cfg, ".bak)"));
    }
  }
  std::vector<FileChange> out{dropin, main};

  // Another tool's drop-in that containerd loads after ours and that sets the CRI plugin section
  // would win: containerd loads imports in order, each file once, globs sorted (so NVIDIA's
  // conf.d/99-nvidia.toml comes after conf.d/99-gpulet.toml), and before 2.1 a later plugin
  // section replaces an earlier one whole. A node moving from NVIDIA's toolkit to gpulet would keep
  // NVIDIA's runtime. Such a file is emptied (kept in <file>.bak, named in a note); configuring
  // NVIDIA's toolkit again rewrites it, and then it wins again (tests/compat/runtime_configure.sh).
  std::vector<std::string> order;
  if (auto* imports = top["imports"].as_array()) {
    for (const auto& i : *imports) {
      auto pattern = i.value<std::string>();
      if (!pattern) continue;
      glob_t g{};
      std::vector<std::string> found;
      if (::glob((o.root + *pattern).c_str(), 0, nullptr, &g) == 0)
        for (size_t k = 0; k < g.gl_pathc; ++k)
          found.push_back(std::string(g.gl_pathv[k]).substr(o.root.size()));
      ::globfree(&g);
      // Ours may not be written yet: where containerd will find it.
      if (std::find(found.begin(), found.end(), drop) == found.end() &&
          ::fnmatch(pattern->c_str(), drop.c_str(), FNM_PATHNAME) == 0) {
        found.push_back(drop);
        std::sort(found.begin(), found.end());
      }
      for (const auto& f : found)
        if (std::find(order.begin(), order.end(), f) == order.end()) order.push_back(f);
    }
  }
  auto ours = std::find(order.begin(), order.end(), drop);
  for (auto it = ours == order.end() ? order.end() : ours + 1; it != order.end(); ++it) {
    ASSIGN_OR_RETURN(FileChange other, Current(o.root + *it));
    if (!other.existed) continue;
    ASSIGN_OR_RETURN(toml::table t, ParseToml(other.before, *it));
    if (!t["plugins"][cri].as_table()) continue;
    other.after = absl::StrCat("# Emptied by `gpulet runtime configure`: its plugins.\"", cri,
                               "\" section, loaded after ", drop, ", would replace gpulet's.\n",
                               "# The original is ", *it, ".bak.\nversion = ", version, "\n");
    if (notes)
      notes->push_back(absl::StrCat(*it, " (another tool's drop-in, loaded after ", drop,
                                    ") set plugins.\"", cri,
                                    "\" and would override gpulet's runtime: "
                                    "emptied, the original saved as ",
                                    *it, ".bak"));
    out.push_back(std::move(other));
  }
  if (notes) notes->push_back("restart containerd to apply the change");
  return out;
}

absl::StatusOr<std::vector<FileChange>> Docker(const ConfigureOptions& o,
                                               std::vector<std::string>* notes) {
  using Json = nlohmann::ordered_json;
  if (!o.drop_in_path.empty())
    return absl::InvalidArgumentError("docker has no drop-in configuration");
  std::string cfg = o.config_path.empty() ? "/etc/docker/daemon.json" : o.config_path;
  ASSIGN_OR_RETURN(FileChange c, Current(o.root + cfg));
  Json j = Json::object();
  if (c.existed && !c.before.empty()) {
    try {
      j = Json::parse(c.before);
    } catch (const Json::exception& e) {
      // Not only parse_error: a number out of range (1e999) is out_of_range.
      return absl::InvalidArgumentError(JsonErrorText(cfg, e.what(), "invalid JSON"));
    }
    if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(cfg, ": not a JSON object"));
  }
  Json before = j;
  if (!j.contains("runtimes")) j["runtimes"] = Json::object();
  if (!j["runtimes"].is_object())
    return absl::FailedPreconditionError(absl::StrCat(cfg, ": \"runtimes\" is not an object"));
  j["runtimes"][o.runtime_name] = {{"args", Json::array()}, {"path", o.runtime_path}};
  if (o.set_as_default) j["default-runtime"] = o.runtime_name;
  if (o.enable_cdi) {
    if (!j.contains("features")) j["features"] = Json::object();
    if (!j["features"].is_object())
      return absl::FailedPreconditionError(absl::StrCat(cfg, ": \"features\" is not an object"));
    j["features"]["cdi"] = true;
  }
  if (j != before || !c.existed) {  // same content: leave the text alone
    try {
      c.after = j.dump(4) + "\n";
    } catch (const Json::exception& e) {  // a runtime path that is not UTF-8
      return absl::InvalidArgumentError(
          absl::StrCat(cfg, ": cannot write the new content: ", e.what()));
    }
  }
  if (notes) notes->push_back("restart dockerd to apply the change");
  return std::vector<FileChange>{c};
}

absl::StatusOr<std::vector<FileChange>> Crio(const ConfigureOptions& o,
                                             std::vector<std::string>* notes) {
  std::string cfg = o.config_path.empty() ? "/etc/crio/crio.conf" : o.config_path;
  std::string drop =
      o.drop_in_path.empty() ? DirOf(cfg) + "/crio.conf.d/99-gpulet.toml" : o.drop_in_path;
  RETURN_IF_ERROR(NotTheConfigItself(o, cfg, drop));
  ASSIGN_OR_RETURN(FileChange main, Current(o.root + cfg));
  toml::table top;
  if (main.existed) {
    ASSIGN_OR_RETURN(top, ParseToml(main.before, cfg));
  }
  toml::table d;
  toml::table entry;
  for (const char* base : {"runc", "crun"})
    if (auto* t = top["crio"]["runtime"]["runtimes"][base].as_table()) {
      entry = *t;  // keep the operator's options for the low-level runtime
      break;
    }
  DropCdiPassThrough(entry, {"allowed_annotations"}, cfg, notes);
  entry.insert_or_assign("runtime_path", o.runtime_path);
  entry.insert_or_assign("runtime_type", "oci");
  Path(d, {"crio", "runtime", "runtimes"})->insert_or_assign(o.runtime_name, entry);
  if (o.set_as_default)
    Path(d, {"crio", "runtime"})->insert_or_assign("default_runtime", o.runtime_name);
  if (o.enable_cdi && notes)
    notes->push_back("CRI-O reads CDI specs by default; --enable-cdi changes nothing");
  ASSIGN_OR_RETURN(FileChange dropin, Current(o.root + drop));
  dropin.after =
      absl::StrCat("# Written by `gpulet runtime configure`; edit with it.\n", TomlText(d));
  if (notes) notes->push_back("restart crio to apply the change");
  return std::vector<FileChange>{dropin};
}

}  // namespace

absl::StatusOr<Engine> ParseEngine(const std::string& s) {
  if (s == "containerd") return Engine::kContainerd;
  if (s == "docker") return Engine::kDocker;
  if (s == "crio" || s == "cri-o") return Engine::kCrio;
  return absl::InvalidArgumentError(
      absl::StrCat("runtime \"", s, "\" is not containerd, docker or crio"));
}

absl::StatusOr<std::vector<FileChange>> PlanConfigure(const ConfigureOptions& o,
                                                      std::vector<std::string>* notes) {
  if (o.runtime_path.empty() || o.runtime_path[0] != '/')
    return absl::InvalidArgumentError(
        absl::StrCat("the runtime path \"", o.runtime_path, "\" is not absolute"));
  if (o.runtime_name.empty()) return absl::InvalidArgumentError("empty runtime name");
  switch (o.engine) {
    case Engine::kContainerd:
      return Containerd(o, notes);
    case Engine::kDocker:
      return Docker(o, notes);
    case Engine::kCrio:
      return Crio(o, notes);
  }
  return absl::InternalError("unknown engine");
}

absl::Status ApplyChanges(const std::vector<FileChange>& changes) {
  for (const auto& c : changes) {
    if (!c.changed()) continue;
    // An existing file keeps its mode and owner (daemon.json or config.toml may hold registry
    // credentials and be 0600); new drop-ins are 0644.
    struct stat st;
    bool had = c.existed && ::stat(c.path.c_str(), &st) == 0;
    mode_t mode = had ? (st.st_mode & 07777) : 0644;
    auto named = [&](const absl::Status& s) {  // the target, not WriteFileAtomic's temporary
      return absl::Status(s.code(), absl::StrCat("cannot write ", c.path, ": ", s.message()));
    };
    if (c.existed) {
      absl::Status s = WriteFileAtomic(c.path + ".bak", c.before, 0600);
      if (!s.ok()) return named(s);
    }
    std::string dir = DirOf(c.path);
    if (::access(dir.c_str(), F_OK) != 0) {
      // drop-in directories (conf.d) may not exist yet
      if (absl::Status s = MakeDirs(dir); !s.ok()) return named(s);
    }
    if (absl::Status s = WriteFileAtomic(c.path, c.after, mode); !s.ok()) return named(s);
    if (had && (::chown(c.path.c_str(), st.st_uid, st.st_gid) != 0 ||
                ::chmod(c.path.c_str(), mode) != 0))  // chown may clear set-id bits: mode again
      return absl::InternalError(
          absl::StrCat("cannot keep the owner and mode of ", c.path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

namespace {

// A text as lines for the diff: each line's text and whether a newline ends it (only the last
// line of a file can lack one; "\ No newline at end of file" then).
struct Line {
  std::string text;
  bool eol = true;
  bool operator==(const Line& o) const { return text == o.text && eol == o.eol; }
};
std::vector<Line> Lines(const std::string& s) {
  std::vector<Line> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find('\n', i);
    if (j == std::string::npos) {
      out.push_back({s.substr(i), false});
      break;
    }
    out.push_back({s.substr(i, j - i), true});
    i = j + 1;
  }
  return out;
}

}  // namespace

std::string UnifiedDiff(const FileChange& c) {
  std::vector<Line> a = c.existed ? Lines(c.before) : std::vector<Line>{}, b = Lines(c.after);
  // Longest common subsequence table (config files are small).
  size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> l(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = n; i-- > 0;)
    for (size_t j = m; j-- > 0;)
      l[i][j] = a[i] == b[j] ? l[i + 1][j + 1] + 1 : std::max(l[i + 1][j], l[i][j + 1]);
  struct Op {
    char kind;
    const Line* line;
  };
  std::vector<Op> ops;
  size_t i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] == b[j])
      ops.push_back({' ', &a[i++]}), ++j;
    else if (i < n && (j == m || l[i + 1][j] >= l[i][j + 1]))
      ops.push_back({'-', &a[i++]});
    else
      ops.push_back({'+', &b[j++]});
  }
  std::string out = absl::StrCat("--- ", c.existed ? c.path : "/dev/null", "\n+++ ", c.path, "\n");
  // Hunks: changed ops with 3 lines of context, merged when their contexts touch.
  constexpr size_t kContext = 3;
  size_t k = 0, old_line = 0, new_line = 0;  // lines of a and b before ops[k]
  while (k < ops.size()) {
    size_t first = k;
    while (first < ops.size() && ops[first].kind == ' ') ++first;
    if (first == ops.size()) break;
    size_t start = first >= k + kContext ? first - kContext : k;
    for (size_t x = k; x < start; ++x) ++old_line, ++new_line;  // unchanged lines skipped
    size_t end = first;                                         // one past the hunk's last op
    for (size_t x = first; x < ops.size(); ++x) {
      if (ops[x].kind != ' ') {
        end = x + 1;
      } else if (x - end + 1 > 2 * kContext) {
        break;
      }
    }
    end = std::min(ops.size(), end + kContext);
    size_t old_count = 0, new_count = 0;
    std::string body;
    for (size_t x = start; x < end; ++x) {
      if (ops[x].kind != '+') ++old_count;
      if (ops[x].kind != '-') ++new_count;
      absl::StrAppend(&body, std::string(1, ops[x].kind), ops[x].line->text, "\n");
      if (!ops[x].line->eol) body += "\\ No newline at end of file\n";
    }
    // A range of no lines starts at the line before it (0 at the top), as diff -u writes it.
    absl::StrAppend(&out, "@@ -", old_count ? old_line + 1 : old_line, ",", old_count, " +",
                    new_count ? new_line + 1 : new_line, ",", new_count, " @@\n", body);
    old_line += old_count, new_line += new_count;
    k = end;
  }
  return out;
}

}  // namespace gpulet::runtime
