// Placement library: feasibility rules, state updates, workload classes, and every policy on
// small hand-made clusters whose right answer follows from the policy's definition (the
// reasoning is written above each case).
#include "placement/placement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

namespace gpulet::placement {
namespace {

using ::testing::HasSubstr;

Node MakeNode(std::string name, int gpus, std::string model = "T4", int64_t cpu = 32000,
              int64_t mem = 131072) {
  Node n;
  n.name = std::move(name);
  n.cpu_milli_total = n.cpu_milli_free = cpu;
  n.memory_mib_total = n.memory_mib_free = mem;
  n.gpus.assign(gpus, Gpu{model});
  return n;
}

PodRequest Share(int32_t milli, int64_t cpu = 1000, std::vector<std::string> models = {}) {
  PodRequest p;
  p.name = "share-" + std::to_string(milli);
  p.cpu_milli = cpu;
  p.memory_mib = 1024;
  p.containers.push_back({0, milli, 0});
  p.gpu_models = std::move(models);
  return p;
}

PodRequest Whole(int32_t n, int64_t cpu = 1000, std::vector<std::string> models = {}) {
  PodRequest p;
  p.name = "whole-" + std::to_string(n);
  p.cpu_milli = cpu;
  p.memory_mib = 1024;
  p.containers.push_back({n, 0, 0});
  p.gpu_models = std::move(models);
  return p;
}

PodRequest CpuOnly(int64_t cpu) {
  PodRequest p;
  p.name = "cpu";
  p.cpu_milli = cpu;
  p.memory_mib = 1024;
  p.containers.push_back({});
  return p;
}

// Runs one decision with the named policy (workload given when non-empty).
Choice Decide(const std::string& policy, const Cluster& c, const PodRequest& pod,
              const Workload& w = {}) {
  auto p = MakePolicy(policy, {.seed = 7});
  EXPECT_TRUE(p.ok()) << p.status();
  (*p)->SetWorkload(w);
  auto choice = Schedule(c, pod, **p);
  EXPECT_TRUE(choice.ok()) << choice.status();
  return choice.ok() ? *choice : Choice{};
}

// CPU and memory of the node both gate a pod, with a reason naming the shortfall.
TEST(Fits, CpuAndMemory) {
  Node n = MakeNode("n", 1, "T4", 4000, 2048);
  std::string why;
  EXPECT_TRUE(Fits(n, Share(500, 4000)));
  EXPECT_FALSE(Fits(n, Share(500, 4001), &why));
  EXPECT_THAT(why, HasSubstr("insufficient cpu: need 4001m, free 4000m"));
  PodRequest big = Share(500);
  big.memory_mib = 4096;
  EXPECT_FALSE(Fits(n, big, &why));
  EXPECT_THAT(why, HasSubstr("insufficient memory"));
}

// gpu_spec: only GPUs of an accepted model count; CPU-only pods ignore models.
TEST(Fits, GpuModelConstraint) {
  Node n = MakeNode("n", 2, "P100");
  std::string why;
  EXPECT_TRUE(Fits(n, Whole(1, 1000, {"P100", "V100M16"})));
  EXPECT_FALSE(Fits(n, Whole(1, 1000, {"V100M16"}), &why));
  EXPECT_THAT(why, HasSubstr("no GPU of model V100M16"));
  EXPECT_FALSE(Fits(n, Share(100, 1000, {"T4"})));
}

// Whole GPUs need untouched GPUs; a share fits any GPU with enough free compute.
TEST(Fits, WholeVersusFractional) {
  Node n = MakeNode("n", 2);
  n.gpus[0].free_milli = 600;
  std::string why;
  EXPECT_TRUE(Fits(n, Whole(1)));
  EXPECT_FALSE(Fits(n, Whole(2), &why));
  EXPECT_THAT(why, HasSubstr("needs 2 whole GPU(s), 1 free"));
  EXPECT_TRUE(Fits(n, Share(600)));
  n.gpus[1].free_milli = 500;
  EXPECT_FALSE(Fits(n, Share(700), &why));
  EXPECT_THAT(why, HasSubstr("largest free share: 600"));
}

// Whole-only GPUs take whole requests but no shares; unhealthy GPUs take nothing.
TEST(Fits, WholeOnlyAndUnhealthy) {
  Node n = MakeNode("n", 2);
  n.gpus[0].fractional_allowed = false;
  n.gpus[1].healthy = false;
  EXPECT_TRUE(Fits(n, Whole(1)));
  EXPECT_FALSE(Fits(n, Whole(2)));
  EXPECT_FALSE(Fits(n, Share(100)));
}

// GPU memory is checked only where it is tracked (total > 0).
TEST(Fits, GpuMemory) {
  Node n = MakeNode("n", 1);
  PodRequest p = Share(100);
  p.containers[0].memory_bytes = int64_t{8} << 30;
  EXPECT_TRUE(Fits(n, p));  // untracked
  n.gpus[0].memory_total_bytes = int64_t{16} << 30;
  n.gpus[0].memory_free_bytes = int64_t{4} << 30;
  std::string why;
  EXPECT_FALSE(Fits(n, p, &why));
  EXPECT_THAT(why, HasSubstr("bytes memory"));
}

// Apply then Release restores the node exactly; an over-commit is refused and changes nothing.
TEST(ApplyRelease, RoundTripAndRefusal) {
  Cluster c;
  c.nodes.push_back(MakeNode("n", 2));
  const Node before = c.nodes[0];
  PodRequest p = Share(300, 2000);
  auto choice = Decide("best-fit", c, p);
  ASSERT_TRUE(Apply(c.nodes[0], p, choice.placement.assignment).ok());
  EXPECT_EQ(c.nodes[0].cpu_milli_free, before.cpu_milli_free - 2000);
  EXPECT_EQ(c.nodes[0].gpus[0].free_milli + c.nodes[0].gpus[1].free_milli, 1700);
  ASSERT_TRUE(Release(c.nodes[0], p, choice.placement.assignment).ok());
  EXPECT_EQ(c.nodes[0].gpus[0].free_milli, 1000);
  EXPECT_EQ(c.nodes[0].cpu_milli_free, before.cpu_milli_free);

  Assignment bad;
  bad.containers.push_back({{0}, 1000, 0});
  c.nodes[0].gpus[0].free_milli = 200;
  const Node snapshot = c.nodes[0];
  EXPECT_FALSE(Apply(c.nodes[0], Share(300), bad).ok());
  EXPECT_FALSE(Release(c.nodes[0], Whole(1), bad).ok());  // GPU 0 is not held whole
  EXPECT_EQ(c.nodes[0].gpus[0].free_milli, snapshot.gpus[0].free_milli);
  EXPECT_EQ(c.nodes[0].cpu_milli_free, snapshot.cpu_milli_free);
}

// No feasible node: NotFound naming the pod and the first nodes' reasons.
TEST(Schedule, NoNodeFits) {
  Cluster c;
  c.nodes.push_back(MakeNode("a", 1, "T4", 500));
  auto p = MakePolicy("fgd");
  ASSERT_TRUE(p.ok());
  auto r = Schedule(c, Whole(1), **p);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsNotFound(r.status()));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("whole-1"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("a: insufficient cpu"));
}

// Extender scaling: best -> hi, worst -> lo, all equal -> hi.
TEST(ScaleScores, MinMax) {
  std::vector<double> s = {3, -1, 1};
  EXPECT_EQ(ScaleScores(s, 0, 10), (std::vector<int64_t>{10, 0, 5}));
  std::vector<double> same = {2, 2};
  EXPECT_EQ(ScaleScores(same, 0, 10), (std::vector<int64_t>{10, 10}));
}

// Workload classes: grouped by cpu and GPU ask (memory not part of the key; a class carries its
// pods' mean memory, which gpulet's stranding term reads), most frequent first, and the tail
// beyond the coverage share dropped and weights renormalised.
TEST(WorkloadFromPods, GroupsAndCoverage) {
  std::vector<PodRequest> pods;
  for (int i = 0; i < 6; ++i) pods.push_back(Share(500));
  pods[1].memory_mib = 99;  // same class despite other memory
  for (int i = 0; i < 3; ++i) pods.push_back(Whole(1));
  pods.push_back(CpuOnly(4000));
  Workload all = WorkloadFromPods(pods, 1.0);
  ASSERT_EQ(all.classes.size(), 3u);
  EXPECT_EQ(all.classes[0].shape.containers[0].milli, 500);
  EXPECT_DOUBLE_EQ(all.classes[0].weight, 0.6);
  EXPECT_EQ(all.classes[0].shape.memory_mib, (5 * 1024 + 99) / 6);
  Workload top = WorkloadFromPods(pods, 0.9);  // 6 + 3 = 90% of pods
  ASSERT_EQ(top.classes.size(), 2u);
  EXPECT_DOUBLE_EQ(top.classes[0].weight + top.classes[1].weight, 1.0);
}

// Unknown policy names are refused with the list of known ones.
TEST(MakePolicy, UnknownName) {
  auto p = MakePolicy("tetris");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("known: random, best-fit"));
  for (const auto& n : PolicyNames()) EXPECT_TRUE(MakePolicy(n).ok()) << n;
}

