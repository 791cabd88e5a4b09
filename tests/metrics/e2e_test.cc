// End-to-end: the real chain on a simulated dgx-h100. The kubelet emulator admits pods, allocating
// GPUs through `gpulet device-plugin` (a separate process, fake NVML via dlopen); `gpulet exporter`
// (another process, same simulated node) attributes GPUs through the emulator's PodResources
// socket; a real Prometheus scrapes it over loopback and answers PromQL over its HTTP API. Faults
// are injected into the running node through its control log, as `gpulet sim fault` does.
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "fake_nvml/control.h"
#include "fake_nvml/machine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "testing/kubelet/emulator.h"
#include "testing/metrics/expo_util.h"
#include "testing/process/spawn.h"

extern char** environ;

namespace gpulet::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

// A child process with its stdout in a file; SIGTERM + wait on destruction.
class Child {
 public:
  Child(std::vector<std::string> argv, const std::string& out_path)
      : pid_(testing_process::SpawnLogged(argv, out_path)), out_(out_path) {}
  ~Child() { Stop(); }
  void Stop() {
    testing_process::StopProcess(pid_);
    pid_ = -1;
  }
  bool alive() const { return pid_ > 0 && kill(pid_, 0) == 0; }
  std::string output() const { return testing_metrics::ReadFileOrEmpty(out_); }

 private:
  pid_t pid_ = -1;
  std::string out_;
};

int FreePort() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  close(s);
  return ntohs(a.sin_port);
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

template <typename F>
bool Eventually(F f, std::chrono::milliseconds timeout) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(100ms);
  }
  return f();
}

std::string Scrape(int port) {
  httplib::Client c("127.0.0.1", port);
  auto r = c.Get("/metrics");
  return r && r->status == 200 ? r->body : "";
}

// Only the lines of gpulet's own families (HELP/TYPE/samples of names starting gpulet_).
std::string OwnFamilies(const std::string& text) {
  std::string out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    absl::string_view name = line;
    if (absl::StartsWith(line, "# HELP ") || absl::StartsWith(line, "# TYPE "))
      name = line.substr(7);
    if (absl::StartsWith(name, "gpulet_")) absl::StrAppend(&out, line, "\n");
  }
  return out;
}

