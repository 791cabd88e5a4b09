// `gpulet validate`: checks a node's GPU stack in order and says, per step, what it found or what
// is wrong. Steps: driver (NVML answers with GPUs), runtime (the engine is configured for the
// installed shim, the CDI spec parses, and a container asking for the first GPU would get its
// device node and the driver libraries), device plugin (the kubelet lists our resources as
// allocatable through its PodResources API and, with API access, the node's capacity shows them). A
// failed step stops the steps after it (they depend on it).
#pragma once

#include <string>
#include <vector>

#include "gpu/open.h"
#include "k8s/client.h"
#include "node/validation.h"

namespace gpulet::node {

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
  // The container probe of the runtime step. Paths are as this process sees them.
  bool container_probe = true;
  std::string probe_busybox = "/bin/busybox";  // static busybox: the probe's whole rootfs
  std::string probe_runc;  // empty: the host's runc (under host_root), else runc on PATH
  int probe_timeout_seconds = 30;
};

ValidationReport ValidateStack(const ValidateOptions& options);

// ValidateStack's last step alone: the kubelet's device-plugin GPU resources and, with
// `dra_driver`, the driver's ResourceSlices of the node.
StepResult ValidateDevicePlugin(const ValidateOptions& options);

}  // namespace gpulet::node
