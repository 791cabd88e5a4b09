// Unit tests of the metrics exporter: exposition, family rendering, attribution, sampler faults,
// HTTP. Expected values come from the formats' specifications and the reference samples, never
// from the code under test.
#include <httplib.h>
#include <sys/stat.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <thread>

#include "abi/vgpu_accounting.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kubelet/podresources_client.h"
#include "metrics/exporter.h"
#include "metrics/exposition.h"
#include "metrics/render.h"
#include "metrics/sampler.h"
#include "metrics/server.h"
#include "testing/common/fake_clock.h"
#include "testing/gpu/fake_gpu.h"
#include "testing/metrics/expo_util.h"
#include "testing/metrics/pod_server.h"
#include "testing/metrics/sample.h"

namespace gpulet::metrics {
namespace {

using testing::FakeGpuLayer;
using ::testing::HasSubstr;
using ::testing::Not;
using testing_metrics::FakeContainer;
using testing_metrics::PodResourcesServer;
using testing_metrics::SampleOf;

std::string TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "gpulet-metrics-XXXXXX").string();
  return mkdtemp(tmpl.data());
}

// A lister returning a fixed answer or an error, for cache and sampler tests.
class StaticLister : public kubelet::PodResourcesLister {
 public:
  explicit StaticLister(std::vector<kubelet::PodDevice> d) : devices_(std::move(d)) {}
  absl::StatusOr<std::vector<kubelet::PodDevice>> List() override {
    if (fail_) return absl::UnavailableError("kubelet socket gone");
    return devices_;
  }
  std::atomic<bool> fail_{false};
  std::vector<kubelet::PodDevice> devices_;
};

// --- exposition -------------------------------------------------------------------------------

// Label values escape backslash, quote and newline (exposition_formats.md) and never carry invalid
// UTF-8, which Prometheus rejects.
TEST(Exposition, EscapesLabelValues) {
  std::string out;
  AppendEscapedLabelValue(&out, "a\\b\"c\nd");
  EXPECT_EQ(out, "a\\\\b\\\"c\\nd");
  out.clear();
  AppendEscapedLabelValue(&out, "p\xC3\xA9 \xF0\x9F\x98\x80");  // é, emoji: valid, kept
  EXPECT_EQ(out, "p\xC3\xA9 \xF0\x9F\x98\x80");
  out.clear();
  AppendEscapedLabelValue(&out, "x\xFFy\xC3");  // stray byte, truncated sequence
  EXPECT_EQ(out, "x\xEF\xBF\xBDy\xEF\xBF\xBD");
  out.clear();
  AppendEscapedLabelValue(&out, "\xED\xA0\x80");  // UTF-16 surrogate encoded: invalid UTF-8
  EXPECT_EQ(out, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

// Values: integers exactly (energy counters exceed 2^32), shortest round-trip doubles, and the
// special spellings of both formats.
TEST(Exposition, FormatsValues) {
  auto v = [](double d) {
    std::string s;
    AppendValue(&s, d);
    return s;
  };
  EXPECT_EQ(v(55491669881), "55491669881");
  EXPECT_EQ(v(0.37), "0.37");
  EXPECT_EQ(v(-2), "-2");
  EXPECT_EQ(v(1.98e9), "1980000000");
  EXPECT_EQ(v(std::nan("")), "NaN");
  EXPECT_EQ(v(1.0 / 0.0), "+Inf");
  EXPECT_EQ(v(-1.0 / 0.0), "-Inf");
}

// OpenMetrics declares counter `x_total` as family `x`, a counter without the suffix as unknown,
// and ends with # EOF; the text format keeps names as they are.
TEST(Exposition, OpenMetricsCounterNaming) {
  std::string om, text;
  for (auto [f, out] : {std::pair{Format::kOpenMetrics, &om}, std::pair{Format::kText, &text}}) {
    ExpositionWriter w(f, out);
    w.Family("a_errors_total", MetricType::kCounter, "Help with \"quotes\" and \\.");
    w.Sample({{"l", "v"}}, 1);
    w.Family("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", MetricType::kCounter, "h");
    w.Sample({}, 2);
    w.Finish();
  }
  EXPECT_EQ(om,
            "# HELP a_errors Help with \\\"quotes\\\" and \\\\.\n# TYPE a_errors counter\n"
            "a_errors_total{l=\"v\"} 1\n# HELP DCGM_FI_DEV_PCIE_REPLAY_COUNTER h\n"
            "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER unknown\nDCGM_FI_DEV_PCIE_REPLAY_COUNTER 2\n"
            "# EOF\n");
  EXPECT_EQ(text,
            "# HELP a_errors_total Help with \"quotes\" and \\\\.\n# TYPE a_errors_total counter\n"
            "a_errors_total{l=\"v\"} 1\n# HELP DCGM_FI_DEV_PCIE_REPLAY_COUNTER h\n"
            "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\nDCGM_FI_DEV_PCIE_REPLAY_COUNTER 2\n");
}

// The Accept header Prometheus 2.x sends selects OpenMetrics; curl's */* gets the text format.
TEST(Exposition, NegotiatesFormat) {
  EXPECT_TRUE(WantsOpenMetrics(
      "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
      "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"));
  EXPECT_FALSE(WantsOpenMetrics("*/*"));
  EXPECT_FALSE(WantsOpenMetrics("text/plain;version=0.0.4"));
}

// --- rendering --------------------------------------------------------------------------------

std::vector<ContainerDevice> PodsOn(const Sample& s, int per_gpu) {
  std::vector<ContainerDevice> c;
  for (size_t i = 0; i < s.devices.size(); ++i) {
    for (int k = 0; k < per_gpu; ++k) {
      c.push_back({"ml", absl::StrCat("train-", i, "-", k), "main", "nvidia.com/gpu",
                   absl::StrCat(s.devices[i].device.uuid, "::", k), i, -1});
    }
  }
  return c;
}

// gpulet's own families obey Prometheus naming rules: promtool check metrics reports nothing.
TEST(Render, OwnFamiliesPassPromtoolLint) {
  if (!testing_metrics::HavePromtool()) GTEST_SKIP() << "promtool not installed";
  FakeGpuLayer g(8, /*mig_on_last=*/true);
  Sample s = SampleOf(g);
  s.containers = PodsOn(s, 2);
  s.devices[0].xid_counts[79] = 2;
  s.devices[0].xid_last = 79;
  s.vgpu.push_back({"ml", "vgpu-pod", "c", 1, 2ull << 30, 4ull << 30, 0.25, 0.3});
  s.self.kubelet_enabled = s.self.vgpu_enabled = true;
  s.self.bare_pods_reported = 2;
  std::string text;
  Render(s, RenderOptions{kGpuletFamilies, true}, Format::kText, &text);
  auto r = testing_metrics::PromtoolCheckMetrics(text);
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_EQ(r.output, "");
  EXPECT_THAT(text, HasSubstr("\ngpulet_node_bare_pods_rejected_total 2\n"));
  EXPECT_THAT(text, HasSubstr("gpulet_gpu_utilization_ratio{gpu=\"0\",uuid=\""));
  EXPECT_THAT(text, HasSubstr("gpulet_vgpu_container_memory_limit_bytes{namespace=\"ml\""));
}

// The DCGM-compatible families carry the family names, types and label names of the reference
// sample (dcgm-exporter's default counters and render template).
TEST(Render, DcgmFamiliesMatchReferenceSample) {
  const std::string path = std::string(GPULET_SOURCE_DIR) + "/tests/metrics/data/dcgm_sample.prom";
  std::string sample = testing_metrics::ReadFileOrEmpty(path);
  ASSERT_FALSE(sample.empty()) << "the reference sample is part of the tree: " << path;
  FakeGpuLayer g(2);
  Sample s = SampleOf(g);
  s.containers = PodsOn(s, 1);
  std::string text;
  Render(s, RenderOptions{kDcgmFamilies, true}, Format::kText, &text);
  auto ref = testing_metrics::ReadShapes(sample);
  auto ours = testing_metrics::ReadShapes(text);
  // Labels dcgm-exporter adds on some series only (label-type fields, pod attribution, MIG).
  const std::set<std::string> optional = {"DCGM_FI_DRIVER_VERSION", "container", "namespace", "pod",
                                          "GPU_I_PROFILE",          "GPU_I_ID"};
  int compared = 0;
  for (const auto& [name, shape] : ref) {
    ASSERT_TRUE(ours.count(name)) << name << " missing";
    EXPECT_EQ(ours[name].type, shape.type) << name;
    for (const std::string& l : shape.labels) EXPECT_TRUE(ours[name].labels.count(l)) << name << l;
    for (const std::string& l : ours[name].labels) {
      EXPECT_TRUE(shape.labels.count(l) || optional.count(l)) << name << " extra label " << l;
    }
    ++compared;
  }
  EXPECT_EQ(compared, 6);
  EXPECT_THAT(text, HasSubstr("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-"));
  EXPECT_THAT(text, HasSubstr(",Hostname=\"node1\",DCGM_FI_DRIVER_VERSION=\"550.54.15\","
                              "container=\"main\",namespace=\"ml\",pod=\"train-0-0\"} 37\n"));
}

// Several pods sharing one GPU (time-slicing replicas) each get their own DCGM series.
TEST(Render, SeveralPodsPerGpuEachGetSeries) {
  FakeGpuLayer g(2);
  Sample s = SampleOf(g);
  s.containers = PodsOn(s, 3);
  std::string text;
  Render(s, RenderOptions{kDcgmFamilies | kGpuletFamilies, true}, Format::kText, &text);
  for (int k = 0; k < 3; ++k) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("pod=\"train-1-", k, "\"} 38\n")));
  }
  auto shapes = testing_metrics::ReadShapes(text);
  EXPECT_EQ(shapes["DCGM_FI_DEV_GPU_UTIL"].samples, 6);
  EXPECT_EQ(shapes["gpulet_container_gpu_info"].samples, 6);
}

