// The device plugin's configuration: NVIDIA k8s-device-plugin `version: v1` files accepted as they
// are (flags, resources, sharing.timeSlicing, imex), plus gpulet's own `gpulet:` section (health,
// checkpoint ID strategy). Values come from defaults < config file < environment < flags, with
// NVIDIA's variable and flag names. Plain values; the functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gpulet::plugin {

// The most replicas a GPU may be shared into (sharing.timeSlicing / sharing.mps): see config.cc.
inline constexpr int kMaxReplicasPerGpu = 1024;

enum class MigStrategy { kNone, kSingle, kMixed };
enum class IdStrategy { kUuid, kIndex };
enum class SharedPolicy { kDistributed, kPacked };

struct ListStrategies {
  bool envvar = true, volume_mounts = false, cdi_annotations = false, cdi_cri = false;
  bool operator==(const ListStrategies&) const = default;
  bool OnlyCdi() const { return !envvar && !volume_mounts; }
};

// resources.gpus / resources.mig: devices whose product name (GPUs) or MIG profile (MIG) matches
// the glob `pattern` are offered as `name` (fully qualified, "nvidia.com/...").
struct NamedPattern {
  std::string pattern, name;
  bool operator==(const NamedPattern&) const = default;
};

// One sharing.timeSlicing.resources entry.
struct ReplicatedResource {
  std::string name;    // fully qualified resource being shared, e.g. nvidia.com/gpu
  std::string rename;  // fully qualified new name; empty: `name` (or name.shared, renameByDefault)
  int replicas = 0;    // >= 2
  // devices: all | <count> | [index or UUID, ...]
  bool all_devices = true;
  int device_count = 0;
  std::vector<std::string> device_list;
  std::string where;  // file:line, for later messages
  bool operator==(const ReplicatedResource&) const = default;
};

struct HealthConfig {
  bool disabled = false;       // DP_DISABLE_HEALTHCHECKS=all
  bool xids_disabled = false;  // DP_DISABLE_HEALTHCHECKS=xids
  std::set<uint64_t> disabled_xids, enabled_xids;
  absl::Duration hold_down = absl::Seconds(30);  // healthy answers needed before recovery
  absl::Duration probe_interval = absl::Seconds(1);
  std::string unhealthy_devices_file = "/etc/nvidia-device-plugin/unhealthyDevices.json";
  bool operator==(const HealthConfig&) const = default;
};

// gpulet.vgpu: which GPUs are shared fractionally as tencent.com/vcuda-core / vcuda-memory
// (src/vgpu/node/node.h, docs/vgpu.md). Pool GPUs are not offered as nvidia.com/gpu.
struct VgpuConfig {
  std::string gpus;            // "" (default): vGPU off; "all": every non-MIG GPU; or "0,3,GPU-..."
  bool nominal_memory = true;  // memory units from the whole-GiB size (H100 80GB: 320), not NVML's
  std::string state_dir = "/var/lib/gpulet/vgpu";  // checkpoint + per-container accounting files
  // Host path of the interposer: where `gpulet install` puts it (node/install.h prefix).
  std::string library = "/usr/local/gpulet/lib/libgpulet-vcuda.so";
  // Accounting directories on size-bounded tmpfs mounts (vgpu/container/container_files.h).
  bool accounting_tmpfs = false;
  std::string policy = "binpack";  // placement of pods the extender did not place
  absl::Duration reconcile_interval = absl::Seconds(5);  // release / identity housekeeping
  bool operator==(const VgpuConfig&) const = default;
};

// gpulet.dra: which GPUs the node agent serves as a DRA driver (src/dra, docs/dra.md) instead of
// through the device plugin. DRA GPUs (and their MIG devices) are not offered as device-plugin
// resources, so one GPU is never served both ways.
struct DraConfig {
  std::string gpus;                               // "" (default): DRA off; "all"; or "0,3,GPU-..."
  std::string state_dir = "/var/lib/gpulet/dra";  // checkpoint + fractional claims' accounting
  std::string cdi_dir = "/var/run/cdi";           // the claims' CDI specs
  std::string kubelet_dir = "/var/lib/kubelet";   // plugins_registry/ and plugins/ live here
  bool consumable_capacity = false;  // shareable GPUs (DRAConsumableCapacity, alpha in 1.34)
  bool operator==(const DraConfig&) const = default;
};

