// The vGPU scheduler extender: kube-scheduler's HTTP JSON extender v1 (filter, prioritize, bind)
// for pods asking for tencent.com/vcuda-core / vcuda-memory.
//
// State: per node, its fractional-pool GPUs (from the node annotation gpulet.io/vgpu-gpus the
// agent writes, else derived from node capacity: cores/100 GPUs sharing memory evenly) and what
// every pod holds on them. Feasibility, in-node choice and scores come from the placement library
// (src/placement), the same code the cluster-scale simulator runs.
// Bind reserves the GPUs in memory and creates the Binding, which carries the per-container GPU
// UUIDs (annotations gpulet.io/vgpu-gpus-<i>, -node, -bind-time, -assigned=false) that the API
// server sets on the pod with its node: one API call, no lock held across it, the pod read from
// the watch cache (one GET only when the watch has not delivered it yet). The state is rebuilt
// from the API server (pods carry their assignment) on start, so a restart loses nothing.
//
// Binds in flight: kube-scheduler filters the next pod before the previous pod's bind arrives.
// So prioritize (or a filter that leaves a single node, when kube-scheduler skips prioritize)
// reserves the pod's GPUs on the node it scores best, and gives that node alone the top score
// (the others at most one step below), which makes it kube-scheduler's choice whenever no other
// plugin outweighs the extender. The next pod's filter counts the reservation; the bind
// replaces it (on whichever node kube-scheduler chose); an unclaimed one expires after
// `reservation_ttl`, and ends early when the pod is bound by someone else or deleted.
//
// CPU and memory: each node's allocatable CPU and memory, less the requests of every pod the
// extender knows on it (its vGPU pods, and the other pods bound to its nodes), feed the policies'
// scores (best-fit is half free CPU, half free GPU, as in the simulator). They never refuse a node
// (placement::Node::cpu_memory_binding is false): kube-scheduler's own fit check owns that.
// With `all_pods` (kube-scheduler calls the extender for every pod: no managedResources), pods
// that ask for no vGPU are scored and bound too, and every node is kept, so that the policy
// places the CPU-only pods as the simulator does (they decide where CPU runs out).
//
// Workload: the `fgd` and `gpulet` policies measure fragmentation against the expected mix of
// arriving pods (placement::Policy::SetWorkload). The extender derives it from the vGPU pods it
// sees -- pending and bound, not finished -- grouped by placement::WorkloadFromPods, so it is
// rebuilt from the API server after a restart like the bookings. It is recomputed before a
// prioritize/bind when the pod set changed, at most once per `workload_refresh` (a cluster with
// thousands of pods then pays the O(pods) rebuild about once a second, not per decision).
//
// Thread-safety: every public method is thread-safe (one absl::Mutex over the state; filter and
// prioritize take it shared).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/parallel.h"
#include "k8s/client.h"
#include "placement/placement.h"
#include "vgpu/rules/node_pool.h"
#include "vgpu/rules/rules.h"

namespace httplib {
class Server;
}