// MIG: pods on a MIG device are attributed to that GPU instance (GPU_I_* labels) for per-instance
// families; utilisation stays at GPU level (NVML has none per instance).
TEST(Render, MigInstancesCarryTheirPods) {
  FakeGpuLayer g(2, /*mig_on_last=*/true);
  Sample s = SampleOf(g);
  s.containers.push_back({"ml", "mig-pod", "c", "nvidia.com/mig-3g.40gb",
                          s.devices[1].device.mig_devices[0].uuid, 1, 0});
  std::string text;
  Render(s, RenderOptions{kDcgmFamilies, false}, Format::kText, &text);
  EXPECT_THAT(text, HasSubstr("DCGM_FI_DEV_GPU_TEMP{gpu=\"1\",UUID=\"" + s.devices[1].device.uuid));
  EXPECT_THAT(text,
              HasSubstr("GPU_I_PROFILE=\"3g.40gb\",GPU_I_ID=\"1\",DCGM_FI_DRIVER_VERSION="
                        "\"550.54.15\",container=\"c\",namespace=\"ml\",pod=\"mig-pod\"} 41"));
  EXPECT_THAT(text, HasSubstr("GPU_I_PROFILE=\"1g.10gb+me\",GPU_I_ID=\"2\""));
  EXPECT_THAT(text, Not(HasSubstr("Hostname=")));
  auto shapes = testing_metrics::ReadShapes(text);
  EXPECT_EQ(shapes["DCGM_FI_DEV_GPU_TEMP"].samples, 3);  // GPU 0 + two instances of GPU 1
  EXPECT_EQ(shapes["DCGM_FI_DEV_GPU_UTIL"].samples, 2);  // GPU level only
}

// 1000 label-breaking pod names (quotes, backslashes, newlines, unicode, invalid UTF-8) in every
// family set: the exposition stays parseable (promtool: no parse error) and the gpulet families
// stay lint-clean.
TEST(Render, HostilePodNamesKeepExpositionValid) {
  if (!testing_metrics::HavePromtool()) GTEST_SKIP() << "promtool not installed";
  FakeGpuLayer g(8);
  Sample s = SampleOf(g);
  const char* nasty[] = {"\"",
                         "\\",
                         "\n",
                         "\\\"",
                         "}",
                         "{a=\"b\"}",
                         " 1\n",
                         "\xE2\x80\x8F",
                         "\xF0\x9F\x94\xA5",
                         "\xFF\xFE",
                         "# TYPE x counter",
                         "\r",
                         "=",
                         "\\n",
                         "\t",
                         "\xC3\xA9\xC3\xA8",
                         ""};
  for (int i = 0; i < 1000; ++i) {
    std::string name = absl::StrCat(nasty[i % 17], "pod", i, nasty[(i / 17) % 17]);
    s.containers.push_back({absl::StrCat("ns", nasty[(i + 3) % 17]), name, nasty[(i + 5) % 17],
                            "nvidia.com/gpu", absl::StrCat(s.devices[i % 8].device.uuid, "::", i),
                            static_cast<size_t>(i % 8), -1});
  }
  for (unsigned fams :
       {unsigned{kGpuletFamilies},
        unsigned{kDcgmFamilies | kNvidiaSmiFamilies | kGpuManagerFamilies | kGpuletFamilies}}) {
    std::string text;
    Render(s, RenderOptions{fams, true}, Format::kText, &text);
    auto r = testing_metrics::PromtoolCheckMetrics(text);
    EXPECT_THAT(r.output, Not(HasSubstr("parsing error"))) << r.output.substr(0, 500);
    if (fams == kGpuletFamilies) {
      EXPECT_EQ(r.rc, 0) << r.output.substr(0, 500);
      EXPECT_EQ(testing_metrics::ReadShapes(text)["gpulet_container_gpu_info"].samples, 1000);
    } else {
      EXPECT_NE(r.rc, 1) << r.output.substr(0, 500);  // 3 = lint on DCGM/nvidia_smi names only
    }
  }
}

