// Which pod and container holds which GPU, from the kubelet's PodResources v1 API (List), for the
// metrics exporter's attribution. The kubelet is asked on a timer and on demand (after a
// device-plugin allocation) and by the exporter before a scrape (rate-limited there, see
// metrics::Sampler::ScrapeSnapshot); readers get the last answer from memory.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu/gpu.h"

namespace gpulet::kubelet {

// One device ID given to one container.
struct PodDevice {
  std::string namespace_, pod, container, resource, device_id;
  bool operator==(const PodDevice&) const = default;
};

// The kubelet as an outside world: one List call. Thread-compatible.
class PodResourcesLister {
 public:
  virtual ~PodResourcesLister() = default;
  // Every device of every container whose resource passes the filter (see GrpcPodResourcesLister).
  virtual absl::StatusOr<std::vector<PodDevice>> List() = 0;
};

struct PodResourcesOptions {
  std::string socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  std::chrono::milliseconds timeout{5000};
  // Resources kept besides every "nvidia.com/*" one (renamed or vendor-specific GPU resources).
  std::vector<std::string> extra_resources;
};

// The real kubelet: PodResourcesLister.List over the unix socket. A fresh channel per call, so a
// kubelet restart (socket re-created) is picked up at the next call without reconnect backoff.
class GrpcPodResourcesLister : public PodResourcesLister {
 public:
  explicit GrpcPodResourcesLister(PodResourcesOptions options) : options_(std::move(options)) {}
  absl::StatusOr<std::vector<PodDevice>> List() override;

 private:
  PodResourcesOptions options_;
};

// Where a device ID of the device plugin points on this node: a physical GPU (position in
// Inventory::devices) and, for MIG, the MIG device (position in its mig_devices).
struct DeviceRef {
  size_t device = 0;
  int mig = -1;
};

// Maps the device plugin's ID forms back to the physical device: "GPU-<uuid>", "MIG-<uuid>", an
// index "3", a MIG index "3:1" (GPU index : MIG device index), each optionally with a replica
// suffix "::<n>" (time-slicing / MPS replicas). nullopt when nothing on the node matches.
std::optional<DeviceRef> ResolveDeviceId(const gpu::Inventory& inventory, std::string_view id);

// Keeps the last List answer, refreshed by a background thread every `interval` and whenever
// RequestRefresh() is called. Thread-safe; Stop() (or the destructor) joins the thread.
class PodResourcesCache {
 public:
  struct State {
    std::vector<PodDevice> devices;  // last successful answer
    bool up = false;                 // whether the last call succeeded
    uint64_t errors = 0;             // failed calls so far
    uint64_t refreshes = 0;          // completed calls (successful or not)
    uint64_t generation = 0;         // bumped each time a successful answer differs from the last
  };

  PodResourcesCache(std::unique_ptr<PodResourcesLister> lister, std::chrono::milliseconds interval);
  ~PodResourcesCache();
  void Start();
  void Stop();
  // Asks for a refresh soon (e.g. after an Allocate); returns at once.
  void RequestRefresh();
  // Refreshes on the caller's thread (tests, first fill).
  void RefreshNow();
  State state() const;

 private:
  void Loop();

  std::unique_ptr<PodResourcesLister> lister_;
  std::chrono::milliseconds interval_;
  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_);
  bool refresh_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex call_mu_;  // serialises List calls between the loop and RefreshNow
  std::thread thread_;
};

}  // namespace gpulet::kubelet
