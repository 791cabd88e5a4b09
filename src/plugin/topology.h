// Topology-aware choice of a GPU set for GetPreferredAllocation. The score of a set is the sum of
// its pair scores, compared lexicographically: NVLink count first, then PCIe proximity, then NUMA
// locality (see PairScore). Pair scores are precomputed once per inventory; Best() is an exact
// branch-and-bound search over bitmasks, so the answer is the optimum under this score and takes
// microseconds for 16 GPUs. Immutable after construction; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/gpu.h"

namespace gpulet::plugin {

class TopologyScorer {
 public:
  static constexpr int kMaxGpus = 64;  // bitmask width; optimality is the contract up to 16+

  explicit TopologyScorer(const gpu::Inventory& inventory);

  int size() const { return n_; }
  // nvlinks * 1e6 + pcie rank (SameBoard 6 .. CrossNuma 1, unknown 0) * 1e3 + same NUMA node (1).
  // The weights keep the levels apart for sets of up to 16 GPUs (120 pairs * 6 < 1000).
  int64_t PairScore(int a, int b) const { return pair_[a * n_ + b]; }
  int64_t SetScore(uint64_t mask) const;

  // The best set of `size` GPUs drawn from `available` that contains `required` (bit i = GPU
  // index i). Among equal scores the first found wins (deterministic). InvalidArgument when
  // impossible (size too small or too large).
  absl::StatusOr<uint64_t> Best(uint64_t available, uint64_t required, int size) const;

  // The best `count` GPUs of `candidates` to add to a multiset of GPUs already chosen (`base[g]`
  // items on GPU g, e.g. time-slicing replicas; may be shorter than size()). The score is that of
  // the whole multiset: every pair of items on two different GPUs counts its pair score (so an
  // added GPU gains base[h] * PairScore(g, h) from each GPU h). A candidate may already be in the
  // base. Exact, by the same search as Best(). InvalidArgument when count exceeds the candidates.
  absl::StatusOr<uint64_t> BestAddition(uint64_t candidates, const std::vector<int>& base,
                                        int count) const;

 private:
  // The best `need` of `candidates` given each GPU's score towards what is already chosen
  // (`link`, indexed by GPU); `context` orders the search (ties: strongest pull to it first).
  uint64_t Extend(uint64_t candidates, const std::vector<int64_t>& link, uint64_t context,
                  int need) const;

  int n_ = 0;
  std::vector<int64_t> pair_;  // n_ * n_
};

}  // namespace gpulet::plugin
