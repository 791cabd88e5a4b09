// Node-side vGPU: the two kubelet resources tencent.com/vcuda-core (100 devices per pool GPU) and
// tencent.com/vcuda-memory (one device per 256 MiB), and the assignment of containers to GPUs.
//
// The device-plugin Allocate call carries no pod identity, so NodeAssigner finds the container the
// way GPU Manager and HAMi do, through the API server: the Pending pods bound to this node, their
// vGPU containers not yet served, ordered by the extender's bind time (then creation time, then
// name), the first whose (cores, memory) equals what the kubelet is allocating. A container with
// memory gets two Allocate calls (one per resource, back to back, in either order); the first is
// remembered and the second completes the pair, so the match uses both numbers. The container's
// GPUs come from the extender's annotations when present and still free, else from the placement
// library on this node (same rules and policy), and are then written on the pod.
// Every grant is checkpointed atomically (state_dir/assignments.json) before Allocate answers;
// grants of pods that are gone are released (Release / ReleaseGoneFromApi); Correct() repairs a
// mismatch between two identical pods from the kubelet's own record (PodResources). A restart
// reloads the checkpoint and loses nothing.
//
// Pool GPUs are offered ONLY as vcuda resources: the caller must not offer them as nvidia.com/gpu
// (see PoolGpus()), so the kubelet can never book one GPU whole and fractionally at once; a
// vcuda-core 100*k request takes k idle pool GPUs exclusively.
// Thread-safety: all methods are thread-safe (one absl::Mutex).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "abi/vgpu_contract_builder.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "gpu/gpu.h"
#include "k8s/client.h"
#include "k8s/deviceplugin/v1beta1/api.pb.h"
#include "kubelet/resource.h"
#include "vgpu/container/container_files.h"
#include "vgpu/rules/node_pool.h"
#include "vgpu/rules/rules.h"

namespace gpulet::vgpu {

struct NodeOptions {
  ResourceNames names;
  std::string node_name;
  // Host directory for the checkpoint and the per-container accounting files
  // (<state_dir>/<pod-uid>/<container>/accounting).
  std::string state_dir = "/var/lib/gpulet/vgpu";
  // Host path of the interposer library mounted read-only into vGPU containers.
  std::string library_host_path = "/usr/local/gpulet/lib/libgpulet-vcuda.so";
  // Each container's accounting directory on a size-bounded tmpfs of its own
  // (vgpu/container/container_files.h); needs CAP_SYS_ADMIN and a shared state_dir mount.
  bool accounting_tmpfs = false;
  std::string policy = "binpack";  // for pods the extender did not place
  // Memory units of a GPU: from the memory NVML reports (default: floor(total / 256 MiB), 318 on
  // an H100 80GB) or from the nominal size (total rounded up to a whole GiB: 320).
  bool nominal_memory = false;
  // How the granted GPUs (UUIDs) reach the container: device nodes, CDI names, the shim's volume
  // mounts, as the device plugin's own resources deliver them (plugin::MakeGpuDelivery). Unset:
  // only NVIDIA_VISIBLE_DEVICES, which only an NVIDIA-aware runtime acts on.
  std::function<void(const std::vector<std::string>& uuids, v1beta1::ContainerAllocateResponse*)>
      deliver;
  // Called after each grant, under the assigner's lock (so it must only note the call and return):
  // the agent then corrects the records from the kubelet's as soon as it has them (Correct()).
  std::function<void()> granted;
};

// Which GPUs form the fractional pool. `selection` empty: none (vGPU off); "all": every GPU
// without MIG enabled; else a comma list of indexes or UUIDs. Errors name the unknown entry.
absl::StatusOr<std::vector<PoolGpu>> PoolGpus(const gpu::Inventory& inv,
                                              const std::string& selection,
                                              bool nominal_memory = false);

// One container's grant.
struct Grant {
  std::string pod_uid, ns, pod, container;
  int container_index = 0;
  std::vector<std::string> gpus;  // UUIDs (k for whole GPUs, 1 for a share)
  int64_t cores = 0, memory_units = 0, ceiling = 0;
  std::vector<std::string> device_ids;  // the kubelet's IDs of both resources for this container
  std::string accounting_dir;           // host directory, empty for whole GPUs
  bool inject = true;                   // false: GPULET_VGPU_DISABLE=1 or whole GPUs
  int64_t time_ns = 0;
};

// The grants checkpointed in <state_dir>/assignments.json (the agent's own record, 0600, never
// mounted into a container): an empty list when there is none yet; DataLoss naming the file and
// the grant when it is not a gpulet checkpoint. The metrics exporter reads it to label vGPU usage
// by what the agent granted, not by what a tenant-writable accounting file says.
absl::StatusOr<std::vector<Grant>> ReadGrantCheckpoint(const std::string& state_dir);

class NodeAssigner {
 public:
  // `api` may be null (a node without API server): containers are then placed from the kubelet's
  // counts alone, recorded under a placeholder pod until Correct() learns the real one.
  NodeAssigner(NodeOptions options, std::vector<PoolGpu> pool, k8s::Client* api,
               Clock* clock = RealClock());

