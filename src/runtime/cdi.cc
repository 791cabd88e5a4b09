#include "runtime/cdi.h"

#include <dirent.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/fs.h"
#include "common/status.h"
#include "gpu/device_nodes.h"
#include "runtime/driver.h"
#include "yaml-cpp/yaml.h"

namespace gpulet::runtime {
namespace {

const std::set<std::string>& KnownVersions() {
  static const std::set<std::string> k = {"0.3.0", "0.4.0", "0.5.0", "0.6.0",
                                          "0.7.0", "0.8.0", "1.0.0", "1.1.0"};
  return k;
}
const std::set<std::string>& HookNames() {
  static const std::set<std::string> k = {"prestart",       "createRuntime", "createContainer",
                                          "startContainer", "poststart",     "poststop"};
  return k;
}

bool ValidName(const std::string& n) {
  return !n.empty() && std::all_of(n.begin(), n.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '.' || c == ':';
  });
}
bool ValidKind(const std::string& k) {
  size_t slash = k.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == k.size()) return false;
  return std::all_of(k.begin(), k.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '.' || c == '/';
  });
}

// Well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, at most U+10FFFF).
bool IsUtf8(const std::string& s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

struct Parser {
  std::string source;
  absl::Status Err(const YAML::Node& n, const std::string& msg) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", n.Mark().line + 1, ": ", msg));
  }
  absl::StatusOr<std::string> Str(const YAML::Node& n, const char* what) {
    if (!n.IsScalar()) return Err(n, absl::StrCat(what, " must be a string"));
    // yaml-cpp passes any bytes through; they would reach config.json, which must be UTF-8.
    if (!IsUtf8(n.Scalar())) return Err(n, absl::StrCat(what, " is not valid UTF-8"));
    return n.Scalar();
  }
  absl::StatusOr<std::vector<std::string>> Strs(const YAML::Node& n, const char* what) {
    std::vector<std::string> out;
    if (!n || n.IsNull()) return out;
    if (!n.IsSequence()) return Err(n, absl::StrCat(what, " must be a list of strings"));
    for (const auto& e : n) {
      ASSIGN_OR_RETURN(auto s, Str(e, what));
      out.push_back(s);
    }
    return out;
  }
  absl::StatusOr<std::string> AbsPath(const YAML::Node& n, const char* what) {
    ASSIGN_OR_RETURN(auto s, Str(n, what));
    if (s.empty() || s[0] != '/') return Err(n, absl::StrCat(what, " \"", s, "\" is not absolute"));
    return s;
  }
  template <typename T>
  absl::StatusOr<T> Num(const YAML::Node& n, const char* what) {
    T v;
    if (!n.IsScalar() || !YAML::convert<T>::decode(n, v))
      return Err(n, absl::StrCat(what, " must be a number"));
    return v;
  }

  absl::StatusOr<ContainerEdits> Edits(const YAML::Node& n) {
    ContainerEdits e;
    if (!n || n.IsNull()) return e;
    if (!n.IsMap()) return Err(n, "containerEdits must be a mapping");
    ASSIGN_OR_RETURN(e.env, Strs(n["env"], "env"));
    for (const auto& kv : e.env)
      if (kv.find('=') == std::string::npos || kv[0] == '=')
        return Err(n["env"], absl::StrCat("env entry \"", kv, "\" is not KEY=VALUE"));
    if (auto dn = n["deviceNodes"]; dn && !dn.IsNull()) {
      if (!dn.IsSequence()) return Err(dn, "deviceNodes must be a list");
      for (const auto& d : dn) {
        if (!d.IsMap()) return Err(d, "a device node must be a mapping");
        DeviceNode node;
        if (!d["path"]) return Err(d, "device node without \"path\"");
        ASSIGN_OR_RETURN(node.path, AbsPath(d["path"], "deviceNodes.path"));
        if (d["hostPath"]) {
          ASSIGN_OR_RETURN(node.host_path, AbsPath(d["hostPath"], "hostPath"));
        }
        node.type = "";
        if (d["type"]) {
          ASSIGN_OR_RETURN(node.type, Str(d["type"], "type"));
        }
        if (!node.type.empty() && node.type != "c" && node.type != "b" && node.type != "u" &&
            node.type != "p")
          return Err(d["type"],
                     absl::StrCat("device type \"", node.type, "\" is not c, b, u or p"));
        if (d["major"]) {
          ASSIGN_OR_RETURN(node.major, Num<int64_t>(d["major"], "major"));
        }
        if (d["minor"]) {
          ASSIGN_OR_RETURN(node.minor, Num<int64_t>(d["minor"], "minor"));
        }
        if (d["fileMode"]) {
          ASSIGN_OR_RETURN(node.file_mode, Num<uint32_t>(d["fileMode"], "fileMode"));
        }
        if (d["uid"]) {
          ASSIGN_OR_RETURN(node.uid, Num<uint32_t>(d["uid"], "uid"));
        }
        if (d["gid"]) {
          ASSIGN_OR_RETURN(node.gid, Num<uint32_t>(d["gid"], "gid"));
        }
        if (d["permissions"]) {
          ASSIGN_OR_RETURN(node.permissions, Str(d["permissions"], "permissions"));
          if (node.permissions.find_first_not_of("rwm") != std::string::npos)
            return Err(d["permissions"], "permissions must be made of r, w and m");
        }
        e.device_nodes.push_back(node);
      }
    }
    if (auto ms = n["mounts"]; ms && !ms.IsNull()) {
      if (!ms.IsSequence()) return Err(ms, "mounts must be a list");
      for (const auto& m : ms) {
        if (!m.IsMap() || !m["hostPath"] || !m["containerPath"])
          return Err(m, "a mount needs hostPath and containerPath");
        Mount mount;
        ASSIGN_OR_RETURN(mount.host_path, Str(m["hostPath"], "hostPath"));
        ASSIGN_OR_RETURN(mount.container_path, AbsPath(m["containerPath"], "containerPath"));
        if (m["type"]) {
          ASSIGN_OR_RETURN(mount.type, Str(m["type"], "type"));
        }
        ASSIGN_OR_RETURN(mount.options, Strs(m["options"], "options"));
        e.mounts.push_back(mount);
      }
    }
    if (auto hs = n["hooks"]; hs && !hs.IsNull()) {
      if (!hs.IsSequence()) return Err(hs, "hooks must be a list");
      for (const auto& h : hs) {
        if (!h.IsMap() || !h["hookName"] || !h["path"])
          return Err(h, "a hook needs hookName and path");
        Hook hook;
        ASSIGN_OR_RETURN(hook.hook_name, Str(h["hookName"], "hookName"));
        if (!HookNames().count(hook.hook_name))
          return Err(h["hookName"], absl::StrCat("unknown hookName \"", hook.hook_name, "\""));
        ASSIGN_OR_RETURN(hook.path, AbsPath(h["path"], "hook path"));
        ASSIGN_OR_RETURN(hook.args, Strs(h["args"], "args"));
        ASSIGN_OR_RETURN(hook.env, Strs(h["env"], "env"));
        if (h["timeout"]) {
          ASSIGN_OR_RETURN(hook.timeout, Num<int>(h["timeout"], "timeout"));
        }
        e.hooks.push_back(hook);
      }
    }
    return e;
  }
};

