#include "plugin/topology.h"

#include <algorithm>
#include <bit>

#include "absl/strings/str_cat.h"

namespace gpulet::plugin {
namespace {

int PcieRank(gpu::PcieRelation r) {
  switch (r) {
    case gpu::PcieRelation::kSameBoard:
      return 6;
    case gpu::PcieRelation::kSingleSwitch:
      return 5;
    case gpu::PcieRelation::kMultiSwitch:
      return 4;
    case gpu::PcieRelation::kHostBridge:
      return 3;
    case gpu::PcieRelation::kSameNuma:
      return 2;
    case gpu::PcieRelation::kCrossNuma:
      return 1;
    default:
      return 0;
  }
}

// Depth-first search state. Candidates are tried in a fixed order (most promising first); each
// node adds one candidate or skips it; `link[k]` is candidate k's score towards the chosen set.
struct Search {
  const TopologyScorer& t;
  int m = 0;  // candidates
  int cand[TopologyScorer::kMaxGpus];
  int64_t link[TopologyScorer::kMaxGpus];
  // top[k * m + j]: sum of candidate k's j best pair scores towards the other candidates.
  std::vector<int64_t> top;
  int64_t best_score = -1;
  uint64_t best = 0;

  void Prepare() {
    top.assign(static_cast<size_t>(m) * m, 0);
    int64_t row[TopologyScorer::kMaxGpus];
    for (int k = 0; k < m; ++k) {
      int n = 0;
      for (int l = 0; l < m; ++l)
        if (l != k) row[n++] = t.PairScore(cand[k], cand[l]);
      std::sort(row, row + n, std::greater<>());
      for (int j = 1; j < m; ++j) top[k * m + j] = top[k * m + j - 1] + row[j - 1];
    }
  }

  // Upper bound, doubled, on what `r` more picks from cand[pos..] can add. Every pair among the
  // new picks is counted half at each end, and one end k can gain at most its r-1 best pair
  // scores (top); so each pick k is worth at most 2 * link[k] + top[k][r-1] (doubled units), and
  // the bound is the sum of the r largest such values. Exact for sets of mutually best partners
  // (a NUMA node of an NVSwitch box), which is what makes the search prune at once there.
  int64_t Bound2(int pos, int r) const {
    int64_t v[TopologyScorer::kMaxGpus];
    int n = 0;
    for (int k = pos; k < m; ++k) v[n++] = 2 * link[k] + top[k * m + r - 1];
    std::nth_element(v, v + r - 1, v + n, std::greater<>());
    int64_t b = 0;
    for (int i = 0; i < r; ++i) b += v[i];
    return b;
  }

