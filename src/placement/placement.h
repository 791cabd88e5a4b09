// Placement library: where on a cluster a GPU pod goes, and onto which GPU(s) of that node.
//
// Used by two callers with one code path:
//  - the scheduler extender (src/scheduler): builds a Cluster snapshot from the API server, calls
//    Fits() in `filter` and Policy::Score() in `prioritize` (ScaleScores() maps to 0..10), and
//    writes the chosen Assignment into the pod's annotations at bind;
//  - the trace simulator (gpulet-sched simulate): replays the openb trace through
//  Schedule()/Apply().
//
// CMake target: gpulet_placement (static library; links absl only).
// The model knows nothing of Kubernetes, JSON or files: plain structs, plain numbers.
// Units: GPU compute in milli-GPU (1000 = one whole GPU; one tencent.com/vcuda-core unit = 10
// milli), node CPU in milli-cores, node memory in MiB, GPU memory in bytes (0 = not tracked, as in
// openb).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace gpulet::placement {

inline constexpr int32_t kMilliPerGpu = 1000;
inline constexpr int32_t kMilliPerVcudaCore = 10;  // vcuda-core 100 = one GPU

// One physical GPU as the scheduler sees it.
struct Gpu {
  std::string model;                  // e.g. "V100M16", "T4", or a product name; matched exactly
  int32_t free_milli = kMilliPerGpu;  // compute share not yet given out, 0..1000
  int64_t memory_total_bytes = 0;     // 0 = memory not tracked: memory requests are not checked
  int64_t memory_free_bytes = 0;
  bool healthy = true;             // unhealthy GPUs take nothing
  bool fractional_allowed = true;  // false = whole-only (e.g. exclusive-mode GPU, no vGPU)
};

// One node: its free and total CPU/memory and its GPUs (index = position in `gpus`).
struct Node {
  std::string name;
  int64_t cpu_milli_total = 0;
  int64_t cpu_milli_free = 0;
  int64_t memory_mib_total = 0;
  int64_t memory_mib_free = 0;
  std::vector<Gpu> gpus;
  // false: CPU and memory are scored but never make a pod not fit, and Apply/Release keep any
  // balance (free may go below zero or above the total). The extender's nodes: kube-scheduler's
  // NodeResourcesFit owns that check, and the extender's count (what it has seen of every pod)
  // may lag the scheduler's, so it must not refuse a node the scheduler found room on.
  bool cpu_memory_binding = true;
};

// A snapshot of the cluster. Owned by the caller; policies only read it.
struct Cluster {
  std::vector<Node> nodes;
};

// What a cluster can still give GPU tasks: free CPU, memory and healthy GPU compute summed over
// the nodes that have some GPU compute free (CPU elsewhere serves no GPU task). gpulet weighs a
// node's leftovers against it, so that a resource short everywhere strands nothing.
struct ClusterFree {
  double gpu_milli = 0;
  double cpu_milli = 0;
  double memory_mib = 0;
  void Add(const Node& node);
};
ClusterFree FreeOf(const Cluster& cluster);

// What one container asks of GPUs: either `whole_gpus` >= 1 whole GPUs (milli and memory ignored:
// a whole GPU brings all of its memory), or, with whole_gpus == 0, a share of ONE GPU:
// `milli` in 1..1000 and optionally `memory_bytes`. milli == 1000 with whole_gpus == 0 is still a
// share request (it needs a GPU whose free_milli is 1000, but it may be a fractional-allowed GPU
// only; use whole_gpus = 1 for exclusive GPUs). whole_gpus == 0 && milli == 0: no GPU.
struct ContainerRequest {
  int32_t whole_gpus = 0;
  int32_t milli = 0;
  int64_t memory_bytes = 0;
};

// A pod: node-level CPU/memory (summed over containers), per-container GPU needs, and the GPU
// models it accepts (empty = any). Every GPU the pod gets must have an accepted model.
struct PodRequest {
  std::string name;  // used only for messages and the random policy's per-pod draw
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  std::vector<ContainerRequest> containers;
  std::vector<std::string> gpu_models;

  // Total GPU compute asked, in milli (whole GPUs count 1000 each).
  int64_t TotalGpuMilli() const;
};

// Which GPU(s) each container gets on the chosen node (same order as PodRequest::containers).
// For a share request `gpus` has one index and `milli`/`memory_bytes` are the amounts taken; for
// whole GPUs milli is 1000 and memory_bytes 0 (a whole GPU takes all of its memory). A container
// without GPUs has an empty entry.
struct ContainerAssignment {
  std::vector<int32_t> gpus;
  int32_t milli = 0;
  int64_t memory_bytes = 0;
};
struct Assignment {
  std::vector<ContainerAssignment> containers;
};

