// The fractional-GPU resource rules, in ONE place: the admission webhook, the scheduler extender
// and the node agent all call ParsePod() so a pod is judged the same way everywhere.
//
// A container's tencent.com/vcuda-core (C) and tencent.com/vcuda-memory (M, 256 MiB units):
//   C in 1..99           a share of one GPU; M >= 1 is required and must fit one GPU.
//   C = 100*k (k >= 1)   k whole GPUs, exclusive; M is optional (a whole GPU brings all its memory)
//                        and, if given, may not exceed k GPUs' memory.
//   anything else        rejected: 150, 250, 0 (or absent) with memory, negative, fractional.
// Requests, when given, must equal limits. Init containers may not ask for vGPU resources (the
// kubelet would book them on top of the app containers; not supported).
// Plain functions on plain data: thread-safe, no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"
#include "placement/placement.h"

namespace gpulet::vgpu {

inline constexpr uint64_t kMemoryUnitBytes = 256ull << 20;  // one vcuda-memory unit
inline constexpr int64_t kCoresPerGpu = 100;
// Bounds on what a pod or a node inventory may say (a GPU of 256 TiB, 128 GPUs for one
// container). Larger values are refused, so no product of them below overflows.
inline constexpr int64_t kMaxMemoryUnitsPerGpu = int64_t{1} << 20;
inline constexpr int64_t kMaxGpusPerContainer = 128;

// Resource names, configurable; TKEStack GPU Manager's by default so existing pods keep working.
struct ResourceNames {
  std::string core = "tencent.com/vcuda-core";
  std::string memory = "tencent.com/vcuda-memory";
};

// Annotations gpulet reads and writes on pods. The extender writes the node, the per-container GPU
// UUIDs and the bind time; the node agent flips `assigned` to "true" once Allocate served the pod.
inline constexpr char kAnnotationNode[] = "gpulet.io/vgpu-node";
inline constexpr char kAnnotationGpusPrefix[] = "gpulet.io/vgpu-gpus-";    // + container index
inline constexpr char kAnnotationBindTime[] = "gpulet.io/vgpu-bind-time";  // unix nanoseconds
inline constexpr char kAnnotationAssigned[] = "gpulet.io/vgpu-assigned";
inline constexpr char kAnnotationPolicy[] = "gpulet.io/vgpu-policy";  // binpack|spread|<registry>
// TKEStack's soft-limit annotation: the core share may borrow up to this percent when idle.
inline constexpr char kAnnotationCoreLimit[] = "tencent.com/vcuda-core-limit";
// Node annotation written by the agent: per-GPU inventory of the fractional pool (JSON list of
// {"uuid","index","memoryUnits","healthy"}). The extender prefers it over node capacity.
inline constexpr char kAnnotationNodeGpus[] = "gpulet.io/vgpu-gpus";

// What one container asks for, in vcuda units (cores: 1/100 GPU; memory: 256 MiB units; the
// placement library's ContainerRequest is in milli-GPU and bytes: PlacementRequestOf converts).
// `index` is the position in spec.containers.
struct ContainerUnits {
  int index = 0;
  std::string name;
  int64_t cores = 0;
  int64_t memory_units = 0;
  bool wants_gpu() const { return cores > 0; }
  bool fractional() const { return cores > 0 && cores < kCoresPerGpu; }
  int64_t whole_gpus() const { return cores >= kCoresPerGpu ? cores / kCoresPerGpu : 0; }
};

struct PodUnits {
  std::vector<ContainerUnits> containers;  // only containers that ask for vGPU resources
  bool empty() const { return containers.empty(); }
};

// The one vGPU -> placement translation: k x 100 cores are k whole GPUs (memory units of whole
// GPUs are not placed: the GPU is theirs); 1-99 cores a share of one GPU with its memory in bytes.
placement::ContainerRequest PlacementRequestOf(const ContainerUnits& c);

// The one conversion between vcuda-memory units and bytes: units -> bytes (exact), bytes -> units
// (bytes / 256 MiB, rounded toward zero: the units a GPU with `bytes` of memory offers).
constexpr int64_t MemoryUnitsToBytes(int64_t units) {
  return units * static_cast<int64_t>(kMemoryUnitBytes);
}
int64_t MemoryUnitsOf(int64_t bytes);
// The units of a GPU's nominal size: its memory rounded up to whole GiB (a "16 GB" card that
// reports 15.6 GiB counts 16), 4 units per GiB.
int64_t NominalMemoryUnitsOf(int64_t bytes);

// Checks one container's numbers. `max_units_per_gpu` is the largest GPU's memory in units (0 =
// unknown: the memory-fits check is skipped). Errors are InvalidArgument with a message that says
// what is allowed.
absl::Status ValidateContainer(const ContainerUnits& c, int64_t max_units_per_gpu,
                               const ResourceNames& names);

// Reads and validates the vGPU requests of a pod (Kubernetes JSON). Errors name the container and
// the resource. A pod without vGPU requests gives an empty PodUnits.
absl::StatusOr<PodUnits> ParsePod(const nlohmann::json& pod, const ResourceNames& names,
                                  int64_t max_units_per_gpu);

// Parses an integer Kubernetes quantity ("30", "2k", "1Ki", "4Ti"; every suffix of
// resource.Quantity up to E/Ei); fractional values and overflow are errors. The one integer
// quantity parser of the tree: the webhook, the extender, the agent and DRA's claims all read
// through it (CPU and memory requests, which may be fractional, through ParseMilliQuantity).
absl::StatusOr<int64_t> ParseIntQuantity(std::string_view q);

// Any Kubernetes quantity ("500m", "1.5", "2", "1Gi", "0.5Gi", "100u") times 1000, rounded up as
// resource.Quantity's MilliValue() rounds (a CPU request in milli-cores; memory in milli-bytes).
// Exponent forms ("1e3") are read too. Errors: not a quantity, or beyond int64.
absl::StatusOr<int64_t> ParseMilliQuantity(std::string_view q);

// The integer quantity `name` in a resource list (node capacity/allocatable, container limits),
// written as a number or a quantity string; 0 when absent or not an integer.
int64_t QuantityIn(const nlohmann::json& list, const std::string& name);

}  // namespace gpulet::vgpu