  // Loads the checkpoint (a missing file is an empty state; a corrupt one is an error naming it).
  absl::Status Load();

  // One Allocate call of resource `core` (is_core) or memory with `ids`. Returns the container
  // response: empty while waiting for the second resource of a pair, the full edits once the
  // container is identified.
  absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocate(bool is_core,
                                                              const std::vector<std::string>& ids);

  // The GPU the next container asking `cores` (and `memory_units`, 0 = unknown) would get, for
  // GetPreferredAllocation. Empty when unknown.
  std::string PredictGpu(int64_t cores, int64_t memory_units);

  ~NodeAssigner();

  // Drops grants of pods not in `live_uids`, removes their accounting directories, checkpoints.
  absl::Status Release(const std::set<std::string>& live_uids);
  // Release() with the pods bound to this node in the API server (terminal phases count as gone):
  // from the watch (StartWatching) once it has listed (grants younger than 10 s are kept when
  // their pod is not in that view yet: an Allocate can run before the pod's watch event), else
  // one LIST.
  absl::Status ReleaseGoneFromApi();
  // Watches this node's pods (field selector spec.nodeName=<node>): a pod that ends (deleted, or
  // Succeeded/Failed) has its grants freed from that event, and the periodic housekeeping reads
  // the pods from memory instead of listing them (what a thousand agents would cost the API
  // server: one LIST each per reconcile interval).
  void StartWatching();
  void StopWatching();
  bool watch_synced() const;
  // Without an API server: drops grants none of whose device IDs the kubelet still holds
  // (`held`, from PodResources), once they are older than `grace` (the kubelet records an
  // allocation only after Allocate answers).
  absl::Status ReleaseNotHeld(const std::set<std::string>& held, std::chrono::nanoseconds grace);
  // The kubelet's view (device ID -> "namespace/pod" and container name, from PodResources): a
  // grant whose devices belong to another container is given to it (identical pods admitted in
  // another order than their bind times): swapped with that container's grant when it has one,
  // else moved to it (its pod Pending on this node with the same request; the pod the grant was
  // made for is unserved again). Grant folders are refitted, the checkpoint and the pods'
  // annotations rewritten. The agent runs it just after each grant (NodeOptions::granted), so
  // that the pod's annotations name its GPU before its container starts, and periodically.
  absl::Status Correct(const std::map<std::string, std::pair<std::string, std::string>>& owner_of);
  // With an API server: rewrites the annotations of each pod bound here whose
  // gpulet.io/vgpu-gpus-<i> does not name its grant's GPUs (an agent stopped between checkpointing
  // a grant or a correction and annotating it). One LIST of this node's pods; the agent runs it as
  // it starts.
  absl::Status Reannotate();

  // With an API server: writes the pool on this node's annotation gpulet.io/vgpu-gpus
  // ([{"uuid","index","memoryUnits","healthy"}]), which the extender and the webhook read, when
  // it differs from what was last written. `healthy(uuid)` may be empty.
  absl::Status PublishPool(const std::function<bool(const std::string&)>& healthy);

  std::vector<Grant> grants() const;
  const std::vector<PoolGpu>& pool() const { return pool_; }
  const NodeOptions& options() const { return options_; }

