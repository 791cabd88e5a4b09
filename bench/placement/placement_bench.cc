// One placement decision (Schedule() over the whole cluster) on the openb cluster: 1213 nodes,
// 6212 GPUs, loaded to a realistic mid-run state.
//
// Method: load the openb node and pod lists (GPULET_OPENB_DIR, default data/openb of the source
// tree; if absent, the 1/10 sample in tests/placement/data with its nodes repeated
// 10x), replay the seed-42 arrival stream with FGD until `state`% of the GPU capacity has been
// asked, then time Schedule() for the next 256 tasks of the stream in turn (scoring only; the
// cluster is not changed). Reported time is per decision.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>

#include "placement/placement.h"
#include "placement/sim.h"

namespace pl = gpulet::placement;

namespace {

struct Fixture {
  pl::Cluster cluster;
  std::vector<pl::PodRequest> trace;
  std::string source;
};

const Fixture& Data() {
  static const Fixture f = [] {
    Fixture f;
    const char* env = std::getenv("GPULET_OPENB_DIR");
    const std::string dir = env ? env : std::string(GPULET_SOURCE_DIR) + "/data/openb";
    auto c = pl::LoadOpenbNodes(dir + "/openb_node_list_gpu_node.csv");
    auto t = pl::LoadOpenbPods(dir + "/openb_pod_list_default.csv");
    if (c.ok() && t.ok()) {
      f.cluster = std::move(*c);
      f.trace = std::move(*t);
      f.source = "openb";
      return f;
    }
    const std::string sample = std::string(GPULET_SOURCE_DIR) + "/tests/placement/data";
    auto sc = pl::LoadOpenbNodes(sample + "/sample_nodes.csv");
    auto st = pl::LoadOpenbPods(sample + "/sample_pods.csv");
    if (!sc.ok() || !st.ok()) std::abort();
    for (int rep = 0; rep < 10; ++rep) {
      for (pl::Node n : sc->nodes) {
        n.name += "-" + std::to_string(rep);
        f.cluster.nodes.push_back(std::move(n));
      }
    }
    f.trace = std::move(*st);
    f.source = "sample x10";
    return f;
  }();
  return f;
}

void BM_Decision(benchmark::State& state, const char* policy_name) {
  const Fixture& f = Data();
  auto policy = pl::MakePolicy(policy_name, {.seed = 42});
  (*policy)->SetWorkload(pl::WorkloadFromPods(f.trace));
  auto fgd = pl::MakePolicy("fgd");
  (*fgd)->SetWorkload(pl::WorkloadFromPods(f.trace));
  pl::Cluster cluster = f.cluster;
  const int64_t cap = pl::GpuCapacityMilli(cluster);
  const auto stream = pl::ArrivalStream(f.trace, cap, 1.3, 42);
  const double fill = static_cast<double>(state.range(0)) / 100.0;
  size_t i = 0;
  for (int64_t asked = 0; i < stream.size() && asked < fill * cap; ++i) {
    asked += stream[i].TotalGpuMilli();
    auto c = pl::Schedule(cluster, stream[i], **fgd);
    if (c.ok()) (void)pl::Apply(cluster.nodes[c->node], stream[i], c->placement.assignment);
  }
  std::vector<pl::PodRequest> next(
      stream.begin() + static_cast<std::ptrdiff_t>(i),
      stream.begin() + static_cast<std::ptrdiff_t>(std::min(stream.size(), i + 256)));
  size_t k = 0;
  for (auto _ : state) {
    auto c = pl::Schedule(cluster, next[k++ % next.size()], **policy);
    benchmark::DoNotOptimize(c);
  }
  state.SetLabel(f.source + ", " + std::to_string(cluster.nodes.size()) + " nodes");
}

BENCHMARK_CAPTURE(BM_Decision, fgd, "fgd")->Arg(0)->Arg(50)->Arg(90)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Decision, gpulet, "gpulet")
    ->Arg(0)
    ->Arg(50)
    ->Arg(90)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Decision, best_fit, "best-fit")->Arg(50)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Decision, random, "random")->Arg(50)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
