// The vGPU scheduler extender: kube-scheduler's HTTP JSON extender v1 (filter, prioritize, bind)
// for pods asking for tencent.com/vcuda-core / vcuda-memory.
//
// State: per node, its fractional-pool GPUs (from the node annotation gpulet.io/vgpu-gpus the
// agent writes, else derived from node capacity: cores/100 GPUs sharing memory evenly) and what
// every pod holds on them. Feasibility, in-node choice and scores come from the placement library
// (src/scheduler/placement), the same code the cluster-scale simulator runs.
// Bind reserves the GPUs in memory, writes the per-container GPU UUIDs on the pod (annotations
// gpulet.io/vgpu-gpus-<i>, -node, -bind-time, -assigned=false), then creates the Binding. The
// state is rebuilt from the API server (pods carry their assignment) on start, so a restart loses
// nothing. Binds on one node are serialised (per-node mutex held across the API calls).
//
// Thread-safety: every public method is thread-safe (one shared_mutex over the state; filter and
// prioritize take it shared).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "k8s/client.h"
#include "scheduler/placement/placement.h"
#include "vgpu/rules.h"

namespace httplib {
class Server;
}

namespace gpulet::scheduler {

using nlohmann::json;

struct ExtenderOptions {
  vgpu::ResourceNames names;
  // "binpack" (placement "best-fit"), "spread", or any placement registry name. A pod may choose
  // with the annotation gpulet.io/vgpu-policy.
  std::string default_policy = "binpack";
};

// One pod's booking.
struct Booking {
  std::string node;
  std::string ns, name;
  placement::PodRequest request;
  placement::Assignment assignment;
  std::vector<int> container_index;  // spec.containers index of each request container
  bool assumed = false;              // reserved by a bind in progress, not yet seen bound
  bool applied = false;              // counted on the node (false: node unknown or overfull)
};

class Extender {
 public:
  // `api` may be null (no bind, no sync: tests and benchmarks feeding objects directly).
  Extender(k8s::Client* api, ExtenderOptions options);
  ~Extender();

  // Lists nodes and pods and rebuilds the state from scratch.
  absl::Status Sync();
  // Keeps the state current with watches on nodes and pods (Sync first).
  void StartWatching();
  void StopWatching();

  // The verbs, JSON in / JSON out, exactly the extender v1 wire shapes.
  json Filter(const json& args);
  json Prioritize(const json& args);
  json Bind(const json& args);

  // Registers POST <prefix>/filter, /prioritize, /bind and GET <prefix>/healthz, /state.
  void Register(httplib::Server& server, const std::string& prefix = "");

  // State feed (reflectors call these; tests may too).
  void UpsertNode(const json& node);
  void RemoveNode(const std::string& name);
  void UpsertPod(const json& pod);
  void RemovePod(const json& pod);

  // Snapshot for tests, `/state` and the benchmark: per node, per GPU free milli/memory.
  placement::Cluster Snapshot() const;
  // Per node: GPU UUIDs in the order of Snapshot()'s GPUs.
  std::map<std::string, std::vector<std::string>> GpuUuids() const;
  size_t booked_pods() const;

 private:
  struct NodeState {
    placement::Node node;            // free amounts = capacity minus bookings
    std::vector<std::string> uuids;  // per GPU
    std::unordered_map<std::string, int> index_of;  // uuid -> position
  };
  absl::StatusOr<const placement::Policy*> PolicyFor(const json& pod) const;
  // Request of `pod` in placement units; containers without vGPU requests are left out.
  absl::StatusOr<std::pair<placement::PodRequest, std::vector<int>>> RequestOf(
      const json& pod) const;
  void ApplyLocked(const std::string& uid, Booking b);
  void ReleaseLocked(const std::string& uid);
  std::mutex& NodeLock(const std::string& node);

  k8s::Client* api_;
  ExtenderOptions options_;
  std::map<std::string, std::unique_ptr<placement::Policy>> policies_;
  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, NodeState> nodes_;
  std::unordered_map<std::string, Booking> bookings_;  // by pod uid
  std::unordered_map<std::string, json> orphans_;      // bound pods whose node is not known yet
  std::mutex node_locks_mu_;
  std::map<std::string, std::unique_ptr<std::mutex>> node_locks_;
  std::unique_ptr<k8s::Reflector> node_reflector_, pod_reflector_;
};

}  // namespace gpulet::scheduler
