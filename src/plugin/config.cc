#include "plugin/config.h"

#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/duration.h"
#include "common/fs.h"
#include "common/status.h"

namespace gpulet::plugin {
namespace {

constexpr char kPrefix[] = "nvidia.com/";

const std::vector<Setting> kSettings = {
    {"flags.migStrategy", "mig-strategy", {"MIG_STRATEGY"}, "MIG strategy: none | single | mixed"},
    {"flags.failOnInitError",
     "fail-on-init-error",
     {"FAIL_ON_INIT_ERROR"},
     "Exit when NVML cannot be initialised at start (false: wait and retry)"},
    {"flags.nvidiaDriverRoot",
     "nvidia-driver-root",
     {"NVIDIA_DRIVER_ROOT"},
     "Root of the NVIDIA driver installation"},
    {"flags.nvidiaDevRoot",
     "nvidia-dev-root",
     {"NVIDIA_DEV_ROOT"},
     "Root of the NVIDIA device nodes (default: the driver root)"},
    {"flags.mpsRoot",
     "mps-root",
     {"MPS_ROOT"},
     "Host directory of the MPS control daemons' pipe, log and shm directories (sharing.mps)"},
    {"flags.gdrcopyEnabled",
     "gdrcopy-enabled",
     {"GDRCOPY_ENABLED"},
     "Request GDRCopy in containers (NVIDIA_GDRCOPY=enabled)"},
    {"flags.gdsEnabled",
     "gds-enabled",
     {"GDS_ENABLED"},
     "Request GPUDirect Storage in containers (NVIDIA_GDS=enabled)"},
    {"flags.mofedEnabled",
     "mofed-enabled",
     {"MOFED_ENABLED"},
     "Request MOFED in containers (NVIDIA_MOFED=enabled)"},
    {"flags.plugin.passDeviceSpecs",
     "pass-device-specs",
     {"PASS_DEVICE_SPECS"},
     "Return /dev/nvidia* device specs in Allocate (CPUManager compatibility)"},
    {"flags.plugin.deviceListStrategy",
     "device-list-strategy",
     {"DEVICE_LIST_STRATEGY"},
     "How devices reach the runtime: envvar, volume-mounts, cdi-annotations, cdi-cri "
     "(comma list)"},
    {"flags.plugin.deviceIDStrategy",
     "device-id-strategy",
     {"DEVICE_ID_STRATEGY"},
     "How containers are told their devices: uuid | index"},
    {"flags.plugin.cdiAnnotationPrefix",
     "cdi-annotation-prefix",
     {"CDI_ANNOTATION_PREFIX"},
     "Key prefix of CDI annotations"},
    {"flags.plugin.sharedDevicesAllocationPolicy",
     "shared-devices-allocation-policy",
     {"SHARED_DEVICES_ALLOCATION_POLICY"},
     "Preferred allocation of shared replicas: distributed | packed"},
    {"gpulet.checkpointDeviceIDStrategy",
     "checkpoint-device-id-strategy",
     {"CHECKPOINT_DEVICE_ID_STRATEGY"},
     "Device IDs shown to the kubelet: uuid | index (index survives UUID changes)"},
    {"gpulet.health.disable",
     "disable-healthchecks",
     {"DP_DISABLE_HEALTHCHECKS"},
     "Health checks to skip: all | xids | comma list of XIDs"},
    {"gpulet.health.enable",
     "enable-healthchecks",
     {"DP_ENABLE_HEALTHCHECKS"},
     "XIDs that always make a device unhealthy (comma list; wins over disable)"},
    {"gpulet.health.holdDown",
     "health-hold-down",
     {"GPULET_HEALTH_HOLD_DOWN"},
     "How long a device must answer normally before it is Healthy again (e.g. 30s)"},
    {"gpulet.health.probeInterval",
     "health-probe-interval",
     {"GPULET_HEALTH_PROBE_INTERVAL"},
     "How often devices are probed (e.g. 1s)"},
    {"gpulet.health.unhealthyDevicesFile",
     "unhealthy-devices-file",
     {"UNHEALTHY_DEVICES_FILE"},
     "Manual isolation list {\"index\": [...], \"uuid\": [...]}, watched live"},
    {"gpulet.mps.binDir",
     "mps-bin-dir",
     {"GPULET_MPS_BIN_DIR"},
     "Directory of nvidia-cuda-mps-control and nvidia-smi for sharing.mps (empty: $PATH)"},
    {"gpulet.vgpu.gpus",
     "vgpu-gpus",
     {"GPULET_VGPU_GPUS"},
     "GPUs shared fractionally as tencent.com/vcuda-core/-memory (not offered as nvidia.com/gpu): "
     "empty (off, the default) | all | comma list of indexes or UUIDs"},
    {"gpulet.vgpu.nominalMemory",
     "vgpu-nominal-memory",
     {"GPULET_VGPU_NOMINAL_MEMORY"},
     "vcuda-memory units from the GPU's whole-GiB size (true: 320 on an H100 80GB) or from the "
     "memory NVML reports (false: 318)"},
    {"gpulet.vgpu.stateDir",
     "vgpu-state-dir",
     {"GPULET_VGPU_STATE_DIR"},
     "vGPU checkpoint and per-container accounting files (<dir>/<pod-uid>/<container>/accounting)"},
    {"gpulet.vgpu.library",
     "vgpu-library",
     {"GPULET_VGPU_LIBRARY"},
     "Host path of libgpulet-vcuda.so, mounted read-only into vGPU containers"},
    {"gpulet.vgpu.accountingTmpfs",
     "vgpu-accounting-tmpfs",
     {"GPULET_VGPU_ACCOUNTING_TMPFS"},
     "Each fractional container's (and DRA claim's) accounting files on a 16 KiB tmpfs of its own, "
     "so no tenant can grow them (needs CAP_SYS_ADMIN and mountPropagation: Bidirectional on the "
     "state directories; the shipped manifests set both): true | false (default)"},
    {"gpulet.vgpu.policy",
     "vgpu-policy",
     {"GPULET_VGPU_POLICY"},
     "Placement of vGPU pods the scheduler extender did not place: binpack | spread | random | "
     "best-fit | gpu-packing | dot-product | fgd | gpulet"},
    {"gpulet.vgpu.reconcileInterval",
     "vgpu-reconcile-interval",
     {"GPULET_VGPU_RECONCILE_INTERVAL"},
     "How often vGPU grants of deleted pods are released (e.g. 5s)"},
    {"gpulet.dra.gpus",
     "dra-gpus",
     {"GPULET_DRA_GPUS"},
     "GPUs served as a DRA driver (gpu.gpulet.io ResourceSlices; agent with --node-name), not "
     "as device-plugin resources: empty (off, the default) | all | comma list of indexes or UUIDs"},
    {"gpulet.dra.stateDir",
     "dra-state-dir",
     {"GPULET_DRA_STATE_DIR"},
     "DRA checkpoint of prepared claims and fractional claims' accounting files"},
    {"gpulet.dra.cdiDir",
     "dra-cdi-dir",
     {"GPULET_DRA_CDI_DIR"},
     "Where the DRA claims' CDI specs are written (the container runtime's CDI spec directory)"},
    {"gpulet.dra.kubeletDir",
     "dra-kubelet-dir",
     {"GPULET_DRA_KUBELET_DIR"},
     "The kubelet's root directory (plugins_registry/ and plugins/ for the DRA sockets)"},
    {"gpulet.dra.consumableCapacity",
     "dra-consumable-capacity",
     {"GPULET_DRA_CONSUMABLE_CAPACITY"},
     "Publish DRA GPUs as shareable with consumable memory/cores capacity (needs the "
     "DRAConsumableCapacity feature gate, alpha in Kubernetes 1.34)"},
};

// What each setting is when nothing sets it, as `--help` shows it. ConfigTest.HelpDefaultsAreTrue
// applies each to a default Config and checks that nothing changes; "" is "unset".
const std::map<std::string, const char*> kDefaults = {
    {"flags.migStrategy", "none"},
    {"flags.failOnInitError", "true"},
    {"flags.nvidiaDriverRoot", "/"},
    {"flags.nvidiaDevRoot", ""},
    {"flags.mpsRoot", "/run/nvidia/mps"},
    {"flags.gdrcopyEnabled", "false"},
    {"flags.gdsEnabled", "false"},
    {"flags.mofedEnabled", "false"},
    {"flags.plugin.passDeviceSpecs", "false"},
    {"flags.plugin.deviceListStrategy", "envvar"},
    {"flags.plugin.deviceIDStrategy", "uuid"},
    {"flags.plugin.cdiAnnotationPrefix", "cdi.k8s.io/"},
    {"flags.plugin.sharedDevicesAllocationPolicy", "distributed"},
    {"gpulet.checkpointDeviceIDStrategy", "uuid"},
    {"gpulet.health.disable", ""},
    {"gpulet.health.enable", ""},
    {"gpulet.health.holdDown", "30s"},
    {"gpulet.health.probeInterval", "1s"},
    {"gpulet.health.unhealthyDevicesFile", "/etc/nvidia-device-plugin/unhealthyDevices.json"},
    {"gpulet.mps.binDir", ""},
    {"gpulet.vgpu.gpus", ""},
    {"gpulet.vgpu.nominalMemory", "true"},
    {"gpulet.vgpu.stateDir", "/var/lib/gpulet/vgpu"},
    {"gpulet.vgpu.library", "/usr/local/gpulet/lib/libgpulet-vcuda.so"},
    {"gpulet.vgpu.accountingTmpfs", "false"},
    {"gpulet.vgpu.policy", "binpack"},
    {"gpulet.vgpu.reconcileInterval", "5s"},
    {"gpulet.dra.gpus", ""},
    {"gpulet.dra.stateDir", "/var/lib/gpulet/dra"},
    {"gpulet.dra.cdiDir", "/var/run/cdi"},
    {"gpulet.dra.kubeletDir", "/var/lib/kubelet"},
    {"gpulet.dra.consumableCapacity", "false"},
};

// Keys NVIDIA defines that concern other programs (GFD, CDI spec generation): accepted and ignored
// so NVIDIA's files load unchanged. Each with why, said once per load (Config::notes). The GFD keys
// are ignored by NVIDIA's device plugin too, so they load silently.
const std::map<std::string, const char*> kIgnored = {
    {"flags.useNodeFeatureAPI", ""},
    {"flags.gfd", ""},
    {"flags.plugin.nvidiaCTKPath",
     "gpulet writes its CDI specs itself (gpulet cdi generate), with no nvidia-ctk hook"},
    {"flags.plugin.nvidiaHookPath",
     "gpulet writes its CDI specs itself (gpulet cdi generate), with no nvidia-ctk hook"},
    {"flags.plugin.containerDriverRoot",
     "gpulet finds the driver through flags.nvidiaDriverRoot (the host path) only"},
};

absl::StatusOr<bool> ParseBool(const std::string& v) {
  std::string l = absl::AsciiStrToLower(v);
  if (l == "true" || l == "1" || l == "t" || l == "yes") return true;
  if (l == "false" || l == "0" || l == "f" || l == "no") return false;
  return absl::InvalidArgumentError(absl::StrCat("\"", v, "\" is not a boolean"));
}

absl::StatusOr<IdStrategy> ParseId(const std::string& v) {
  if (v == "uuid") return IdStrategy::kUuid;
  if (v == "index") return IdStrategy::kIndex;
  return absl::InvalidArgumentError(absl::StrCat("\"", v, "\" is not uuid or index"));
}

absl::StatusOr<absl::Duration> ParseDur(const std::string& v) {
  // The caller names the key; one syntax with every flag (common/duration.h).
  ASSIGN_OR_RETURN(ParsedDuration d, ParseDuration("duration", v, {.allow_zero = true}));
  return d.value;
}

// Applies one scalar setting; the error names only the value (callers add where and which key).
absl::Status Apply(Config& c, const std::string& key, const std::string& v) {
  if (key == "flags.migStrategy") {
    if (v == "none")
      c.mig_strategy = MigStrategy::kNone;
    else if (v == "single")
      c.mig_strategy = MigStrategy::kSingle;
    else if (v == "mixed")
      c.mig_strategy = MigStrategy::kMixed;
    else
      return absl::InvalidArgumentError(absl::StrCat("\"", v, "\" is not none, single or mixed"));
  } else if (key == "flags.failOnInitError") {
    ASSIGN_OR_RETURN(c.fail_on_init_error, ParseBool(v));
  } else if (key == "flags.nvidiaDriverRoot") {
    if (v.empty() || v[0] != '/') return absl::InvalidArgumentError("must be an absolute path");
    c.driver_root = v;
  } else if (key == "flags.nvidiaDevRoot") {
    if (!v.empty() && v[0] != '/') return absl::InvalidArgumentError("must be an absolute path");
    c.dev_root = v;
  } else if (key == "flags.mpsRoot") {
    if (v.empty() || v[0] != '/') return absl::InvalidArgumentError("must be an absolute path");
    c.mps_root = v;
  } else if (key == "flags.deviceDiscoveryStrategy") {
    if (v == "tegra")
      return absl::InvalidArgumentError(
          "tegra is not supported: gpulet discovers GPUs through NVML only (auto and nvml mean "
          "that)");
    if (v != "auto" && v != "nvml")
      return absl::InvalidArgumentError(absl::StrCat("\"", v, "\" is not auto, nvml or tegra"));
  } else if (key == "gpulet.mps.binDir") {
    if (!v.empty() && v[0] != '/') return absl::InvalidArgumentError("must be an absolute path");
    c.mps_bin_dir = v;
  } else if (key == "flags.gdrcopyEnabled") {
    ASSIGN_OR_RETURN(c.gdrcopy, ParseBool(v));
  } else if (key == "flags.gdsEnabled") {
    ASSIGN_OR_RETURN(c.gds, ParseBool(v));
  } else if (key == "flags.mofedEnabled") {
    ASSIGN_OR_RETURN(c.mofed, ParseBool(v));
  } else if (key == "flags.plugin.passDeviceSpecs") {
    ASSIGN_OR_RETURN(c.pass_device_specs, ParseBool(v));
  } else if (key == "flags.plugin.deviceListStrategy") {
    ListStrategies l{false, false, false, false};
    for (absl::string_view s : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
      s = absl::StripAsciiWhitespace(s);
      if (s == "envvar")
        l.envvar = true;
      else if (s == "volume-mounts")
        l.volume_mounts = true;
      else if (s == "cdi-annotations")
        l.cdi_annotations = true;
      else if (s == "cdi-cri")
        l.cdi_cri = true;
      else
        return absl::InvalidArgumentError(
            absl::StrCat("\"", s, "\" is not envvar, volume-mounts, cdi-annotations or cdi-cri"));
    }
    if (!l.envvar && !l.volume_mounts && !l.cdi_annotations && !l.cdi_cri)
      return absl::InvalidArgumentError("empty list");
    c.list = l;
  } else if (key == "flags.plugin.deviceIDStrategy") {
    ASSIGN_OR_RETURN(c.id_strategy, ParseId(v));
  } else if (key == "flags.plugin.cdiAnnotationPrefix") {
    c.cdi_annotation_prefix = v;
  } else if (key == "flags.plugin.sharedDevicesAllocationPolicy") {
    if (v == "distributed")
      c.shared_policy = SharedPolicy::kDistributed;
    else if (v == "packed")
      c.shared_policy = SharedPolicy::kPacked;
    else
      return absl::InvalidArgumentError(absl::StrCat("\"", v, "\" is not distributed or packed"));
  } else if (key == "gpulet.checkpointDeviceIDStrategy") {
    ASSIGN_OR_RETURN(c.checkpoint_id_strategy, ParseId(v));
  } else if (key == "gpulet.health.disable") {
    c.health.disabled = c.health.xids_disabled = false;
    c.health.disabled_xids.clear();
    std::string l = absl::AsciiStrToLower(absl::StripAsciiWhitespace(v));
    if (l == "all")
      c.health.disabled = true;
    else if (l == "xids")
      c.health.xids_disabled = true;
    else
      RETURN_IF_ERROR(ParseXidList(v, &c.health.disabled_xids));
  } else if (key == "gpulet.health.enable") {
    c.health.enabled_xids.clear();
    RETURN_IF_ERROR(ParseXidList(v, &c.health.enabled_xids));
  } else if (key == "gpulet.health.holdDown") {
    ASSIGN_OR_RETURN(c.health.hold_down, ParseDur(v));
  } else if (key == "gpulet.health.probeInterval") {
    ASSIGN_OR_RETURN(c.health.probe_interval, ParseDur(v));
    if (c.health.probe_interval < absl::Milliseconds(10))
      return absl::InvalidArgumentError("must be at least 10ms");
  } else if (key == "gpulet.health.unhealthyDevicesFile") {
    c.health.unhealthy_devices_file = v;
  } else if (key == "gpulet.vgpu.gpus") {
    c.vgpu.gpus = std::string(absl::StripAsciiWhitespace(v));
  } else if (key == "gpulet.vgpu.nominalMemory") {
    ASSIGN_OR_RETURN(c.vgpu.nominal_memory, ParseBool(v));
  } else if (key == "gpulet.vgpu.accountingTmpfs") {
    ASSIGN_OR_RETURN(c.vgpu.accounting_tmpfs, ParseBool(v));
  } else if (key == "gpulet.vgpu.stateDir" || key == "gpulet.vgpu.library") {
    if (v.empty() || v[0] != '/') return absl::InvalidArgumentError("must be an absolute path");
    (key == "gpulet.vgpu.stateDir" ? c.vgpu.state_dir : c.vgpu.library) = v;
  } else if (key == "gpulet.vgpu.reconcileInterval") {
    ASSIGN_OR_RETURN(c.vgpu.reconcile_interval, ParseDur(v));
    if (c.vgpu.reconcile_interval < absl::Milliseconds(100))
      return absl::InvalidArgumentError("must be at least 100ms");
  } else if (key == "gpulet.dra.gpus") {
    c.dra.gpus = std::string(absl::StripAsciiWhitespace(v));
  } else if (key == "gpulet.dra.stateDir" || key == "gpulet.dra.cdiDir" ||
             key == "gpulet.dra.kubeletDir") {
    if (v.empty() || v[0] != '/') return absl::InvalidArgumentError("must be an absolute path");
    (key == "gpulet.dra.stateDir" ? c.dra.state_dir
     : key == "gpulet.dra.cdiDir" ? c.dra.cdi_dir
                                  : c.dra.kubelet_dir) = v;
  } else if (key == "gpulet.dra.consumableCapacity") {
    ASSIGN_OR_RETURN(c.dra.consumable_capacity, ParseBool(v));
  } else if (key == "gpulet.vgpu.policy") {
    if (v.empty()) return absl::InvalidArgumentError("must name a policy");
    c.vgpu.policy = v;
  } else {
    return absl::NotFoundError("unknown key");
  }
  return absl::OkStatus();
}

// --- the file ---

struct FileParser {
  const std::string& file;
  Config& c;

