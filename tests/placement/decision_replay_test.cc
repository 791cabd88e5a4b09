// Decision replay: the placement policies' choices on seeded clusters and pod streams, compared
// with decisions recorded from the code before a change (data/decisions-*.txt). A speed-up of a
// policy must not move a single pod. Re-record (only when a change is meant to alter decisions):
//   GPULET_RECORD_DECISIONS=1 build/tests/placement_decision_replay_test
// writes the files into tests/placement/data/ of the source tree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "placement/placement.h"

namespace gpulet::placement {
namespace {

// splitmix64, written out so the streams are the same on every platform and library version.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int64_t In(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(Next() % (hi - lo + 1)); }
};

constexpr int64_t kGiB = int64_t{1} << 30;

// What the vGPU extender sees: 1000 nodes x 8 GPUs with memory, no CPU, about half the GPUs
// already carrying one or two shares; pods are shares of one GPU (cores 5..95 as milli 50..950)
// with memory, and now and then 1-2 whole GPUs.
struct Scenario {
  Cluster cluster;
  std::vector<PodRequest> pods;      // the stream to place
  std::vector<PodRequest> workload;  // what the policy is told to expect
};

Scenario VgpuScenario() {
  Rng r{7};
  Scenario sc;
  for (int n = 0; n < 1000; ++n) {
    Node node{.name = absl::StrCat("node-", n)};
    for (int g = 0; g < 8; ++g) {
      Gpu gpu{.model = "H100", .memory_total_bytes = 80 * kGiB, .memory_free_bytes = 80 * kGiB};
      const int shares = static_cast<int>(r.In(0, 2));
      for (int s = 0; s < shares && gpu.free_milli > 450; ++s) {
        gpu.free_milli -= static_cast<int32_t>(r.In(5, 44) * 10);
        gpu.memory_free_bytes -= r.In(1, 20) * kGiB;
      }
      node.gpus.push_back(gpu);
    }
    sc.cluster.nodes.push_back(std::move(node));
  }
  auto shape = [&](int i) {
    PodRequest p{.name = absl::StrCat("pod-", i)};
    if (r.In(0, 19) == 0) {
      p.containers.push_back({.whole_gpus = static_cast<int32_t>(r.In(1, 2))});
    } else {
      p.containers.push_back(
          {.milli = static_cast<int32_t>(r.In(5, 95) * 10), .memory_bytes = r.In(1, 30) * kGiB});
    }
    return p;
  };
  for (int i = 0; i < 4000; ++i) sc.workload.push_back(shape(i));
  for (int i = 0; i < 3000; ++i) sc.pods.push_back(shape(i));
  return sc;
}

// An openb-like cluster: CPU and memory tracked, mixed models and GPU counts, CPU-only tasks,
// model-constrained tasks, shares and multi-GPU tasks (the simulator's path). `memory_scale`
// multiplies every task's memory (drawn as before): at 4 memory runs out before the GPUs, and
// gpulet measures stranding at the cluster's supply ratio (its other rule).
Scenario TraceScenario(int memory_scale = 1) {
  Rng r{11};
  Scenario sc;
  const char* models[] = {"T4", "V100M16", "V100M32", "A100"};
  for (int n = 0; n < 300; ++n) {
    Node node{.name = absl::StrCat("n", n),
              .cpu_milli_total = r.In(3, 12) * 8000,
              .memory_mib_total = r.In(2, 8) * 65536};
    node.cpu_milli_free = node.cpu_milli_total;
    node.memory_mib_free = node.memory_mib_total;
    const int ngpu = static_cast<int>(r.In(0, 4)) * 2;
    const std::string model = models[r.In(0, 3)];
    for (int g = 0; g < ngpu; ++g) node.gpus.push_back({.model = model});
    sc.cluster.nodes.push_back(std::move(node));
  }
  auto shape = [&](int i) {
    PodRequest p{.name = absl::StrCat("task-", i),
                 .cpu_milli = r.In(1, 16) * 1000,
                 .memory_mib = r.In(1, 32) * 1024 * memory_scale};
    const int kind = static_cast<int>(r.In(0, 9));
    if (kind < 2) {
      // CPU only
    } else if (kind < 6) {
      p.containers.push_back({.milli = static_cast<int32_t>(r.In(1, 10) * 100)});
    } else {
      p.containers.push_back({.whole_gpus = static_cast<int32_t>(r.In(1, 4))});
    }
    if (r.In(0, 4) == 0 && !p.containers.empty()) p.gpu_models = {models[r.In(0, 3)]};
    return p;
  };
  for (int i = 0; i < 3000; ++i) sc.workload.push_back(shape(i));
  for (int i = 0; i < 2500; ++i) sc.pods.push_back(shape(i));
  return sc;
}

// Under ASan/UBSan or TSan (CI's second run, ~20x slower here) the replay stops after this many
// pods and compares that prefix: the sanitizers see the same code paths; the optimised build
// compares all.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr size_t kPods = 400;
#else
constexpr size_t kPods = SIZE_MAX;
#endif

// Places the stream one pod at a time (no departures) and writes one line per decision.
std::string Replay(Scenario sc, const std::string& policy_name) {
  if (sc.pods.size() > kPods) sc.pods.resize(kPods);
  auto policy = MakePolicy(policy_name, {.seed = 3});
  EXPECT_TRUE(policy.ok()) << policy.status();
  (*policy)->SetWorkload(WorkloadFromPods(sc.workload));
  std::ostringstream out;
  for (const PodRequest& pod : sc.pods) {
    auto choice = Schedule(sc.cluster, pod, **policy);
    if (!choice.ok()) {
      out << pod.name << " -\n";
      continue;
    }
    out << pod.name << " " << choice->node << absl::StrFormat(" %.17g", choice->placement.score);
    for (const auto& c : choice->placement.assignment.containers) {
      for (int g : c.gpus) out << " " << g;
      out << "/" << c.milli;
    }
    out << "\n";
    EXPECT_TRUE(Apply(sc.cluster.nodes[choice->node], pod, choice->placement.assignment).ok());
  }
  return out.str();
}

void Check(const std::string& file, const std::string& got) {
  const std::string path = std::string(GPULET_SOURCE_DIR) + "/tests/placement/data/" + file;
  if (std::getenv("GPULET_RECORD_DECISIONS")) {
    if (kPods != SIZE_MAX)
      GTEST_SKIP() << "record from the optimised build (this one replays a prefix)";
    std::ofstream(path) << got;
    GTEST_SKIP() << "recorded " << path;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in) << "missing " << path;
  std::stringstream want;
  want << in.rdbuf();
  std::istringstream a(want.str()), b(got);
  std::string la, lb;
  int line = 0, differ = 0;
  std::string first;
  while (static_cast<size_t>(line) < kPods) {
    const bool ga = static_cast<bool>(std::getline(a, la));
    const bool gb = static_cast<bool>(std::getline(b, lb));
    if (!ga && !gb) break;
    ++line;
    if (la != lb) {
      if (differ++ == 0)
        first = absl::StrCat("line ", line, ": recorded '", la, "', now '", lb, "'");
    }
  }
  EXPECT_EQ(differ, 0) << differ << " decisions differ from " << file << "; first at " << first;
  EXPECT_GE(static_cast<size_t>(line), std::min<size_t>(kPods, 1001));
}

TEST(DecisionReplay, GpuletOnVgpuCluster) {
  Check("decisions-vgpu-gpulet.txt", Replay(VgpuScenario(), "gpulet"));
}
TEST(DecisionReplay, FgdOnVgpuCluster) {
  Check("decisions-vgpu-fgd.txt", Replay(VgpuScenario(), "fgd"));
}
TEST(DecisionReplay, GpuletOnTraceCluster) {
  Check("decisions-trace-gpulet.txt", Replay(TraceScenario(), "gpulet"));
}
TEST(DecisionReplay, FgdOnTraceCluster) {
  Check("decisions-trace-fgd.txt", Replay(TraceScenario(), "fgd"));
}
TEST(DecisionReplay, GpuletOnTraceClusterShortOfMemory) {
  Check("decisions-trace-memory-short-gpulet.txt", Replay(TraceScenario(4), "gpulet"));
}

}  // namespace
}  // namespace gpulet::placement
