// `gpulet validate`: checks a node's GPU stack in order and says, per step, what it found or what
// is wrong. Steps: driver (NVML answers with GPUs), runtime (the engine is configured for the
// installed shim, the CDI spec parses, and a container asking for the first GPU would get its
// device node and the driver libraries), device plugin (the kubelet lists our resources as
// allocatable through its PodResources API and, with API access, the node's capacity shows them). A
// failed step stops the steps after it (they depend on it).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gpu/open.h"
#include "k8s/client.h"
#include "node/validation.h"

namespace gpulet::node {

// How the device plugin hands GPUs to containers (flags.plugin.deviceListStrategy and
// passDeviceSpecs).
struct GpuDelivery {
  bool cdi_cri = false;       // CDI names in the CRI request, which the engine resolves
  bool through_shim = false;  // envvar, volume-mounts, cdi-annotations: only gpulet's shim acts
  bool device_specs = false;  // device nodes from the kubelet: any runtime (no driver libraries)
};

// Whether the containers the kubelet starts on this node get their GPUs: FailedPrecondition naming
// the engine, what it does not act on and the fix, when nothing of `d` reaches them.
// `runtime_version` is the Node's status.nodeInfo.containerRuntimeVersion ("containerd://1.6.20";
// empty: unknown, CDI assumed): CDI in CRI needs containerd >= 1.7 or CRI-O >= 1.28, and Docker
// (cri-dockerd) has none. `shim_is_default`: gpulet's shim is the engine's default runtime.
absl::Status CheckGpuDelivery(const GpuDelivery& d, const std::string& runtime_version,
                              bool shim_is_default);

struct ValidateOptions {
  gpu::GpuOptions gpu;
  gpu::GpuLayer* layer = nullptr;  // not owned; when set, used instead of opening `gpu`
  std::string host_root = "/";
  std::string runtime = "auto";  // engine to check: containerd | docker | crio | auto
  std::string prefix = "/usr/local/gpulet";
  std::string cdi_dir = "/var/run/cdi";
  std::string pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  std::vector<std::string> resource_prefixes = {"nvidia.com/", "tencent.com/vcuda-"};
  std::string node_name;          // with `client`: the node whose capacity is checked
  k8s::Client* client = nullptr;  // not owned; null: the capacity check is skipped (and said so)
  // The DRA driver that serves some or all GPUs (gpulet.dra.gpus; empty: none): its ResourceSlices
  // on this node must hold devices, and when every GPU is DRA's the kubelet rightly has no
  // device-plugin GPU resources.
  std::string dra_driver;
  // The device plugin's delivery: the runtime step checks this node's engine acts on it
  // (CheckGpuDelivery; the engine's version from the Node, with `client`). Unset: not checked.
  std::optional<GpuDelivery> delivery;
  // The container probe of the runtime step. Paths are as this process sees them.
  bool container_probe = true;
  std::string probe_busybox = "/bin/busybox";  // static busybox: the probe's whole rootfs
  std::string probe_runc;  // empty: the host's runc (under host_root), else runc on PATH
  int probe_timeout_seconds = 30;
};

ValidationReport ValidateStack(const ValidateOptions& options);

// The runtime step's delivery check alone (CheckGpuDelivery for this node's engine): OK when
// `delivery` is unset. What the readiness controller reruns when the agent's settings change.
absl::Status ValidateGpuDelivery(const ValidateOptions& options);

// ValidateStack's last step alone: the kubelet's device-plugin GPU resources and, with
// `dra_driver`, the driver's ResourceSlices of the node.
StepResult ValidateDevicePlugin(const ValidateOptions& options);

}  // namespace gpulet::node
