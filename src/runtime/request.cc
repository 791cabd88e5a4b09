#include "runtime/request.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/fs.h"
#include "common/status.h"
#include "runtime/cdi.h"
#include "runtime/driver.h"

namespace gpulet::runtime {
namespace {

constexpr char kVolumeDir[] = "/var/run/nvidia-container-devices/";

template <typename T>
absl::Status Get(const Json& j, const char* key, T& out, const std::string& path) {
  if (!j.contains(key)) return absl::OkStatus();
  try {
    out = j.at(key).get<T>();
  } catch (const Json::exception&) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": \"", key, "\" has the wrong type"));
  }
  return absl::OkStatus();
}

// The device plugin's grant is always a bind of /dev/null (src/plugin/resources.cc): anything else
// at that path (an emptyDir, an image VOLUME, a hostPath of something else) is an ordinary mount.
bool IsDevicePluginGrant(const Json& m) {
  auto src = m.find("source");
  if (src == m.end() || !src->is_string() || CleanPath(src->get<std::string>()) != "/dev/null")
    return false;
  auto type = m.find("type");
  if (type != m.end() && type->is_string() && !type->get<std::string>().empty())
    return type->get<std::string>() == "bind";
  // No type: a bind mount is told by its options (older OCI specs, Docker).
  auto opts = m.find("options");
  if (opts == m.end() || !opts->is_array()) return false;
  for (const auto& o : *opts)
    if (o.is_string() && (o.get<std::string>() == "bind" || o.get<std::string>() == "rbind"))
      return true;
  return false;
}

// The ids the device plugin puts in the path (src/plugin/resources.cc, `Visible`): an index, a
// <gpu>:<mig> index, or a GPU-/MIG- UUID. Never "all", never a path.
bool IsDevicePluginId(const std::string& id) {
  auto digits = [](absl::string_view s) {
    return !s.empty() && s.size() <= 6 &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (digits(id)) return true;
  if (size_t colon = id.find(':'); colon != std::string::npos)
    return digits(absl::string_view(id).substr(0, colon)) &&
           digits(absl::string_view(id).substr(colon + 1));
  if (!absl::StartsWith(id, "GPU-") && !absl::StartsWith(id, "MIG-")) return false;
  absl::string_view rest = absl::string_view(id).substr(4);
  return !rest.empty() && rest.size() <= 64 && std::all_of(rest.begin(), rest.end(), [](char c) {
    return absl::ascii_isxdigit(c) || c == '-';
  });
}

// "1.2.3" -> {1,2,3}; false when not dotted numbers.
bool ParseVersion(absl::string_view s, std::vector<int>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(s, '.')) {
    int v;
    if (!absl::SimpleAtoi(part, &v)) return false;
    out->push_back(v);
  }
  return !out->empty();
}

int CompareVersions(std::vector<int> a, std::vector<int> b) {
  size_t n = std::max(a.size(), b.size());
  a.resize(n), b.resize(n);
  return a < b ? -1 : (a > b ? 1 : 0);
}

absl::StatusOr<bool> Holds(absl::string_view cond, const DriverFacts& facts) {
  static const char* kOps[] = {">=", "<=", "!=", "=", ">", "<"};
  for (const char* op : kOps) {
    size_t at = cond.find(op);
    if (at == absl::string_view::npos) continue;
    std::string key(cond.substr(0, at));
    absl::string_view want = cond.substr(at + strlen(op));
    if (want.size() && want[0] == '=') want.remove_prefix(1);  // "==" reads as "="
    std::string have;
    if (key == "cuda")
      have = facts.cuda_version;
    else if (key == "driver")
      have = facts.driver_version;
    else
      return absl::InvalidArgumentError(
          absl::StrCat("requirement \"", cond, "\": unsupported constraint \"", key, "\""));
    std::vector<int> h, w;
    if (!ParseVersion(want, &w))
      return absl::InvalidArgumentError(absl::StrCat("requirement \"", cond, "\": bad version"));
    if (have.empty() || !ParseVersion(have, &h))
      return absl::FailedPreconditionError(
          absl::StrCat("requirement \"", cond, "\": the ", key, " version is unknown"));
    int c = CompareVersions(h, w);
    std::string o = op;
    return o == ">="   ? c >= 0
           : o == "<=" ? c <= 0
           : o == "!=" ? c != 0
           : o == "="  ? c == 0
           : o == ">"  ? c > 0
                       : c < 0;
  }
  return absl::InvalidArgumentError(absl::StrCat("requirement \"", cond, "\" has no operator"));
}

}  // namespace

