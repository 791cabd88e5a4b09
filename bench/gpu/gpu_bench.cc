// GPU-layer costs on a simulated node (the fake NVML through the real dlopen backend):
//   BM_GetTelemetry   one full telemetry sample of one GPU (~25 NVML calls)
//   BM_GetInventory   a copy of the cached inventory (what every consumer reads)
//   BM_OpenLayer      dlopen + nvmlInit + inventory + topology (the startup cost), per profile
//   BM_XidToSubscriber  fault written to the control log -> Event in a subscriber callback
// Method: build/bin/gpu_bench --benchmark_min_time=1 ; numbers include the fake's own costs (one
// stat() of the control log per call), so they bound what the layer adds on top of NVML.
#include <condition_variable>
#include <filesystem>
#include <mutex>

#include "benchmark/benchmark.h"
#include "fake_nvml/control.h"
#include "gpu/open.h"

namespace gpulet::gpu {
namespace {

struct Node {
  std::string root;
  std::unique_ptr<GpuLayer> layer;
  explicit Node(const std::string& profile) {
    char tmpl[] = "/tmp/gpulet-bench-XXXXXX";
    root = mkdtemp(tmpl);
    GpuOptions o;
    o.simulate = profile;
    o.sim_root = root;
    layer = *OpenGpuLayer(o);
  }
  ~Node() {
    layer.reset();
    std::filesystem::remove_all(root);
  }
};

void BM_GetTelemetry(benchmark::State& state) {
  Node n("dgx-h100");
  for (auto _ : state) benchmark::DoNotOptimize(n.layer->GetTelemetry(3));
}
BENCHMARK(BM_GetTelemetry);

void BM_GetInventory(benchmark::State& state) {
  Node n("dgx2-v100");
  for (auto _ : state) benchmark::DoNotOptimize(n.layer->GetInventory());
}
BENCHMARK(BM_GetInventory);

void BM_OpenLayer(benchmark::State& state, const char* profile) {
  for (auto _ : state) Node n(profile);
}
BENCHMARK_CAPTURE(BM_OpenLayer, dgx_h100, "dgx-h100")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_OpenLayer, dgx2_v100, "dgx2-v100")->Unit(benchmark::kMillisecond);

void BM_XidToSubscriber(benchmark::State& state) {
  Node n("dgx-h100");
  std::mutex mu;
  std::condition_variable cv;
  int seen = 0;
  auto sub = n.layer->Subscribe([&](const Event&) {
    std::lock_guard<std::mutex> l(mu);
    ++seen;
    cv.notify_all();
  });
  sim::Fault f;
  f.kind = sim::Fault::Kind::kXid;
  f.gpu = 1;
  f.code = 79;
  int want = 0;
  for (auto _ : state) {
    ++want;
    if (!sim::InjectFault(n.root, f).ok()) state.SkipWithError("inject failed");
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return seen >= want; });
  }
}
BENCHMARK(BM_XidToSubscriber)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace gpulet::gpu

BENCHMARK_MAIN();