Json EditsToJson(const ContainerEdits& e) {
  Json j = Json::object();
  if (!e.env.empty()) j["env"] = e.env;
  if (!e.device_nodes.empty()) {
    j["deviceNodes"] = Json::array();
    for (const auto& d : e.device_nodes) {
      Json n = {{"path", d.path}};
      if (!d.host_path.empty()) n["hostPath"] = d.host_path;
      if (!d.type.empty() && (d.major || d.type != "c")) n["type"] = d.type;
      if (d.major) n["major"] = *d.major;
      if (d.minor) n["minor"] = *d.minor;
      if (d.file_mode) n["fileMode"] = *d.file_mode;
      if (!d.permissions.empty()) n["permissions"] = d.permissions;
      if (d.uid) n["uid"] = *d.uid;
      if (d.gid) n["gid"] = *d.gid;
      j["deviceNodes"].push_back(n);
    }
  }
  if (!e.mounts.empty()) {
    j["mounts"] = Json::array();
    for (const auto& m : e.mounts) {
      Json n = {{"hostPath", m.host_path}, {"containerPath", m.container_path}};
      if (!m.type.empty()) n["type"] = m.type;
      if (!m.options.empty()) n["options"] = m.options;
      j["mounts"].push_back(n);
    }
  }
  if (!e.hooks.empty()) {
    j["hooks"] = Json::array();
    for (const auto& h : e.hooks) {
      Json n = {{"hookName", h.hook_name}, {"path", h.path}};
      if (!h.args.empty()) n["args"] = h.args;
      if (!h.env.empty()) n["env"] = h.env;
      if (h.timeout) n["timeout"] = *h.timeout;
      j["hooks"].push_back(n);
    }
  }
  return j;
}