  std::string At(const YAML::Node& n, const std::string& key) const {
    return absl::StrCat(file, ":", n.Mark().line + 1, ": ", key);
  }
  absl::Status Err(const YAML::Node& n, const std::string& key, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(At(n, key), ": ", what));
  }
  absl::StatusOr<std::string> Scalar(const YAML::Node& n, const std::string& key) const {
    if (!n.IsScalar()) return Err(n, key, "must be a single value");
    return n.Scalar();
  }
  absl::Status NeedMap(const YAML::Node& n, const std::string& key) const {
    if (!n.IsMap() && !n.IsNull()) return Err(n, key, "must be a mapping");
    return absl::OkStatus();
  }

  // Walks a mapping of scalar settings (flags, flags.plugin, gpulet, gpulet.health).
  absl::Status Settings(const YAML::Node& n, const std::string& path) {
    RETURN_IF_ERROR(NeedMap(n, path));
    if (n.IsNull()) return absl::OkStatus();
    for (const auto& kv : n) {
      std::string key = path + "." + kv.first.Scalar();
      const YAML::Node& v = kv.second;
      if (auto ig = kIgnored.find(key); ig != kIgnored.end()) {
        if (*ig->second)
          c.notes.push_back(
              absl::StrCat(At(kv.first, key), ": accepted and ignored: ", ig->second));
        continue;
      }
      if (key == "flags.plugin" || key == "gpulet.health" || key == "gpulet.vgpu" ||
          key == "gpulet.mps" || key == "gpulet.dra") {
        RETURN_IF_ERROR(Settings(v, key));
        continue;
      }
      std::string value;
      if (key == "flags.plugin.deviceListStrategy" && v.IsSequence()) {
        std::vector<std::string> items;
        for (const auto& i : v) items.push_back(i.Scalar());
        value = absl::StrJoin(items, ",");
      } else if (v.IsNull()) {
        continue;  // `key:` with no value keeps the default, as NVIDIA's loader does
      } else {
        ASSIGN_OR_RETURN(value, Scalar(v, key));
      }
      absl::Status s = Apply(c, key, value);
      if (absl::IsNotFound(s)) return Err(kv.first, key, "unknown key");
      if (!s.ok()) return Err(v, key, s.message());
    }
    return absl::OkStatus();
  }

