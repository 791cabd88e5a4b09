// KubeletEmulator: a stand-in for the kubelet's device manager, speaking the real gRPC APIs over
// real unix sockets so device plugins are tested through their production code paths.
//
//  - Registration (device plugin v1beta1) on <device_plugin_dir>/kubelet.sock. Start() first
//  removes
//    every non-directory entry of the directory except kubelet_internal_checkpoint, like the
//    kubelet.
//  - For each accepted plugin: dials <dir>/<endpoint>, consumes ListAndWatch, tracks capacity
//    (all devices) and allocatable (healthy devices). A plugin whose stream ends counts as gone:
//    its devices become unhealthy (allocatable 0), capacity stays.
//  - Pods: validation, scheduling check / kubelet admission, GetPreferredAllocation (when offered),
//    Allocate per container, PreStartContainer (when required). Allocations are checkpointed to
//    <dir>/kubelet_internal_checkpoint and restored by a new emulator on the same directory.
//  - PodResources v1 (List, GetAllocatableResources, Get) on its own socket.
//
// Admission: a pod without spec.nodeName goes through a scheduler-like fit check first; if the node
// lacks allocatable resources it stays Pending (reason Unschedulable, the scheduler's
// "0/1 nodes are available: 1 Insufficient <res>." wording) and is retried whenever devices free up
// or appear. A pod with spec.nodeName (or any pod when Options::scheduler is false) meets the
// kubelet's own admission and fails with reason UnexpectedAdmissionError ("Pod was rejected:
// Allocate failed due to ..., which is unexpected") when devices are short.
//
// Thread-safety: every public method may be called from any thread. Start/Stop may be repeated.
// The emulator owns its gRPC servers, plugin connections and its worker thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "k8s/deviceplugin/v1beta1/api.pb.h"
#include "testing/kubelet/pod.h"

namespace gpulet::emu {

struct EmulatorOptions {
  // Device-plugin directory: kubelet.sock and the checkpoint live here; plugin endpoints too.
  std::string device_plugin_dir;
  // PodResources socket; empty: <device_plugin_dir>/../pod-resources/kubelet.sock.
  std::string pod_resources_socket;
  // true: pods without spec.nodeName wait Pending when they do not fit (scheduler behaviour).
  // false: every pod meets kubelet admission directly (UnexpectedAdmissionError on shortage).
  bool scheduler = true;
  std::string node_name = "sim-node";
  Clock* clock = nullptr;  // nullptr: RealClock(); not owned
};

// One device as last reported by ListAndWatch.
struct DeviceInfo {
  std::string id;
  bool healthy = false;
  std::vector<int64_t> numa_nodes;
};

// What the emulator knows about one extended resource.
struct ResourceState {
  std::string name;
  std::string endpoint;             // plugin socket base name
  bool connected = false;           // ListAndWatch stream open
  bool pre_start_required = false;  // from GetDevicePluginOptions at Register
  bool preferred_allocation = false;
  std::vector<DeviceInfo> devices;  // last ListAndWatch list (sorted by id)
  uint64_t generation = 0;          // number of ListAndWatch responses received (all plugins)
  Clock::TimePoint updated_at{};    // when the last ListAndWatch response was received
  int64_t capacity = 0;             // devices known
  int64_t allocatable = 0;          // healthy devices while the plugin is connected
  int64_t allocated = 0;            // devices assigned to pods
};

enum class PodPhase { kPending, kRunning, kSucceeded, kFailed };
const char* PodPhaseName(PodPhase phase);

// What one container received.
struct ContainerAllocation {
  std::string container;
  std::map<std::string, std::vector<std::string>> devices;  // resource -> device IDs
  // Merged ContainerAllocateResponse of every resource (envs, mounts, devices, annotations,
  // cdi_devices), as the kubelet hands it to the runtime.
  v1beta1::ContainerAllocateResponse response;
};

struct PodStatus {
  PodSpec spec;
  PodPhase phase = PodPhase::kPending;
  std::string reason;   // Unschedulable, UnexpectedAdmissionError, OutOf<res>, Completed, ...
  std::string message;  // human-readable, kubelet/scheduler wording
  std::vector<ContainerAllocation> containers;  // filled when admitted
  Clock::TimePoint started_at{};
};

// A `kubectl get events`-like record, in order of occurrence.
struct Event {
  Clock::TimePoint at;
  std::string object;  // "pod/default/x" or "resource/nvidia.com/gpu"
  std::string type;    // Normal | Warning
  std::string reason;
  std::string message;
};

class KubeletEmulator {
 public:
  explicit KubeletEmulator(EmulatorOptions options);
  ~KubeletEmulator();  // Stop()s
  KubeletEmulator(const KubeletEmulator&) = delete;
  KubeletEmulator& operator=(const KubeletEmulator&) = delete;

  // Cleans the directory, restores the checkpoint (first Start only), serves kubelet.sock and the
  // PodResources socket. Error when a socket cannot be bound.
  absl::Status Start();
  // Closes plugin connections, stops the servers and deletes both sockets. Pods and allocations
  // stay; devices become unhealthy until their plugin registers again. Idempotent.
  void Stop();
  bool running() const;

  std::string kubelet_socket() const;
  std::string pod_resources_socket() const;
  const std::string& device_plugin_dir() const;

  // --- node state ---
  std::vector<ResourceState> Resources() const;
  std::optional<ResourceState> Resource(const std::string& name) const;
  // Waits until `name` has exactly `n` allocatable devices. DeadlineExceeded with the last seen
  // count otherwise.
  absl::Status WaitForAllocatable(const std::string& name, int64_t n,
                                  std::chrono::milliseconds timeout);
  // Waits until `name` has received a ListAndWatch response with generation > `after`. Returns
  // the new state.
  absl::StatusOr<ResourceState> WaitForUpdate(const std::string& name, uint64_t after,
                                              std::chrono::milliseconds timeout);
  // Number of successful Register calls so far (re-registrations included).
  int64_t registrations() const;

  // --- pods ---
  // Validates (InvalidArgument with the API server's wording; the pod is not created), then
  // admits. Returns the pod's status after this admission attempt. AlreadyExists for a duplicate.
  absl::StatusOr<PodStatus> AddPod(const PodSpec& pod);
  // Frees the pod's devices and forgets it; pending pods are retried. NotFound if unknown.
  absl::Status DeletePod(const std::string& namespace_, const std::string& name);
  std::optional<PodStatus> GetPod(const std::string& namespace_, const std::string& name) const;
  std::vector<PodStatus> Pods() const;  // in order of creation
  // Waits until the pod reaches `phase`; DeadlineExceeded naming the phase it is in otherwise.
  absl::StatusOr<PodStatus> WaitForPodPhase(const std::string& namespace_, const std::string& name,
                                            PodPhase phase, std::chrono::milliseconds timeout);
  // True while some Running pod has a simulated run time still to go (it will free devices).
  bool HasTimedPods() const;
  // Waits until no admission or retry is in progress or queued (after a pod completed or devices
  // changed). False on timeout.
  bool WaitIdle(std::chrono::milliseconds timeout);

  std::vector<Event> Events() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpulet::emu