namespace gpulet::scheduler {

using nlohmann::json;

using vgpu::kMaxNodeGpus;

// The Kubernetes name rules the extender checks before it uses a name in an API path.
bool IsDns1123Label(std::string_view s);      // namespaces: [a-z0-9]([-a-z0-9]*[a-z0-9])?, <= 63
bool IsDns1123Subdomain(std::string_view s);  // pods, nodes: dot-separated labels, <= 253

struct ExtenderOptions {
  vgpu::ResourceNames names;
  // spec.schedulerName values whose pods Bind accepts (the kube-scheduler profiles that call
  // this extender); pods of any other scheduler are refused.
  std::vector<std::string> scheduler_names = {"default-scheduler"};
  // kube-scheduler configured with nodeCacheCapable: false sends whole Node objects and expects
  // them back. Echoing attacker-shaped objects is refused by default (the filter answers an
  // error asking for nodeCacheCapable: true); true echoes them (depth-limited on parse).
  bool echo_node_objects = false;
  // Serve GET <prefix>/state and /workload (the cluster's GPU layout): off by default.
  bool debug_endpoints = false;
  // "binpack" (placement "best-fit"), "spread", or any placement registry name. A pod may choose
  // with the annotation gpulet.io/vgpu-policy.
  std::string default_policy = "binpack";
  // Minimum interval between workload rebuilds while pods keep changing (0: before every
  // decision that follows a change).
  std::chrono::milliseconds workload_refresh{1000};
  // Threads besides the request's own that score candidate nodes (-1: one per core beyond the
  // first, at most 7). Decisions do not depend on it.
  int score_threads = -1;
  // How long a reservation made at prioritize waits for its bind (see above).
  std::chrono::milliseconds reservation_ttl{30000};
  // Serve pods that ask for no vGPU too (see above): kube-scheduler's extender entry without
  // managedResources sends every pod here.
  bool all_pods = false;
  // Whose time reservations expire and `workload_refresh` passes in.
  Clock* clock = RealClock();
};

// A pod's CPU (milli-cores) and memory (MiB) requests as kube-scheduler counts them: the pod's own
// spec.resources when set, else its containers and restartable init containers summed or its
// largest init container (with the sidecars started before it), whichever is more, plus the
// runtime class's overhead. Malformed quantities count as 0 (the API server refuses them).
std::pair<int64_t, int64_t> PodCpuMemory(const nlohmann::json& pod);

// One pod's booking (GPUs, CPU and memory; a pod that asks for no vGPU holds no GPUs).
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
  // Filter and Prioritize answers serialised directly (what the HTTP handlers send): building
  // a nlohmann object per node costs more than the placement itself on 1000-node requests.
  std::string FilterWire(const json& args);
  std::string PrioritizeWire(const json& args);

  // Registers POST <prefix>/filter, /prioritize, /bind and GET <prefix>/healthz, /state,
  // /workload.
  void Register(httplib::Server& server, const std::string& prefix = "");
  // Whether the verbs are answered (default) or refused with 503 and `why`: a replica that is
  // not the leader keeps its state current but neither reserves nor binds, so that one replica
  // alone writes GPU assignments.
  void SetServing(bool on, const std::string& why = "");
  bool serving() const { return serving_.load(); }

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
  // Reservations made at prioritize that no bind has replaced yet.
  size_t reserved_pods() const;
  // Recomputes the workload from the pods seen now and hands it to every policy.
  void RebuildWorkload();
  // The workload the policies were last given.
  placement::Workload workload() const;