  absl::Status Patterns(const YAML::Node& n, const std::string& key,
                        std::vector<NamedPattern>* out) {
    if (!n.IsSequence()) return Err(n, key, "must be a list of {pattern, name}");
    for (const auto& item : n) {
      if (!item.IsMap()) return Err(item, key, "entries must be {pattern, name}");
      NamedPattern p;
      for (const auto& kv : item) {
        std::string k = kv.first.Scalar();
        if (k == "pattern") {
          ASSIGN_OR_RETURN(p.pattern, Scalar(kv.second, key + ".pattern"));
        } else if (k == "name") {
          ASSIGN_OR_RETURN(p.name, Scalar(kv.second, key + ".name"));
        } else
          return Err(kv.first, key + "." + k, "unknown key");
      }
      if (p.pattern.empty() || p.name.empty())
        return Err(item, key, "entries need both pattern and name");
      ASSIGN_OR_RETURN(p.name, ResourceName(item, key + ".name", p.name));
      out->push_back(std::move(p));
    }
    return absl::OkStatus();
  }

  // NVIDIA adds the "nvidia.com/" prefix to bare names; any other domain is refused.
  absl::StatusOr<std::string> ResourceName(const YAML::Node& n, const std::string& key,
                                           std::string name) const {
    if (name.find('/') == std::string::npos) name = kPrefix + name;
    if (!absl::StartsWith(name, kPrefix))
      return Err(n, key, absl::StrCat("\"", name, "\" must be in the nvidia.com domain"));
    std::string rest = name.substr(sizeof(kPrefix) - 1);
    bool ok = !rest.empty() && rest.size() <= 63;
    for (char ch : rest)
      ok = ok && (absl::ascii_isalnum(ch) || ch == '-' || ch == '.' || ch == '_');
    if (!ok) return Err(n, key, absl::StrCat("\"", name, "\" is not a valid resource name"));
    return name;
  }

