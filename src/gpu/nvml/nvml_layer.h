// The production GpuLayer: NVML loaded with dlopen (never linked), symbols resolved at run time
// with the newest versioned name preferred (nvmlInit_v2 over nvmlInit, ...). A missing optional
// symbol degrades its feature (the field stays unset; one warning names the symbol); a missing
// required one (init, count, handles, UUID) is an error. Used through OpenGpuLayer (gpu/open.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gpu/gpu.h"

namespace gpulet::gpu {

struct NvmlBackendOptions {
  std::string library = "libnvidia-ml.so.1";  // dlopen() name or path
  std::string host_root = "/";                // root for /sys reads (NUMA node, CPU list)
  // Simulated node only: the fake library is told its machine and sim root before nvmlInit, and its
  // error text (machine file:line) replaces NVML's generic one.
  bool simulate = false;
  std::string machine, sim_root;
  std::string owned_dir;  // removed (recursively) when the layer is destroyed; may be empty
};

absl::StatusOr<std::unique_ptr<GpuLayer>> OpenNvmlGpuLayer(const NvmlBackendOptions& options);

// The MIG profile name ("1g.5gb", "1c.3g.20gb") from a MIG device's slice counts and memory, with
// the memory rounded as NVIDIA's device plugin names its resources: the fraction of the parent's
// memory is rounded up to eighths, then scaled by the parent's size in whole GiB.
std::string MigProfileName(uint32_t gi_slices, uint32_t ci_slices, uint64_t memory_mib,
                           uint64_t parent_memory_bytes);

}  // namespace gpulet::gpu