Json SpecToJson(const CdiSpec& s) {
  Json j = {{"cdiVersion", s.cdi_version.empty() ? MinimumCdiVersion(s) : s.cdi_version},
            {"kind", s.kind}};
  j["devices"] = Json::array();
  for (const auto& d : s.devices)
    j["devices"].push_back({{"name", d.name}, {"containerEdits", EditsToJson(d.edits)}});
  if (!s.edits.empty()) j["containerEdits"] = EditsToJson(s.edits);
  return j;
}

// Strings a YAML reader would take for another type ("0", "true", "~") are quoted.
bool NeedsQuotes(const std::string& s) {
  double d;
  std::string l = absl::AsciiStrToLower(s);
  return s.empty() || absl::SimpleAtod(s, &d) || l == "true" || l == "false" || l == "null" ||
         l == "~" || l == "yes" || l == "no" || l == "on" || l == "off" ||
         s.find(':') != std::string::npos;
}

void EmitYaml(YAML::Emitter& out, const Json& j) {
  if (j.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [k, v] : j.items()) {
      out << YAML::Key << k << YAML::Value;
      EmitYaml(out, v);
    }
    out << YAML::EndMap;
  } else if (j.is_array()) {
    bool flow = std::all_of(j.begin(), j.end(), [](const Json& e) { return e.is_primitive(); });
    out << (flow && j.size() <= 8 ? YAML::Flow : YAML::Block) << YAML::BeginSeq;
    for (const auto& e : j) EmitYaml(out, e);
    out << YAML::EndSeq;
  } else if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    if (NeedsQuotes(s)) out << YAML::DoubleQuoted;
    out << s;
  } else if (j.is_boolean()) {
    out << j.get<bool>();
  } else if (j.is_number_integer()) {
    out << j.get<int64_t>();
  } else {
    out << j.dump();
  }
}

}  // namespace

bool SplitQualifiedName(const std::string& s, std::string* kind, std::string* name) {
  size_t eq = s.find('=');
  if (eq == std::string::npos) return false;
  *kind = s.substr(0, eq);
  *name = s.substr(eq + 1);
  return ValidKind(*kind) && ValidName(*name);
}

namespace {

// A JSON document as the YAML node tree the parser reads, built without yaml-cpp's scanner: the
// scanner was most of the shim's added time on `create` (about 5 ms for an 8-GPU spec).
YAML::Node FromJson(const Json& j) {
  if (j.is_object()) {
    YAML::Node n(YAML::NodeType::Map);
    for (const auto& [k, v] : j.items()) n.force_insert(k, FromJson(v));
    return n;
  }
  if (j.is_array()) {
    YAML::Node n(YAML::NodeType::Sequence);
    for (const auto& e : j) n.push_back(FromJson(e));
    return n;
  }
  if (j.is_null()) return YAML::Node(YAML::NodeType::Null);
  if (j.is_string()) return YAML::Node(j.get_ref<const std::string&>());
  return YAML::Node(j.dump());  // numbers and booleans: their JSON text, as YAML scalars hold them
}

absl::StatusOr<CdiSpec> ParseCdiTree(const YAML::Node& root, const std::string& source) {
  Parser p{source};
  if (!root.IsMap()) return p.Err(root, "a CDI spec must be a mapping");
  CdiSpec spec;
  spec.source = source;
  try {
    if (!root["cdiVersion"]) return p.Err(root, "no cdiVersion");
    ASSIGN_OR_RETURN(spec.cdi_version, p.Str(root["cdiVersion"], "cdiVersion"));
    if (!KnownVersions().count(spec.cdi_version))
      return p.Err(root["cdiVersion"],
                   absl::StrCat("unsupported cdiVersion \"", spec.cdi_version, "\""));
    if (!root["kind"]) return p.Err(root, "no kind");
    ASSIGN_OR_RETURN(spec.kind, p.Str(root["kind"], "kind"));
    if (!ValidKind(spec.kind))
      return p.Err(root["kind"], absl::StrCat("kind \"", spec.kind, "\" is not vendor/class"));
    auto devs = root["devices"];
    if (!devs || !devs.IsSequence() || devs.size() == 0)
      return p.Err(devs ? devs : root, "devices must be a non-empty list");
    std::set<std::string> names;
    for (const auto& d : devs) {
      if (!d.IsMap() || !d["name"]) return p.Err(d, "a device needs a name");
      CdiDevice dev;
      ASSIGN_OR_RETURN(dev.name, p.Str(d["name"], "name"));
      if (!ValidName(dev.name))
        return p.Err(d["name"], absl::StrCat("invalid device name \"", dev.name, "\""));
      if (!names.insert(dev.name).second)
        return p.Err(d["name"], absl::StrCat("duplicate device name \"", dev.name, "\""));
      if (!d["containerEdits"])
        return p.Err(d, absl::StrCat("device ", dev.name, " has no containerEdits"));
      ASSIGN_OR_RETURN(dev.edits, p.Edits(d["containerEdits"]));
      spec.devices.push_back(std::move(dev));
    }
    ASSIGN_OR_RETURN(spec.edits, p.Edits(root["containerEdits"]));
    // As the CDI library containerd and CRI-O use: a spec that uses a feature newer than the
    // version it declares is invalid (containerd skips it, and its devices are unresolvable).
    if (std::string need = MinimumCdiVersion(spec); spec.cdi_version < need)
      return p.Err(root["cdiVersion"], absl::StrCat("cdiVersion \"", spec.cdi_version,
                                                    "\" is too old for what the spec "
                                                    "uses: it must be at least ",
                                                    need));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", e.mark.line + 1, ": ", e.msg));
  }
  return spec;
}

}  // namespace