// Best fit: a 1-GPU pod on node "tight" (1 GPU free) leaves less free GPU than on "roomy"
// (4 free), with equal CPU, so its score (1 - normalised leftover) is higher there.
TEST(Policies, BestFitPicksTightestNode) {
  Cluster c;
  c.nodes.push_back(MakeNode("roomy", 4));
  c.nodes.push_back(MakeNode("tight", 1));
  EXPECT_EQ(Decide("best-fit", c, Whole(1)).node, 1);
}

// Without a workload FGD's measure is undefined; fgd and gpulet then fall back to best fit
// (the extender may not know the workload), so they pick the tight node too.
TEST(Policies, FragPoliciesWithoutWorkloadFallBackToBestFit) {
  Cluster c;
  c.nodes.push_back(MakeNode("roomy", 4));
  c.nodes.push_back(MakeNode("tight", 1));
  EXPECT_EQ(Decide("fgd", c, Whole(1)).node, 1);
  EXPECT_EQ(Decide("gpulet", c, Whole(1)).node, 1);
}

// GPU packing: a share goes to a GPU already shared (score >= 50) before any idle node
// (score <= 33); within the node, to the used GPU (best-fit GPU selection).
TEST(Policies, GpuPackingPrefersSharedGpu) {
  Cluster c;
  c.nodes.push_back(MakeNode("idle", 2));
  c.nodes.push_back(MakeNode("used", 2));
  c.nodes[1].gpus[1].free_milli = 500;
  Choice ch = Decide("gpu-packing", c, Share(300));
  EXPECT_EQ(ch.node, 1);
  EXPECT_EQ(ch.placement.assignment.containers[0].gpus, (std::vector<int32_t>{1}));
}

