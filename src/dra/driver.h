// gpulet as a DRA driver (resource.k8s.io/v1, kubelet DRA plugin API v1 and v1beta1).
//
// The kubelet finds the plugin through a Registration socket in its plugins_registry directory
// (GetInfo: type "DRAPlugin", name gpu.gpulet.io, the DRA service socket as endpoint, versions
// "v1.DRAPlugin" and "v1beta1.DRAPlugin") and then calls NodePrepareResources /
// NodeUnprepareResources with claim namespace, name and uid. Prepare reads the ResourceClaim from
// the API server, takes the allocation results of this driver and this node's pool, writes one CDI
// spec per claim (kind gpu.gpulet.io/claim, atomically, under the CDI directory) and answers with
// its CDI device IDs; the container runtime applies it. Fractional claims (opaque
// gpu.gpulet.io/v1alpha1 VgpuConfig, or consumed capacity) get the vGPU interposer's environment,
// library and a per-claim accounting file: every container of every pod sharing the claim shares
// that one limit. Prepared claims are checkpointed before the answer: a restart loses nothing and
// a repeated prepare answers the same devices without reading the API again. Unprepare removes the
// spec, the accounting directory and the checkpoint entry; an unknown claim is already unprepared.
//
// The node's devices are published as ResourceSlices (SlicePublisher) and re-published when
// health or the inventory (MIG layout) changes: an unhealthy device leaves the slice. Prepared
// claims get status.devices entries with a Ready condition that follows the device's health.
//
// Thread-safe. Owns its gRPC servers and one sync thread. The GpuLayer, the API client and the
// change notifier are not owned and must outlive the driver.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "dra/devices.h"
#include "dra/slices.h"
#include "gpu/gpu.h"
#include "k8s/client.h"
#include "kubelet/resource.h"
#include "runtime/cdi.h"

namespace grpc {
class Server;
}

namespace gpulet::dra {

struct DriverOptions {
  std::string driver = kDriverName;
  std::string node_name;
  DeviceOptions devices;
  // The kubelet's directory: the registration socket goes in <dir>/plugins_registry, the DRA
  // service socket in <dir>/plugins/<driver>/dra.sock. Empty: no gRPC servers (tests and the
  // benchmark call Prepare/Unprepare directly).
  std::string kubelet_dir = "/var/lib/kubelet";
  std::string cdi_dir = "/var/run/cdi";
  // Checkpoint (prepared/<uid>.json per claim) and fractional claims' accounting files
  // (claims/<uid>/accounting).
  std::string state_dir = "/var/lib/gpulet/dra";
  runtime::CdiGenerateOptions cdi;  // driver root, hook: the device edits of the claim specs
  // Host path of the interposer library, mounted read-only into fractional claims' containers.
  std::string library_host_path = "/usr/local/gpulet/lib/libgpulet-vcuda.so";
  // Each limited claim's accounting directory on a size-bounded tmpfs of its own
  // (vgpu/container/container_files.h).
  bool accounting_tmpfs = false;
  bool write_device_status = true;            // ResourceClaim status.devices with conditions
  absl::Duration resync = absl::Seconds(30);  // slice check even without a change signal
  Clock* clock = RealClock();                 // whose time `resync` is counted in; never null
};

// One prepared device as the kubelet is told.
struct PreparedDevice {
  std::vector<std::string> requests;
  std::string pool, device;
  // A share of a device with allowMultipleAllocations (consumable capacity): the API accepts the
  // claim's status.devices entry only with the allocation's shareID. Empty otherwise.
  std::string share_id;
  std::vector<std::string> cdi_ids;
};

struct PreparedClaim {
  std::string ns, name, uid;
  std::vector<PreparedDevice> devices;
  std::string spec_file;       // the claim's CDI spec
  std::string accounting_dir;  // empty: no fractional device
  std::string spec_text;       // the spec file's content (kept in the checkpoint)
};

// The opaque configuration of gpu.gpulet.io (docs/dra.md): memory (a quantity, >= 256Mi, a
// multiple of 256Mi) and cores (percent of the GPU's compute, 1..100). Errors name the field.
struct VgpuLimits {
  int64_t memory_bytes = 0;  // 0: no memory limit
  int64_t cores = 0;         // 0: no compute limit
  bool any() const { return memory_bytes > 0 || cores > 0; }
};
absl::StatusOr<VgpuLimits> ParseVgpuConfig(const nlohmann::json& parameters);
// A Kubernetes quantity ("4Gi", "512Mi", "1000000000", "2G") in bytes / units; errors name it.
absl::StatusOr<int64_t> ParseQuantity(const std::string& q);

class Driver {
 public:
  using HealthFn = std::function<bool(uint32_t gpu, int mig)>;
  Driver(gpu::GpuLayer* gpu, k8s::Client* api, HealthFn healthy,
         const kubelet::ChangeNotifier* health_changes, DriverOptions options);
  ~Driver();  // Stop()s

  // Loads the checkpoint, publishes the slice, serves the sockets, starts the sync thread.
  absl::Status Start();
  void Stop();

  // The kubelet's calls, one claim at a time (the gRPC handlers loop over the request).
  absl::StatusOr<PreparedClaim> Prepare(const std::string& ns, const std::string& name,
                                        const std::string& uid);
  absl::Status Unprepare(const std::string& uid);

  // Re-reads the inventory and health and publishes the slice when it changed; refreshes the
  // Ready condition of prepared claims whose devices changed health.
  absl::Status Sync();

  std::vector<PreparedClaim> prepared() const;
  std::string registration_socket() const;
  std::string service_socket() const;
  int64_t slice_generation() const;

 private:
  struct Served;
  absl::Status LoadCheckpoint() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SaveClaim(const PreparedClaim& c);
  std::string ClaimFile(const std::string& uid) const;
  absl::Status RefreshInventory() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteDeviceStatus(const PreparedClaim& c);
  void WritePendingStatus();              // the claims prepared since the last call
  void Loop(uint64_t seen, bool failed);  // `seen`: the health generation of the first sync

  gpu::GpuLayer* const gpu_;
  k8s::Client* const api_;
  const HealthFn healthy_;
  const kubelet::ChangeNotifier* const changes_;
  const DriverOptions options_;
  mutable absl::Mutex mu_;
  gpu::Inventory inventory_ ABSL_GUARDED_BY(mu_);
  std::vector<DraDevice> devices_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, size_t> by_name_ ABSL_GUARDED_BY(mu_);
  runtime::CdiSpec base_spec_ ABSL_GUARDED_BY(mu_);  // device edits by UUID, shared edits
  std::map<std::string, PreparedClaim> claims_ ABSL_GUARDED_BY(mu_);  // by uid
  std::set<std::string> unhealthy_ ABSL_GUARDED_BY(mu_);       // device names, as last synced
  std::set<std::string> status_pending_ ABSL_GUARDED_BY(mu_);  // claims whose status to write
  absl::Mutex sync_mu_;  // one Sync at a time (publisher state)
  SlicePublisher publisher_ ABSL_GUARDED_BY(sync_mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<Served> served_;
  std::thread thread_;
};

}  // namespace gpulet::dra
