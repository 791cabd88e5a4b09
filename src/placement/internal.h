// Internals shared by placement.cc and policies.cc (not part of the public API).
// The hot path (Schedule() over ~1200 nodes, ~10^4 times per simulated run) works on a Plan: a
// heap-free list of GPU takes; an Assignment (vectors) is built only for the winning node.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/container/inlined_vector.h"
#include "placement/placement.h"

namespace gpulet::placement::internal {

// One container taking `milli` (and `memory` bytes) of GPU `gpu`; whole GPUs take 1000 and
// memory 0 (all of it).
struct Take {
  int32_t container = 0;
  int32_t gpu = 0;
  int32_t milli = 0;
  int64_t memory = 0;
  bool whole = false;
};
using Plan = absl::InlinedVector<Take, 8>;

// A node's GPU state in the fixed-size form FGD's fragmentation measure is computed on
// (policies.cc).
struct FragState {
  int64_t cpu = 0;
  uint64_t models = 0;  // bits of the node's GPU models (bit 63 = a model no class names)
  int n = 0;
  std::array<int32_t, 16> free{};  // healthy GPUs only; nodes with more are truncated
};

bool ModelAllowed(const PodRequest& pod, const std::string& model);

// The pod's single share container, or -1 when the pod is not "one container with a share of
// one GPU" (then policies use the greedy plan).
int SingleShareContainer(const PodRequest& pod);

// Whether GPU `g` of `node` can take the share container `c` of `pod` (health, model, fractional,
// compute, memory).
bool ShareFits(const Node& node, const PodRequest& pod, int c, int g);

// Feasibility plus a default plan: whole GPUs first (whole-only GPUs preferred, then lowest
// index), then share containers best-fit (least free compute that fits, lowest index on ties).
// Writes a reason when it fails and `reason` is non-null.
bool PlanGreedy(const Node& node, const PodRequest& pod, Plan* plan, std::string* reason);

Assignment ToAssignment(const PodRequest& pod, const Plan& plan);

// Base of the built-in policies: enumerates in-node candidates and asks Evaluate() for a score.
class PolicyImpl : public Policy {
 public:
  std::optional<NodeScore> Score(const Node& node, const PodRequest& pod) const final;
  std::optional<double> ScoreValue(const Node& node, const PodRequest& pod,
                                   const ClusterFree* cluster) const final {
    Plan plan;
    return ScorePlan(node, pod, &plan, cluster);
  }
  // Score() without building an Assignment; `plan` receives the chosen in-node placement.
  std::optional<double> ScorePlan(const Node& node, const PodRequest& pod, Plan* plan,
                                  const ClusterFree* cluster) const;

 protected:
  // Per-(node, pod) scratch a policy may fill lazily (e.g. FGD's fragmentation before placing).
  struct Context {
    bool has_before = false;
    double before = 0;
    // The node's GPU state as FGD's measure reads it, built once per (node, pod) instead of once
    // per candidate GPU (it looks up every GPU's model).
    bool has_state = false;
    FragState state;
    const ClusterFree* cluster = nullptr;  // what the cluster has free, when the caller knows
    // gpulet's node-level terms (policies.cc), once per (node, pod).
    bool has_extra = false;
    bool scarce = false;
    bool used = false;
    double stranded_more = 0;
  };
  // Score of placing `pod` on `node` as `plan` (known feasible). Higher is better.
  virtual double Evaluate(const Node& node, const PodRequest& pod, const Plan& plan,
                          Context& ctx) const = 0;
  // For a single share container: try every distinct GPU (true) or only the best-fit one.
  virtual bool TriesEveryGpu() const { return false; }

 public:
  // True when the score depends only on the node's resources, not on its name: Schedule() then
  // scores nodes in identical states once per decision (large clusters have many).
  virtual bool StateOnly() const { return true; }
};

// splitmix64: a tiny, fully specified PRNG step, so runs are identical on every platform.
inline uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// Uniform in [0, n) (n > 0); the modulo bias is below 2^-40 for the n used here.
inline uint64_t Uniform(uint64_t& state, uint64_t n) { return SplitMix(state) % n; }

}  // namespace gpulet::placement::internal
