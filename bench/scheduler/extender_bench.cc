// Filter + prioritize latency of the vGPU extender for one pod against 1000 (and 5000) nodes x 8
// GPUs: the benchmark's argument is the node count.
//
// Method: N nodes of 8 GPUs (318 memory units each) are fed to the extender, then about 4 pods per
// node
// of mixed shares (cores 5..95, memory 1..80 units; seeded, so every run sees the same cluster)
// are booked onto them, leaving a realistic mix of partly used GPUs. Each iteration then runs
// filter and prioritize for one 30-core / 20-unit pod with all N node names
// (nodeCacheCapable), as kube-scheduler sends it:
//   BM_FilterPrioritize      the handlers on already-parsed JSON, answers serialised (what our
//                            code costs; the HTTP server sends exactly these strings);
//   BM_FilterPrioritizeJson  plus parsing both request bodies;
//   BM_FilterPrioritizeHttp  plus two HTTP round trips over loopback (what kube-scheduler sees).
// Each runs with the default policy (binpack = best-fit) and, as /gpulet, with the pod choosing the
// gpulet policy (FGD's fragmentation measure: it tries every GPU of every node against the
// workload derived from the ~4000 booked pods, built once before timing).
// Every iteration's time is recorded; p50 and p99 (microseconds) are reported as counters.
// Run: build/bench/scheduler_extender_bench --benchmark_min_time=2
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "httplib.h"
#include "scheduler/extender.h"

