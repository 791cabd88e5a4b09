// Which of a node's GPUs a setting names: "" (none), "all", or a comma list of NVML indexes and
// UUIDs (gpulet.dra.gpus). Below every part that splits the GPUs between ways of serving them, so
// the device plugin and the DRA driver read one selection the same way.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/gpu.h"

namespace gpulet::gpu {

// Positions in inv.devices, sorted, each once. NotFound names an entry that matches no GPU.
absl::StatusOr<std::vector<uint32_t>> SelectGpus(const Inventory& inv,
                                                 const std::string& selection);

// The device-plugin IDs (UUIDs, "3", "1:0") of the selected GPUs and their MIG devices: what the
// device plugin leaves out when another way (DRA) serves them, so one GPU is never served twice.
absl::StatusOr<std::set<std::string>> DevicePluginIds(const Inventory& inv,
                                                      const std::string& selection);

}  // namespace gpulet::gpu