absl::StatusOr<CdiSpec> ParseCdiSpec(const std::string& text, const std::string& source) {
  // JSON (what `gpulet cdi generate --format json` and the agent write) takes the fast path. A
  // JSON spec the checks reject is read again below only to name the line of the problem.
  if (size_t first = text.find_first_not_of(" \t\r\n");
      first != std::string::npos && text[first] == '{') {
    Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) {
      auto spec = ParseCdiTree(FromJson(j), source);
      if (spec.ok()) return spec;
    }
  }
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.mark.line + 1, ": invalid YAML/JSON: ", e.msg));
  }
  return ParseCdiTree(root, source);
}

// Versions compare as strings: every known version (KnownVersions) has one-digit parts.
std::string MinimumCdiVersion(const CdiSpec& spec) {
  std::string v = "0.3.0";
  auto at_least = [&](const char* version) { v = std::max(v, std::string(version)); };
  auto scan = [&](const ContainerEdits& e) {
    for (const auto& m : e.mounts)
      if (!m.type.empty()) at_least("0.4.0");
    for (const auto& d : e.device_nodes)
      if (!d.host_path.empty()) at_least("0.5.0");
  };
  scan(spec.edits);
  for (const auto& d : spec.devices) {
    scan(d.edits);
    // 0.5.0 allowed a device name to start with a digit: GPU indexes, a DRA claim's uid.
    if (!d.name.empty() && absl::ascii_isdigit(static_cast<unsigned char>(d.name[0])))
      at_least("0.5.0");
  }
  // 0.6.0 allowed dots in the class of the kind.
  if (size_t slash = spec.kind.find('/');
      slash != std::string::npos && spec.kind.find('.', slash) != std::string::npos)
    at_least("0.6.0");
  return v;
}

