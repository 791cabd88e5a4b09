// The vGPU placement policies by the names users give (extender --policy, the pod annotation
// gpulet.io/vgpu-policy, the node agent): "binpack" (placement "best-fit": the fullest node and GPU
// that fit), "spread" (the emptiest), or any placement registry name. One place, so the extender
// and the node choose alike. Policies are placement::Policy objects (thread-safe Score()).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "placement/placement.h"

namespace gpulet::vgpu {

absl::StatusOr<std::unique_ptr<placement::Policy>> MakeVgpuPolicy(const std::string& name);
std::vector<std::string> VgpuPolicyNames();

}  // namespace gpulet::vgpu