  // The container edits of a grant (env, mounts) per the interposer contract.
  v1beta1::ContainerAllocateResponse Response(const Grant& g) const;
  static ContainerLimits LimitsOf(const Grant& g);
  std::string PreloadPath() const;  // the node's /etc/ld.so.preload for vGPU containers

 private:
  struct Candidate {
    std::string uid, ns, pod, container;
    int index = 0;
    int64_t cores = 0, memory_units = 0, ceiling = 0;
    int64_t order = 0;  // bind time (ns) or creation time
    std::vector<std::string> annotated_gpus;
    bool inject = true;
    nlohmann::json pod_json;
  };
  // `started_too`: Running pods' unserved containers as well (a correction: the kubelet may have
  // started a container before its grant is found, or before a restarted agent looks).
  absl::StatusOr<std::vector<Candidate>> CandidatesLocked(bool started_too = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Grant> GrantLocked(int64_t cores, int64_t memory_units,
                                    std::vector<std::string> ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SaveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReleaseLocked(const std::set<std::string>& gone_uids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // <state_dir>/<pod-uid>/pod = "namespace/name", for a person reading the directory (the metrics
  // exporter names pods by the checkpointed grants instead: ReadGrantCheckpoint).
  void WritePodFile(const Grant& g) const;
  // `pod` is the grant's pod as the API server has it (null when unknown: then the pod is not
  // marked assigned); only its containers are read.
  void PatchAnnotations(const Grant& g, const nlohmann::json& pod)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a correction, before the container starts: its limits file from the grant as it is now
  // (the pod's ceiling), its accounting file owned by the user `pod` (null: unknown) runs as.
  // Failures are logged.
  void RefitGrantDirLocked(const Grant& g, const nlohmann::json& pod)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One pass of Correct(): whether it changed a record (then annotated and checkpointed).
  absl::StatusOr<bool> CorrectPassLocked(
      const std::map<std::string, std::pair<std::string, std::string>>& owner_of)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  NodeOptions options_;
  std::vector<PoolGpu> pool_;
  k8s::Client* api_;
  Clock* clock_;
  mutable absl::Mutex mu_;
  std::vector<Grant> grants_ ABSL_GUARDED_BY(mu_);
  struct Pending {
    bool is_core = false;
    std::vector<std::string> ids;
    Clock::TimePoint at;
  };
  std::optional<Pending> pending_ ABSL_GUARDED_BY(mu_);
  // Remembers the first Allocate of a container's pair (its device IDs) until the second comes.
  v1beta1::ContainerAllocateResponse WaitForPairLocked(bool is_core,
                                                       const std::vector<std::string>& ids,
                                                       Clock::TimePoint now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string published_ ABSL_GUARDED_BY(mu_);  // the pool annotation last written
  // Releases the grants of pods not in `live` that are older than the grace above (10 s).
  absl::Status ReleaseAbsent(const std::set<std::string>& live);
  // Releases the grants older than `grace` for which `gone` holds.
  absl::Status ReleaseOlder(std::chrono::nanoseconds grace,
                            const std::function<bool(const Grant&)>& gone);
  // The watch's view: uids of this node's pods that have not ended.
  mutable absl::Mutex pods_mu_;
  std::set<std::string> live_pods_ ABSL_GUARDED_BY(pods_mu_);
  bool pods_synced_ ABSL_GUARDED_BY(pods_mu_) = false;
  std::unique_ptr<k8s::Reflector> reflector_;
};

// The kubelet resources over one assigner: [vcuda-core, vcuda-memory]. Device IDs are
// "<gpu-uuid>::vc<n>" and "<gpu-uuid>::vm<n>"; Preferred keeps a container's units on the GPU it
// will get. `healthy(uuid)` (may be empty) marks devices of unhealthy GPUs; `changes` (may be
// null) is the notifier their health moves with.
std::vector<std::shared_ptr<kubelet::Resource>> MakeVcudaResources(
    std::shared_ptr<NodeAssigner> assigner, std::function<bool(const std::string&)> healthy = {},
    const kubelet::ChangeNotifier* changes = nullptr);

}  // namespace gpulet::vgpu