  void Run(int pos, int r, int64_t score, uint64_t mask) {
    if (r == 0) {
      if (score > best_score) best_score = score, best = mask;
      return;
    }
    if (m - pos < r) return;
    if (best_score >= 0 && 2 * score + Bound2(pos, r) <= 2 * best_score) return;
    // Take cand[pos].
    const int g = cand[pos];
    for (int k = pos + 1; k < m; ++k) link[k] += t.PairScore(cand[k], g);
    Run(pos + 1, r - 1, score + link[pos], mask | (uint64_t{1} << g));
    for (int k = pos + 1; k < m; ++k) link[k] -= t.PairScore(cand[k], g);
    // Skip it.
    Run(pos + 1, r, score, mask);
  }
};

}  // namespace

TopologyScorer::TopologyScorer(const gpu::Inventory& inv)
    : n_(std::min<int>(inv.devices.size(), kMaxGpus)), pair_(n_ * n_, 0) {
  for (int a = 0; a < n_; ++a) {
    for (int b = 0; b < n_; ++b) {
      if (a == b) continue;
      gpu::Link l;
      if (a < static_cast<int>(inv.topology.size()) && b < static_cast<int>(inv.topology[a].size()))
        l = inv.topology[a][b];
      int na = inv.devices[a].numa_node, nb = inv.devices[b].numa_node;
      pair_[a * n_ + b] =
          int64_t{l.nvlinks} * 1000000 + PcieRank(l.pcie) * 1000 + (na >= 0 && na == nb ? 1 : 0);
    }
  }
  // Links must count the same both ways; NVML can disagree (NVIDIA's allocator panics on that,
  // their issue #448). Take the better of the two directions instead.
  for (int a = 0; a < n_; ++a)
    for (int b = a + 1; b < n_; ++b)
      pair_[a * n_ + b] = pair_[b * n_ + a] = std::max(pair_[a * n_ + b], pair_[b * n_ + a]);
}

int64_t TopologyScorer::SetScore(uint64_t mask) const {
  int64_t s = 0;
  for (int a = 0; a < n_; ++a)
    if (mask >> a & 1)
      for (int b = a + 1; b < n_; ++b)
        if (mask >> b & 1) s += PairScore(a, b);
  return s;
}

absl::StatusOr<uint64_t> TopologyScorer::Best(uint64_t available, uint64_t required,
                                              int size) const {
  const uint64_t all = n_ == 64 ? ~uint64_t{0} : (uint64_t{1} << n_) - 1;
  available = (available | required) & all;
  const int need = size - std::popcount(required);
  if (size <= 0 || need < 0 || std::popcount(available) < size)
    return absl::InvalidArgumentError(absl::StrCat("cannot choose ", size, " of ",
                                                   std::popcount(available), " devices with ",
                                                   std::popcount(required), " required"));
  std::vector<int64_t> link(n_, 0);
  for (int g = 0; g < n_; ++g)
    for (int h = 0; h < n_; ++h)
      if (h != g && (required >> h & 1)) link[g] += PairScore(g, h);
  return required | Extend(available & ~required, link, available, need);
}

absl::StatusOr<uint64_t> TopologyScorer::BestAddition(uint64_t candidates,
                                                      const std::vector<int>& base,
                                                      int count) const {
  const uint64_t all = n_ == 64 ? ~uint64_t{0} : (uint64_t{1} << n_) - 1;
  candidates &= all;
  if (count < 0 || std::popcount(candidates) < count)
    return absl::InvalidArgumentError(
        absl::StrCat("cannot choose ", count, " of ", std::popcount(candidates), " devices"));
  std::vector<int64_t> link(n_, 0);
  uint64_t context = candidates;
  for (int h = 0; h < n_ && h < static_cast<int>(base.size()); ++h) {
    if (base[h] <= 0) continue;
    context |= uint64_t{1} << h;
    for (int g = 0; g < n_; ++g)
      if (g != h) link[g] += base[h] * PairScore(g, h);
  }
  return Extend(candidates, link, context, count);
}

uint64_t TopologyScorer::Extend(uint64_t candidates, const std::vector<int64_t>& link,
                                uint64_t context, int need) const {
  Search s{*this};
  for (int g = 0; g < n_; ++g)
    if (candidates >> g & 1) s.cand[s.m++] = g;
  // Most promising first: strongest links to what is chosen, then to the whole context.
  auto pull = [&](int g, uint64_t m) {
    int64_t v = 0;
    for (int h = 0; h < n_; ++h)
      if (h != g && (m >> h & 1)) v += PairScore(g, h);
    return v;
  };
  std::pair<int64_t, int64_t> key[kMaxGpus];
  for (int k = 0; k < s.m; ++k) key[s.cand[k]] = {link[s.cand[k]], pull(s.cand[k], context)};
  std::stable_sort(s.cand, s.cand + s.m, [&](int a, int b) { return key[a] > key[b]; });
  for (int k = 0; k < s.m; ++k) s.link[k] = key[s.cand[k]].first;
  if (need > 0) s.Prepare();
  s.Run(0, need, 0, 0);
  return s.best;
}

}  // namespace gpulet::plugin