struct Config {
  MigStrategy mig_strategy = MigStrategy::kNone;
  bool fail_on_init_error = true;
  std::string driver_root = "/";
  std::string dev_root;  // empty: driver_root
  bool gdrcopy = false, gds = false, mofed = false;
  bool pass_device_specs = false;
  ListStrategies list;
  IdStrategy id_strategy = IdStrategy::kUuid;             // what containers are told
  IdStrategy checkpoint_id_strategy = IdStrategy::kUuid;  // what the kubelet sees as device IDs
  std::string cdi_annotation_prefix = "cdi.k8s.io/";
  SharedPolicy shared_policy = SharedPolicy::kDistributed;
  std::vector<NamedPattern> gpus, migs;  // empty: NVIDIA's defaults
  bool rename_by_default = false;
  bool fail_requests_greater_than_one = false;
  std::vector<ReplicatedResource> time_slicing;
  // sharing.mps: the same shape; NVIDIA fails requests of more than one replica unless told not to.
  bool mps_rename_by_default = false;
  bool mps_fail_requests_greater_than_one = true;
  std::vector<ReplicatedResource> mps;
  std::string mps_root = "/run/nvidia/mps";  // flags.mpsRoot: host dir of pipe, log and shm dirs
  std::string mps_bin_dir;  // gpulet.mps.binDir: nvidia-cuda-mps-control, nvidia-smi; "": $PATH
  std::vector<int> imex_channels;
  bool imex_required = false;
  HealthConfig health;
  VgpuConfig vgpu;
  DraConfig dra;
  // NVIDIA keys accepted and ignored, each "file:line: key: accepted and ignored: why" (logged).
  std::vector<std::string> notes;
  bool operator==(const Config&) const = default;

  std::string DevRoot() const { return dev_root.empty() ? driver_root : dev_root; }
  // The active sharing (NVIDIA's SharingStrategy()): MPS when configured, else time-slicing.
  bool UsesMps() const { return !mps.empty(); }
  const std::vector<ReplicatedResource>& Shared() const { return UsesMps() ? mps : time_slicing; }
  bool FailSharedRequestsGreaterThanOne() const {
    return UsesMps() ? mps_fail_requests_greater_than_one : fail_requests_greater_than_one;
  }
};

// A scalar setting reachable from the file, the environment and a flag.
struct Setting {
  const char* key;                // dotted path in the file, e.g. "flags.migStrategy"
  const char* flag;               // long flag without dashes, e.g. "mig-strategy"
  std::vector<const char*> envs;  // environment variables, first wins
  const char* help;
};
const std::vector<Setting>& Settings();
// The setting's value when nothing sets it, as text Apply() takes ("" = unset); nullptr if none is
// recorded (ConfigTest.EverySettingHasATrueDefault fails then).
const char* DefaultOf(const Setting& s);

struct ConfigSources {
  std::string file;                          // config file path; empty: none
  std::map<std::string, std::string> env;    // variable -> value (EnvironmentSnapshot())
  std::map<std::string, std::string> flags;  // Setting::key -> value, only for flags given
};

// The environment variables of Settings() that are set in this process.
std::map<std::string, std::string> EnvironmentSnapshot();

// defaults < file < environment < flags. Errors name the source: "file:line: key: problem",
// "environment MIG_STRATEGY: ...", "flag --mig-strategy: ...".
absl::StatusOr<Config> LoadConfig(const ConfigSources& sources);

// The file layer alone on top of `base`; `filename` is used in messages.
absl::StatusOr<Config> ParseConfig(const std::string& text, const std::string& filename,
                                   Config base = {});

// What gpu-feature-discovery labels from the same config: the MIG strategy ("none", "single",
// "mixed") and the sharing of nvidia.com/gpu ("none", "time-slicing", "mps" with its replicas).
struct SharingLabels {
  std::string mig_strategy = "none";
  std::string sharing_strategy = "none";
  int replicas = 1;
};
SharingLabels LabelsOf(const Config& c);

// The rules across keys and sources (sharing.mps with migStrategy mixed, gdrcopy/gds/mofed/IMEX
// with CDI strategies are refused, each naming the key and why); part of LoadConfig.
absl::Status Validate(const Config& c);

// Parses "79,48" into `out`; InvalidArgument naming the bad element.
absl::Status ParseXidList(const std::string& text, std::set<uint64_t>* out);

}  // namespace gpulet::plugin