class MetricsE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    bin_ = std::string(GPULET_BINARY_DIR) + "/bin/gpulet";
    if (!std::filesystem::exists(bin_)) GTEST_SKIP() << "gpulet binary not built";
    if (!testing_metrics::HavePromtool() || system("command -v prometheus >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "prometheus/promtool not installed";
    }
    std::string tmpl = (std::filesystem::temp_directory_path() / "gpulet-e2e-XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    sim_ = dir_ + "/sim";
    std::filesystem::create_directories(dir_ + "/dp");
    std::filesystem::create_directories(dir_ + "/pod-resources");
    eo_.device_plugin_dir = dir_ + "/dp";
    eo_.pod_resources_socket = dir_ + "/pod-resources/kubelet.sock";
  }
  // `gpulet device-plugin` on the simulated node, registering with the emulator of eo_.
  std::vector<std::string> DevicePluginArgv() const {
    return {bin_, "device-plugin",       "--simulate",         "dgx-h100", "--sim-root",
            sim_, "--device-plugin-dir", eo_.device_plugin_dir};
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string bin_, dir_, sim_;
  emu::EmulatorOptions eo_;  // the kubelet emulator's sockets under dir_
};

// The Done-when chain: pods allocated by the kubelet emulator through the device plugin; the
// exporter's scrape is promtool-clean for gpulet's families; a real Prometheus scrapes it and a
// PromQL query returns GPU utilisation per pod, equal to the utilisation set on the pod's GPUs;
// NVML failing and the kubelet going away keep the exposition valid, and it recovers.
TEST_F(MetricsE2E, PrometheusGetsPerPodUtilizationFromEmulatedKubelet) {
  emu::KubeletEmulator kubelet(eo_);
  ASSERT_TRUE(kubelet.Start().ok());
  Child plugin(DevicePluginArgv(), dir_ + "/plugin.log");
  ASSERT_TRUE(kubelet.WaitForAllocatable("nvidia.com/gpu", 8, 30s).ok()) << plugin.output();

  // Two pods through the emulator's admission and the plugin's Allocate.
  auto pods = emu::ParsePods(R"(
apiVersion: v1
kind: Pod
metadata: {name: train-a, namespace: ml}
spec:
  containers:
  - name: trainer
    image: x
    resources: {limits: {nvidia.com/gpu: 2}}
---
apiVersion: v1
kind: Pod
metadata: {name: infer-b, namespace: serve}
spec:
  containers:
  - name: server
    image: x
    resources: {limits: {nvidia.com/gpu: 1}}
)",
                             "pods.yaml");
  ASSERT_TRUE(pods.ok()) << pods.status();
  std::map<std::string, std::vector<std::string>> pod_uuids;  // pod -> GPU UUIDs allocated
  for (const emu::PodSpec& p : *pods) {
    auto st = kubelet.AddPod(p);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_EQ(st->phase, emu::PodPhase::kRunning) << st->message;
    for (const auto& c : st->containers) {
      for (const auto& id : c.devices.at("nvidia.com/gpu")) pod_uuids[p.name].push_back(id);
    }
  }

  // Give every GPU a distinct utilisation through the simulated node's control log.
  auto machine = sim::LoadMachine("dgx-h100");
  ASSERT_TRUE(machine.ok());
  std::map<std::string, int> util_by_uuid;
  for (int i = 0; i < static_cast<int>(machine->gpus.size()); ++i) {
    sim::Fault f;
    f.kind = sim::Fault::Kind::kSet;
    f.gpu = i;
    f.values = {{"gpu_util_pct", 10 * (i + 1)}};
    util_by_uuid[machine->gpus[i].uuid] = 10 * (i + 1);
    ASSERT_TRUE(sim::InjectFault(sim_, f).ok());
  }
  std::map<std::string, double> expected;  // pod -> mean utilisation ratio of its GPUs
  for (const auto& [pod, uuids] : pod_uuids) {
    double sum = 0;
    for (const std::string& u : uuids) {
      ASSERT_TRUE(util_by_uuid.count(u)) << "allocated ID is not a GPU UUID: " << u;
      sum += util_by_uuid[u] / 100.0;
    }
    expected[pod] = sum / uuids.size();
  }

  Child exporter({bin_, "exporter", "--simulate", "dgx-h100", "--sim-root", sim_, "--address",
                  "127.0.0.1:0", "--interval", "500ms", "--pod-resources-interval", "1s",
                  "--pod-resources-socket", eo_.pod_resources_socket, "--vgpu-accounting-dir", ""},
                 dir_ + "/exporter.log");
  int port = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        std::string out = exporter.output();
        size_t p = out.find("listening on port ");
        if (p == std::string::npos) return false;
        port = std::atoi(out.c_str() + p + 18);
        return port > 0;
      },
      20s))
      << exporter.output();
  // The banner says which address it listens on and where to scrape, not only a port.
  EXPECT_THAT(exporter.output(), HasSubstr(absl::StrCat("listening on port ", port,
                                                        " of 127.0.0.1: http://127.0.0.1:", port,
                                                        "/metrics and /health")));

  // promtool: gpulet's own families have no findings; everything parses.
  std::string scrape;
  ASSERT_TRUE(Eventually(
      [&] {
        scrape = Scrape(port);
        return absl::StrContains(scrape, "pod=\"train-a\"");
      },
      15s))
      << scrape.substr(0, 2000) << exporter.output();
  auto own = testing_metrics::PromtoolCheckMetrics(OwnFamilies(scrape));
  EXPECT_EQ(own.rc, 0) << own.output;
  EXPECT_EQ(own.output, "");
  auto all = testing_metrics::PromtoolCheckMetrics(scrape);
  EXPECT_NE(all.rc, 1) << all.output;  // parses; findings only for DCGM's upper-case names
  for (absl::string_view line : absl::StrSplit(all.output, '\n', absl::SkipEmpty())) {
    EXPECT_FALSE(absl::StartsWith(line, "gpulet_")) << line;
  }

  // A real Prometheus scrapes the exporter on loopback.
  int prom_port = FreePort();
  {
    std::ofstream cfg(dir_ + "/prometheus.yml");
    cfg << "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
           "scrape_configs:\n  - job_name: gpulet-metrics\n    static_configs:\n"
           "      - targets: ['127.0.0.1:"
        << port << "']\n";
  }
  Child prometheus({"/usr/bin/prometheus", "--config.file=" + dir_ + "/prometheus.yml",
                    "--storage.tsdb.path=" + dir_ + "/tsdb",
                    absl::StrCat("--web.listen-address=127.0.0.1:", prom_port)},
                   dir_ + "/prometheus.log");
  httplib::Client prom("127.0.0.1", prom_port);
  auto query = [&](const std::string& q) -> nlohmann::json {
    auto r = prom.Get("/api/v1/query?query=" + UrlEncode(q));
    if (!r || r->status != 200) return nlohmann::json();
    return nlohmann::json::parse(r->body, nullptr, false);
  };
  const std::string by_pod =
      "avg by (namespace, pod) (gpulet_gpu_utilization_ratio * on (instance, uuid) group_right "
      "gpulet_container_gpu_info)";
  nlohmann::json result;
  ASSERT_TRUE(Eventually(
      [&] {
        result = query(by_pod);
        return result.is_object() && result["data"]["result"].size() == 2;
      },
      40s))
      << result.dump() << prometheus.output().substr(0, 3000);
  for (const auto& series : result["data"]["result"]) {
    std::string pod = series["metric"]["pod"];
    double v = std::stod(series["value"][1].get<std::string>());
    EXPECT_NEAR(v, expected.at(pod), 1e-9) << pod;
    EXPECT_EQ(series["metric"]["namespace"], pod == "train-a" ? "ml" : "serve");
  }
  // The DCGM dashboards' way: DCGM_FI_DEV_GPU_UTIL carries the pod labels itself.
  auto dcgm = query("avg by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{pod!=\"\"})");
  ASSERT_EQ(dcgm["data"]["result"].size(), 2u) << dcgm.dump();
  for (const auto& series : dcgm["data"]["result"]) {
    std::string pod = series["metric"]["pod"];
    EXPECT_NEAR(std::stod(series["value"][1].get<std::string>()), 100 * expected.at(pod), 1e-9);
  }
  // Every expression of the Grafana dashboard evaluates against the live data.
  auto dash = nlohmann::json::parse(testing_metrics::ReadFileOrEmpty(
      std::string(GPULET_SOURCE_DIR) + "/deploy/monitoring/dashboards/gpulet-gpu.json"));
  int evaluated = 0;
  for (const auto& panel : dash["panels"]) {
    if (!panel.contains("targets")) continue;
    for (const auto& t : panel["targets"]) {
      std::string e = t["expr"];
      for (const char* v : {"$node", "$gpu", "$namespace", "$pod"}) {
        for (size_t p; (p = e.find(v)) != std::string::npos;) e.replace(p, strlen(v), ".*");
      }
      auto r = query(e);
      EXPECT_EQ(r.value("status", ""), "success") << panel["title"] << ": " << e << r.dump();
      ++evaluated;
    }
  }
  EXPECT_GT(evaluated, 20);

  // Fault: NVML fails mid-run -> nvml_up 0, exposition still valid; then it recovers.
  sim::Fault fail;
  fail.kind = sim::Fault::Kind::kNvmlFail;
  ASSERT_TRUE(sim::InjectFault(sim_, fail).ok());
  ASSERT_TRUE(Eventually(
      [&] { return absl::StrContains(Scrape(port), "gpulet_exporter_nvml_up 0"); }, 10s));
  std::string degraded = Scrape(port);
  EXPECT_NE(testing_metrics::PromtoolCheckMetrics(degraded).rc, 1);
  EXPECT_THAT(degraded, Not(HasSubstr("gpulet_gpu_utilization_ratio{")));
  sim::Fault ok;
  ok.kind = sim::Fault::Kind::kNvmlOk;
  ASSERT_TRUE(sim::InjectFault(sim_, ok).ok());
  EXPECT_TRUE(Eventually(
      [&] { return absl::StrContains(Scrape(port), "gpulet_exporter_nvml_up 1"); }, 10s));

  // Fault: the kubelet goes away -> kubelet_up 0, attribution kept, still valid.
  kubelet.Stop();
  ASSERT_TRUE(Eventually(
      [&] { return absl::StrContains(Scrape(port), "gpulet_exporter_kubelet_up 0"); }, 10s));
  std::string no_kubelet = Scrape(port);
  EXPECT_THAT(no_kubelet, HasSubstr("pod=\"train-a\""));
  EXPECT_EQ(testing_metrics::PromtoolCheckMetrics(OwnFamilies(no_kubelet)).rc, 0);
  EXPECT_TRUE(exporter.alive());
}

