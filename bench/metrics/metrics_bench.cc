// Exporter benchmarks for 8 GPUs x 128 containers (16 pods per GPU through time-slicing replica
// IDs, default families gpulet + dcgm).
//
// Method:
//  * BM_ScrapeProcess: starts the real `gpulet exporter --simulate dgx-h100` (fake NVML through
//    dlopen) with an in-process PodResources server listing 128 containers, then times GET
//    /metrics over loopback with a keep-alive client, one scrape per iteration. p50/p99 are
//    computed from every iteration's latency; rss_mib / hwm_mib are the exporter process's VmRSS /
//    VmHWM (/proc/<pid>/status) after the scrapes, anon_mib its RssAnon (VmRSS less the pages of
//    the binary and shared libraries); body_kib the response size on the wire.
//    Arg 0: "Accept-Encoding: identity" (curl); arg 1: "Accept-Encoding: gzip" as Prometheus sends
//    it (the client does not decompress, so the figure is the exporter's side alone).
//  * BM_SampleCycle: one sampling cycle (read 8 GPUs, attribute 128 containers, render text and
//    OpenMetrics) in-process; Google Benchmark's CPU time column is the CPU time per cycle.
//    _SimulatedNvml reads the fake libnvidia-ml.so.1 through the production dlopen layer;
//    _InProcessLayer uses a C++ fake GpuLayer (rendering cost alone); _GzipOpenMetrics adds the
//    per-cycle compression a Prometheus scraper (OpenMetrics + gzip) causes.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "gpu/open.h"
#include "metrics/sampler.h"
#include "tests/metrics/fake_gpu.h"
#include "tests/metrics/pod_server.h"

extern char** environ;

namespace gpulet::metrics {
namespace {

constexpr int kGpus = 8, kContainers = 128;

// dgx-h100's UUIDs come from the GPU layer; containers are spread 16 per GPU as replicas.
std::vector<testing_metrics::FakeContainer> Containers(const std::vector<std::string>& uuids) {
  std::vector<testing_metrics::FakeContainer> out;
  for (int i = 0; i < kContainers; ++i) {
    out.push_back({absl::StrCat("team-", i % 7), absl::StrCat("job-", i, "-7f9c4d-abcde"),
                   "worker", "nvidia.com/gpu",
                   {absl::StrCat(uuids[i % uuids.size()], "::", i / uuids.size())}});
  }
  return out;
}

double StatusField(pid_t pid, const char* field) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field, 0) == 0) return std::atof(line.c_str() + strlen(field)) / 1024.0;
  }
  return 0;
}