// nvidia_smi_* uses nvidia_gpu_exporter's units and its uuid label (lower case, no GPU- prefix).
TEST(Render, NvidiaSmiUnitsAndUuid) {
  FakeGpuLayer g(1);
  Sample s = SampleOf(g);
  std::string text;
  Render(s, RenderOptions{kNvidiaSmiFamilies, true}, Format::kText, &text);
  EXPECT_THAT(text,
              HasSubstr("nvidia_smi_clocks_current_sm_clock_hz{uuid=\"604ac76c-d9cf-fef3-62e9-"
                        "d92044ab6e00\"} 1980000000\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_utilization_gpu_ratio{uuid=\"604ac76c-d9cf-fef3-62e9-"
                              "d92044ab6e00\"} 0.37\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_memory_used_bytes{uuid=\"604ac76c-d9cf-fef3-62e9-"
                              "d92044ab6e00\"} 1073741824\n"));
}

// GPU Manager's families: an exclusive whole-GPU container uses the device's figures; a vGPU
// container its accounting (percent and MiB, as GPU Manager reported them).
TEST(Render, GpuManagerFamilies) {
  FakeGpuLayer g(2);
  Sample s = SampleOf(g);
  s.containers.push_back({"ml", "whole", "c", "nvidia.com/gpu", s.devices[0].device.uuid, 0, -1});
  s.vgpu.push_back({"ml", "frac", "c", 1, 300ull << 20, 1024ull << 20, 0.25, 0.3});
  std::string text;
  RenderGpuManager(s, Format::kText, &text);
  EXPECT_THAT(text, HasSubstr("container_gpu_utilization{pod_name=\"whole\",namespace=\"ml\","
                              "node=\"node1\",container_name=\"c\",gpu=\"0\"} 37\n"));
  EXPECT_THAT(text, HasSubstr("container_gpu_utilization{pod_name=\"frac\",namespace=\"ml\","
                              "node=\"node1\",container_name=\"c\",gpu=\"1\"} 25\n"));
  EXPECT_THAT(text, HasSubstr("container_gpu_memory_total{pod_name=\"frac\",namespace=\"ml\","
                              "node=\"node1\",container_name=\"c\",gpu_memory=\"1\"} 300\n"));
  EXPECT_THAT(text, HasSubstr("container_request_gpu_memory{pod_name=\"frac\",namespace=\"ml\","
                              "node=\"node1\",container_name=\"c\",req_of_gpu_memory=\"total\"} "
                              "1024\n"));
  EXPECT_THAT(text, HasSubstr("container_request_gpu_utilization{pod_name=\"whole\","
                              "namespace=\"ml\",node=\"node1\",container_name=\"c\","
                              "req_of_gpu=\"total\"} 1\n"));
}

// --- attribution ------------------------------------------------------------------------------

// Every device-plugin ID form maps back to the physical device (and MIG device).
TEST(Attribution, ResolvesEveryIdForm) {
  FakeGpuLayer g(4, /*mig_on_last=*/true);
  gpu::Inventory inv = *g.GetInventory();
  auto r = [&](const std::string& id) { return kubelet::ResolveDeviceId(inv, id); };
  ASSERT_TRUE(r(inv.devices[2].uuid));
  EXPECT_EQ(r(inv.devices[2].uuid)->device, 2u);
  EXPECT_EQ(r(inv.devices[2].uuid + "::7")->device, 2u);
  EXPECT_EQ(r("1")->device, 1u);
  EXPECT_EQ(r("1::3")->device, 1u);
  EXPECT_EQ(r("1")->mig, -1);
  EXPECT_EQ(r(inv.devices[3].mig_devices[1].uuid)->mig, 1);
  EXPECT_EQ(r(inv.devices[3].mig_devices[1].uuid + "::2")->device, 3u);
  EXPECT_EQ(r("3:1")->mig, 1);
  EXPECT_EQ(r("3:0::4")->mig, 0);
  EXPECT_FALSE(r("GPU-00000000-0000-0000-0000-000000000000"));
  EXPECT_FALSE(r("9"));
  EXPECT_FALSE(r("3:9"));
  EXPECT_FALSE(r("tencent.com/vcuda-core-3"));
  EXPECT_FALSE(r(""));
}

// The gRPC client talks PodResources v1 List over a real unix socket, keeps nvidia.com/* (and
// configured) resources, and reports a missing socket as an error, quickly.
TEST(Attribution, GrpcListOverUnixSocket) {
  std::string dir = TempDir();
  std::string sock = dir + "/kubelet.sock";
  PodResourcesServer server(sock);
  ASSERT_TRUE(server.Start());
  server.Set({{"ml", "a", "c1", "nvidia.com/gpu", {"GPU-1", "GPU-2::1"}},
              {"ml", "b", "c2", "cpu.example/x", {"7"}},
              {"ml", "c", "c3", "example.com/renamed-gpu", {"GPU-3"}}});
  kubelet::GrpcPodResourcesLister lister(
      {sock, std::chrono::milliseconds(2000), {"example.com/renamed-gpu"}});
  auto got = lister.List();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 3u);
  EXPECT_EQ((*got)[1], (kubelet::PodDevice{"ml", "a", "c1", "nvidia.com/gpu", "GPU-2::1"}));
  EXPECT_EQ((*got)[2].resource, "example.com/renamed-gpu");
  server.Stop();
  std::filesystem::remove(sock);
  auto gone = lister.List();
  EXPECT_FALSE(gone.ok());
  EXPECT_THAT(std::string(gone.status().message()), HasSubstr(sock));
  std::filesystem::remove_all(dir);
}