// The port a child printed after `marker` ("listening on port ", "metrics: http://127.0.0.1:").
int PortAfter(const Child& child, const std::string& marker) {
  int port = 0;
  Eventually(
      [&] {
        std::string out = child.output();
        size_t p = out.find(marker);
        if (p != std::string::npos) port = std::atoi(out.c_str() + p + marker.size());
        return port > 0;
      },
      20s);
  return port;
}

std::string HealthySample(const std::string& scrape, int gpu, const std::string& uuid) {
  std::string key = absl::StrCat("gpulet_gpu_healthy{gpu=\"", gpu, "\",uuid=\"", uuid, "\"} ");
  size_t p = scrape.find(key);
  return p == std::string::npos ? "" : scrape.substr(p + key.size(), 1);
}

// dcgm-exporter resolves pods at each scrape; so does gpulet's: with the sampling and the
// PodResources timers at one hour and no checkpoint to watch, the first scrape after a pod's
// GPUs are allocated carries its labels (it took up to both timers, 20 s by default).
TEST_F(MetricsE2E, ExporterAttributesANewPodAtTheFirstScrape) {
  emu::KubeletEmulator kubelet(eo_);
  ASSERT_TRUE(kubelet.Start().ok());
  Child plugin(DevicePluginArgv(), dir_ + "/plugin.log");
  ASSERT_TRUE(kubelet.WaitForAllocatable("nvidia.com/gpu", 8, 30s).ok()) << plugin.output();
  Child exporter(
      {bin_, "exporter", "--simulate", "dgx-h100", "--sim-root", sim_, "--address", "127.0.0.1:0",
       "--interval", "1h", "--pod-resources-interval", "1h", "--pod-resources-socket",
       eo_.pod_resources_socket, "--kubelet-checkpoint", "", "--vgpu-accounting-dir", ""},
      dir_ + "/exporter.log");
  const int port = PortAfter(exporter, "listening on port ");
  ASSERT_GT(port, 0) << exporter.output();
  std::string before = Scrape(port);
  ASSERT_THAT(before, HasSubstr("gpulet_exporter_kubelet_up 1")) << before.substr(0, 2000);
  EXPECT_THAT(before, Not(HasSubstr("pod=\"late\"")));

  auto pods = emu::ParsePods(R"(
apiVersion: v1
kind: Pod
metadata: {name: late, namespace: ml}
spec:
  containers:
  - name: main
    image: x
    resources: {limits: {nvidia.com/gpu: 1}}
)",
                             "late.yaml");
  ASSERT_TRUE(pods.ok()) << pods.status();
  auto st = kubelet.AddPod(pods->at(0));
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->phase, emu::PodPhase::kRunning) << st->message;
  std::this_thread::sleep_for(1100ms);  // past the one-List-per-second gap the first scrape took
  std::string after = Scrape(port);
  EXPECT_THAT(after, HasSubstr("DCGM_FI_DEV_GPU_UTIL{"));
  EXPECT_THAT(after, HasSubstr("pod=\"late\"")) << "the first scrape after the allocation";
  EXPECT_TRUE(absl::StrContains(after, "namespace=\"ml\",pod=\"late\",container=\"main\""))
      << after.substr(0, 3000);
}

