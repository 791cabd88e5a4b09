// The host seam: how a process learns the machine it runs on. The real NVML, or a simulated node
// (`--simulate PROFILE`) that loads the fake libnvidia-ml.so.1 through the very same dlopen path;
// and where that node's /sys, /proc and /dev are. The choice between the two, and a simulated
// node's private state directory, are made in open.cc and nowhere else.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/clock.h"
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
  // Root under which the host's /sys and /proc are read (NUMA node of a PCI device, MIG minors):
  // "/", or the host's root mounted in a container (install, validate). Not used when simulating.
  std::string host_root = "/";
};

// The machine a long-running node process (the device plugin, the agent, the DRA driver) works
// on: its GPU layer, where its node's files are, and the clock. Opened once; every part started
// on it reads the node through it, so none of them asks whether the node is simulated.
class Machine {
 public:
  // Opens the GPU layer (OpenGpuLayer's errors). A simulated node without a sim root gets a
  // private one, made here so that the parts can find its /proc and /dev, and removed with the
  // Machine.
  static absl::StatusOr<std::unique_ptr<Machine>> Open(const GpuOptions& options,
                                                       Clock* clock = RealClock());
  ~Machine();
  Machine(const Machine&) = delete;
  Machine& operator=(const Machine&) = delete;

  GpuLayer& gpus() const { return *gpus_; }
  // Where this node's /sys, /proc and /dev are read: a simulated node's sim root, else the host
  // root.
  const std::string& node_root() const { return node_root_; }
  // `path` of this node (e.g. "/dev/nvidia0") as this process reaches it.
  std::string Path(std::string_view path) const;
  // Where the kernel's GPU state (/proc/driver/nvidia-caps/mig-minors) is read before the
  // driver's root: a simulated node's root; empty on a real node (the driver's, then this host's).
  std::string kernel_root() const { return simulated_ ? node_root_ : std::string(); }
  Clock* clock() const { return clock_; }

 private:
  Machine(std::unique_ptr<GpuLayer> gpus, std::string node_root, bool simulated,
          std::string owned_root, Clock* clock);
  std::unique_ptr<GpuLayer> gpus_;
  std::string node_root_;
  bool simulated_;
  std::string owned_root_;  // a private sim root, removed after the layer is gone
  Clock* clock_;
};

// Just the GPU layer, for commands that read nothing else of the node (info, labels, the
// exporter, cdi generate, install, validate): NVML (or the fake, for `simulate`), initialised,
// its inventory read; a simulated node without a sim root gets a private one, removed with the
// layer. A missing library, a failed nvmlInit or a bad machine file is one clear error naming the
// cause.
absl::StatusOr<std::unique_ptr<GpuLayer>> OpenGpuLayer(const GpuOptions& options);

}  // namespace gpulet::gpu
