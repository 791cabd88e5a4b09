// What `gpulet scheduler` (the real binary) holds in memory once it has listed and watches a
// cluster, by the part of the cluster it serves and the part it does not (issue 30 item 2: its
// memory should follow the vGPU nodes and pods, not the cluster).
//
// Method: the fake API server (testing/apiserver, the same list, paging and watch wire format as
// kube-apiserver) holds V vGPU nodes (8 H100s each, the inventory annotation gpulet's agent
// writes, one 30-core pod bound per GPU) and O other nodes (whole GPUs or none, P pods each that
// ask for no vGPU). Node and pod objects are shaped and sized as a kubelet's and a Deployment's
// are (labels, conditions, images, managedFields: about 3.5 KB a node and 3 KB a pod). The
// scheduler is started against it with the shipped flags, and once /healthz answers (after its
// lists and the watches' first lists) and a second has passed, its VmRSS and VmHWM (the peak,
// which is what a memory limit meets) are read from /proc. One iteration per argument set: the
// figures are of one process, not averaged; rerun to see their spread.
//   Args: {V, O, P}.
// GPULET_BENCH_BINARY=<prefix>/bin/gpulet measures another build (A/B of one change).
// Run: build/bench/scheduler_extender_memory_bench
#include <benchmark/benchmark.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "testing/apiserver/fake_apiserver.h"
#include "testing/net/loopback.h"
#include "testing/process/spawn.h"

