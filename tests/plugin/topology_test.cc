#include "plugin/topology.h"

#include <gtest/gtest.h>

#include <bit>
#include <random>

#include "testing/gpu/fake_gpu.h"

namespace gpulet::plugin {
namespace {

using gpulet::testing::Dgx1Links;
using gpulet::testing::MakeInventory;

uint64_t Mask(std::initializer_list<int> gpus) {
  uint64_t m = 0;
  for (int g : gpus) m |= uint64_t{1} << g;
  return m;
}

// Every set of `size` from `avail` containing `req`, best score.
int64_t BruteForce(const TopologyScorer& t, uint64_t avail, uint64_t req, int size) {
  int64_t best = -1;
  for (uint64_t m = 0; m < (uint64_t{1} << t.size()); ++m)
    if ((m & ~avail) == 0 && (m & req) == req && std::popcount(m) == size)
      best = std::max(best, t.SetScore(m));
  return best;
}

// On the DGX-1 cube mesh, 4 GPUs are one of the two fully NVLinked quads.
TEST(TopologyTest, Dgx1QuadIsFullyConnected) {
  TopologyScorer t(MakeInventory(8, Dgx1Links()));
  auto best = t.Best(0xff, 0, 4);
  ASSERT_TRUE(best.ok());
  EXPECT_TRUE(*best == Mask({0, 1, 2, 3}) || *best == Mask({4, 5, 6, 7})) << std::hex << *best;
  // With GPU 5 required, the quad must be 4-7.
  EXPECT_EQ(*t.Best(0xff, Mask({5}), 4), Mask({4, 5, 6, 7}));
}

// 2 GPUs are a double-NVLink pair; with GPU 6 required, its partner over 2 links is 2 or 7.
TEST(TopologyTest, Dgx1PairHasNvlink) {
  const auto links = Dgx1Links();
  TopologyScorer t(MakeInventory(8, links));
  auto best = t.Best(0xff, 0, 2);
  ASSERT_TRUE(best.ok());
  int a = std::countr_zero(*best), b = 63 - std::countl_zero(*best);
  EXPECT_EQ(links[a][b], 2);
  auto with6 = *t.Best(0xff, Mask({6}), 2);
  EXPECT_TRUE(with6 == Mask({6, 2}) || with6 == Mask({6, 7}) || with6 == Mask({6, 5}) ||
              with6 == Mask({6, 4}));
  EXPECT_EQ(links[6][std::countr_zero(with6 & ~Mask({6}))], 2);
  // When 0-3 are taken, the quad comes from 4-7.
  EXPECT_EQ(*t.Best(Mask({4, 5, 6, 7}), 0, 4), Mask({4, 5, 6, 7}));
}

// Impossible requests are errors, not crashes.
TEST(TopologyTest, ImpossibleRequests) {
  TopologyScorer t(MakeInventory(8, Dgx1Links()));
  EXPECT_FALSE(t.Best(Mask({0, 1}), 0, 3).ok());
  EXPECT_FALSE(t.Best(0xff, Mask({0, 1, 2}), 2).ok());
  EXPECT_FALSE(t.Best(0xff, 0, 0).ok());
}

// The search returns the brute-force optimum on random 16-GPU topologies, availability and
// must-include sets (the optimality contract).
TEST(TopologyTest, OptimalAgainstBruteForce) {
  std::mt19937 rng(7);
  for (int round = 0; round < 60; ++round) {
    const int n = 16;
    std::vector<std::vector<int>> links(n, std::vector<int>(n, 0));
    for (int i = 0; i < n; ++i)
      for (int j = i + 1; j < n; ++j) links[i][j] = links[j][i] = rng() % 3 == 0 ? rng() % 5 : 0;
    auto inv = MakeInventory(n, links);
    // Vary PCIe too so the second level matters.
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        if (i != j && (i / 4) == (j / 4))
          inv.topology[i][j].pcie = gpu::PcieRelation::kSingleSwitch;
    TopologyScorer t(inv);
    uint64_t avail = (rng() & 0xffff) | 0x0f0f;
    int size = 1 + rng() % std::min(8, std::popcount(avail));
    uint64_t req = 0;
    for (int g = 0; g < n && std::popcount(req) < size / 2; ++g)
      if ((avail >> g & 1) && rng() % 4 == 0) req |= uint64_t{1} << g;
    auto best = t.Best(avail, req, size);
    ASSERT_TRUE(best.ok()) << best.status();
    EXPECT_EQ(std::popcount(*best), size);
    EXPECT_EQ(*best & req, req);
    EXPECT_EQ(*best & ~avail, 0u);
    EXPECT_EQ(t.SetScore(*best), BruteForce(t, avail, req, size)) << "round " << round;
  }
}

// BestAddition (time-slicing replicas): the brute-force optimum of the multiset score, with bases
// that count some GPUs several times and candidates that are already in the base.
TEST(TopologyTest, BestAdditionOptimalAgainstBruteForce) {
  std::mt19937 rng(11);
  for (int round = 0; round < 60; ++round) {
    const int n = 12;
    std::vector<std::vector<int>> links(n, std::vector<int>(n, 0));
    for (int i = 0; i < n; ++i)
      for (int j = i + 1; j < n; ++j) links[i][j] = links[j][i] = rng() % 3 == 0 ? rng() % 5 : 0;
    TopologyScorer t(MakeInventory(n, links));
    std::vector<int> base(n, 0);
    for (int g = 0; g < n; ++g) base[g] = rng() % 4 == 0 ? 1 + rng() % 3 : 0;
    uint64_t cand = (rng() & 0xfff) | 0x111;
    int count = rng() % (std::popcount(cand) + 1);
    // Score of base + one item per GPU of m: pairs on two different GPUs.
    auto score = [&](uint64_t m) {
      std::vector<int64_t> c(base.begin(), base.end());
      for (int g = 0; g < n; ++g) c[g] += m >> g & 1;
      int64_t s = 0;
      for (int a = 0; a < n; ++a)
        for (int b = a + 1; b < n; ++b) s += c[a] * c[b] * t.PairScore(a, b);
      return s;
    };
    int64_t brute = -1;
    for (uint64_t m = 0; m < (uint64_t{1} << n); ++m)
      if ((m & ~cand) == 0 && std::popcount(m) == count) brute = std::max(brute, score(m));
    auto best = t.BestAddition(cand, base, count);
    ASSERT_TRUE(best.ok()) << best.status();
    EXPECT_EQ(std::popcount(*best), count);
    EXPECT_EQ(*best & ~cand, 0u);
    EXPECT_EQ(score(*best), brute) << "round " << round;
  }
  TopologyScorer t(MakeInventory(4, {}));
  EXPECT_FALSE(t.BestAddition(Mask({0, 1}), {}, 3).ok());
}

}  // namespace
}  // namespace gpulet::plugin