std::string CdiSpecToJson(const CdiSpec& spec) {
  // Generated specs hold host file names, which need not be UTF-8: replaced, never a throw.
  return SpecToJson(spec).dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

std::string CdiSpecToYaml(const CdiSpec& spec) {
  YAML::Emitter out;
  out.SetIndent(2);
  EmitYaml(out, SpecToJson(spec));
  return absl::StrCat("---\n", out.c_str(), "\n");
}

absl::StatusOr<NameStrategy> ParseNameStrategy(const std::string& s) {
  if (s == "index") return NameStrategy::kIndex;
  if (s == "uuid") return NameStrategy::kUuid;
  if (s == "both") return NameStrategy::kBoth;
  return absl::InvalidArgumentError(
      absl::StrCat("device name strategy \"", s, "\" is not index, uuid or both"));
}

namespace {

// Host paths read under `host_root` (the host mounted into this process's container), renamed as
// the host sees them: the engine that applies the spec runs on the host.
void NameHostPaths(ContainerEdits& e, const std::string& host_root) {
  const std::string root(absl::StripSuffix(host_root, "/"));  // "/host/" as "/host"
  auto strip = [&](std::string& p) {
    if (absl::StartsWith(p, root + "/")) p = p.substr(root.size());
  };
  for (auto& d : e.device_nodes) {
    strip(d.host_path);
    if (d.host_path == d.path) d.host_path.clear();
  }
  for (auto& m : e.mounts) strip(m.host_path);
}

}  // namespace

absl::StatusOr<CdiSpec> GenerateCdiSpec(const gpu::Inventory& inv, const CdiGenerateOptions& opt,
                                        std::vector<std::string>* warnings) {
  if (!ValidKind(opt.kind))
    return absl::InvalidArgumentError(absl::StrCat("kind \"", opt.kind, "\" is not vendor/class"));
  auto has_libcuda = [](const absl::StatusOr<DriverFiles>& d) {
    if (!d.ok()) return false;
    for (const auto& l : d->libraries)
      if (absl::StrContains(l.substr(l.rfind('/') + 1), "libcuda.so.")) return true;
    return false;
  };
  const bool mounted_host = !opt.host_root.empty() && opt.host_root != "/";
  auto from_here = [&](const std::string& host_path) {
    return mounted_host ? JoinRoot(opt.host_root, host_path) : host_path;
  };
  std::string root = from_here(opt.driver_root.empty() ? "/" : opt.driver_root);
  absl::StatusOr<DriverFiles> found = DiscoverDriver(root, inv.driver_version);
  if ((opt.driver_root == "/" || opt.driver_root.empty()) && !has_libcuda(found) &&
      !opt.driver_container_root.empty()) {
    absl::StatusOr<DriverFiles> in_container =
        DiscoverDriver(from_here(opt.driver_container_root), inv.driver_version);
    if (has_libcuda(in_container)) {
      root = from_here(opt.driver_container_root);
      found = std::move(in_container);
      if (warnings)
        warnings->push_back(
            absl::StrCat("no NVIDIA driver libraries under /: using the driver "
                         "container's root ",
                         opt.driver_container_root, " (--driver-root)"));
    }
  }
  if (!found.ok()) return found.status();
  DriverFiles driver = *std::move(found);
  CdiSpec spec;
  spec.kind = opt.kind;
  auto node = [&](const std::string& path) {
    DeviceNode d;
    d.path = path;
    if (JoinRoot(root, path) != path) d.host_path = JoinRoot(root, path);
    return d;
  };
  auto add = [&](const std::string& index_name, const std::string& uuid, ContainerEdits e) {
    if (opt.names != NameStrategy::kUuid) spec.devices.push_back({index_name, e});
    if (opt.names != NameStrategy::kIndex) spec.devices.push_back({uuid, e});
  };
  // MIG access capabilities: "gpu<minor>/gi<id>/access <cap minor>" lines, as the driver lists.
  std::map<std::string, int> cap_minors;
  // Kernel state: the driver root's /proc when it has one (tests), else this host's.
  absl::StatusOr<std::string> minors = absl::NotFoundError("");
  if (!opt.proc_root.empty())
    minors = ReadFileToString(JoinRoot(opt.proc_root, gpu::kMigMinorsFile));
  if (!minors.ok()) minors = ReadFileToString(JoinRoot(root, gpu::kMigMinorsFile));
  if (!minors.ok()) minors = ReadFileToString(gpu::kMigMinorsFile);
  if (minors.ok()) cap_minors = gpu::ParseMigMinors(*minors);
  ContainerEdits all;
  for (const auto& dev : inv.devices) {
    if (!dev.Readable()) continue;  // lost before we knew its minor: nothing to mount
    ContainerEdits e;
    e.device_nodes.push_back(node(gpu::GpuNode(dev.minor)));
    all.Merge(e);
    add(absl::StrCat(dev.index), dev.uuid, e);
    for (const auto& mig : dev.mig_devices) {
      ContainerEdits me = e;
      for (const auto& key :
           gpu::MigCapabilityKeys(dev.minor, mig.gpu_instance_id, mig.compute_instance_id)) {
        auto it = cap_minors.find(key);
        if (it == cap_minors.end()) {
          if (warnings)
            warnings->push_back(absl::StrCat("MIG device ", mig.uuid, ": no capability minor for ",
                                             key, " in ", gpu::kMigMinorsFile));
          continue;
        }
        me.device_nodes.push_back(node(gpu::CapabilityNode(it->second)));
      }
      all.Merge(me);  // "all" includes the MIG capability nodes, as nvidia-ctk's does
      add(gpu::MigIndexName(dev.index, mig.index), mig.uuid, me);
    }
  }
  if (inv.devices.empty()) return absl::FailedPreconditionError("no GPUs in the inventory");
  spec.devices.push_back({"all", all});
  spec.edits = CommonEdits(driver);
  // The legacy hook must not act a second time on a container that got its GPUs through CDI.
  spec.edits.env.push_back("NVIDIA_VISIBLE_DEVICES=void");
  spec.edits.env.push_back(absl::StrCat("GPULET_DRIVER_VERSION=", driver.version));
  if (inv.cuda_driver_version > 0)
    spec.edits.env.push_back(
        absl::StrCat("GPULET_CUDA_DRIVER_VERSION=", inv.cuda_driver_version / 1000, ".",
                     inv.cuda_driver_version % 1000 / 10));
  if (!opt.hook_path.empty() && !driver.libraries.empty()) {
    Hook h;
    h.hook_name = "createRuntime";
    h.path = opt.hook_path;
    h.args = {"gpulet-container-hook", "update-ldcache"};
    std::set<std::string> dirs;
    for (const auto& l : driver.libraries) dirs.insert(l.substr(0, l.rfind('/')));
    for (const auto& d : dirs) {
      h.args.push_back("--folder");
      h.args.push_back(d);
    }
    // An explicit environment: without one, runtimes hand hooks the container's own environment
    // (LD_PRELOAD from the image, CVE-2025-23266).
    h.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
    spec.edits.hooks.push_back(h);
  }
  if (mounted_host) {
    NameHostPaths(spec.edits, opt.host_root);
    for (auto& d : spec.devices) NameHostPaths(d.edits, opt.host_root);
  }
  spec.cdi_version = MinimumCdiVersion(spec);
  return spec;
}

absl::Status CdiRegistry::Load(const std::vector<std::string>& dirs) {
  std::map<std::string, CdiSpec> by_file;  // later directories override earlier ones
  for (const auto& dir : dirs) {
    DIR* d = ::opendir(dir.c_str());
    if (!d) continue;
    std::vector<std::string> files;
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (absl::EndsWith(n, ".yaml") || absl::EndsWith(n, ".yml") || absl::EndsWith(n, ".json"))
        files.push_back(n);
    }
    ::closedir(d);
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::string path = dir + "/" + f;
      absl::StatusOr<std::string> text = ReadFileToString(path);
      absl::StatusOr<CdiSpec> spec =
          text.ok() ? ParseCdiSpec(*text, path) : absl::StatusOr<CdiSpec>(text.status());
      if (!spec.ok()) {
        // Messages of the reader already name the file (and line); a read error may not.
        std::string why(spec.status().message());
        skipped_.push_back(absl::StrContains(why, path) ? why : absl::StrCat(path, ": ", why));
        by_file.erase(f);  // nor does an older directory's file of that name stand in for it
        continue;
      }
      by_file[f] = *std::move(spec);
    }
  }
  for (auto& [f, spec] : by_file) specs_.push_back(std::move(spec));
  return absl::OkStatus();
}