// Dot product: the request (cpu, gpu) is least aligned with the free vector of the emptier
// node... i.e. the node with less free resources has the smaller dot product and wins.
TEST(Policies, DotProductPrefersSmallerFreeVector) {
  Cluster c;
  c.nodes.push_back(MakeNode("big", 8, "T4", 96000));
  c.nodes.push_back(MakeNode("small", 2, "T4", 8000));
  EXPECT_EQ(Decide("dot-product", c, Whole(1, 4000)).node, 1);
}

// FGD picks the GPU that keeps the workload's tasks placeable, even against best fit: every
// expected task asks 600 milli. On GPUs with [1000, 700] free, a 300 share on GPU 1 leaves
// [1000, 400] -- 400 milli no expected task can use (fragment 400); on GPU 0 it leaves
// [700, 700], both still fit a 600 task (fragment 0). Best fit would take GPU 1.
TEST(Policies, FgdAvoidsCreatingFragments) {
  Cluster c;
  c.nodes.push_back(MakeNode("n", 2));
  c.nodes[0].gpus[1].free_milli = 700;
  std::vector<PodRequest> expected(10, Share(600));
  const Workload w = WorkloadFromPods(expected);
  EXPECT_EQ(Decide("fgd", c, Share(300), w).placement.assignment.containers[0].gpus,
            (std::vector<int32_t>{0}));
  EXPECT_EQ(Decide("gpulet", c, Share(300), w).placement.assignment.containers[0].gpus,
            (std::vector<int32_t>{0}));
  EXPECT_EQ(Decide("best-fit", c, Share(300), w).placement.assignment.containers[0].gpus,
            (std::vector<int32_t>{1}));
}

