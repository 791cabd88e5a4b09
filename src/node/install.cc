#include "node/install.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/fs.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "runtime/cdi.h"
#include "runtime/engine_config.h"

namespace gpulet::node {
namespace {

using nlohmann::json;

constexpr char kRecord[] = "/var/lib/gpulet/install.json";
constexpr char kBackupDir[] = "/var/lib/gpulet/backup";

std::string SelfDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  std::string self = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "/usr/bin/gpulet";
  return self.substr(0, self.rfind('/'));
}

bool IsFile(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Copies `from` to `to` (atomically, with `mode`) unless `to` already has the same bytes.
absl::StatusOr<bool> CopyIfChanged(const std::string& from, const std::string& to, mode_t mode) {
  ASSIGN_OR_RETURN(std::string data, ReadFileToString(from));
  if (auto old = ReadFileToString(to); old.ok() && *old == data) return false;
  RETURN_IF_ERROR(MakeDirs(to.substr(0, to.rfind('/'))));
  RETURN_IF_ERROR(WriteFileAtomic(to, data, mode));
  return true;
}

absl::StatusOr<runtime::Engine> EngineOf(const std::string& name) {
  return runtime::ParseEngine(name);
}

std::string EngineUnit(const std::string& engine) { return engine == "docker" ? "docker" : engine; }

// Records one action in `r` and shows it through `on_action` at once.
struct Actions {
  InstallResult& r;
  const OnAction& on_action;
  void operator()(std::string text) const {
    if (on_action) on_action(text);
    r.actions.push_back(std::move(text));
  }
};

absl::Status Restart(const std::string& command, const std::string& host_root,
                     const std::string& engine, const Actions& add) {
  if (command == "none") {
    add("engine configuration changed; not restarting " + engine + " (--restart none)");
    return absl::OkStatus();
  }
  std::string cmd = command;
  if (command == "auto") {
    cmd = absl::StrCat("systemctl restart ", EngineUnit(engine));
    if (host_root != "/" && !host_root.empty()) cmd = absl::StrCat("chroot ", host_root, " ", cmd);
  }
  int rc = std::system(cmd.c_str());
  if (rc != 0)
    return absl::UnavailableError(
        absl::StrCat("restarting ", engine, " with `", cmd, "` failed (status ", rc, ")"));
  add("restarted " + engine + ": " + cmd);
  return absl::OkStatus();
}

}  // namespace

std::string UnderRoot(const std::string& root, const std::string& p) {
  if (root == "/" || root.empty()) return p;
  // The host's symlinks are followed as the host follows them: an absolute target starts again at
  // `root`, not at this container's "/". Most hosts have /var/run -> /run; without this the
  // default CDI directory /var/run/cdi led into the installer container's own (missing) /run.
  std::vector<std::string> rest = absl::StrSplit(p, '/', absl::SkipEmpty());
  std::reverse(rest.begin(), rest.end());  // a stack: the next component at the back
  std::string done;                        // the resolved host path so far ("" is the root)
  int links = 0;
  while (!rest.empty()) {
    std::string c = std::move(rest.back());
    rest.pop_back();
    if (c == ".") continue;
    if (c == "..") {
      done = done.substr(0, done.empty() ? 0 : done.rfind('/'));
      continue;
    }
    std::string next = done + "/" + c;
    char buf[PATH_MAX];
    ssize_t n = ::readlink((root + next).c_str(), buf, sizeof buf - 1);
    if (n <= 0 || ++links > 40) {  // not a link, absent, or a loop: taken as it is
      done = next;
      continue;
    }
    std::string target(buf, static_cast<size_t>(n));
    std::vector<std::string> parts = absl::StrSplit(target, '/', absl::SkipEmpty());
    rest.insert(rest.end(), parts.rbegin(), parts.rend());
    if (target[0] == '/') done.clear();
  }
  return root + (done.empty() ? "/" : done);
}

absl::StatusOr<std::string> DetectEngine(const std::string& host_root) {
  struct Probe {
    const char* engine;
    std::vector<const char*> paths;
  };
  const Probe probes[] = {
      {"containerd", {"/etc/containerd/config.toml", "/run/containerd/containerd.sock"}},
      {"crio", {"/etc/crio/crio.conf", "/etc/crio/crio.conf.d", "/var/run/crio/crio.sock"}},
      {"docker", {"/etc/docker/daemon.json", "/var/run/docker.sock"}},
  };
  for (const auto& p : probes)
    for (const char* path : p.paths)
      if (::access(UnderRoot(host_root, path).c_str(), F_OK) == 0) return std::string(p.engine);
  return absl::NotFoundError(absl::StrCat(
      "no container engine found under ", host_root,
      " (looked for containerd, CRI-O and Docker configs and sockets); pass --runtime"));
}

absl::StatusOr<InstallResult> Install(const InstallOptions& o, const OnAction& on_action) {
  InstallResult r;
  const Actions add{r, on_action};
  if (o.runtime == "auto") {
    ASSIGN_OR_RETURN(r.engine, DetectEngine(o.host_root));
  } else {
    r.engine = o.runtime;
  }
  ASSIGN_OR_RETURN(runtime::Engine engine, EngineOf(r.engine));

  // The engine's files are read and planned before anything is written: an invalid existing
  // configuration stops the install with nothing placed.
  runtime::ConfigureOptions co;
  co.engine = engine;
  co.root = o.host_root == "/" ? "" : o.host_root;
  co.runtime_path = o.prefix + "/bin/gpulet-container-runtime";
  co.set_as_default = o.set_as_default;
  co.enable_cdi = true;
  std::vector<std::string> notes;
  ASSIGN_OR_RETURN(auto changes, runtime::PlanConfigure(co, &notes));
  // Likewise the CDI spec is generated before anything is written.
  ASSIGN_OR_RETURN(auto gpus, gpu::OpenGpuLayer(o.gpu));
  ASSIGN_OR_RETURN(gpu::Inventory inv, gpus->GetInventory());
  runtime::CdiGenerateOptions cdi;
  cdi.host_root = o.host_root;
  cdi.hook_path = o.prefix + "/bin/gpulet-container-hook";
  std::vector<std::string> warnings;
  ASSIGN_OR_RETURN(runtime::CdiSpec spec, runtime::GenerateCdiSpec(inv, cdi, &warnings));
  // What an earlier install recorded (so a re-run adds to it instead of forgetting files).
  json record = {{"engine", r.engine}, {"files", json::array()}, {"configs", json::array()}};
  if (auto old = ReadFileToString(UnderRoot(o.host_root, kRecord)); old.ok()) {
    json parsed = json::parse(*old, nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object())
      return absl::DataLossError(absl::StrCat(UnderRoot(o.host_root, kRecord),
                                              ": install record is not valid JSON; remove it "
                                              "after checking the engine configuration by hand"));
    record = parsed;
  }
  auto remember_file = [&](const std::string& host_path) {
    for (const auto& f : record["files"])
      if (f == host_path) return;
    record["files"].push_back(host_path);
  };
  // Directories this install is about to create (`dir` and its parents that do not exist yet),
  // so uninstall removes them again when they are empty (issue 22.3).
  if (!record.contains("dirs") || !record["dirs"].is_array()) record["dirs"] = json::array();
  auto remember_dirs = [&](const std::string& dir) {
    for (std::string d = dir; d.size() > 1; d = d.substr(0, d.rfind('/'))) {
      struct stat st;
      if (::stat(UnderRoot(o.host_root, d).c_str(), &st) == 0) break;
      bool known = false;
      for (const auto& k : record["dirs"]) known |= k == d;
      if (!known) record["dirs"].push_back(d);
    }
  };
  auto parent = [](const std::string& path) { return path.substr(0, path.rfind('/')); };
  for (const auto& d : {o.prefix + "/bin", o.prefix + "/lib", o.cdi_dir, parent(kRecord)})
    remember_dirs(d);
  for (const auto& c : changes) {
    std::string host_path = c.path.substr(co.root.size());
    remember_dirs(parent(host_path));
    if (c.existed && c.changed()) remember_dirs(parent(std::string(kBackupDir) + host_path));
  }

  // 1. Runtime pieces onto the host.
  std::string bin = o.artifacts_dir.empty() ? SelfDir() : o.artifacts_dir + "/bin";
  std::string lib = o.artifacts_dir.empty() ? SelfDir() + "/../lib" : o.artifacts_dir + "/lib";
  struct Piece {
    std::string from, to;
    mode_t mode;
    bool required;
  };
  const Piece pieces[] = {
      {bin + "/gpulet-container-runtime", o.prefix + "/bin/gpulet-container-runtime", 0755, true},
      {bin + "/gpulet-container-hook", o.prefix + "/bin/gpulet-container-hook", 0755, true},
      {lib + "/libgpulet-vcuda.so", o.prefix + "/lib/libgpulet-vcuda.so", 0644, false},
  };
  for (const auto& p : pieces)
    if (p.required && !IsFile(p.from))
      return absl::NotFoundError(
          absl::StrCat("cannot install ", p.to, ": ", p.from, " is missing"));
  for (const auto& p : pieces) {
    if (!IsFile(p.from)) {
      add(absl::StrCat("skipped ", p.to, ": ", p.from, " is not built"));
      continue;
    }
    ASSIGN_OR_RETURN(bool changed, CopyIfChanged(p.from, UnderRoot(o.host_root, p.to), p.mode));
    remember_file(p.to);
    add(absl::StrCat(changed ? "installed " : "unchanged ", p.to));
  }

  // 2. The CDI spec for this node's GPUs.
  std::string cdi_path = o.cdi_dir + "/gpulet-nvidia.yaml";
  std::string cdi_text = runtime::CdiSpecToYaml(spec);
  bool cdi_changed = ReadFileToString(UnderRoot(o.host_root, cdi_path)).value_or("") != cdi_text;
  if (cdi_changed) {
    RETURN_IF_ERROR(MakeDirs(UnderRoot(o.host_root, o.cdi_dir)));
    RETURN_IF_ERROR(WriteFileAtomic(UnderRoot(o.host_root, cdi_path), cdi_text, 0644));
  }
  remember_file(cdi_path);
  add(absl::StrCat(cdi_changed ? "wrote " : "unchanged ", cdi_path, " (", spec.devices.size(),
                   " CDI devices)"));
  for (const auto& w : warnings) add("warning: " + w);

  // 3. The engine: keep the pre-install content of every file once, then configure.
  for (const auto& c : changes) {
    if (!c.changed()) continue;
    std::string host_path = c.path.substr(co.root.size());
    if (c.existed) remember_file(host_path + ".bak");  // ApplyChanges' own copy beside the file
    bool known = false;
    for (const auto& k : record["configs"]) known |= k["path"] == host_path;
    if (known) continue;
    json entry = {{"path", host_path}, {"existed", c.existed}};
    if (c.existed) {
      std::string backup = std::string(kBackupDir) + host_path;
      RETURN_IF_ERROR(MakeDirs(UnderRoot(o.host_root, backup.substr(0, backup.rfind('/')))));
      RETURN_IF_ERROR(WriteFileAtomic(UnderRoot(o.host_root, backup), c.before, 0600));
      entry["backup"] = backup;
    }
    record["configs"].push_back(entry);
  }
  // The record goes down before the engine files change: an interrupted install can be undone.
  record["engine"] = r.engine;
  RETURN_IF_ERROR(MakeDirs(UnderRoot(o.host_root, "/var/lib/gpulet")));
  RETURN_IF_ERROR(WriteFileAtomic(UnderRoot(o.host_root, kRecord), record.dump(2) + "\n", 0600));
  RETURN_IF_ERROR(runtime::ApplyChanges(changes));
  for (const auto& c : changes) {
    r.engine_config_changed |= c.changed();
    add(absl::StrCat(c.changed() ? "configured " : "unchanged ", c.path.substr(co.root.size())));
  }
  if (r.engine_config_changed)
    RETURN_IF_ERROR(Restart(o.restart_command, o.host_root, r.engine, add));
  return r;
}

absl::StatusOr<InstallResult> Uninstall(const std::string& host_root,
                                        const std::string& restart_command,
                                        const OnAction& on_action) {
  InstallResult r;
  const Actions add{r, on_action};
  // A root that is not there is a mistake in the command, not an uninstalled host: "nothing to
  // uninstall" with exit 0 would hide it (and leave the real host's install in place).
  std::error_code ec;
  if (!std::filesystem::is_directory(host_root, ec)) {
    return absl::NotFoundError(absl::StrCat("--host-root ", host_root, ": no such directory"));
  }
  auto text = ReadFileToString(UnderRoot(host_root, kRecord));
  if (!text.ok()) {
    add(absl::StrCat("nothing to uninstall: no ", kRecord, " under ", host_root));
    return r;
  }
  json record = json::parse(*text, nullptr, false);
  if (record.is_discarded() || !record.is_object() || !record["files"].is_array() ||
      !record["configs"].is_array())
    return absl::DataLossError(absl::StrCat(UnderRoot(host_root, kRecord),
                                            ": install record is not valid; nothing was changed"));
  r.engine = record.value("engine", "");
  // Host paths through UnderRoot (the host's own symlinks, e.g. /var/run -> /run, followed inside
  // host_root): a plain host_root + path could name a dangling link and remove nothing.
  auto remove = [&](const std::string& path) {
    return RootedFilesystem().Remove(UnderRoot(host_root, path));
  };
  // Engine configuration first, so the engine never points at a shim that is already gone.
  for (const auto& c : record["configs"]) {
    std::string path = c.value("path", "");
    if (c.value("existed", false)) {
      ASSIGN_OR_RETURN(std::string before,
                       ReadFileToString(UnderRoot(host_root, c.value("backup", ""))));
      // The file keeps its mode (install kept it too): a 0600 config may hold credentials.
      struct stat st;
      mode_t mode =
          ::stat(UnderRoot(host_root, path).c_str(), &st) == 0 ? st.st_mode & 07777 : 0644;
      RETURN_IF_ERROR(WriteFileAtomic(UnderRoot(host_root, path), before, mode));
      add("restored " + path);
    } else {
      RETURN_IF_ERROR(remove(path));
      add("removed " + path);
    }
    r.engine_config_changed = true;
    if (c.contains("backup")) RETURN_IF_ERROR(remove(c.value("backup", "")));
  }
  if (r.engine_config_changed && !r.engine.empty())
    RETURN_IF_ERROR(Restart(restart_command, host_root, r.engine, add));
  for (const auto& f : record["files"]) {
    RETURN_IF_ERROR(remove(f.get<std::string>()));
    add("removed " + f.get<std::string>());
  }
  RETURN_IF_ERROR(remove(kRecord));
  add(absl::StrCat("removed ", kRecord));
  // The directories install created, deepest first, each only when empty (something else may
  // have put files there since).
  std::vector<std::string> dirs;
  if (record.contains("dirs") && record["dirs"].is_array())
    for (const auto& d : record["dirs"])
      if (d.is_string() && absl::StartsWith(d.get<std::string>(), "/")) dirs.push_back(d);
  std::sort(dirs.begin(), dirs.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  for (const auto& d : dirs)
    if (::rmdir(UnderRoot(host_root, d).c_str()) == 0) add("removed " + d + "/");
  return r;
}

}  // namespace gpulet::node
