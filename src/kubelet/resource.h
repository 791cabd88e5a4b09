// The device plugin's extension point: one Resource per extended resource name the node offers
// (nvidia.com/gpu, nvidia.com/mig-1g.5gb, nvidia.com/gpu.shared, tencent.com/vcuda-core, ...).
// The kubelet-facing server (server.h) serves any Resource on its own socket without knowing what
// kind it is; a new kind of resource implements this interface and is handed to PluginManager.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "k8s/deviceplugin/v1beta1/api.pb.h"

namespace gpulet::kubelet {

// A generation counter that wakes waiters when it moves. Owners call Notify() whenever something a
// reader derives (device list, health) may have changed. Thread-safe.
class ChangeNotifier {
 public:
  void Notify() {
    absl::MutexLock l(&mu_);
    ++generation_;
  }
  uint64_t generation() const {
    absl::MutexLock l(&mu_);
    return generation_;
  }
  // Blocks until the generation differs from `seen` or `timeout` passes; returns the generation.
  uint64_t WaitChange(uint64_t seen, absl::Duration timeout) const {
    absl::MutexLock l(&mu_);
    auto moved = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return generation_ != seen; };
    mu_.AwaitWithTimeout(absl::Condition(&moved), timeout);
    return generation_;
  }

 private:
  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

// One device as the kubelet sees it.
struct DeviceState {
  std::string id;  // at most 63 characters (kubelet limit)
  bool healthy = true;
  int numa_node = -1;  // -1: no topology hint
  bool operator==(const DeviceState&) const = default;
};

// An extended resource served to the kubelet. Implementations must be thread-safe: gRPC handlers
// call them concurrently. Errors returned by Allocate/Preferred/PreStart go to the kubelet as they
// are (use InvalidArgument naming the offending device ID for bad requests).
class Resource {
 public:
  virtual ~Resource() = default;

  // Fully qualified resource name, e.g. "nvidia.com/gpu". Constant for the object's lifetime.
  virtual const std::string& name() const = 0;

  // The current device list with health and NUMA node, in a stable order.
  virtual std::vector<DeviceState> Devices() const = 0;

  // Moves whenever Devices() may have changed; ListAndWatch re-sends the list then. Never null,
  // owned by the resource (or by something that outlives it).
  virtual const ChangeNotifier* changes() const = 0;

  // Container edits (env, mounts, device specs, annotations, CDI devices) for one container that
  // was given `ids`.
  virtual absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocate(
      const std::vector<std::string>& ids) = 0;

  // The preferred `size` devices out of `available`, including every `must_include` one.
  virtual absl::StatusOr<std::vector<std::string>> Preferred(
      const std::vector<std::string>& available, const std::vector<std::string>& must_include,
      int size) = 0;

  // Whether the kubelet must call PreStart before each container start, and the call itself.
  virtual bool pre_start_required() const { return false; }
  virtual absl::Status PreStart(const std::vector<std::string>& ids) { return absl::OkStatus(); }
};

}  // namespace gpulet::kubelet