absl::StatusOr<RuntimeConfig> LoadRuntimeConfig(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  static const std::set<std::string> kKeys = {
      "mode",
      "runtimes",
      "spec-dirs",
      "annotation-prefixes",
      "default-kind",
      "hook-path",
      "ldconfig",
      "accept-nvidia-visible-devices-envvar-when-unprivileged",
      "accept-nvidia-visible-devices-as-volume-mounts",
      "disable-require"};
  for (const auto& [k, v] : j.items())
    if (!kKeys.count(k))
      return absl::InvalidArgumentError(absl::StrCat(path, ": unknown key \"", k, "\""));
  RuntimeConfig c;
  c.source = path;
  RETURN_IF_ERROR(Get(j, "mode", c.mode, path));
  RETURN_IF_ERROR(Get(j, "runtimes", c.runtimes, path));
  RETURN_IF_ERROR(Get(j, "spec-dirs", c.spec_dirs, path));
  RETURN_IF_ERROR(Get(j, "annotation-prefixes", c.annotation_prefixes, path));
  RETURN_IF_ERROR(Get(j, "default-kind", c.default_kind, path));
  RETURN_IF_ERROR(Get(j, "hook-path", c.hook_path, path));
  RETURN_IF_ERROR(Get(j, "ldconfig", c.ldconfig, path));
  RETURN_IF_ERROR(Get(j, "accept-nvidia-visible-devices-envvar-when-unprivileged",
                      c.accept_envvar_when_unprivileged, path));
  RETURN_IF_ERROR(
      Get(j, "accept-nvidia-visible-devices-as-volume-mounts", c.accept_volume_mounts, path));
  RETURN_IF_ERROR(Get(j, "disable-require", c.disable_require, path));
  if (c.mode != "auto" && c.mode != "cdi" && c.mode != "legacy")
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": mode \"", c.mode, "\" is not auto, cdi or legacy"));
  if (c.runtimes.empty())
    return absl::InvalidArgumentError(absl::StrCat(path, ": runtimes is empty"));
  if ((j.contains("ldconfig") && (c.ldconfig.empty() || c.ldconfig[0] != '/')) ||
      c.hook_path.empty() || c.hook_path[0] != '/')
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ldconfig and hook-path must be absolute host paths"));
  return c;
}

absl::StatusOr<RuntimeConfig> LoadDefaultRuntimeConfig(const std::string& path) {
  if (!path.empty()) return LoadRuntimeConfig(path);
  if (const char* p = std::getenv("GPULET_RUNTIME_CONFIG"); p && *p) return LoadRuntimeConfig(p);
  constexpr char kDefault[] = "/etc/gpulet/container-runtime.json";
  if (::access(kDefault, F_OK) != 0) return RuntimeConfig{};
  return LoadRuntimeConfig(kDefault);
}

bool IsPrivileged(const Json& spec) {
  const Json* bounding = nullptr;
  if (spec.contains("process") && spec["process"].is_object() &&
      spec["process"].contains("capabilities") && spec["process"]["capabilities"].is_object() &&
      spec["process"]["capabilities"].contains("bounding"))
    bounding = &spec["process"]["capabilities"]["bounding"];
  if (!bounding || !bounding->is_array()) return false;
  for (const auto& c : *bounding)
    if (c.is_string() && c.get<std::string>() == "CAP_SYS_ADMIN") return true;
  return false;
}