absl::StatusOr<ContainerEdits> CdiRegistry::Resolve(const std::vector<std::string>& names) const {
  ContainerEdits out, shared;
  std::set<const CdiSpec*> used;
  for (const auto& q : names) {
    std::string kind, name;
    if (!SplitQualifiedName(q, &kind, &name))
      return absl::InvalidArgumentError(
          absl::StrCat("\"", q, "\" is not a fully-qualified CDI device name (vendor/class=name)"));
    const CdiDevice* found = nullptr;
    const CdiSpec* in = nullptr;
    for (const auto& s : specs_) {
      if (s.kind != kind) continue;
      for (const auto& d : s.devices)
        if (d.name == name) found = &d, in = &s;
    }
    if (!found)
      return absl::NotFoundError(absl::StrCat(
          "unresolvable CDI device ", q,
          skipped_.empty()
              ? ""
              : absl::StrCat(" (specs skipped as invalid: ", absl::StrJoin(skipped_, "; "), ")")));
    out.Merge(found->edits);
    if (used.insert(in).second) shared.Merge(in->edits);
  }
  shared.Merge(out);  // shared edits first, as CDI applies them
  return shared;
}

ContainerEdits CdiRegistry::SharedEdits(const std::string& kind) const {
  ContainerEdits out;
  for (const auto& s : specs_)
    if (s.kind == kind) out.Merge(s.edits);
  return out;
}

bool CdiRegistry::HasKind(const std::string& kind) const {
  for (const auto& s : specs_)
    if (s.kind == kind) return true;
  return false;
}

}  // namespace gpulet::runtime