// One health truth: an XID the device plugin treats as fatal (79, fallen off the bus) turns
// gpulet_gpu_healthy to 0 although the GPU still answers NVML, in the agent (the plugin's own
// monitor) and in `gpulet exporter` alone (a monitor of its own under the same rules); an
// application's XID (13) leaves it at 1. The exporter said 1 for both.
TEST_F(MetricsE2E, HealthIsTheDevicePluginsInTheAgentAndAlone) {
  auto machine = sim::LoadMachine("dgx-h100");
  ASSERT_TRUE(machine.ok());
  const std::string gpu1 = machine->gpus[1].uuid, gpu3 = machine->gpus[3].uuid;
  auto check = [&](const Child& child, int port, const std::string& root) {
    ASSERT_GT(port, 0) << child.output();
    std::string scrape;
    ASSERT_TRUE(Eventually(
        [&] {
          scrape = Scrape(port);
          return HealthySample(scrape, 3, gpu3) == "1" && HealthySample(scrape, 1, gpu1) == "1";
        },
        20s))
        << scrape.substr(0, 2000) << child.output();
    for (auto [gpu, code] : {std::pair{1, 13}, std::pair{3, 79}}) {
      sim::Fault f;
      f.kind = sim::Fault::Kind::kXid;
      f.gpu = gpu;
      f.code = code;
      ASSERT_TRUE(sim::InjectFault(root, f).ok());
    }
    ASSERT_TRUE(Eventually(
        [&] {
          scrape = Scrape(port);
          return HealthySample(scrape, 3, gpu3) == "0" &&
                 absl::StrContains(scrape,
                                   "gpulet_gpu_xid_last_code{gpu=\"1\",uuid=\"" + gpu1 + "\"} 13");
        },
        20s))
        << scrape.substr(0, 3000) << child.output();
    EXPECT_EQ(HealthySample(scrape, 1, gpu1), "1") << "an application's XID";
    EXPECT_THAT(scrape, HasSubstr("gpulet_gpu_temperature_celsius{gpu=\"3\""))
        << "it still answers NVML";
  };

  {
    Child exporter(
        {bin_, "exporter", "--simulate", "dgx-h100", "--sim-root", sim_, "--address", "127.0.0.1:0",
         "--interval", "200ms", "--pod-resources-socket", "", "--vgpu-accounting-dir", ""},
        dir_ + "/exporter.log");
    check(exporter, PortAfter(exporter, "listening on port "), sim_);
  }

  emu::KubeletEmulator kubelet(eo_);
  ASSERT_TRUE(kubelet.Start().ok());
  const std::string sim2 = dir_ + "/sim2";
  Child agent({bin_, "agent", "--simulate", "dgx-h100", "--sim-root", sim2, "--device-plugin-dir",
               eo_.device_plugin_dir, "--pod-resources-socket", eo_.pod_resources_socket,
               "--metrics-address", "127.0.0.1:0", "--metrics-interval", "200ms", "--labels-output",
               dir_ + "/features"},
              dir_ + "/agent.log");
  ASSERT_TRUE(kubelet.WaitForAllocatable("nvidia.com/gpu", 8, 30s).ok()) << agent.output();
  check(agent, PortAfter(agent, "metrics: http://127.0.0.1:"), sim2);
  EXPECT_TRUE(kubelet.WaitForAllocatable("nvidia.com/gpu", 7, 10s).ok())
      << "the plugin withdrew GPU 3 as the exporter says";
}