// FGD across nodes: the workload is whole-GPU 2-GPU tasks. Putting a 1-GPU task on "pair"
// (2 free GPUs) leaves one free GPU that no expected task can use; on "triple" (3 free) it
// leaves 2, which still host one. So FGD (and gpulet) choose "triple" although best fit
// would choose "pair".
TEST(Policies, FgdKeepsNodesUsableAcrossNodes) {
  Cluster c;
  c.nodes.push_back(MakeNode("pair", 2));
  c.nodes.push_back(MakeNode("triple", 3));
  std::vector<PodRequest> expected(10, Whole(2));
  const Workload w = WorkloadFromPods(expected);
  EXPECT_EQ(Decide("fgd", c, Whole(1), w).node, 1);
  EXPECT_EQ(Decide("gpulet", c, Whole(1), w).node, 1);
  EXPECT_EQ(Decide("best-fit", c, Whole(1), w).node, 0);
}

// Two nodes in use with 4 free GPUs each: "tight" has 24 cores free, "roomy" 64.
Cluster TightAndRoomy() {
  Cluster c;
  c.nodes.push_back(MakeNode("tight", 4, "T4", 32000));
  c.nodes.push_back(MakeNode("roomy", 4, "T4", 72000));
  c.nodes[0].cpu_milli_free = 24000;
  c.nodes[1].cpu_milli_free = 64000;
  return c;
}

// Expected GPU tasks at 2 milli-CPU per milli-GPU on average (1000m and 3000m per GPU).
std::vector<PodRequest> TwoCoresPerGpuTasks() {
  std::vector<PodRequest> tasks(5, Whole(1, 1000));
  for (int i = 0; i < 5; ++i) tasks.push_back(Whole(1, 3000));
  return tasks;
}

// gpulet weighs the GPUs a placement strands behind the node's CPU: the expected tasks ask 2
// milli-CPU per milli-GPU on average (1000m and 3000m per GPU). Both nodes are in use and have 4
// free GPUs; "tight" has 24 cores free, "roomy" 64. A whole GPU with 20 cores leaves "tight"
// 3 free GPUs but 4 cores, enough for one 3000m task yet only 2000 milli-GPU at the average
// ratio: 1000 milli stranded. Every class still fits both nodes afterwards, so FGD's measure
// sees no difference (a tie: first node, "tight"); gpulet picks "roomy". CPU-only tasks have no
// tie rule of their own (they follow node order, like FGD).
TEST(Policies, GpuletAvoidsStrandingGpusBehindCpu) {
  Cluster c = TightAndRoomy();
  const Workload w = WorkloadFromPods(TwoCoresPerGpuTasks());
  EXPECT_EQ(Decide("fgd", c, Whole(1, 20000), w).node, 0);
  EXPECT_EQ(Decide("gpulet", c, Whole(1, 20000), w).node, 1);
  // A task at the workload's ratio strands nothing on either node: a tie for gpulet too.
  EXPECT_EQ(Decide("gpulet", c, Whole(1, 2000), w).node, 0);
  EXPECT_EQ(Decide("gpulet", c, CpuOnly(2000), w).node, 0);
}