  // sharing.timeSlicing or sharing.mps (NVIDIA's ReplicatedResources): the flags and entries.
  struct SharingTarget {
    bool* rename_by_default;
    bool* fail_requests_greater_than_one;
    std::vector<ReplicatedResource>* resources;
    bool mps;
  };
  absl::Status Sharing(const YAML::Node& n, const std::string& path, const SharingTarget& t) {
    RETURN_IF_ERROR(NeedMap(n, path));
    if (n.IsNull()) return absl::OkStatus();
    for (const auto& kv : n) {
      std::string k = kv.first.Scalar(), key = path + "." + k;
      const YAML::Node& v = kv.second;
      if (k == "renameByDefault" || k == "failRequestsGreaterThanOne") {
        ASSIGN_OR_RETURN(auto s, Scalar(v, key));
        auto b = ParseBool(s);
        if (!b.ok()) return Err(v, key, b.status().message());
        *(k == "renameByDefault" ? t.rename_by_default : t.fail_requests_greater_than_one) = *b;
      } else if (k == "resources") {
        if (!v.IsSequence()) return Err(v, key, "must be a list");
        for (const auto& item : v) RETURN_IF_ERROR(Replicated(item, key, t));
      } else {
        return Err(kv.first, key, "unknown key");
      }
    }
    return absl::OkStatus();
  }