 private:
  struct NodeState {
    placement::Node node;                           // free amounts = capacity minus bookings
    std::vector<std::string> uuids;                 // per GPU
    std::unordered_map<std::string, int> index_of;  // uuid -> position
  };
  // What Bind checks and books of a pod, as the watch delivered it or a GET read it.
  struct PodFacts {
    std::string uid, ns, name, node, phase, scheduler, policy;
    bool deleting = false;
    placement::PodRequest request;     // vGPU containers only
    std::vector<int> container_index;  // their spec.containers index
  };
  absl::StatusOr<PodFacts> FactsOf(const json& pod) const;
  // What the lists keep (k8s::ListPaged): the Nodes that can offer vGPU GPUs (the inventory
  // annotation, or vGPU capacity) and the pods asking for vGPU. The others would be dropped by
  // UpsertNode and UpsertPod anyway; not holding them while listing keeps the extender's memory
  // to the part of the cluster it serves.
  k8s::KeepFn ServesFn() const;
  // The pods: those asking for vGPU, and the others bound to a node served (one of `nodes`, else
  // of the nodes known now); every pod with `all_pods`.
  k8s::KeepFn PodsKeptFn(std::shared_ptr<const absl::flat_hash_set<std::string>> nodes) const;
  void UpsertNodeUnguarded(const json& node);
  void UpsertPodUnguarded(const json& pod);
  // Whether this extender places a pod of this request: one asking for vGPU, or any with
  // all_pods.
  bool Places(const placement::PodRequest& request) const {
    return options_.all_pods || !request.containers.empty();
  }
  absl::StatusOr<const placement::Policy*> PolicyFor(const json& pod) const;
  absl::StatusOr<const placement::Policy*> PolicyNamed(std::string name) const;
  // Replaces the pod's reservation (if any) with one on `node`, when the pod fits there.
  // `pod` is the pod kube-scheduler sent (its request, `containers`, from RequestOf).
  void Reserve(const json& pod, const std::string& node, placement::PodRequest request,
               std::vector<int> containers, const placement::Policy& policy);
  // Releases the reservations whose time is up.
  void ExpireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the pod's reservation from an earlier round (it is being scheduled again), and
  // the reservations whose time is up.
  void DropReservation(const std::string& uid);
  // Request of `pod` in placement units; containers without vGPU requests are left out.
  absl::StatusOr<std::pair<placement::PodRequest, std::vector<int>>> RequestOf(
      const json& pod) const;
  void ApplyLocked(const std::string& uid, Booking b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLocked(const std::string& uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefitLocked(const std::string& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RebuildWorkload() when the pod set changed and the last rebuild is old enough.
  void MaybeRebuildWorkload();
  // What all known nodes have free (placement::ClusterFree), for the policy. Caller holds mu_.
  placement::ClusterFree FreeLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  k8s::Client* api_;
  ExtenderOptions options_;
  std::map<std::string, std::unique_ptr<placement::Policy>> policies_;
  mutable absl::Mutex mu_;
  // Looked up per candidate per request.
  absl::flat_hash_map<std::string, NodeState> nodes_ ABSL_GUARDED_BY(mu_);
  // Bumped (under the exclusive lock) by every change of nodes_, bookings or the workload.
  std::atomic<uint64_t> generation_{0};
  // filter's scores for the pod it just filtered: kube-scheduler calls prioritize for the same
  // pod right after, and when nothing changed in between it reuses them instead of placing the
  // pod on every node a second time.
  struct ScoreCache {
    std::string pod_uid;
    uint64_t generation = 0;
    const placement::Policy* policy = nullptr;
    std::vector<std::string> names;  // nodes that passed, in filter's order
    std::vector<double> scores;
  };
  absl::Mutex cache_mu_;
  ScoreCache cache_ ABSL_GUARDED_BY(cache_mu_);
  std::unordered_map<std::string, Booking> bookings_ ABSL_GUARDED_BY(mu_);  // by pod uid
  // Bookings that did not fit their node (applied == false there), by node: taken again when
  // the node frees capacity (RefitLocked).
  absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>> unfitted_ ABSL_GUARDED_BY(mu_);
  // Bound pods whose node is not known yet.
  std::unordered_map<std::string, json> orphans_ ABSL_GUARDED_BY(mu_);
  // Unbound vGPU pods (every unbound pod with all_pods) by uid, as the watch last showed them:
  // what Bind reads.
  std::unordered_map<std::string, PodFacts> pending_ ABSL_GUARDED_BY(mu_);
  // The bookings that are reservations made at prioritize (no bind yet), by uid, with their
  // expiry.
  absl::flat_hash_map<std::string, Clock::TimePoint> reserved_ ABSL_GUARDED_BY(mu_);
  // vGPU pods seen (every pod with all_pods; pending or bound, not finished) by uid: what the
  // workload is built from.
  std::unordered_map<std::string, placement::PodRequest> shapes_ ABSL_GUARDED_BY(mu_);
  bool workload_dirty_ ABSL_GUARDED_BY(mu_) = true;
  bool workload_built_ ABSL_GUARDED_BY(mu_) = false;
  Clock::TimePoint workload_at_ ABSL_GUARDED_BY(mu_){};
  placement::Workload workload_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> serving_{true};
  absl::Mutex serving_mu_;
  std::string not_serving_why_ ABSL_GUARDED_BY(serving_mu_);
  std::unique_ptr<k8s::Reflector> node_reflector_, pod_reflector_;
  std::unique_ptr<ParallelFor> scorers_;
};

}  // namespace gpulet::scheduler