// The labels command writes the GFD label set of dgx-h100 atomically, once.
TEST_F(MetricsE2E, LabelsOneshotOnSimulatedNode) {
  std::string out = dir_ + "/features.d/gpulet";
  auto r = testing_metrics::RunCommand(bin_ + " labels --oneshot --simulate dgx-h100 --sim-root " +
                                       sim_ + " --output " + out + " --machine-type-file ''");
  ASSERT_EQ(r.rc, 0) << r.output;
  std::string text = testing_metrics::ReadFileOrEmpty(out);
  EXPECT_THAT(text, HasSubstr("nvidia.com/gpu.count=8\n"));
  EXPECT_THAT(text, HasSubstr("nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3\n"));
  EXPECT_THAT(text, HasSubstr("nvidia.com/gpu.family=hopper\n"));
  EXPECT_THAT(text, HasSubstr("nvidia.com/gfd.timestamp="));
  auto bad = testing_metrics::RunCommand(bin_ +
                                         " labels --oneshot --simulate dgx-h100 "
                                         "--mig-strategy dual --output " +
                                         out);
  EXPECT_EQ(bad.rc, 2);
  EXPECT_THAT(bad.output, HasSubstr("--mig-strategy 'dual'"));
}

// Bad exporter flags are one clear error each, before anything starts.
TEST_F(MetricsE2E, ExporterRejectsBadFlags) {
  auto r =
      testing_metrics::RunCommand(bin_ + " exporter --simulate dgx-h100 --families gpulet,dcmg");
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.output, HasSubstr("unknown family set 'dcmg'"));
  r = testing_metrics::RunCommand(bin_ + " exporter --simulate dgx-h100 --interval soon");
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.output, HasSubstr("--interval \"soon\": expected a duration like 10s"));
  r = testing_metrics::RunCommand(bin_ + " exporter --simulate dgx-h100 --address 9400");
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.output, HasSubstr("listen address '9400'"));
}

}  // namespace
}  // namespace gpulet::metrics
