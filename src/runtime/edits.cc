#include "runtime/edits.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/json.h"
#include "common/status.h"

namespace gpulet::runtime {

void ContainerEdits::Merge(const ContainerEdits& other) {
  for (const auto& e : other.env) env.push_back(e);
  std::set<std::string> dev_paths, mount_paths;
  for (const auto& d : device_nodes) dev_paths.insert(d.path);
  for (const auto& m : mounts) mount_paths.insert(m.container_path);
  for (const auto& d : other.device_nodes)
    if (dev_paths.insert(d.path).second) device_nodes.push_back(d);
  for (const auto& m : other.mounts)
    if (mount_paths.insert(m.container_path).second) mounts.push_back(m);
  for (const auto& h : other.hooks) hooks.push_back(h);
}

absl::Status ResolveDeviceNodes(std::vector<DeviceNode>& nodes) {
  for (auto& d : nodes) {
    if (d.major && d.minor && !d.type.empty() && d.file_mode) continue;
    const std::string& host = d.host_path.empty() ? d.path : d.host_path;
    struct stat st;
    if (::stat(host.c_str(), &st) != 0)
      return absl::NotFoundError(
          absl::StrCat("device node ", host, " is not available: ", std::strerror(errno)));
    if (!S_ISCHR(st.st_mode) && !S_ISBLK(st.st_mode))
      return absl::FailedPreconditionError(absl::StrCat(host, " is not a device node"));
    if (!d.major) d.major = major(st.st_rdev);
    if (!d.minor) d.minor = minor(st.st_rdev);
    if (d.type.empty()) d.type = S_ISCHR(st.st_mode) ? "c" : "b";
    if (!d.file_mode) d.file_mode = st.st_mode & 07777;
  }
  return absl::OkStatus();
}

namespace {

std::string EnvKey(const std::string& kv) { return kv.substr(0, kv.find('=')); }

absl::Status ExpectObject(Json& parent, const char* key, const char* where) {
  if (!parent.contains(key) || parent[key].is_null()) parent[key] = Json::object();
  if (!parent[key].is_object())
    return absl::InvalidArgumentError(absl::StrCat("OCI spec: ", where, " is not an object"));
  return absl::OkStatus();
}
absl::Status ExpectArray(Json& parent, const char* key, const char* where) {
  if (!parent.contains(key) || parent[key].is_null()) parent[key] = Json::array();
  if (!parent[key].is_array())
    return absl::InvalidArgumentError(absl::StrCat("OCI spec: ", where, " is not an array"));
  return absl::OkStatus();
}

// linux.resources.devices allow rules for resolved nodes (the cgroup device filter runc applies).
absl::Status AddDeviceRules(const std::vector<DeviceNode>& nodes, Json& spec) {
  if (!spec.is_object()) return absl::InvalidArgumentError("OCI spec is not a JSON object");
  RETURN_IF_ERROR(ExpectObject(spec, "linux", "linux"));
  RETURN_IF_ERROR(ExpectObject(spec["linux"], "resources", "linux.resources"));
  RETURN_IF_ERROR(ExpectArray(spec["linux"]["resources"], "devices", "linux.resources.devices"));
  Json& rules = spec["linux"]["resources"]["devices"];
  for (const auto& d : nodes) {
    if (!d.major || !d.minor)
      return absl::InternalError(absl::StrCat("device node ", d.path, " has no major/minor"));
    Json rule = {{"allow", true},
                 {"type", d.type},
                 {"major", *d.major},
                 {"minor", *d.minor},
                 {"access", d.permissions.empty() ? "rwm" : d.permissions}};
    if (std::find(rules.begin(), rules.end(), rule) == rules.end()) rules.push_back(rule);
  }
  return absl::OkStatus();
}

absl::Status ApplyTo(const ContainerEdits& edits, Json& spec) {
  if (!spec.is_object()) return absl::InvalidArgumentError("OCI spec is not a JSON object");
  if (!edits.env.empty()) {
    RETURN_IF_ERROR(ExpectObject(spec, "process", "process"));
    RETURN_IF_ERROR(ExpectArray(spec["process"], "env", "process.env"));
    Json& env = spec["process"]["env"];
    for (const auto& kv : edits.env) {
      bool replaced = false;
      for (auto& e : env) {
        if (e.is_string() && EnvKey(e.get<std::string>()) == EnvKey(kv)) {
          e = kv;
          replaced = true;
        }
      }
      if (!replaced) env.push_back(kv);
    }
  }
  if (!edits.device_nodes.empty()) {
    RETURN_IF_ERROR(ExpectObject(spec, "linux", "linux"));
    Json& linux = spec["linux"];
    RETURN_IF_ERROR(ExpectArray(linux, "devices", "linux.devices"));
    RETURN_IF_ERROR(AddDeviceRules(edits.device_nodes, spec));
    for (const auto& d : edits.device_nodes) {
      bool present = false;
      for (const auto& e : linux["devices"])
        present |= e.is_object() && e.value("path", "") == d.path;
      if (!present) {
        Json dev = {{"path", d.path}, {"type", d.type}, {"major", *d.major}, {"minor", *d.minor}};
        if (d.file_mode) dev["fileMode"] = *d.file_mode;
        dev["uid"] = d.uid.value_or(0);
        dev["gid"] = d.gid.value_or(0);
        linux["devices"].push_back(dev);
      }
    }
  }
  if (!edits.mounts.empty()) {
    RETURN_IF_ERROR(ExpectArray(spec, "mounts", "mounts"));
    for (const auto& m : edits.mounts) {
      bool present = false;
      for (const auto& e : spec["mounts"])
        present |= e.is_object() && e.value("destination", "") == m.container_path;
      if (present) continue;
      Json mount = {{"destination", m.container_path},
                    {"type", m.type.empty() ? "bind" : m.type},
                    {"source", m.host_path}};
      mount["options"] =
          m.options.empty() ? std::vector<std::string>{"ro", "nosuid", "nodev", "rbind", "rprivate"}
                            : m.options;
      spec["mounts"].push_back(mount);
    }
  }
  if (!edits.hooks.empty()) {
    RETURN_IF_ERROR(ExpectObject(spec, "hooks", "hooks"));
    for (const auto& h : edits.hooks) {
      Json& list = spec["hooks"][h.hook_name];
      if (list.is_null()) list = Json::array();
      if (!list.is_array())
        return absl::InvalidArgumentError(
            absl::StrCat("OCI spec: hooks.", h.hook_name, " is not an array"));
      Json hook = {{"path", h.path}};
      if (!h.args.empty()) hook["args"] = h.args;
      if (!h.env.empty()) hook["env"] = h.env;
      if (h.timeout) hook["timeout"] = *h.timeout;
      list.push_back(hook);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AllowDevices(const std::vector<DeviceNode>& nodes, Json& spec) {
  Json copy = spec;
  RETURN_IF_ERROR(AddDeviceRules(nodes, copy));
  spec = std::move(copy);
  return absl::OkStatus();
}

absl::Status ApplyEdits(const ContainerEdits& edits, Json& spec) {
  Json copy = spec;  // all or nothing: the caller's spec changes only when every edit applies
  RETURN_IF_ERROR(ApplyTo(edits, copy));
  spec = std::move(copy);
  return absl::OkStatus();
}

absl::StatusOr<Json> LoadOciSpec(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  Json spec = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (spec.is_discarded()) {
    // Re-parse with exceptions only to get the position of the error for the message.
    try {
      Json unused = Json::parse(text);
      (void)unused;
    } catch (const Json::exception& e) {
      // Not only parse_error: a number out of range (5e370551615) is out_of_range.
      return absl::InvalidArgumentError(JsonErrorText(path, e.what(), "invalid JSON"));
    }
    return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON"));
  }
  if (!spec.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  for (const char* key : {"ociVersion", "process", "root"}) {
    if (!spec.contains(key))
      return absl::InvalidArgumentError(absl::StrCat(path, ": OCI spec has no \"", key, "\""));
  }
  if (!spec["ociVersion"].is_string() || !spec["process"].is_object() || !spec["root"].is_object())
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ociVersion must be a string, process and root objects"));
  if (spec["process"].contains("env") && !spec["process"]["env"].is_array())
    return absl::InvalidArgumentError(absl::StrCat(path, ": process.env is not an array"));
  if (!spec["root"].contains("path") || !spec["root"]["path"].is_string())
    return absl::InvalidArgumentError(absl::StrCat(path, ": root.path is not a string"));
  return spec;
}

absl::Status SaveOciSpec(const std::string& path, const Json& spec) {
  // Atomic for readers (temp file + rename), but without fsync: it cost most of the shim's time on
  // a busy disk, and after a crash the container being created is gone anyway.
  struct stat st;
  mode_t mode = ::stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0644;
  std::string tmp = absl::StrCat(path, ".gpulet-", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0)
    return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  std::string text;
  try {
    text = spec.dump() + "\n";
  } catch (const Json::exception& e) {  // a string that is not UTF-8 (from a CDI spec or a path)
    return absl::InvalidArgumentError(absl::StrCat("cannot write ", path, ": ", e.what()));
  }
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(err)));
    }
    off += static_cast<size_t>(n);
  }
  ::fchmod(fd, mode);
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot replace ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

std::string CleanPath(const std::string& path) {
  bool abs = !path.empty() && path[0] == '/';
  std::vector<std::string> parts;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    std::string part = path.substr(i, j - i);
    i = j + 1;
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty() && parts.back() != "..")
        parts.pop_back();
      else if (!abs)
        parts.push_back(part);
      continue;
    }
    parts.push_back(part);
  }
  std::string out = abs ? "/" : "";
  for (size_t k = 0; k < parts.size(); ++k) {
    if (k) out += '/';
    out += parts[k];
  }
  return out.empty() ? "." : out;
}

std::optional<std::string> GetEnv(const std::vector<std::string>& env, const std::string& key) {
  std::optional<std::string> found;  // the last definition wins, as in execve's environment
  for (const auto& kv : env)
    if (kv.size() > key.size() && kv.compare(0, key.size(), key) == 0 && kv[key.size()] == '=')
      found = kv.substr(key.size() + 1);
    else if (kv == key)
      found = "";
  return found;
}

std::optional<std::string> GetEnv(const Json& spec, const std::string& key) {
  std::vector<std::string> env;
  if (spec.contains("process") && spec["process"].is_object() && spec["process"].contains("env") &&
      spec["process"]["env"].is_array())
    for (const auto& e : spec["process"]["env"])
      if (e.is_string()) env.push_back(e.get<std::string>());
  return GetEnv(env, key);
}

}  // namespace gpulet::runtime