// The cache refreshes on demand and on its timer, and keeps the last answer while the kubelet is
// away (up = false), so pod labels do not flap.
TEST(Attribution, CacheRefreshesAndSurvivesKubeletLoss) {
  auto lister = std::make_unique<StaticLister>(
      std::vector<kubelet::PodDevice>{{"ml", "a", "c", "nvidia.com/gpu", "0"}});
  StaticLister* l = lister.get();
  kubelet::PodResourcesCache cache(std::move(lister), std::chrono::hours(1));
  cache.RefreshNow();
  EXPECT_TRUE(cache.state().up);
  l->fail_ = true;
  cache.Start();  // first loop iteration refreshes at once
  for (int i = 0; i < 200 && cache.state().refreshes < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_FALSE(cache.state().up);
  EXPECT_EQ(cache.state().devices.size(), 1u);
  EXPECT_EQ(cache.state().errors, 1u);
  l->fail_ = false;
  cache.RequestRefresh();
  for (int i = 0; i < 200 && !cache.state().up; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(cache.state().up);
  cache.Stop();
}

// Attribution follows allocations at once, not at the next tick: a rewrite of the kubelet's
// device-manager checkpoint (what the kubelet does after every Allocate and release), by rename or
// in place, and an explicit RefreshPods() each make the exporter ask PodResources again and
// publish, with the sampling and PodResources timers both at one hour. Other files in the
// directory do not.
TEST(Attribution, RefreshesOnCheckpointRewriteAndOnRequest) {
  std::string dir = TempDir();
  std::filesystem::create_directories(dir + "/device-plugins");
  const std::string checkpoint = dir + "/device-plugins/kubelet_internal_checkpoint";
  PodResourcesServer kubelet(dir + "/pod-resources.sock");
  ASSERT_TRUE(kubelet.Start());
  FakeGpuLayer g(2);
  ExporterOptions o;
  o.server.address = "127.0.0.1:0";
  o.sampler.interval = std::chrono::hours(1);
  o.pod_resources_socket = dir + "/pod-resources.sock";
  o.pod_resources_interval = std::chrono::hours(1);
  o.kubelet_checkpoint = checkpoint;
  auto e = Exporter::Start(o, &g, nullptr);
  ASSERT_TRUE(e.ok()) << e.status();
  auto attributed = [&](const std::string& pod, int tries) {
    for (int i = 0; i < tries; ++i) {
      if (absl::StrContains((*e)->sampler().snapshot()->text, "pod=\"" + pod + "\"")) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  };
  const std::string gpu0 = g.inventory().devices[0].uuid, gpu1 = g.inventory().devices[1].uuid;
  kubelet.Set({{"ml", "train-a", "main", "nvidia.com/gpu", {gpu0}}});
  EXPECT_FALSE(attributed("train-a", 20)) << "nothing happened yet: no refresh";
  {
    std::ofstream(checkpoint + ".tmp") << "{\"Data\":{}}";
    std::filesystem::rename(checkpoint + ".tmp", checkpoint);
  }
  EXPECT_TRUE(attributed("train-a", 400)) << "checkpoint renamed into place";
  kubelet.Set({{"ml", "train-b", "main", "nvidia.com/gpu", {gpu1}}});
  std::ofstream(checkpoint) << "{\"Data\":{\"PodDeviceEntries\":[]}}";
  EXPECT_TRUE(attributed("train-b", 400)) << "checkpoint rewritten in place";
  kubelet.Set({{"ml", "train-c", "main", "nvidia.com/gpu", {gpu0 + "::1"}}});
  std::ofstream(dir + "/device-plugins/nvidia-gpu.sock.tmp") << "x";
  EXPECT_FALSE(attributed("train-c", 60)) << "another file changed: no refresh";
  (*e)->RefreshPods();
  EXPECT_TRUE(attributed("train-c", 400)) << "RefreshPods()";
  EXPECT_GE((*e)->sampler().pokes_handled(), 3u);
  (*e)->Stop();
  std::filesystem::remove_all(dir);
}

// --- sampler ----------------------------------------------------------------------------------

// NVML failing mid-run: the snapshot keeps only what can be produced, says nvml_up 0, and the
// exporter recovers (through Reinit) once NVML answers again; no restart.
TEST(Sampler, NvmlFailingMidRunThenRecovering) {
  auto owned = std::make_unique<FakeGpuLayer>(2);
  FakeGpuLayer* g = owned.get();
  auto opener = [&owned]() -> absl::StatusOr<std::unique_ptr<gpu::GpuLayer>> {
    if (!owned) return absl::UnavailableError("libnvidia-ml.so.1 not found");
    return std::unique_ptr<gpu::GpuLayer>(std::move(owned));
  };
  Sampler sampler(nullptr, opener, nullptr, nullptr, nullptr, {});
  sampler.SampleOnce();
  EXPECT_THAT(sampler.snapshot()->text, HasSubstr("gpulet_exporter_nvml_up 1\n"));
  EXPECT_THAT(sampler.snapshot()->text, HasSubstr("gpulet_gpu_utilization_ratio{"));
  g->SetNvmlDown(true);
  sampler.SampleOnce();
  std::string down = sampler.snapshot()->text;
  EXPECT_THAT(down, HasSubstr("gpulet_exporter_nvml_up 0\n"));
  EXPECT_THAT(down, HasSubstr("gpulet_exporter_sampling_errors_total{source=\"nvml\"} 1\n"));
  EXPECT_THAT(down, Not(HasSubstr("gpulet_gpu_utilization_ratio")));
  if (testing_metrics::HavePromtool()) {
    auto r = testing_metrics::PromtoolCheckMetrics(down);  // only gpulet_exporter_* remain
    EXPECT_EQ(r.rc, 0) << r.output;
  }
  g->SetNvmlDown(false);
  sampler.SampleOnce();
  EXPECT_GE(g->reinits(), 1);
  EXPECT_THAT(sampler.snapshot()->text, HasSubstr("gpulet_exporter_nvml_up 1\n"));
  EXPECT_THAT(sampler.snapshot()->text, HasSubstr("gpulet_gpu_utilization_ratio{"));
}

// The reboot readiness controller's bare-pod count is read every cycle; without a controller the
// family is absent rather than a misleading 0.
TEST(Sampler, ReportsBarePodsOnlyWithAController) {
  FakeGpuLayer g(1);
  Sampler plain(&g, nullptr, nullptr, nullptr, nullptr, {});
  plain.SampleOnce();
  EXPECT_THAT(plain.snapshot()->text, Not(HasSubstr("gpulet_node_bare_pods_rejected_total")));
  std::atomic<int64_t> reported{0};
  SamplerOptions o;
  o.bare_pods_reported = [&reported] { return reported.load(); };
  Sampler sampler(&g, nullptr, nullptr, nullptr, nullptr, o);
  sampler.SampleOnce();
  EXPECT_THAT(sampler.snapshot()->text, HasSubstr("\ngpulet_node_bare_pods_rejected_total 0\n"));
  reported = 3;
  sampler.SampleOnce();
  EXPECT_THAT(sampler.snapshot()->text, HasSubstr("\ngpulet_node_bare_pods_rejected_total 3\n"));
}

// NVML absent at start (library missing): the endpoint has a snapshot with nvml_up 0, and the
// opener is retried each cycle.
TEST(Sampler, NvmlMissingAtStart) {
  int attempts = 0;
  Sampler sampler(nullptr,
                  [&]() -> absl::StatusOr<std::unique_ptr<gpu::GpuLayer>> {
                    ++attempts;
                    return absl::NotFoundError("libnvidia-ml.so.1: cannot open shared object file");
                  },
                  nullptr, nullptr, nullptr, {});
  sampler.SampleOnce();
  sampler.SampleOnce();
  EXPECT_EQ(attempts, 2);
  EXPECT_THAT(sampler.snapshot()->text, HasSubstr("gpulet_exporter_nvml_up 0\n"));
}

// A lost GPU is reported unhealthy while the others keep their series.
TEST(Sampler, LostGpuIsUnhealthy) {
  FakeGpuLayer g(2);
  g.SetDeviceError(1, absl::UnavailableError("GPU is lost"));
  Sampler sampler(&g, nullptr, nullptr, nullptr, nullptr, {});
  sampler.SampleOnce();
  std::string t = sampler.snapshot()->text;
  EXPECT_THAT(t, HasSubstr("gpulet_gpu_healthy{gpu=\"1\",uuid=\"" + g.inventory().devices[1].uuid +
                           "\"} 0\n"));
  EXPECT_THAT(t, HasSubstr("gpulet_gpu_healthy{gpu=\"0\""));
  EXPECT_THAT(t, HasSubstr("gpulet_exporter_nvml_up 1\n"));
}

// XID events from the GPU layer become per-GPU counts and the last code.
TEST(Sampler, CountsXidEvents) {
  FakeGpuLayer g(2);
  Sampler sampler(&g, nullptr, nullptr, nullptr, nullptr, {});
  sampler.SampleOnce();  // subscribes
  g.Emit(1, 79);
  g.Emit(1, 48);
  g.Emit(1, 48);
  sampler.SampleOnce();
  std::string t = sampler.snapshot()->text;
  std::string labels = "{gpu=\"1\",uuid=\"" + g.inventory().devices[1].uuid + "\"}";
  EXPECT_THAT(t, HasSubstr("gpulet_gpu_xid_errors_total" + labels + " 3\n"));
  EXPECT_THAT(t, HasSubstr("gpulet_gpu_xid_last_code" + labels + " 48\n"));
  EXPECT_THAT(t, HasSubstr("DCGM_FI_DEV_XID_ERRORS{gpu=\"1\""));
}

// Kubelet socket gone: pods already known keep their labels, kubelet_up says 0; the snapshot
// is still served.
TEST(Sampler, KubeletGoneKeepsLastAttribution) {
  FakeGpuLayer g(2);
  auto lister = std::make_unique<StaticLister>(std::vector<kubelet::PodDevice>{
      {"ml", "a", "c", "nvidia.com/gpu", g.inventory().devices[0].uuid}});
  StaticLister* l = lister.get();
  kubelet::PodResourcesCache cache(std::move(lister), std::chrono::hours(1));
  cache.RefreshNow();
  Sampler sampler(&g, nullptr, &cache, nullptr, nullptr, {});
  sampler.SampleOnce();
  EXPECT_THAT(sampler.snapshot()->text, HasSubstr("gpulet_exporter_kubelet_up 1\n"));
  l->fail_ = true;
  cache.RefreshNow();
  sampler.SampleOnce();
  std::string t = sampler.snapshot()->text;
  EXPECT_THAT(t, HasSubstr("gpulet_exporter_kubelet_up 0\n"));
  EXPECT_THAT(t, HasSubstr("gpulet_exporter_sampling_errors_total{source=\"kubelet\"} 1\n"));
  EXPECT_THAT(t, HasSubstr("pod=\"a\""));
}

// A scrape sees the pods as the kubelet has them now, with the sampling and PodResources timers
// at one hour: the first scrape after an allocation carries the new pod's labels (it waited for
// both timers, up to 20 s with the defaults). One List per gap for all scrapes; a kubelet that
// failed last time is not asked at a scrape.
TEST(Sampler, ScrapeAttributesPodsAsOfNow) {
  FakeGpuLayer g(2);
  auto lister = std::make_unique<StaticLister>(std::vector<kubelet::PodDevice>{});
  StaticLister* l = lister.get();
  kubelet::PodResourcesCache cache(std::move(lister), std::chrono::hours(1));
  cache.RefreshNow();
  SamplerOptions o;
  o.interval = std::chrono::hours(1);
  o.scrape_list_gap = std::chrono::milliseconds(0);
  Sampler sampler(&g, nullptr, &cache, nullptr, nullptr, o);
  sampler.SampleOnce();
  const uint64_t cycles = sampler.snapshot()->self.cycles;
  EXPECT_THAT(sampler.ScrapeSnapshot()->text, Not(HasSubstr("pod=\"a\"")));

  l->devices_ = {{"ml", "a", "c", "nvidia.com/gpu", g.inventory().devices[1].uuid}};
  std::shared_ptr<const Snapshot> scraped = sampler.ScrapeSnapshot();
  EXPECT_THAT(scraped->text,
              HasSubstr("gpulet_container_gpu_info{namespace=\"ml\",pod=\"a\",container=\"c\""));
  EXPECT_THAT(scraped->text, HasSubstr("pod=\"a\""));
  EXPECT_EQ(scraped->self.cycles, cycles) << "attributed again, not sampled again";
  EXPECT_THAT(sampler.snapshot()->text, HasSubstr("pod=\"a\"")) << "published for every reader";

  // Unchanged answer: the same snapshot object, nothing rendered.
  EXPECT_EQ(sampler.ScrapeSnapshot().get(), sampler.snapshot().get());

  // The kubelet failed at the last call: scrapes leave it to the timer.
  l->fail_ = true;
  cache.RefreshNow();
  const uint64_t refreshes = cache.state().refreshes;
  sampler.ScrapeSnapshot();
  EXPECT_EQ(cache.state().refreshes, refreshes);
}

TEST(Sampler, ScrapeListsAtMostOncePerGap) {
  FakeGpuLayer g(1);
  auto lister = std::make_unique<StaticLister>(std::vector<kubelet::PodDevice>{});
  kubelet::PodResourcesCache cache(std::move(lister), std::chrono::hours(1));
  cache.RefreshNow();
  SamplerOptions o;
  o.interval = std::chrono::hours(1);
  o.scrape_list_gap = std::chrono::hours(1);
  Sampler sampler(&g, nullptr, &cache, nullptr, nullptr, o);
  sampler.SampleOnce();
  const uint64_t before = cache.state().refreshes;
  for (int i = 0; i < 5; ++i) sampler.ScrapeSnapshot();
  EXPECT_EQ(cache.state().refreshes, before + 1);
}

// gpulet_gpu_healthy says what the device plugin decided (DeviceHealth), not only whether the GPU
// answered: a withdrawn GPU that still answers NVML reads 0, with its telemetry still served.
TEST(Sampler, HealthFollowsTheDevicePluginsDecision) {
  class Withdrawn : public DeviceHealth {
   public:
    explicit Withdrawn(std::string uuid) : uuid_(std::move(uuid)) {}
    std::string Reason(const gpu::Device& d) const override {
      return d.uuid == uuid_ ? "XID 79" : "";
    }
    std::string uuid_;
  };
  FakeGpuLayer g(2);
  int made = 0;
  SamplerOptions o;
  o.device_health = [&](gpu::GpuLayer* layer, const gpu::Inventory& inv) {
    EXPECT_EQ(layer, &g);
    EXPECT_EQ(inv.devices.size(), 2u);
    ++made;
    return std::make_unique<Withdrawn>(g.inventory().devices[1].uuid);
  };
  Sampler sampler(&g, nullptr, nullptr, nullptr, nullptr, o);
  sampler.SampleOnce();
  sampler.SampleOnce();
  EXPECT_EQ(made, 1) << "made once, from the first inventory";
  std::string t = sampler.snapshot()->text;
  EXPECT_THAT(t, HasSubstr("gpulet_gpu_healthy{gpu=\"0\",uuid=\"" + g.inventory().devices[0].uuid +
                           "\"} 1\n"));
  EXPECT_THAT(t, HasSubstr("gpulet_gpu_healthy{gpu=\"1\",uuid=\"" + g.inventory().devices[1].uuid +
                           "\"} 0\n"));
  EXPECT_THAT(t, HasSubstr("gpulet_gpu_temperature_celsius{gpu=\"1\""));
}

// vGPU accounting files become per-container usage; utilisation is busy_ns growth over wall time.
TEST(Sampler, ReadsVgpuAccounting) {
  gpulet::testing::FakeClock clock;
  std::string root = TempDir();
  FakeGpuLayer g(2);
  std::filesystem::create_directories(root + "/uid-1/main");
  { std::ofstream(root + "/uid-1/pod") << "ml/frac-pod\n"; }
  const char* err = "";
  vgpu::AccountingRegion* r =
      vgpu::MapAccounting((root + "/uid-1/main/accounting").c_str(), true, &err);
  ASSERT_NE(r, nullptr) << err;
  r->memory_limit = 4ull << 30;
  r->core_limit = 30;
  snprintf(r->device_uuid, sizeof r->device_uuid, "%s", g.inventory().devices[1].uuid.c_str());
  int slot = vgpu::ClaimSlot(*r, vgpu::OwnerWord(getpid(), vgpu::ProcessStartTicks(getpid())));
  ASSERT_GE(slot, 0);
  ASSERT_TRUE(vgpu::Reserve(*r, slot, r->owner[slot].load(), 1ull << 30));
  VgpuGrantReader grants = [&] {
    return std::vector<VgpuGrantRecord>{
        {"uid-1/main", "ml", "frac-pod", "main", g.inventory().devices[1].uuid, 4ull << 30, 0.3}};
  };
  AccountingDirUsageSource source(root, grants, &clock);
  Sampler sampler(&g, nullptr, nullptr, &source, &clock, {});
  sampler.SampleOnce();
  r->busy_ns += 250'000'000;  // 0.25 s of GPU time in 1 s of wall time
  clock.Advance(std::chrono::seconds(1));
  sampler.SampleOnce();
  std::string t = sampler.snapshot()->text;
  std::string labels = "{namespace=\"ml\",pod=\"frac-pod\",container=\"main\",gpu=\"1\",uuid=\"" +
                       g.inventory().devices[1].uuid + "\"}";
  EXPECT_THAT(t, HasSubstr("gpulet_vgpu_container_memory_used_bytes" + labels + " 1073741824\n"));
  EXPECT_THAT(t, HasSubstr("gpulet_vgpu_container_memory_limit_bytes" + labels + " 4294967296\n"));
  EXPECT_THAT(t, HasSubstr("gpulet_vgpu_container_utilization_ratio" + labels + " 0.25\n"));
  EXPECT_THAT(t, HasSubstr("gpulet_vgpu_container_core_limit_ratio" + labels + " 0.3\n"));
  EXPECT_THAT(t, HasSubstr("gpulet_exporter_vgpu_accounting_up 1\n"));
  std::filesystem::remove_all(root);
}

// The accounting file is the tenant's to write: what it says is a claim. A file naming another
// GPU and more memory than granted, and a file of a container the agent never granted, forge
// nothing: the series carry the grant's names, GPU and limits, memory in use at most the limit.
TEST(Sampler, VgpuUsageIsCheckedAgainstTheAgentsGrants) {
  gpulet::testing::FakeClock clock;
  std::string root = TempDir();
  FakeGpuLayer g(2);
  auto forge = [&](const std::string& dir, const std::string& uuid) {
    std::filesystem::create_directories(root + dir);
    const char* err = "";
    vgpu::AccountingRegion* r =
        vgpu::MapAccounting((root + dir + "/accounting").c_str(), true, &err);
    ASSERT_NE(r, nullptr) << err;
    r->memory_limit = 1ull << 40;  // 1 TiB "limit"
    r->core_limit = 100;
    snprintf(r->device_uuid, sizeof r->device_uuid, "%s", uuid.c_str());
    r->high_water = 1;
    r->owner[0] = 1;
    r->held[0] = 64ull << 30;  // 64 GiB "in use"
    munmap(r, sizeof *r);
  };
  forge("/uid-1/main", g.inventory().devices[0].uuid);                // granted GPU 1, claims GPU 0
  forge("/uid-2/evil", g.inventory().devices[0].uuid);                // never granted
  { std::ofstream(root + "/uid-2/pod") << "kube-system/coredns\n"; }  // names are the grant's
  VgpuGrantReader grants = [&] {
    return std::vector<VgpuGrantRecord>{
        {"uid-1/main", "ml", "frac-pod", "main", g.inventory().devices[1].uuid, 4ull << 30, 0.3},
        {"../uid-2/evil", "x", "y", "evil", g.inventory().devices[0].uuid, 1ull << 40, 1}};
  };
  AccountingDirUsageSource source(root, grants, &clock);
  Sampler sampler(&g, nullptr, nullptr, &source, &clock, {});
  sampler.SampleOnce();
  std::string t = sampler.snapshot()->text;
  std::string labels = "{namespace=\"ml\",pod=\"frac-pod\",container=\"main\",gpu=\"1\",uuid=\"" +
                       g.inventory().devices[1].uuid + "\"}";
  EXPECT_THAT(t, HasSubstr("gpulet_vgpu_container_memory_used_bytes" + labels + " 4294967296\n"));
  EXPECT_THAT(t, HasSubstr("gpulet_vgpu_container_memory_limit_bytes" + labels + " 4294967296\n"));
  EXPECT_THAT(t, HasSubstr("gpulet_vgpu_container_core_limit_ratio" + labels + " 0.3\n"));
  EXPECT_THAT(t, Not(HasSubstr("container=\"evil\"")));
  EXPECT_THAT(t, Not(HasSubstr("coredns")));
  EXPECT_THAT(t, Not(HasSubstr("1099511627776")));
  EXPECT_THAT(t, Not(HasSubstr("68719476736")));
  std::filesystem::remove_all(root);
}

// --- HTTP -------------------------------------------------------------------------------------

// A GpuLayer whose telemetry blocks until released: a sampling cycle that hangs in NVML.
class BlockingGpu : public FakeGpuLayer {
 public:
  BlockingGpu() : FakeGpuLayer(1) {}
  absl::StatusOr<gpu::Telemetry> GetTelemetry(uint32_t i) override {
    if (block_) {
      entered_.set_value();
      release_.get_future().wait();
    }
    return FakeGpuLayer::GetTelemetry(i);
  }
  std::atomic<bool> block_{false};
  std::promise<void> entered_, release_;
};

// /metrics serves text or OpenMetrics by Accept header, /health answers, and a scrape returns the
// last snapshot while a sampling cycle is stuck inside NVML.
TEST(Server, ServesSnapshotsWithoutWaitingOnNvml) {
  BlockingGpu g;
  SamplerOptions so;
  so.render.families = kDefaultFamilies | kGpuManagerFamilies;
  Sampler sampler(&g, nullptr, nullptr, nullptr, nullptr, so);
  sampler.SampleOnce();
  MetricsServer server(&sampler, {"127.0.0.1:0", "127.0.0.1:0", 2});
  ASSERT_TRUE(server.Start().ok());
  httplib::Client c("127.0.0.1", server.port());
  auto text = c.Get("/metrics");
  ASSERT_TRUE(text);
  EXPECT_EQ(text->status, 200);
  EXPECT_EQ(text->get_header_value("Content-Type"), std::string(kTextContentType));
  EXPECT_THAT(text->body, HasSubstr("gpulet_exporter_scrape_duration_seconds "));
  EXPECT_TRUE(absl::EndsWith(text->body, "\n"));
  auto om = c.Get("/metrics", {{"Accept", "application/openmetrics-text;version=1.0.0"}});
  ASSERT_TRUE(om);
  EXPECT_EQ(om->get_header_value("Content-Type"), std::string(kOpenMetricsContentType));
  EXPECT_TRUE(absl::EndsWith(om->body, "# EOF\n"));
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);

  g.block_ = true;
  std::thread cycle([&] { sampler.SampleOnce(); });
  g.entered_.get_future().wait();  // the sampler is now inside GetTelemetry
  auto during = c.Get("/metrics");
  ASSERT_TRUE(during);
  EXPECT_EQ(during->status, 200);
  EXPECT_THAT(during->body, HasSubstr("DCGM_FI_DEV_GPU_UTIL{"));
  g.release_.set_value();
  cycle.join();
  server.Stop();
}

// /health measures the snapshot's age on the sampler's clock (it subtracted a time point of that
// clock from the steady clock's now): fresh is 200, older than 3 intervals + 30 s is 503.
TEST(Server, HealthMeasuresAgeOnTheSamplersClock) {
  gpulet::testing::FakeClock clock;
  FakeGpuLayer g(1);
  SamplerOptions so;
  Sampler sampler(&g, nullptr, nullptr, nullptr, &clock, so);
  sampler.SampleOnce();
  MetricsServer server(&sampler, {"127.0.0.1:0", "127.0.0.1:0", 2});
  ASSERT_TRUE(server.Start().ok());
  httplib::Client c("127.0.0.1", server.port());
  auto fresh = c.Get("/health");
  ASSERT_TRUE(fresh);
  EXPECT_EQ(fresh->status, 200) << fresh->body;
  clock.Advance(3 * so.interval + std::chrono::seconds(29));
  auto old = c.Get("/health");
  ASSERT_TRUE(old);
  EXPECT_EQ(old->status, 200) << old->body;
  clock.Advance(std::chrono::seconds(2));
  auto stalled = c.Get("/health");
  ASSERT_TRUE(stalled);
  EXPECT_EQ(stalled->status, 503) << stalled->body;
  EXPECT_THAT(stalled->body, HasSubstr("sampling stalled"));
  server.Stop();
}

// Accept-Encoding: gzip and x-gzip unless refused with q=0; anything else is identity.
TEST(Exposition, AcceptsGzip) {
  EXPECT_TRUE(AcceptsGzip("gzip"));
  EXPECT_TRUE(AcceptsGzip("deflate, GZIP;q=0.5"));
  EXPECT_TRUE(AcceptsGzip("br, x-gzip"));
  EXPECT_FALSE(AcceptsGzip(""));
  EXPECT_FALSE(AcceptsGzip("identity"));
  EXPECT_FALSE(AcceptsGzip("gzip;q=0"));
  EXPECT_FALSE(AcceptsGzip("gzip; q=0.000"));
  EXPECT_FALSE(AcceptsGzip("gzipx, deflate"));
}

// A scrape with Accept-Encoding: gzip (what Prometheus sends) gets Content-Encoding: gzip and one
// complete gzip member that inflates to the same exposition as an identity scrape (body from the
// snapshot, tail written per request), in both formats; the wire size shrinks by far. A format
// is compressed from the cycle after its first gzip scrape on (that one is served identity).
TEST(Server, GzipWhenTheScraperAcceptsIt) {
  FakeGpuLayer g(8);
  Sampler sampler(&g, nullptr, nullptr, nullptr, nullptr, {});
  sampler.SampleOnce();
  MetricsServer server(&sampler, {"127.0.0.1:0", "", 2});
  ASSERT_TRUE(server.Start().ok());
  httplib::Client c("127.0.0.1", server.port());
  c.set_decompress(false);
  const char* kFormats[] = {"text/plain", "application/openmetrics-text;version=1.0.0"};
  for (const char* accept : kFormats) {
    auto first = c.Get("/metrics", {{"Accept", accept}, {"Accept-Encoding", "gzip"}});
    ASSERT_TRUE(first);
    EXPECT_EQ(first->get_header_value("Content-Encoding"), "") << "not compressed yet";
  }
  sampler.SampleOnce();
  for (const char* accept : kFormats) {
    auto plain = c.Get("/metrics", {{"Accept", accept}, {"Accept-Encoding", "identity"}});
    auto gz = c.Get("/metrics", {{"Accept", accept}, {"Accept-Encoding", "gzip"}});
    ASSERT_TRUE(plain && gz);
    EXPECT_EQ(plain->get_header_value("Content-Encoding"), "");
    EXPECT_EQ(gz->get_header_value("Content-Encoding"), "gzip");
    EXPECT_EQ(gz->get_header_value("Vary"), "Accept-Encoding");
    std::string inflated = testing_metrics::Gunzip(gz->body);
    ASSERT_FALSE(inflated.empty()) << "not a single complete gzip member";
    // Identical up to the per-scrape tail (the previous scrape's duration differs).
    const std::string tail_start = "# HELP gpulet_exporter_scrape_duration_seconds";
    size_t a = plain->body.find(tail_start), b = inflated.find(tail_start);
    ASSERT_NE(a, std::string::npos);
    ASSERT_NE(b, std::string::npos);
    EXPECT_EQ(inflated.substr(0, b), plain->body.substr(0, a));
    EXPECT_THAT(inflated.substr(b), HasSubstr("\ngpulet_exporter_scrape_duration_seconds "));
    EXPECT_EQ(absl::EndsWith(inflated, "# EOF\n"), absl::EndsWith(plain->body, "# EOF\n"));
    EXPECT_LT(gz->body.size() * 5, plain->body.size()) << accept;
  }
  server.Stop();
}

// Only the variants scraped lately are kept in the snapshot: before the first scrape both
// uncompressed bodies, then (a Prometheus asking for gzipped OpenMetrics) only that compressed
// body. A scrape for a variant that was not rendered still gets a whole exposition, rendered on
// the spot from the cycle's sample, and from the next cycle on that variant is kept too.
TEST(Server, KeepsOnlyTheVariantsScraped) {
  FakeGpuLayer g(8);
  Sampler sampler(&g, nullptr, nullptr, nullptr, nullptr, {});
  sampler.SampleOnce();
  EXPECT_THAT(sampler.snapshot()->text, HasSubstr("DCGM_FI_DEV_GPU_UTIL{"));
  EXPECT_THAT(sampler.snapshot()->openmetrics, HasSubstr("DCGM_FI_DEV_GPU_UTIL{"));
  MetricsServer server(&sampler, {"127.0.0.1:0", "", 2});
  ASSERT_TRUE(server.Start().ok());
  httplib::Client c("127.0.0.1", server.port());
  c.set_decompress(false);
  const httplib::Headers prometheus = {{"Accept", "application/openmetrics-text;version=1.0.0"},
                                       {"Accept-Encoding", "gzip"}};
  ASSERT_TRUE(c.Get("/metrics", prometheus));
  sampler.SampleOnce();
  auto snap = sampler.snapshot();
  EXPECT_FALSE(snap->openmetrics_gz.data.empty());
  EXPECT_EQ(snap->openmetrics, "");
  EXPECT_EQ(snap->text, "");
  EXPECT_TRUE(snap->text_gz.data.empty());

  auto text = c.Get("/metrics");  // text, identity: not rendered this cycle
  ASSERT_TRUE(text);
  EXPECT_EQ(text->status, 200);
  EXPECT_EQ(text->get_header_value("Content-Type"), std::string(kTextContentType));
  EXPECT_THAT(text->body, HasSubstr("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"));
  EXPECT_THAT(text->body, HasSubstr("\ngpulet_exporter_scrape_duration_seconds "));
  auto gz = c.Get("/metrics", prometheus);
  ASSERT_TRUE(gz);
  EXPECT_EQ(gz->get_header_value("Content-Encoding"), "gzip");
  EXPECT_TRUE(absl::EndsWith(testing_metrics::Gunzip(gz->body), "# EOF\n"));

  sampler.SampleOnce();
  EXPECT_THAT(sampler.snapshot()->text, HasSubstr("DCGM_FI_DEV_GPU_UTIL{"));
  EXPECT_EQ(sampler.snapshot()->openmetrics, "");
  server.Stop();
}

// A busy port is one clear error naming the address.
TEST(Server, PortInUseIsAClearError) {
  FakeGpuLayer g(1);
  Sampler sampler(&g, nullptr, nullptr, nullptr, nullptr, {});
  MetricsServer first(&sampler, {"127.0.0.1:0", "", 1});
  ASSERT_TRUE(first.Start().ok());
  std::string addr = absl::StrCat("127.0.0.1:", first.port());
  MetricsServer second(&sampler, {addr, "", 1});
  absl::Status st = second.Start();
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(std::string(st.message()), HasSubstr(addr));
}

}  // namespace
}  // namespace gpulet::metrics