absl::StatusOr<GpuRequest> ResolveRequest(const Json& spec, const RuntimeConfig& config) {
  GpuRequest r;
  auto qualify = [&](const std::string& id) -> absl::StatusOr<std::string> {
    std::string kind, name;
    if (SplitQualifiedName(id, &kind, &name)) return id;
    std::string q = absl::StrCat(config.default_kind, "=", id);
    if (!SplitQualifiedName(q, &kind, &name))
      return absl::InvalidArgumentError(absl::StrCat("invalid device \"", id, "\""));
    return q;
  };
  // 1. CDI annotations (set by the device plugin through the kubelet: not image-controlled).
  if (spec.contains("annotations") && spec["annotations"].is_object()) {
    for (const auto& [k, v] : spec["annotations"].items()) {
      bool match = false;
      for (const auto& p : config.annotation_prefixes) match |= absl::StartsWith(k, p);
      if (!match || !v.is_string()) continue;
      for (absl::string_view id :
           absl::StrSplit(v.get<std::string>(), ',', absl::SkipWhitespace())) {
        std::string s(absl::StripAsciiWhitespace(id)), kind, name;
        if (!SplitQualifiedName(s, &kind, &name))
          return absl::InvalidArgumentError(absl::StrCat(
              "annotation ", k, ": \"", s, "\" is not a fully-qualified CDI device name"));
        r.devices.push_back(s);
      }
      r.from_cdi = true;
      r.source = "annotation " + k;
    }
  }
  // 2. The device plugin's volume mounts /var/run/nvidia-container-devices/<id>.
  std::vector<std::string> volume_ids;
  auto mounts = spec.find("mounts");
  if (config.accept_volume_mounts && mounts != spec.end() && mounts->is_array()) {
    for (const auto& m : *mounts) {
      if (!m.is_object()) continue;
      auto d = m.find("destination");
      if (d == m.end() || !d->is_string()) continue;
      std::string dst = CleanPath(d->get<std::string>());
      if (!absl::StartsWith(dst, kVolumeDir) || !IsDevicePluginGrant(m)) continue;
      std::string id = dst.substr(strlen(kVolumeDir));
      if (!IsDevicePluginId(id))
        return absl::InvalidArgumentError(absl::StrCat(
            "mount of /dev/null at ", d->get<std::string>(), ": \"", id,
            "\" is not a device id the device plugin issues (an index, <gpu>:<mig>, a GPU- or "
            "MIG- UUID)"));
      volume_ids.push_back(id);
    }
  }
  // 3. NVIDIA_VISIBLE_DEVICES, trusted from an unprivileged container only when configured.
  auto env = GetEnv(spec, "NVIDIA_VISIBLE_DEVICES");
  bool env_trusted = IsPrivileged(spec) || config.accept_envvar_when_unprivileged;
  std::vector<std::string> ids;
  if (!r.devices.empty()) {
    // CDI annotations decide alone.
  } else if (!volume_ids.empty()) {
    ids = volume_ids;
    r.source = kVolumeDir;
  } else if (env && env_trusted) {
    std::string v(absl::StripAsciiWhitespace(*env));
    r.source = "NVIDIA_VISIBLE_DEVICES";
    if (v.empty() || v == "void") return r;  // not a GPU container
    if (v != "none")
      for (absl::string_view id : absl::StrSplit(v, ',', absl::SkipWhitespace()))
        ids.emplace_back(absl::StripAsciiWhitespace(id));
    r.gpu_container = true;  // "none": driver files, no GPU
  } else {
    return r;
  }
  for (const auto& id : ids) {
    if (id.find('=') != std::string::npos) r.from_cdi = true;
    ASSIGN_OR_RETURN(std::string q, qualify(id));
    r.devices.push_back(q);
  }
  r.gpu_container = r.gpu_container || !r.devices.empty();
  if (!r.gpu_container) return r;

  // Capabilities: default utility,compute; "all" is everything.
  auto caps = GetEnv(spec, "NVIDIA_DRIVER_CAPABILITIES");
  std::string c = caps ? std::string(absl::StripAsciiWhitespace(*caps)) : "";
  if (c.empty()) c = "utility,compute";
  for (absl::string_view cap : absl::StrSplit(c, ',', absl::SkipWhitespace())) {
    std::string s(absl::StripAsciiWhitespace(cap));
    if (s == "all") {
      r.capabilities = AllCapabilities();
      continue;
    }
    if (!AllCapabilities().count(s))
      return absl::InvalidArgumentError(
          absl::StrCat("NVIDIA_DRIVER_CAPABILITIES: unknown capability \"", s,
                       "\" (known: ", absl::StrJoin(AllCapabilities(), ","), ", all)"));
    r.capabilities.insert(s);
  }
  if (!config.disable_require && !GetEnv(spec, "NVIDIA_DISABLE_REQUIRE")) {
    if (spec.contains("process") && spec["process"].is_object() &&
        spec["process"].contains("env") && spec["process"]["env"].is_array())
      for (const auto& e : spec["process"]["env"]) {
        if (!e.is_string()) continue;
        std::string kv = e.get<std::string>();
        if (absl::StartsWith(kv, "NVIDIA_REQUIRE_") &&
            !absl::StartsWith(kv, "NVIDIA_REQUIRE_JETPACK"))
          if (size_t eq = kv.find('='); eq != std::string::npos && eq + 1 < kv.size())
            r.requirements.push_back(kv.substr(eq + 1));
      }
  }
  return r;
}