// Two nodes with 16 free GPUs each and no free CPU: the cluster's CPU per free GPU drops.
void AddCpuLessNodes(Cluster& c) {
  for (const char* name : {"no-cpu-a", "no-cpu-b"}) {
    c.nodes.push_back(MakeNode(name, 16, "T4", 32000));
    c.nodes.back().cpu_milli_free = 0;
  }
}

// When CPU is short cluster-wide (two nodes hold 32 free GPUs and no CPU: 88 cores for 40 free
// GPUs, 2.2 per GPU against the 2 the expected tasks ask, under the 1.5x margin), every node
// would look stranded at the workload's ratio; gpulet then measures stranding at the cluster's
// own supply ratio, 2.2 cores per GPU. A whole GPU with 20 cores leaves "tight" 3 free GPUs and
// 4 cores, 1.8 GPUs' worth: 1182 milli stranded; "roomy" keeps 44 cores for 3 GPUs. FGD sees
// a tie (first node); gpulet picks "roomy". The same nodes scored without the cluster
// (Score()) show the workload-ratio penalty.
TEST(Policies, GpuletMeasuresStrandingAtTheClustersSupplyWhenCpuIsShortEverywhere) {
  Cluster c = TightAndRoomy();
  AddCpuLessNodes(c);
  const Workload w = WorkloadFromPods(TwoCoresPerGpuTasks());
  EXPECT_EQ(Decide("fgd", c, Whole(1, 20000), w).node, 0);
  EXPECT_EQ(Decide("gpulet", c, Whole(1, 20000), w).node, 1);
  auto gpulet = MakePolicy("gpulet");
  ASSERT_TRUE(gpulet.ok());
  (*gpulet)->SetWorkload(w);
  auto tight = (*gpulet)->Score(c.nodes[0], Whole(1, 20000));
  auto roomy = (*gpulet)->Score(c.nodes[1], Whole(1, 20000));
  ASSERT_TRUE(tight && roomy);
  EXPECT_LT(tight->score, roomy->score);
}

// CPU short: 68 cores for 40 free GPUs (1.7 per GPU), "rich" has 64 of them for its 4 GPUs,
// "poor" 4 (1647 milli of its GPUs stranded at 1.7 per GPU). A whole GPU with 1 core on "poor"
// leaves 3 GPUs and 3 cores: 1235 stranded, 412 fewer; on "rich" nothing changes. Every class
// still fits both nodes, so FGD sees a tie (first node, "rich"); gpulet takes the GPU "poor"
// could hardly serve and keeps "rich"'s cores for the tasks that ask more. A task asking 3
// cores per GPU, more than the cluster supplies, would strand more on "poor": "rich" for both.
// Multi-GPU tasks keep FGD's score (they need whole nodes, which FGD's measure keeps for them).
TEST(Policies, GpuletGivesTasksAskingLittleCpuToCpuPoorNodesWhenCpuIsShort) {
  Cluster c;
  c.nodes.push_back(MakeNode("rich", 4, "T4", 72000));
  c.nodes.push_back(MakeNode("poor", 4, "T4", 32000));
  c.nodes[0].cpu_milli_free = 64000;
  c.nodes[1].cpu_milli_free = 4000;
  AddCpuLessNodes(c);
  const Workload w = WorkloadFromPods(TwoCoresPerGpuTasks());
  EXPECT_EQ(Decide("fgd", c, Whole(1, 1000), w).node, 0);
  EXPECT_EQ(Decide("gpulet", c, Whole(1, 1000), w).node, 1);
  EXPECT_EQ(Decide("gpulet", c, Whole(1, 3000), w).node, 0);
  EXPECT_EQ(Decide("fgd", c, Whole(2, 1000), w).node, 0);
  EXPECT_EQ(Decide("gpulet", c, Whole(2, 1000), w).node, 0);
}