namespace gpulet::scheduler {
namespace {

constexpr int kGpus = 8, kUnits = 318;

std::unique_ptr<Extender> MakeCluster(std::vector<std::string>* names, int nodes) {
  auto e = std::make_unique<Extender>(nullptr, ExtenderOptions{});
  std::mt19937 rng(42);
  for (int n = 0; n < nodes; ++n) {
    std::string name = "node-" + std::to_string(n);
    names->push_back(name);
    json list = json::array();
    for (int g = 0; g < kGpus; ++g) {
      list.push_back({{"uuid", name + "-GPU-" + std::to_string(g)}, {"memoryUnits", kUnits}});
    }
    e->UpsertNode(
        {{"metadata", {{"name", name}, {"annotations", {{"gpulet.io/vgpu-gpus", list.dump()}}}}}});
    // About half the GPUs carry one or two shares already.
    for (int g = 0; g < kGpus; ++g) {
      int shares = rng() % 3;
      int used = 0;
      for (int s = 0; s < shares; ++s) {
        int cores = 5 + rng() % 40;
        if (used + cores > 100) break;
        used += cores;
        std::string pod = name + "-" + std::to_string(g) + "-" + std::to_string(s);
        json limits = {{"tencent.com/vcuda-core", cores},
                       {"tencent.com/vcuda-memory", 1 + rng() % 80}};
        e->UpsertPod({{"metadata",
                       {{"name", pod},
                        {"namespace", "default"},
                        {"uid", pod},
                        {"annotations",
                         {{"gpulet.io/vgpu-node", name},
                          {"gpulet.io/vgpu-gpus-0", name + "-GPU-" + std::to_string(g)}}}}},
                      {"spec",
                       {{"nodeName", name},
                        {"containers",
                         json::array({{{"name", "c"}, {"resources", {{"limits", limits}}}}})}}}});
      }
    }
  }
  return e;
}

json SeedPod(const std::string& policy) {
  json annotations = json::object();
  if (policy != "binpack") annotations["gpulet.io/vgpu-policy"] = policy;
  return {
      {"metadata",
       {{"name", "seed"}, {"namespace", "default"}, {"uid", "seed"}, {"annotations", annotations}}},
      {"spec",
       {{"containers", json::array({{{"name", "cuda"},
                                     {"resources",
                                      {{"limits",
                                        {{"tencent.com/vcuda-core", "30"},
                                         {"tencent.com/vcuda-memory", "20"}}}}}}})}}}};
}

void Report(benchmark::State& state, std::vector<double>& us) {
  std::sort(us.begin(), us.end());
  if (us.empty()) return;
  state.counters["p50_us"] = us[us.size() / 2];
  state.counters["p99_us"] = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  state.counters["max_us"] = us.back();
}

// The prioritize request kube-scheduler sends after filter: the pod and the nodes that passed.
json PrioritizeArgs(Extender& e, const json& filter_args) {
  json f = json::parse(e.FilterWire(filter_args));
  return {{"Pod", filter_args["Pod"]}, {"NodeNames", f["NodeNames"]}, {"Nodes", nullptr}};
}

void BM_FilterPrioritize(benchmark::State& state, const char* policy) {
  std::vector<std::string> names;
  auto e = MakeCluster(&names, static_cast<int>(state.range(0)));
  e->RebuildWorkload();
  json args = {{"Pod", SeedPod(policy)}, {"NodeNames", names}, {"Nodes", nullptr}};
  json pargs = PrioritizeArgs(*e, args);
  std::vector<double> us;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    std::string f = e->FilterWire(args);
    std::string p = e->PrioritizeWire(pargs);
    benchmark::DoNotOptimize(f);
    benchmark::DoNotOptimize(p);
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  Report(state, us);
}
BENCHMARK_CAPTURE(BM_FilterPrioritize, binpack, "binpack")
    ->Unit(benchmark::kMicrosecond)
    ->Arg(1000)
    ->Arg(5000);
BENCHMARK_CAPTURE(BM_FilterPrioritize, gpulet, "gpulet")
    ->Unit(benchmark::kMicrosecond)
    ->Arg(1000)
    ->Arg(5000);

void BM_FilterPrioritizeJson(benchmark::State& state, const char* policy) {
  std::vector<std::string> names;
  auto e = MakeCluster(&names, static_cast<int>(state.range(0)));
  e->RebuildWorkload();
  json args = {{"Pod", SeedPod(policy)}, {"NodeNames", names}, {"Nodes", nullptr}};
  std::string body = args.dump();
  std::string pbody = PrioritizeArgs(*e, args).dump();
  std::vector<double> us;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    std::string f = e->FilterWire(json::parse(body));
    std::string p = e->PrioritizeWire(json::parse(pbody));
    benchmark::DoNotOptimize(f);
    benchmark::DoNotOptimize(p);
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  Report(state, us);
}
BENCHMARK_CAPTURE(BM_FilterPrioritizeJson, binpack, "binpack")
    ->Unit(benchmark::kMicrosecond)
    ->Arg(1000)
    ->Arg(5000);
BENCHMARK_CAPTURE(BM_FilterPrioritizeJson, gpulet, "gpulet")
    ->Unit(benchmark::kMicrosecond)
    ->Arg(1000)
    ->Arg(5000);

void BM_FilterPrioritizeHttp(benchmark::State& state, const char* policy) {
  std::vector<std::string> names;
  auto e = MakeCluster(&names, static_cast<int>(state.range(0)));
  e->RebuildWorkload();
  httplib::Server server;
  e->Register(server, "/scheduler");
  int port = server.bind_to_any_port("127.0.0.1");
  std::thread t([&] { server.listen_after_bind(); });
  while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  httplib::Client cli("127.0.0.1", port);
  cli.set_keep_alive(true);
  cli.set_tcp_nodelay(true);  // as Go's net/http client (kube-scheduler) does by default
  json args = {{"Pod", SeedPod(policy)}, {"NodeNames", names}, {"Nodes", nullptr}};
  std::string body = args.dump();
  // kube-scheduler builds the prioritize body from filter's answer; that is its cost, not ours.
  std::string pbody = PrioritizeArgs(*e, args).dump();
  std::vector<double> us;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    auto f = cli.Post("/scheduler/filter", body, "application/json");
    if (!f) {
      state.SkipWithError("filter request failed");
      break;
    }
    auto p = cli.Post("/scheduler/prioritize", pbody, "application/json");
    benchmark::DoNotOptimize(p);
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  server.stop();
  t.join();
  Report(state, us);
}
BENCHMARK_CAPTURE(BM_FilterPrioritizeHttp, binpack, "binpack")
    ->Unit(benchmark::kMicrosecond)
    ->Arg(1000)
    ->Arg(5000);
BENCHMARK_CAPTURE(BM_FilterPrioritizeHttp, gpulet, "gpulet")
    ->Unit(benchmark::kMicrosecond)
    ->Arg(1000)
    ->Arg(5000);

}  // namespace
}  // namespace gpulet::scheduler

BENCHMARK_MAIN();