void BM_ScrapeProcess(benchmark::State& state) {
  std::string bin = std::string(GPULET_BINARY_DIR) + "/bin/gpulet";
  std::string tmpl = (std::filesystem::temp_directory_path() / "gpulet-bench-XXXXXX").string();
  std::string dir = mkdtemp(tmpl.data());
  gpu::GpuOptions go;
  go.simulate = "dgx-h100";
  auto layer = gpu::OpenGpuLayer(go);
  if (!layer.ok()) {
    state.SkipWithError("cannot open the simulated dgx-h100 (fake NVML not built?)");
    return;
  }
  std::vector<std::string> uuids;
  gpu::Inventory inv = *(*layer)->GetInventory();
  for (const auto& d : inv.devices) uuids.push_back(d.uuid);
  testing_metrics::PodResourcesServer pods(dir + "/kubelet.sock");
  pods.Set(Containers(uuids));
  pods.Start();

  std::string log = dir + "/exporter.log";
  std::vector<std::string> argv = {bin, "exporter", "--simulate", "dgx-h100", "--address",
                                   "127.0.0.1:0", "--pod-resources-socket", dir + "/kubelet.sock",
                                   "--vgpu-accounting-dir", "", "--interval", "1s"};
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  posix_spawn(&pid, bin.c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  int port = 0;
  for (int i = 0; i < 200 && port == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream f(log);
    std::string s((std::istreambuf_iterator<char>(f)), {});
    if (size_t p = s.find("listening on port "); p != std::string::npos) {
      port = std::atoi(s.c_str() + p + 18);
    }
  }
  httplib::Client c("127.0.0.1", port);
  c.set_keep_alive(true);
  c.set_decompress(false);
  // Wait until attribution is in the snapshot (first PodResources answer).
  const httplib::Headers identity = {{"Accept-Encoding", "identity"}};
  for (int i = 0; i < 100; ++i) {
    auto r = c.Get("/metrics", identity);
    if (r && r->body.find("job-127-") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const httplib::Headers headers = {
      {"Accept-Encoding", state.range(0) ? "gzip" : "identity"}};
  if (state.range(0)) {
    // The exporter compresses a format from the cycle after its first gzip scrape on.
    c.Get("/metrics", headers);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  }
  std::vector<double> lat;
  size_t body = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = c.Get("/metrics", headers);
    auto t1 = std::chrono::steady_clock::now();
    if (!r || r->status != 200) {
      state.SkipWithError("scrape failed");
      break;
    }
    body = r->body.size();
    lat.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  if (!lat.empty()) {
    std::sort(lat.begin(), lat.end());
    state.counters["p50_ms"] = lat[lat.size() / 2];
    state.counters["p99_ms"] = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
    state.counters["body_kib"] = body / 1024.0;
    state.counters["rss_mib"] = StatusField(pid, "VmRSS:");
    state.counters["hwm_mib"] = StatusField(pid, "VmHWM:");
    // VmRSS = RssAnon (the process's own memory) + RssFile (shared library and binary pages).
    state.counters["anon_mib"] = StatusField(pid, "RssAnon:");
  }
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  pods.Stop();
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_ScrapeProcess)->Arg(0)->Arg(1)->Iterations(2000)->Unit(benchmark::kMillisecond)->UseRealTime();

// A fixed 128-container attribution, no kubelet round trips (the cache is filled once).
class FixedLister : public kubelet::PodResourcesLister {
 public:
  explicit FixedLister(std::vector<kubelet::PodDevice> d) : d_(std::move(d)) {}
  absl::StatusOr<std::vector<kubelet::PodDevice>> List() override { return d_; }
  std::vector<kubelet::PodDevice> d_;
};

void SampleCycle(benchmark::State& state, gpu::GpuLayer* layer, bool gzip = false) {
  std::vector<kubelet::PodDevice> devs;
  std::vector<std::string> uuids;
  gpu::Inventory inv = *layer->GetInventory();
  for (const auto& d : inv.devices) uuids.push_back(d.uuid);
  for (const auto& c : Containers(uuids)) devs.push_back({c.ns, c.pod, c.container, c.resource, c.ids[0]});
  kubelet::PodResourcesCache cache(std::make_unique<FixedLister>(devs), std::chrono::hours(1));
  cache.RefreshNow();
  SamplerOptions so;
  so.hostname = "dgx-node-01";
  Sampler sampler(layer, nullptr, &cache, nullptr, nullptr, so);
  // As under Prometheus: OpenMetrics scraped with gzip, so each cycle also compresses that body.
  if (gzip) sampler.NoteRequest(Format::kOpenMetrics, true);
  for (auto _ : state) sampler.SampleOnce();
  auto snap = sampler.snapshot();
  state.counters[gzip ? "openmetrics_gz_kib" : "text_kib"] =
      (gzip ? snap->openmetrics_gz.data.size() : snap->text.size()) / 1024.0;
}

void BM_SampleCycle_SimulatedNvml(benchmark::State& state) {
  gpu::GpuOptions go;
  go.simulate = "dgx-h100";
  auto layer = gpu::OpenGpuLayer(go);
  if (!layer.ok()) {
    state.SkipWithError("cannot open the simulated dgx-h100");
    return;
  }
  SampleCycle(state, layer->get());
}
BENCHMARK(BM_SampleCycle_SimulatedNvml)->Unit(benchmark::kMicrosecond);

void BM_SampleCycle_InProcessLayer(benchmark::State& state) {
  testing_metrics::FakeGpuLayer g(kGpus);
  SampleCycle(state, &g);
}
BENCHMARK(BM_SampleCycle_InProcessLayer)->Unit(benchmark::kMicrosecond);

void BM_SampleCycle_InProcessLayer_GzipOpenMetrics(benchmark::State& state) {
  testing_metrics::FakeGpuLayer g(kGpus);
  SampleCycle(state, &g, /*gzip=*/true);
}
BENCHMARK(BM_SampleCycle_InProcessLayer_GzipOpenMetrics)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace gpulet::metrics

BENCHMARK_MAIN();
