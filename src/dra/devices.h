// What gpulet publishes for DRA (resource.k8s.io/v1): one device per GPU without MIG and one per
// MIG device, named by position ("gpu-3", "gpu-1-mig-2-0" for GPU instance 2, compute instance 0),
// with the attributes users select on in CEL and the memory capacity. Pure functions of the
// inventory; the GPU layer's types only (no API client, no gRPC).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/gpu.h"
#include "nlohmann/json.hpp"

namespace gpulet::dra {

using nlohmann::json;

// The driver name: the ResourceSlices' spec.driver, the attribute domain, the DeviceClasses'
// selector and the kubelet plugin's registration name.
inline constexpr char kDriverName[] = "gpu.gpulet.io";
// The interposer's limits through DRA: opaque device configuration of this kind (docs/dra.md).
inline constexpr char kConfigApiVersion[] = "gpu.gpulet.io/v1alpha1";

struct DraDevice {
  std::string name;  // a DNS label, unique in the pool
  uint32_t gpu = 0;  // position in Inventory::devices
  int mig = -1;      // position in Device::mig_devices, -1 for a whole GPU
  std::string uuid;  // GPU-... or MIG-...
  uint64_t memory_bytes = 0;
  json entry;  // the ResourceSlice spec.devices[] element
};

struct DeviceOptions {
  // Which GPUs DRA serves: "" none, "all", or a comma list of indexes / UUIDs (their MIG devices
  // included). Errors name an unknown entry.
  std::string selection = "all";
  // Publish whole GPUs as shareable with consumable capacity (resource.k8s.io/v1
  // allowMultipleAllocations + capacity requestPolicy; the DRAConsumableCapacity feature gate,
  // alpha in Kubernetes 1.34): claims then take a share of "memory" and "cores".
  bool consumable_capacity = false;
  // Where sysfs is looked up for the PCIe root ("" = "/").
  std::string host_root = "/";
};

// Consumable capacity: a GPU's memory rounded down to the request grid (min 256Mi, step 256Mi),
// the requestPolicy default, which the API requires on that grid (min + k * step): what a claim
// that names no memory consumes, i.e. the whole GPU (81559Mi -> 81408Mi).
uint64_t WholeShareBytes(uint64_t memory_bytes);

// Every device DRA serves on this inventory, healthy or not, in a stable order.
absl::StatusOr<std::vector<DraDevice>> BuildDevices(const gpu::Inventory& inv,
                                                    const DeviceOptions& opt);

// NVIDIA's "580.159.04" as a semantic version ("580.159.4"); CUDA 13000 -> "13.0.0";
// compute capability 9.0 -> "9.0.0". Empty when the input has no number.
std::string SemverOf(const std::string& dotted);

// NVLink domains: GPUs joined by NVLink (directly or through others) share the lowest index of
// their group; -1 for a GPU without NVLink.
std::vector<int> NvlinkDomains(const gpu::Inventory& inv);

}  // namespace gpulet::dra