  absl::Status Replicated(const YAML::Node& item, const std::string& key, const SharingTarget& t) {
    if (!item.IsMap()) return Err(item, key, "entries must be mappings");
    ReplicatedResource r;
    r.where = absl::StrCat(file, ":", item.Mark().line + 1);
    for (const auto& kv : item) {
      std::string k = kv.first.Scalar(), sub = key + "." + k;
      const YAML::Node& v = kv.second;
      if (k == "name") {
        ASSIGN_OR_RETURN(auto s, Scalar(v, sub));
        ASSIGN_OR_RETURN(r.name, ResourceName(v, sub, s));
      } else if (k == "rename") {
        ASSIGN_OR_RETURN(auto s, Scalar(v, sub));
        ASSIGN_OR_RETURN(r.rename, ResourceName(v, sub, s));
      } else if (k == "replicas") {
        ASSIGN_OR_RETURN(auto s, Scalar(v, sub));
        // Bounded before anything is expanded: every replica is a device the plugin keeps and
        // lists to the kubelet (1e9 replicas grew the plugin to 2.5 GB before it said a word).
        // 1024 per GPU keeps a 16-GPU node's ListAndWatch answer (16384 devices) well under
        // gRPC's default 4 MiB message.
        if (!absl::SimpleAtoi(s, &r.replicas) || r.replicas < 2 || r.replicas > kMaxReplicasPerGpu)
          return Err(v, sub,
                     absl::StrCat("\"", s, "\" must be an integer 2..", kMaxReplicasPerGpu,
                                  " (replicas per GPU)"));
      } else if (k == "devices") {
        if (t.mps && !(v.IsScalar() && v.Scalar() == "all"))
          return Err(v, sub,
                     "MPS shares every GPU of a resource (one control daemon per resource, as "
                     "NVIDIA's plugin does): only `all` is supported; rename names the shared "
                     "resource");
        if (v.IsSequence()) {
          r.all_devices = false;
          for (const auto& d : v) {
            ASSIGN_OR_RETURN(auto s, Scalar(d, sub));
            r.device_list.push_back(s);
          }
          if (r.device_list.empty()) return Err(v, sub, "empty device list");
        } else {
          ASSIGN_OR_RETURN(auto s, Scalar(v, sub));
          if (s == "all") continue;
          if (!absl::SimpleAtoi(s, &r.device_count) || r.device_count < 1)
            return Err(v, sub, absl::StrCat("\"", s, "\" must be all, a count >= 1 or a list"));
          r.all_devices = false;
        }
      } else {
        return Err(kv.first, sub, "unknown key");
      }
    }
    if (r.name.empty()) return Err(item, key, "entry needs a name");
    if (r.replicas == 0) return Err(item, key, "entry needs replicas");
    t.resources->push_back(std::move(r));
    return absl::OkStatus();
  }