// Feasibility of `pod` on `node` ignoring any policy: CPU, memory, GPU model, health, whole vs
// fractional, per-GPU compute and memory. When it does not fit and `reason` is non-null, a short
// human-readable reason is written there ("insufficient cpu: need 4000m, free 2000m"). Cheap when
// `reason` is null (the simulator calls it millions of times).
bool Fits(const Node& node, const PodRequest& pod, std::string* reason = nullptr);

// Updates `node` as if `pod` ran there with `assignment` (Apply) or stopped (Release). Errors if
// the assignment does not fit (Apply) or does not match what is held (Release); `node` is left
// unchanged on error.
absl::Status Apply(Node& node, const PodRequest& pod, const Assignment& assignment);
absl::Status Release(Node& node, const PodRequest& pod, const Assignment& assignment);

// The expected mix of arriving pods: shapes with relative weights (need not sum to 1). FGD needs
// it to measure fragmentation "as seen by the workload"; other policies ignore it.
struct WorkloadClass {
  PodRequest shape;
  double weight = 0;
};
struct Workload {
  std::vector<WorkloadClass> classes;
};
// The FGD paper's "typical pods": pods grouped by (cpu, GPU request, models) -- memory is not part
// of the key -- weighted by count, CPU-only pods included; only the most frequent classes that
// together cover `coverage` of all pods are kept (the paper's simulator uses 0.95).
Workload WorkloadFromPods(std::span<const PodRequest> pods, double coverage = 0.95);

// A scored in-node placement: higher `score` is better. Scores are only comparable across nodes
// for the same pod and the same policy.
struct NodeScore {
  double score = 0;
  Assignment assignment;
};

// A placement policy. Thread-safety: after construction and SetWorkload(), Score() is const and
// may be called from many threads at once (the extender serves concurrent requests).
class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const = 0;
  // Gives the policy the expected workload (FGD needs it; others ignore it). Not thread-safe.
  // Without it, "fgd" and "gpulet" score like "best-fit" (gpulet keeps its two tie rules).
  virtual void SetWorkload(const Workload& workload) {}
  // Score of placing `pod` on `node` with the policy's best in-node assignment, or nullopt when
  // the pod does not fit (same rule as Fits()).
  virtual std::optional<NodeScore> Score(const Node& node, const PodRequest& pod) const = 0;
  // Score() without the in-node assignment (the extender's filter and prioritize need only the
  // number; the assignment is built at bind). `cluster`: what the whole cluster has free (see
  // ClusterFree; Schedule() passes FreeOf(cluster)), or null when unknown; Score() passes null.
  virtual std::optional<double> ScoreValue(const Node& node, const PodRequest& pod,
                                           const ClusterFree* cluster) const {
    auto s = Score(node, pod);
    return s ? std::optional<double>(s->score) : std::nullopt;
  }
};

struct PolicyOptions {
  uint64_t seed = 0;  // the random policy's stream (and any policy's tie-breaking)
};

// Registry: "random", "best-fit", "gpu-packing", "dot-product", "fgd", "gpulet".
absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(std::string_view name,
                                                   const PolicyOptions& options = {});
std::vector<std::string> PolicyNames();
// The policy the extender and `gpulet-sched` use when none is named.
inline constexpr std::string_view kDefaultPolicy = "gpulet";

// A whole decision: the best node of `cluster` for `pod`, or NotFound("no node fits pod X: ...").
// Ties go to the lowest node index, or, when `tie_rng` is non-null, to a uniformly random one of
// the tied nodes drawn from that PRNG state (what kube-scheduler's selectHost does; the simulator
// uses it so that the paper's integer-scored policies are replayed faithfully).
struct Choice {
  int32_t node = -1;  // index into cluster.nodes
  NodeScore placement;
};
absl::StatusOr<Choice> Schedule(const Cluster& cluster, const PodRequest& pod, const Policy& policy,
                                uint64_t* tie_rng = nullptr);

// Maps scores of one decision onto the integers lo..hi (best -> hi, worst -> lo; all equal -> hi),
// e.g. the extender's 0..10 `prioritize` range.
std::vector<int64_t> ScaleScores(std::span<const double> scores, int64_t lo, int64_t hi);

}  // namespace gpulet::placement
