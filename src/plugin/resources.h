// NVIDIA's resources built from the GPU inventory and the config: whole GPUs (nvidia.com/gpu or a
// renamed resource), MIG devices under the none / single / mixed strategies, and time-slicing
// replicas ("<id>::<n>"), each a kubelet::Resource. Allocate turns device IDs into the container
// edits of the configured device-list strategies; Preferred is topology-aware for whole GPUs and
// distributed / packed for replicas.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/gpu.h"
#include "kubelet/resource.h"
#include "plugin/config.h"
#include "plugin/health.h"
#include "plugin/mps.h"

namespace gpulet::plugin {

// The MIG profile as NVIDIA names resources after it: "1g.5gb", "1c.2g.10gb" (fewer compute than
// GPU slices), "1g.5gb+me" -> resource "nvidia.com/mig-1g.5gb.me".
std::string MigProfileName(const gpu::MigDevice& m);

// Builds every resource of the node. `health` must outlive the resources and is shared by them.
// `host_root` is where /proc/driver/nvidia-caps/mig-minors and the device nodes are looked up
// ("/" in production, the sim root for a simulated node). Errors name the device or config entry
// (file:line) that cannot be placed. With sharing.mps, `mps` (when given) receives one share per
// resource whose GPUs are shared through MPS; their Allocate adds the MPS pipe and shm.
absl::StatusOr<std::vector<std::shared_ptr<kubelet::Resource>>> BuildResources(
    const gpu::Inventory& inventory, const Config& config, const HealthMonitor* health,
    const std::string& host_root = "/", std::vector<MpsShare>* mps = nullptr);

// How a grant of whole GPUs (by UUID) reaches a container, as this node's own resources deliver
// theirs: the device-list strategies and passDeviceSpecs of `config`. For the vGPU resources, whose
// grants are made elsewhere (src/vgpu/node); `resource` names them in a CDI annotation's key.
using GpuDelivery = std::function<void(const std::vector<std::string>& uuids,
                                       v1beta1::ContainerAllocateResponse* response)>;
absl::StatusOr<GpuDelivery> MakeGpuDelivery(const gpu::Inventory& inventory, const Config& config,
                                            const std::string& host_root,
                                            const std::string& resource);

}  // namespace gpulet::plugin
