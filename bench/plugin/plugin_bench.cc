// Device-plugin latency and footprint.
//
//   build/bench/plugin_bench --profile=dgx-h100     (8 GPUs)
//   build/bench/plugin_bench --profile=dgx2-v100    (16 GPUs)
//
// Method: the simulated node is opened in-process through the production dlopen path (fake NVML);
// the resources are built exactly as the plugin builds them. Each iteration times one in-process
// Allocate or GetPreferredAllocation (handler work, no gRPC: a unix-socket round trip adds about
// 0.2 ms on these machines) with steady_clock; p50/p99 over all iterations are reported as
// counters (microseconds). BM_AgentRss starts `build/bin/gpulet agent --simulate <profile>`
// registered with the kubelet emulator, waits until its devices are allocatable plus one second,
// and reads VmRSS from /proc/<pid>/status; BM_FloorRss reads the same of a bare gRPC server, the
// floor that Debian's shared gRPC sets. One simulated machine per process (the fake NVML holds one
// node), hence --profile.
#include <benchmark/benchmark.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gpu/open.h"
#include "plugin/resources.h"
#include "testing/kubelet/emulator.h"

namespace gpulet {
namespace {

std::string g_profile = "dgx-h100";
std::string g_root;

struct Setup {
  std::unique_ptr<gpu::GpuLayer> layer;
  gpu::Inventory inv;
  std::unique_ptr<plugin::HealthMonitor> health;
  std::shared_ptr<kubelet::Resource> gpus;
  std::vector<std::string> ids;
};

Setup& Get() {
  static Setup* s = [] {
    auto* s = new Setup;
    gpu::GpuOptions o;
    o.simulate = g_profile;
    o.sim_root = g_root + "/sim";
    auto l = gpu::OpenGpuLayer(o);
    if (!l.ok()) {
      fprintf(stderr, "%s\n", std::string(l.status().message()).c_str());
      exit(1);
    }
    s->layer = std::move(*l);
    s->inv = *s->layer->GetInventory();
    plugin::Config cfg;
    cfg.health.unhealthy_devices_file = "";
    s->health = std::make_unique<plugin::HealthMonitor>(s->layer.get(), s->inv, cfg.health);
    auto rs = plugin::BuildResources(s->inv, cfg, s->health.get(), o.sim_root);
    s->gpus = (*rs)[0];
    for (const auto& d : s->gpus->Devices()) s->ids.push_back(d.id);
    return s;
  }();
  return *s;
}

void Percentiles(benchmark::State& state, std::vector<double>& us) {
  std::sort(us.begin(), us.end());
  state.counters["p50_us"] = us[us.size() / 2];
  state.counters["p99_us"] = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  state.SetLabel(g_profile);
}

// Allocate of `n` GPUs (envvar strategy), rotating over the node's GPUs.
void BM_Allocate(benchmark::State& state) {
  Setup& s = Get();
  const int n = state.range(0);
  std::vector<double> us;
  size_t k = 0;
  for (auto _ : state) {
    std::vector<std::string> req;
    for (int i = 0; i < n; ++i) req.push_back(s.ids[(k + i) % s.ids.size()]);
    ++k;
    auto t0 = std::chrono::steady_clock::now();
    auto r = s.gpus->Allocate(req);
    auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(r);
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  Percentiles(state, us);
}
BENCHMARK(BM_Allocate)->Arg(1)->Arg(4)->Arg(8);

// GetPreferredAllocation of `size` out of all GPUs (arg 1 = 0) or with every third GPU taken and
// one must-include (arg 1 = 1).
void BM_Preferred(benchmark::State& state) {
  Setup& s = Get();
  const int size = state.range(0);
  std::vector<std::string> avail, must;
  for (size_t i = 0; i < s.ids.size(); ++i)
    if (state.range(1) == 0 || i % 3 != 0) avail.push_back(s.ids[i]);
  if (state.range(1) == 1) must.push_back(avail.back());
  if (static_cast<size_t>(size) > avail.size()) {
    state.SkipWithError("size exceeds the available GPUs");
    return;
  }
  std::vector<double> us;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = s.gpus->Preferred(avail, must, size);
    auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(r);
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  Percentiles(state, us);
}
BENCHMARK(BM_Preferred)->ArgsProduct({{1, 2, 4, 8}, {0, 1}});

// Resident memory of `gpulet device-plugin` (arg 0) or `gpulet agent` (arg 1: device plugin,
// exporter, labels) serving the simulated node to the kubelet emulator. rss_mib = VmRSS,
// anon_mib = RssAnon (VmRSS less the pages of the binary and shared libraries).
void BM_AgentRss(benchmark::State& state) {
  const std::string bin =
      (std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() / "bin/gpulet")
          .string();
  const std::string dir = g_root + "/dp", sim = g_root + "/agent-sim";
  std::filesystem::create_directories(dir);
  for (auto _ : state) {
    emu::KubeletEmulator kubelet({.device_plugin_dir = dir});
    if (!kubelet.Start().ok()) return state.SkipWithError("emulator did not start");
    pid_t pid = fork();
    if (pid == 0) {
      const char* cmd = state.range(0) ? "agent" : "device-plugin";
      const std::string labels = g_root + "/features";
      if (state.range(0)) {
        execl(bin.c_str(), "gpulet", cmd, "--simulate", g_profile.c_str(), "--sim-root",
              sim.c_str(), "--device-plugin-dir", dir.c_str(), "--unhealthy-devices-file", "",
              "--metrics-address", "127.0.0.1:0", "--labels-output", labels.c_str(), nullptr);
      } else {
        execl(bin.c_str(), "gpulet", cmd, "--simulate", g_profile.c_str(), "--sim-root",
              sim.c_str(), "--device-plugin-dir", dir.c_str(), "--unhealthy-devices-file", "",
              nullptr);
      }
      _exit(127);
    }
    const bool up =
        kubelet.WaitForAllocatable("nvidia.com/gpu", Get().ids.size(), std::chrono::seconds(20))
            .ok();
    sleep(1);
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    double kib = 0, anon_kib = 0;
    while (std::getline(status, line)) {
      if (line.rfind("VmRSS:", 0) == 0) kib = std::stod(line.substr(6));
      if (line.rfind("RssAnon:", 0) == 0) anon_kib = std::stod(line.substr(8));
    }
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
    if (!up) return state.SkipWithError("agent did not register");
    state.counters["rss_mib"] = kib / 1024;
    state.counters["anon_mib"] = anon_kib / 1024;
  }
  state.SetLabel(g_profile + (state.range(0) ? " agent" : " device-plugin"));
}
BENCHMARK(BM_AgentRss)->Arg(0)->Arg(1)->Iterations(1)->Unit(benchmark::kMillisecond);

// The floor under rss_mib above: grpc_floor (a bare gRPC server on a unix socket, nothing else) and
// grpc_httplib_floor (the same, with cpp-httplib and so OpenSSL's initialisation loaded), read one
// second after start like the agent.
void BM_FloorRss(benchmark::State& state) {
  const std::string bin = (std::filesystem::read_symlink("/proc/self/exe").parent_path() /
                           (state.range(0) ? "grpc_httplib_floor" : "grpc_floor"))
                              .string();
  const std::string sock = g_root + "/floor.sock";
  for (auto _ : state) {
    pid_t pid = fork();
    if (pid == 0) {
      execl(bin.c_str(), bin.c_str(), sock.c_str(), nullptr);
      _exit(127);
    }
    sleep(1);
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    double kib = 0;
    while (std::getline(status, line))
      if (line.rfind("VmRSS:", 0) == 0) kib = std::stod(line.substr(6));
    kill(pid, SIGTERM);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFSIGNALED(st)) return state.SkipWithError("floor process did not run");
    state.counters["rss_mib"] = kib / 1024;
  }
  state.SetLabel(state.range(0) ? "gRPC server + cpp-httplib" : "bare gRPC server");
}
BENCHMARK(BM_FloorRss)->Arg(0)->Arg(1)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace gpulet

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--profile=", 0) == 0)
      gpulet::g_profile = a.substr(10);
    else
      rest.push_back(argv[i]);
  }
  char tmpl[] = "/tmp/dp-bench-XXXXXX";
  gpulet::g_root = mkdtemp(tmpl);
  int n = rest.size();
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::filesystem::remove_all(gpulet::g_root);
  return 0;
}
