// How commands obtain a GpuLayer: the real NVML, or a simulated node (`--simulate PROFILE`) that
// loads the fake libnvidia-ml.so.1 through the very same dlopen path.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gpu/gpu.h"

namespace gpulet::gpu {

struct GpuOptions {
  // Built-in profile name (dgx-h100, dgx1-v100, a100-mig, pcie-t4, ...) or a machine-file path.
  // Empty: the real NVML.
  std::string simulate;
  // State directory of a simulated node: fault-injection control, its fake /sys and /proc. Shared
  // by every process of one simulated node (agent, `gpulet sim fault`, ...). Empty with `simulate`
  // set: a private temporary directory, removed when the GpuLayer is destroyed.
  std::string sim_root;
  // The NVML library dlopen()ed in production.
  std::string nvml_library = "libnvidia-ml.so.1";
  // Root under which /sys and /proc are read (NUMA node of a PCI device, MIG minors). "/" in
  // production; the sim root for a simulated node.
  std::string host_root = "/";

  // Where this node's /sys, /proc and /dev are read: a simulated node's sim root, else host_root.
  // The one place that choice is made.
  const std::string& NodeRoot() const { return simulate.empty() ? host_root : sim_root; }
};

// A new private sim root (gpulet-sim-XXXXXX in the temporary directory); the caller removes it.
absl::StatusOr<std::string> MakeTempSimRoot();

// Loads NVML (or the fake, for `simulate`), initialises it and reads the inventory. A missing
// library, a failed nvmlInit or a bad machine file is one clear error naming the cause.
absl::StatusOr<std::unique_ptr<GpuLayer>> OpenGpuLayer(const GpuOptions& options);

}  // namespace gpulet::gpu