// Memory short: the expected tasks ask 4 GiB per GPU; only "gpus-free" has GPUs free, with 8 GiB
// (2 GiB per GPU, under the 1.5x margin). A CPU-only task with 4 GiB there would leave 2 GiB for
// its 4 GPUs (2000 milli stranded at the supply ratio); "gpus-taken" has every GPU given out. FGD's
// measure ignores memory and sees a tie (first node); gpulet puts the task where the memory
// serves no GPU. With memory to spare, CPU-only tasks follow FGD (node order).
TEST(Policies, GpuletKeepsCpuOnlyTasksOffMemoryFreeGpusNeedWhenMemoryIsShort) {
  Cluster c;
  c.nodes.push_back(MakeNode("gpus-free", 4, "T4", 32000, 8192));
  c.nodes.push_back(MakeNode("gpus-taken", 4, "T4", 32000, 65536));
  for (Gpu& g : c.nodes[1].gpus) g.free_milli = 0;
  PodRequest gpu_task = Whole(1);
  gpu_task.memory_mib = 4096;
  const Workload w = WorkloadFromPods(std::vector<PodRequest>(10, gpu_task));
  PodRequest cpu_task = CpuOnly(1000);
  cpu_task.memory_mib = 4096;
  EXPECT_EQ(Decide("fgd", c, cpu_task, w).node, 0);
  EXPECT_EQ(Decide("gpulet", c, cpu_task, w).node, 1);
  c.nodes[0].memory_mib_total = c.nodes[0].memory_mib_free = 131072;
  EXPECT_EQ(Decide("gpulet", c, cpu_task, w).node, 0);
}

// Which rule applies is decided as before (session 5's gate): with many big CPU-only tasks
// expected (64 cores each, as many as GPU tasks) CPU will run out, and stranding is measured at
// the cluster's supply (88 cores for 8 GPUs: 11 per GPU; "tight" already strands 1818 milli, a
// whole GPU with 20 cores 818 more: 20 levels per GPU, 16.4); with a few small ones (1 core) CPU
// is to spare, and the workload's ratio (2 per GPU) decides: 1000 milli newly stranded on
// "tight", 2 levels, beside the in-use bonus that both nodes get.
TEST(Policies, GpuletMeasuresStrandingAtTheSupplyRatioWhenCpuOnlyTasksWillDrainCpu) {
  const Cluster c = TightAndRoomy();
  const ClusterFree free = FreeOf(c);
  auto gap = [&](const std::vector<PodRequest>& cpu_tasks) {
    std::vector<PodRequest> expected = TwoCoresPerGpuTasks();
    expected.insert(expected.end(), cpu_tasks.begin(), cpu_tasks.end());
    auto gpulet = MakePolicy("gpulet");
    EXPECT_TRUE(gpulet.ok());
    (*gpulet)->SetWorkload(WorkloadFromPods(expected));
    auto tight = (*gpulet)->ScoreValue(c.nodes[0], Whole(1, 20000), &free);
    auto roomy = (*gpulet)->ScoreValue(c.nodes[1], Whole(1, 20000), &free);
    EXPECT_TRUE(tight && roomy);
    return tight && roomy ? *roomy - *tight : 0.0;
  };
  EXPECT_NEAR(gap(std::vector<PodRequest>(10, CpuOnly(64000))), 20.0 * 9.0 / 11.0, 1e-9);
  EXPECT_NEAR(gap(std::vector<PodRequest>(10, CpuOnly(1000))), 2.0, 1e-9);
  EXPECT_EQ(Decide("fgd", c, Whole(1, 20000), WorkloadFromPods(TwoCoresPerGpuTasks())).node, 0);
}