namespace gpulet {
namespace {

using nlohmann::json;

int64_t StatusKb(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  return -1;
}

// What a kubelet's Node carries besides GPUs, at about its size.
json NodeObject(const std::string& name, const json& annotations, const json& capacity) {
  json labels = {{"kubernetes.io/hostname", name},
                 {"kubernetes.io/os", "linux"},
                 {"kubernetes.io/arch", "amd64"},
                 {"node.kubernetes.io/instance-type", "p5.48xlarge"},
                 {"topology.kubernetes.io/zone", "zone-a"},
                 {"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"},
                 {"nvidia.com/gpu.count", "8"},
                 {"feature.node.kubernetes.io/pci-10de.present", "true"}};
  json conditions = json::array();
  for (const char* c : {"MemoryPressure", "DiskPressure", "PIDPressure", "Ready"})
    conditions.push_back({{"type", c},
                          {"status", std::string(c) == "Ready" ? "True" : "False"},
                          {"lastHeartbeatTime", "2026-12-03T07:00:00Z"},
                          {"lastTransitionTime", "2026-12-01T07:00:00Z"},
                          {"reason", absl::StrCat("Kubelet", c)},
                          {"message", "kubelet has sufficient resources and is posting status"}});
  json images = json::array();
  for (int i = 0; i < 8; ++i)
    images.push_back(
        {{"names",
          {absl::StrCat("registry.example/team/image-", i, "@sha256:", std::string(64, 'a' + i)),
           absl::StrCat("registry.example/team/image-", i, ":v1.2.3")}},
         {"sizeBytes", 1234567890 + i}});
  json cap = {{"cpu", "192"},
              {"memory", "2097152000Ki"},
              {"pods", "110"},
              {"ephemeral-storage", "3750000000Ki"}};
  cap.update(capacity);
  return {{"metadata",
           {{"name", name},
            {"uid", absl::StrCat("uid-", name)},
            {"labels", labels},
            {"annotations", annotations}}},
          {"spec", {{"podCIDR", "10.244.0.0/24"}, {"providerID", absl::StrCat("aws:///", name)}}},
          {"status",
           {{"capacity", cap},
            {"allocatable", cap},
            {"conditions", conditions},
            {"addresses",
             {{{"type", "InternalIP"}, {"address", "10.0.0.1"}},
              {{"type", "Hostname"}, {"address", name}}}},
            {"nodeInfo",
             {{"kubeletVersion", "v1.34.4"},
              {"containerRuntimeVersion", "containerd://2.2.9"},
              {"kernelVersion", "6.8.0-1015-aws"},
              {"osImage", "Ubuntu 24.04.1 LTS"},
              {"machineID", std::string(32, 'f')},
              {"systemUUID", std::string(36, 'e')},
              {"bootID", std::string(36, 'd')}}},
            {"images", images}}}};
}

// A Deployment's pod, at about its size; `limits` adds to cpu and memory.
json PodObject(const std::string& name, const std::string& node, const json& limits,
               const json& annotations) {
  json l = {{"cpu", "1"}, {"memory", "1Gi"}};
  l.update(limits);
  json env = json::array();
  for (int i = 0; i < 8; ++i)
    env.push_back({{"name", absl::StrCat("SETTING_", i)}, {"value", "a-value-of-some-length"}});
  return {{"metadata",
           {{"name", name},
            {"namespace", "team"},
            {"uid", absl::StrCat("uid-", name)},
            {"labels", {{"app", "inference"}, {"pod-template-hash", "7c9f8d6b5"}}},
            {"annotations", annotations},
            {"ownerReferences",
             {{{"apiVersion", "apps/v1"},
               {"kind", "ReplicaSet"},
               {"name", "inference-7c9f8d6b5"},
               {"uid", "rs-uid"},
               {"controller", true}}}},
            {"managedFields",
             {{{"manager", "kube-controller-manager"},
               {"operation", "Update"},
               {"apiVersion", "v1"},
               {"fieldsType", "FieldsV1"},
               {"fieldsV1",
                {{"f:metadata", {{"f:labels", {{"f:app", json::object()}}}}},
                 {"f:spec", {{"f:containers", json::object()}}}}}}}}}},
          {"spec",
           {{"nodeName", node},
            {"serviceAccountName", "default"},
            {"containers",
             {{{"name", "main"},
               {"image", "registry.example/team/inference:v1.2.3"},
               {"args", {"--port=8080", "--model=/models/model", "--batch=8"}},
               {"env", env},
               {"ports", {{{"containerPort", 8080}, {"protocol", "TCP"}}}},
               {"resources", {{"limits", l}, {"requests", l}}},
               {"volumeMounts", {{{"name", "models"}, {"mountPath", "/models"}}}}}}},
            {"volumes", {{{"name", "models"}, {"emptyDir", json::object()}}}}}},
          {"status",
           {{"phase", "Running"},
            {"podIP", "10.244.0.17"},
            {"hostIP", "10.0.0.1"},
            {"conditions",
             {{{"type", "Ready"}, {"status", "True"}},
              {{"type", "ContainersReady"}, {"status", "True"}},
              {{"type", "PodScheduled"}, {"status", "True"}}}},
            {"containerStatuses",
             {{{"name", "main"},
               {"ready", true},
               {"restartCount", 0},
               {"image", "registry.example/team/inference:v1.2.3"},
               {"imageID",
                absl::StrCat("registry.example/team/inference@sha256:", std::string(64, 'c'))},
               {"containerID", absl::StrCat("containerd://", std::string(64, 'b'))}}}}}}};
}

void BM_SchedulerRss(benchmark::State& state) {
  const int vgpu_nodes = static_cast<int>(state.range(0));
  const int other_nodes = static_cast<int>(state.range(1));
  const int pods_per_other = static_cast<int>(state.range(2));
  testing::FakeApiServer api;
  if (!api.Start()) return state.SkipWithError("fake API server did not start");
  size_t bytes = 0;  // the objects' JSON, as a list of them all would carry it
  auto node = [&](const json& n) {
    bytes += n.dump().size();
    api.CreateNode(n);
  };
  auto pod = [&](const json& p) {
    bytes += p.dump().size();
    api.CreatePod(p);
  };
  for (int n = 0; n < vgpu_nodes; ++n) {
    std::string name = absl::StrCat("vgpu-", n);
    json gpus = json::array();
    for (int g = 0; g < 8; ++g)
      gpus.push_back({{"uuid", absl::StrCat("GPU-", name, "-", g)},
                      {"index", g},
                      {"memoryUnits", 320},
                      {"healthy", true}});
    node(NodeObject(name, {{"gpulet.io/vgpu-gpus", gpus.dump()}},
                    {{"tencent.com/vcuda-core", "800"}, {"tencent.com/vcuda-memory", "2560"}}));
    for (int g = 0; g < 8; ++g)
      pod(PodObject(absl::StrCat(name, "-pod-", g), name,
                    {{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "20"}},
                    {{"gpulet.io/vgpu-node", name},
                     {"gpulet.io/vgpu-gpus-0", absl::StrCat("GPU-", name, "-", g)},
                     {"gpulet.io/vgpu-assigned", "true"}}));
  }
  for (int n = 0; n < other_nodes; ++n) {
    std::string name = absl::StrCat("other-", n);
    node(NodeObject(name, json::object(), {{"nvidia.com/gpu", "8"}}));
    for (int p = 0; p < pods_per_other; ++p)
      pod(PodObject(absl::StrCat(name, "-pod-", p), name, {{"nvidia.com/gpu", "1"}},
                    json::object()));
  }
  std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("gpulet-sched-rss-", getpid()))
          .string();
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/kubeconfig") << api.Kubeconfig();
  const char* other = std::getenv("GPULET_BENCH_BINARY");
  std::string binary = other ? other : std::string(GPULET_BINARY_DIR) + "/bin/gpulet";
  int ext = testing_net::FreePort(), health = testing_net::FreePort();
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    pid_t pid = testing_process::SpawnLogged(
        {binary, "scheduler", "--kubeconfig", dir + "/kubeconfig", "--extender-listen",
         absl::StrCat("127.0.0.1:", ext), "--health-listen", absl::StrCat("127.0.0.1:", health)},
        dir + "/scheduler.log");
    bool up = false;
    httplib::Client cli("127.0.0.1", health);
    cli.set_connection_timeout(std::chrono::seconds(1));
    while (!up && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120)) {
      auto r = cli.Get("/healthz");
      up = r && r->status == 200;
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    double ready_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    state.counters["rss_mib"] = StatusKb(pid, "VmRSS") / 1024.0;
    state.counters["peak_mib"] = StatusKb(pid, "VmHWM") / 1024.0;
    std::this_thread::sleep_for(std::chrono::seconds(5));
    state.counters["rss_6s_mib"] = StatusKb(pid, "VmRSS") / 1024.0;
    state.counters["ready_s"] = ready_s;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    if (!up) state.SkipWithError("gpulet scheduler did not answer /healthz in 120 s");
  }
  state.counters["objects_mib"] = static_cast<double>(bytes) / (1 << 20);
  std::filesystem::remove_all(dir);
}

// The floor (10 vGPU nodes); 1000 vGPU nodes alone; beside 1000 and 2000 other nodes (no pods);
// beside 1000 other nodes with 10 pods each.
BENCHMARK(BM_SchedulerRss)
    ->Args({10, 0, 0})
    ->Args({1000, 0, 0})
    ->Args({1000, 1000, 0})
    ->Args({1000, 2000, 0})
    ->Args({1000, 1000, 10})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace gpulet

BENCHMARK_MAIN();