  absl::Status Top(const YAML::Node& root) {
    if (root.IsNull()) return absl::OkStatus();
    if (!root.IsMap()) return Err(root, "(top level)", "must be a mapping");
    for (const auto& kv : root) {
      std::string k = kv.first.Scalar();
      const YAML::Node& v = kv.second;
      if (k == "version") {
        ASSIGN_OR_RETURN(auto s, Scalar(v, k));
        if (!s.empty() && s != "v1")
          return Err(v, k, absl::StrCat("\"", s, "\" is not supported (want v1)"));
      } else if (k == "flags") {
        RETURN_IF_ERROR(Settings(v, "flags"));
      } else if (k == "gpulet") {
        RETURN_IF_ERROR(Settings(v, "gpulet"));
      } else if (k == "resources") {
        RETURN_IF_ERROR(NeedMap(v, k));
        if (v.IsNull()) continue;
        for (const auto& r : v) {
          std::string rk = r.first.Scalar();
          if (rk == "gpus")
            RETURN_IF_ERROR(Patterns(r.second, "resources.gpus", &c.gpus));
          else if (rk == "mig")
            RETURN_IF_ERROR(Patterns(r.second, "resources.mig", &c.migs));
          else
            return Err(r.first, "resources." + rk, "unknown key");
        }
      } else if (k == "sharing") {
        RETURN_IF_ERROR(NeedMap(v, k));
        if (v.IsNull()) continue;
        for (const auto& s : v) {
          std::string sk = s.first.Scalar();
          if (sk == "timeSlicing") {
            RETURN_IF_ERROR(Sharing(
                s.second, "sharing.timeSlicing",
                {&c.rename_by_default, &c.fail_requests_greater_than_one, &c.time_slicing, false}));
          } else if (sk == "mps") {
            // An MPS section without resources is how NVIDIA's defaults spell "off".
            RETURN_IF_ERROR(Sharing(
                s.second, "sharing.mps",
                {&c.mps_rename_by_default, &c.mps_fail_requests_greater_than_one, &c.mps, true}));
            if (!c.mps.empty() && !c.time_slicing.empty())
              return Err(s.first, "sharing.mps",
                         "sharing.timeSlicing and sharing.mps are mutually exclusive (NVIDIA's "
                         "plugin silently drops timeSlicing then); keep one");
          } else {
            return Err(s.first, "sharing." + sk, "unknown key");
          }
        }
      } else if (k == "imex") {
        RETURN_IF_ERROR(NeedMap(v, k));
        if (v.IsNull()) continue;
        for (const auto& i : v) {
          std::string ik = i.first.Scalar();
          if (ik == "channelIDs") {
            if (!i.second.IsSequence()) return Err(i.second, "imex.channelIDs", "must be a list");
            c.imex_channels.clear();
            for (const auto& id : i.second) {
              int x;
              if (!id.IsScalar() || !absl::SimpleAtoi(id.Scalar(), &x) || x != 0)
                return Err(id, "imex.channelIDs", "only [] or [0] are valid");
              c.imex_channels.push_back(x);
            }
          } else if (ik == "required") {
            ASSIGN_OR_RETURN(auto s, Scalar(i.second, "imex.required"));
            auto b = ParseBool(s);
            if (!b.ok()) return Err(i.second, "imex.required", b.status().message());
            c.imex_required = *b;
          } else {
            return Err(i.first, "imex." + ik, "unknown key");
          }
        }
      } else {
        return Err(kv.first, k, "unknown key");
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace

const std::vector<Setting>& Settings() { return kSettings; }

const char* DefaultOf(const Setting& s) {
  auto it = kDefaults.find(s.key);
  return it == kDefaults.end() ? nullptr : it->second;
}

std::map<std::string, std::string> EnvironmentSnapshot() {
  std::map<std::string, std::string> env;
  for (const auto& s : kSettings)
    for (const char* e : s.envs)
      if (const char* v = std::getenv(e)) env[e] = v;
  if (const char* v = std::getenv("CONFIG_FILE")) env["CONFIG_FILE"] = v;
  return env;
}

absl::Status ParseXidList(const std::string& text, std::set<uint64_t>* out) {
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    uint64_t x;
    if (!absl::SimpleAtoi(part, &x))
      return absl::InvalidArgumentError(absl::StrCat("\"", part, "\" is not an XID number"));
    out->insert(x);
  }
  return absl::OkStatus();
}

absl::StatusOr<Config> ParseConfig(const std::string& text, const std::string& filename,
                                   Config base) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(filename, ":", e.mark.line + 1, ": not valid YAML: ", e.msg));
  }
  FileParser p{filename, base};
  try {
    RETURN_IF_ERROR(p.Top(root));
  } catch (const YAML::Exception& e) {  // e.g. a key that is not a scalar
    return absl::InvalidArgumentError(absl::StrCat(filename, ":", e.mark.line + 1, ": ", e.msg));
  }
  if (!base.mps.empty() && !base.time_slicing.empty())
    return absl::InvalidArgumentError(
        absl::StrCat(base.mps.front().where,
                     ": sharing.mps: sharing.timeSlicing and sharing.mps are mutually "
                     "exclusive (NVIDIA's plugin silently drops timeSlicing then); keep one"));
  // A shared resource is renamed to <name>.shared by default when asked to.
  for (auto* list : {&base.time_slicing, &base.mps})
    for (auto& r : *list) {
      bool by_default = list == &base.mps ? base.mps_rename_by_default : base.rename_by_default;
      if (r.rename.empty() && by_default) r.rename = r.name + ".shared";
      if (!r.rename.empty() && r.rename.size() - (sizeof(kPrefix) - 1) > 63)
        return absl::InvalidArgumentError(
            absl::StrCat(r.where, ": rename: \"", r.rename, "\" is longer than 63 characters"));
    }
  return base;
}

absl::StatusOr<Config> LoadConfig(const ConfigSources& src) {
  Config c;
  if (!src.file.empty()) {
    // Not an ifstream: it opens a directory and reads it as empty, i.e. runs with defaults.
    std::error_code ec;
    if (std::filesystem::is_directory(src.file, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("config file ", src.file, ": is a directory, not a config file"));
    }
    absl::StatusOr<std::string> text = ReadFileToString(src.file);
    if (!text.ok()) {
      return absl::NotFoundError(
          absl::StrCat("config file ", src.file, ": cannot read: ", text.status().message()));
    }
    ASSIGN_OR_RETURN(c, ParseConfig(*text, src.file));
  }
  for (const auto& s : kSettings) {
    for (const char* e : s.envs) {
      auto it = src.env.find(e);
      if (it == src.env.end()) continue;
      absl::Status st = Apply(c, s.key, it->second);
      if (!st.ok())
        return absl::InvalidArgumentError(absl::StrCat("environment ", e, ": ", st.message()));
      break;
    }
  }
  for (const auto& s : kSettings) {
    auto it = src.flags.find(s.key);
    if (it == src.flags.end()) continue;
    absl::Status st = Apply(c, s.key, it->second);
    if (!st.ok())
      return absl::InvalidArgumentError(absl::StrCat("flag --", s.flag, ": ", st.message()));
  }
  RETURN_IF_ERROR(Validate(c));
  return c;
}

SharingLabels LabelsOf(const Config& c) {
  SharingLabels l;
  l.mig_strategy = c.mig_strategy == MigStrategy::kSingle  ? "single"
                   : c.mig_strategy == MigStrategy::kMixed ? "mixed"
                                                           : "none";
  for (const ReplicatedResource& r : c.Shared())
    if (r.name == "nvidia.com/gpu" && r.replicas > 1) {
      l.replicas = r.replicas;
      l.sharing_strategy = c.UsesMps() ? "mps" : "time-slicing";
    }
  return l;
}

absl::Status Validate(const Config& c) {
  // NVIDIA's plugin adds CDI devices of its own vendor for these (k8s.device-plugin.nvidia.com/
  // gdrcopy=all, .../imex-channel=0); gpulet's CDI spec defines no such devices, so the
  // combination would silently lose them.
  if (c.list.cdi_annotations || c.list.cdi_cri) {
    for (const auto& [on, key] :
         {std::pair{c.gdrcopy, "flags.gdrcopyEnabled"}, std::pair{c.gds, "flags.gdsEnabled"},
          std::pair{c.mofed, "flags.mofedEnabled"},
          std::pair{!c.imex_channels.empty(), "imex.channelIDs"}})
      if (on)
        return absl::InvalidArgumentError(absl::StrCat(
            key,
            " with a CDI deviceListStrategy (cdi-annotations, cdi-cri) is not supported: "
            "gpulet's CDI spec defines no such device (NVIDIA's adds its own); use envvar or "
            "volume-mounts"));
  }
  if (!c.UsesMps()) return absl::OkStatus();
  // NVIDIA's validateFlags: one MPS daemon per resource cannot serve mixed MIG resources.
  if (c.mig_strategy == MigStrategy::kMixed)
    return absl::InvalidArgumentError(
        absl::StrCat(c.mps.front().where,
                     ": sharing.mps: not supported with migStrategy mixed (MPS does not "
                     "share MIG devices; NVIDIA's plugin refuses this too)"));
  return absl::OkStatus();
}

}  // namespace gpulet::plugin
