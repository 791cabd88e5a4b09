// What a container asks for: which GPUs (NVIDIA_VISIBLE_DEVICES, the device plugin's volume mounts
// under /var/run/nvidia-container-devices/, CDI annotations), which driver capabilities
// (NVIDIA_DRIVER_CAPABILITIES) and which driver constraints (NVIDIA_REQUIRE_*), decided from an OCI
// spec and the runtime configuration. Plain values and functions; thread-safe.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/edits.h"

namespace gpulet::runtime {

class CdiRegistry;

// Configuration shared by the shim and the hook (JSON file, see docs/runtime.md).
struct RuntimeConfig {
  std::string mode = "auto";                             // auto | cdi | legacy
  std::vector<std::string> runtimes = {"runc", "crun"};  // first found is exec'd (PATH or absolute)
  std::vector<std::string> spec_dirs = {"/etc/cdi", "/var/run/cdi"};
  std::vector<std::string> annotation_prefixes = {"cdi.k8s.io/"};
  std::string default_kind = "nvidia.com/gpu";
  std::string hook_path = "/usr/bin/gpulet-container-hook";
  // The host's ldconfig (never the container's); empty: the first of /sbin/ldconfig.real,
  // /sbin/ldconfig, /usr/sbin/ldconfig.real, /usr/sbin/ldconfig. See runtime/ldconfig.h.
  std::string ldconfig;
  // The image's own NVIDIA_VISIBLE_DEVICES is trusted only for privileged containers unless this
  // is set (see docs/runtime.md for the trade-off with the device plugin's envvar strategy).
  bool accept_envvar_when_unprivileged = false;
  // Binds of /dev/null at /var/run/nvidia-container-devices/<id> (the device plugin's grant).
  bool accept_volume_mounts = true;
  bool disable_require = false;
  std::string source;  // the file it was read from; empty for built-in defaults
};

// Reads the JSON configuration; unknown keys and wrong types are errors naming the key.
absl::StatusOr<RuntimeConfig> LoadRuntimeConfig(const std::string& path);
// `path` when given, else $GPULET_RUNTIME_CONFIG, else /etc/gpulet/container-runtime.json; a
// missing default file gives the defaults.
absl::StatusOr<RuntimeConfig> LoadDefaultRuntimeConfig(const std::string& path = "");

struct GpuRequest {
  bool gpu_container = false;        // false: leave the container alone
  std::vector<std::string> devices;  // fully-qualified CDI names
  bool from_cdi = false;             // explicitly CDI (annotations / qualified names)
  std::set<std::string> capabilities;
  std::vector<std::string> requirements;  // NVIDIA_REQUIRE_* values
  std::string source;                     // for messages: "NVIDIA_VISIBLE_DEVICES", ...
};

// Privileged = CAP_SYS_ADMIN in the bounding set, as the NVIDIA toolkit decides it.
bool IsPrivileged(const Json& spec);

// Decides the request. Errors: an unknown driver capability, a malformed device list.
absl::StatusOr<GpuRequest> ResolveRequest(const Json& spec, const RuntimeConfig& config);

// Driver facts constraints are checked against.
struct DriverFacts {
  std::string driver_version;  // "550.54.15"
  std::string cuda_version;    // "12.4"
};
// Checks NVIDIA_REQUIRE_* expressions: "cuda>=12.4 driver>=550" (space: OR, comma: AND; each
// variable must hold). Supported keys: cuda, driver. Failure names the unmet expression.
absl::Status CheckRequirements(const std::vector<std::string>& requirements,
                               const DriverFacts& facts);

// The container edits a request gets (shim in CDI and legacy mode, and the legacy hook): the
// requested devices from the CDI specs ("none": the shared edits of the default kind only), cut
// to the driver capabilities unless the devices were named through CDI, with device numbers
// filled from the host nodes. Errors: unknown device, missing host node.
absl::StatusOr<ContainerEdits> EditsForRequest(const GpuRequest& req, const CdiRegistry& registry,
                                               const RuntimeConfig& config);

// Keeps only the shared mounts and control nodes the capabilities call for (files gpulet does not
// classify are kept).
void FilterByCapabilities(ContainerEdits& edits, const std::set<std::string>& caps);

}  // namespace gpulet::runtime