// The same with memory, which FGD's measure ignores: the expected tasks ask 1024 MiB per GPU.
// A whole GPU with 3 GiB leaves "tight" 3 free GPUs but 1 GiB: 2000 milli stranded; FGD sees a
// tie and takes the first node, gpulet the one with memory to spare.
TEST(Policies, GpuletAvoidsStrandingGpusBehindMemory) {
  Cluster c;
  c.nodes.push_back(MakeNode("tight", 4, "T4", 32000, 8192));
  c.nodes.push_back(MakeNode("roomy", 4, "T4", 32000, 131072));
  for (Node& n : c.nodes) n.cpu_milli_free -= 1000;
  c.nodes[0].memory_mib_free = 4096;
  const Workload w = WorkloadFromPods(std::vector<PodRequest>(10, Whole(1)));
  PodRequest big = Whole(1);
  big.memory_mib = 3072;
  EXPECT_EQ(Decide("fgd", c, big, w).node, 0);
  EXPECT_EQ(Decide("gpulet", c, big, w).node, 1);
  EXPECT_EQ(Decide("gpulet", c, Whole(1), w).node, 0);  // strands nothing: node order
}

// gpulet opens idle nodes last: "idle" and "in-use" have the same free GPUs and enough CPU for
// every expected task, so FGD's score is equal (a tie: first node, the idle one); gpulet puts
// the GPU task on the node already in use (a CPU task runs there), keeping "idle" whole. The rule
// is worth less than one score level, so a fragmentation difference still wins (second half).
TEST(Policies, GpuletPrefersNodesInUseOnTies) {
  Cluster c;
  c.nodes.push_back(MakeNode("idle", 2));
  c.nodes.push_back(MakeNode("in-use", 2));
  c.nodes[1].cpu_milli_free -= 2000;
  std::vector<PodRequest> expected(10, Share(500));
  const Workload w = WorkloadFromPods(expected);
  EXPECT_EQ(Decide("fgd", c, Share(500), w).node, 0);
  EXPECT_EQ(Decide("gpulet", c, Share(500), w).node, 1);
  // Fragmentation first: on "in-use" the only GPUs left have 600 free, where a 500 share
  // strands 100 that no expected (500) task can use; on "idle" it leaves 500, usable. Both
  // policies pick "idle" although "in-use" is in use.
  c.nodes[1].gpus[0].free_milli = 600;
  c.nodes[1].gpus[1].free_milli = 600;
  EXPECT_EQ(Decide("fgd", c, Share(500), w).node, 0);
  EXPECT_EQ(Decide("gpulet", c, Share(500), w).node, 0);
}

// Random: the same seed gives the same choice; the choice is always feasible; over many
// pods more than one node is used.
TEST(Policies, RandomIsSeededAndFeasible) {
  Cluster c;
  for (int i = 0; i < 5; ++i) c.nodes.push_back(MakeNode("n" + std::to_string(i), 2));
  c.nodes[2].cpu_milli_free = 0;  // never feasible
  auto a = MakePolicy("random", {.seed = 1});
  auto b = MakePolicy("random", {.seed = 1});
  std::set<int> used;
  for (int i = 0; i < 40; ++i) {
    PodRequest p = Share(100);
    p.name = "p" + std::to_string(i);
    auto x = Schedule(c, p, **a);
    auto y = Schedule(c, p, **b);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_EQ(x->node, y->node);
    EXPECT_NE(x->node, 2);
    used.insert(x->node);
  }
  EXPECT_GT(used.size(), 1u);
}

// Every policy returns an assignment that Apply accepts, for whole, share and CPU-only pods.
TEST(Policies, AssignmentsApply) {
  for (const auto& name : PolicyNames()) {
    Cluster c;
    c.nodes.push_back(MakeNode("a", 4));
    c.nodes[0].gpus[2].free_milli = 350;
    for (const PodRequest& p : {Whole(2), Share(300), CpuOnly(1000)}) {
      Choice ch = Decide(name, c, p, WorkloadFromPods(std::vector<PodRequest>{Share(300)}));
      EXPECT_TRUE(Apply(c.nodes[ch.node], p, ch.placement.assignment).ok()) << name;
    }
  }
}

}  // namespace
}  // namespace gpulet::placement