absl::Status CheckRequirements(const std::vector<std::string>& requirements,
                               const DriverFacts& facts) {
  for (const auto& req : requirements) {
    bool any = false;  // space-separated alternatives: one must hold
    absl::Status last;
    for (absl::string_view alt : absl::StrSplit(req, ' ', absl::SkipWhitespace())) {
      bool all = true;
      for (absl::string_view cond : absl::StrSplit(alt, ',', absl::SkipWhitespace())) {
        auto h = Holds(absl::StripAsciiWhitespace(cond), facts);
        if (!h.ok() && h.status().code() == absl::StatusCode::kInvalidArgument) return h.status();
        if (!h.ok() || !*h) {
          all = false;
          last = h.ok() ? absl::OkStatus() : h.status();
        }
      }
      any |= all;
    }
    if (!any)
      return absl::FailedPreconditionError(
          absl::StrCat("unsatisfied requirement \"", req, "\" (driver ", facts.driver_version,
                       ", CUDA ", facts.cuda_version.empty() ? "unknown" : facts.cuda_version, ")",
                       last.ok() ? "" : absl::StrCat(": ", last.message())));
  }
  return absl::OkStatus();
}

absl::StatusOr<ContainerEdits> EditsForRequest(const GpuRequest& req, const CdiRegistry& registry,
                                               const RuntimeConfig& config) {
  ContainerEdits edits;
  if (req.devices.empty()) {
    edits = registry.SharedEdits(config.default_kind);
  } else {
    ASSIGN_OR_RETURN(edits, registry.Resolve(req.devices));
  }
  if (!req.from_cdi) FilterByCapabilities(edits, req.capabilities);
  RETURN_IF_ERROR(ResolveDeviceNodes(edits.device_nodes));
  return edits;
}

void FilterByCapabilities(ContainerEdits& edits, const std::set<std::string>& caps) {
  std::set<std::string> eff = caps;
  if (eff.count("video")) eff.insert("compute");  // video needs the compute libraries
  if (eff.count("display")) eff.insert("graphics");
  std::vector<Mount> mounts;
  for (auto& m : edits.mounts) {
    std::string cap = CapabilityOfFile(m.container_path.substr(m.container_path.rfind('/') + 1));
    if (cap.empty() || eff.count(cap)) mounts.push_back(std::move(m));
  }
  edits.mounts = std::move(mounts);
  std::vector<DeviceNode> nodes;
  for (auto& d : edits.device_nodes)
    if (ControlNodeWanted(d.path, eff)) nodes.push_back(std::move(d));
  edits.device_nodes = std::move(nodes);
}

}  // namespace gpulet::runtime
