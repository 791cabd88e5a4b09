// The extender's CPU and memory: nodes' allocatable less every known pod's requests feed the
// policies' scores (never their feasibility), and with all_pods the extender places pods that ask
// for no vGPU too. State fed directly, as in extender_test.cc; binds against the fake API server.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "scheduler/extender.h"
#include "testing/apiserver/fake_apiserver.h"

namespace gpulet::scheduler {
namespace {

using ::testing::HasSubstr;

// A vGPU node: `gpus` GPUs of 64 memory units, `cpu` cores and 256 GiB allocatable.
json Node(const std::string& name, int gpus, const std::string& cpu) {
  json list = json::array();
  for (int i = 0; i < gpus; ++i) {
    list.push_back({{"uuid", name + "-GPU-" + std::to_string(i)}, {"memoryUnits", 64}});
  }
  json node = {{"metadata", {{"name", name}}},
               {"status", {{"allocatable", {{"cpu", cpu}, {"memory", "256Gi"}}}}}};
  if (gpus > 0) node["metadata"]["annotations"] = {{"gpulet.io/vgpu-gpus", list.dump()}};
  return node;
}

json Container(const json& requests, const json& limits = json::object()) {
  return {{"name", "c"}, {"resources", {{"requests", requests}, {"limits", limits}}}};
}

json PodOf(const std::string& name, json containers) {
  return {{"metadata", {{"name", name}, {"namespace", "default"}, {"uid", "uid-" + name}}},
          {"spec", {{"containers", std::move(containers)}}},
          {"status", {{"phase", "Pending"}}}};
}

// 30 cores of a GPU and `cpu` CPU.
json VgpuPod(const std::string& name, const std::string& cpu) {
  json vgpu = {{"tencent.com/vcuda-core", 30}, {"tencent.com/vcuda-memory", 8}};
  json requests = vgpu;
  requests["cpu"] = cpu;
  return PodOf(name, json::array({Container(requests, vgpu)}));
}

json CpuPod(const std::string& name, const std::string& cpu, const std::string& memory = "1Gi") {
  return PodOf(name, json::array({Container({{"cpu", cpu}, {"memory", memory}})}));
}

json BoundTo(json pod, const std::string& node) {
  pod["spec"]["nodeName"] = node;
  pod["status"]["phase"] = "Running";
  return pod;
}

json Args(const json& pod, std::vector<std::string> nodes) {
  return {{"Pod", pod}, {"NodeNames", nodes}, {"Nodes", nullptr}};
}

std::map<std::string, int64_t> Scores(Extender& e, const json& pod,
                                      const std::vector<std::string>& nodes) {
  std::map<std::string, int64_t> s;
  for (const auto& h : e.Prioritize(Args(pod, nodes))) s[h["Host"]] = h["Score"];
  return s;
}

const placement::Node* NodeNamed(const placement::Cluster& c, const std::string& name) {
  for (const auto& n : c.nodes) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

// kube-scheduler's request rule: app containers and sidecars together, or the largest init
// container with the sidecars before it, plus overhead; the pod's own resources outrank them.
TEST(PodCpuMemory, FollowsKubeSchedulersRule) {
  json pod = PodOf("p", json::array({Container({{"cpu", "500m"}, {"memory", "1Gi"}}),
                                     Container({{"cpu", "1"}, {"memory", "512Mi"}})}));
  EXPECT_EQ(PodCpuMemory(pod), std::make_pair(int64_t{1500}, int64_t{1536}));
  json sidecar = Container({{"cpu", "250m"}, {"memory", "256Mi"}});
  sidecar["restartPolicy"] = "Always";
  pod["spec"]["initContainers"] = json::array({sidecar, Container({{"cpu", "4"}})});
  // Init: 4 CPU + the sidecar's 0.25 > 1.5 + 0.25; memory: 1.5 GiB + 256 MiB.
  EXPECT_EQ(PodCpuMemory(pod), std::make_pair(int64_t{4250}, int64_t{1792}));
  pod["spec"]["overhead"] = {{"cpu", "100m"}, {"memory", "64Mi"}};
  EXPECT_EQ(PodCpuMemory(pod), std::make_pair(int64_t{4350}, int64_t{1856}));
  pod["spec"]["resources"] = {{"requests", {{"cpu", "8"}, {"memory", "8Gi"}}}};
  EXPECT_EQ(PodCpuMemory(pod), std::make_pair(int64_t{8100}, int64_t{8256}));
}

// What a tenant writes is not trusted: garbage counts as nothing, huge values saturate, odd
// shapes are skipped; nothing throws.
TEST(PodCpuMemory, HostileShapes) {
  EXPECT_EQ(PodCpuMemory(json::object()), std::make_pair(int64_t{0}, int64_t{0}));
  EXPECT_EQ(PodCpuMemory({{"spec", "x"}}), std::make_pair(int64_t{0}, int64_t{0}));
  json pod = PodOf("p", json::array({Container({{"cpu", "lots"}, {"memory", -5}}), 7,
                                     Container({{"cpu", 3}, {"memory", "1Mi"}})}));
  EXPECT_EQ(PodCpuMemory(pod), std::make_pair(int64_t{3000}, int64_t{1}));
  json huge = json::array();
  for (int i = 0; i < 64; ++i) huge.push_back(Container({{"cpu", "4P"}, {"memory", "4Pi"}}));
  auto [cpu, mem] = PodCpuMemory(PodOf("h", huge));
  EXPECT_GT(cpu, int64_t{1} << 50);
  EXPECT_GT(mem, 0);
}

// Binpack is the simulator's best-fit: half free CPU, half free GPU. Two nodes with the same GPUs,
// one whose CPU is mostly taken by a pod that holds no GPU: binpack prefers it. Before, the
// extender knew no CPU, the nodes tied and the first ("roomy") won.
TEST(ExtenderCpu, BestFitCountsTheCpuOfEveryPodOnTheNode) {
  Extender e(nullptr, {});
  e.UpsertNode(Node("roomy", 2, "64"));
  e.UpsertNode(Node("busy", 2, "64"));
  e.UpsertPod(BoundTo(CpuPod("web", "56"), "busy"));
  auto s = Scores(e, VgpuPod("p", "4"), {"roomy", "busy"});
  EXPECT_EQ(s["busy"], 10);
  EXPECT_LT(s["roomy"], 10);
  const placement::Cluster snapshot = e.Snapshot();
  const placement::Node* busy = NodeNamed(snapshot, "busy");
  ASSERT_NE(busy, nullptr);
  EXPECT_EQ(busy->cpu_milli_total, 64000);
  EXPECT_EQ(busy->cpu_milli_free, 8000);
  EXPECT_EQ(busy->memory_mib_free, 256 * 1024 - 1024);
  // The pod ends: its CPU is free again, and a pod on a node not served is not counted.
  e.RemovePod(BoundTo(CpuPod("web", "56"), "busy"));
  e.UpsertPod(BoundTo(CpuPod("elsewhere", "8"), "cpu-node"));
  EXPECT_EQ(NodeNamed(e.Snapshot(), "busy")->cpu_milli_free, 64000);
  EXPECT_EQ(e.booked_pods(), 0u);
}

// CPU never refuses a node: kube-scheduler checked the fit, and the extender's count may lag it.
TEST(ExtenderCpu, CpuAndMemoryNeverRefuseANode) {
  Extender e(nullptr, {});
  e.UpsertNode(Node("small", 1, "2"));
  e.UpsertPod(BoundTo(CpuPod("web", "2"), "small"));
  json out = e.Filter(Args(VgpuPod("p", "16"), {"small"}));
  EXPECT_EQ(out["NodeNames"], json::array({"small"}));
}

// With all_pods a pod asking for no vGPU is placed by the policy too: it passes every node
// kube-scheduler found room on (known or not), and binpack sends it where the least CPU and GPU
// would be left -- the node without GPUs before a GPU node with free GPUs. A vGPU pod is still
// unresolvable on a node without GPUs.
TEST(ExtenderCpu, AllPodsPlacesPodsWithoutVgpu) {
  ExtenderOptions o;
  o.all_pods = true;
  Extender e(nullptr, o);
  e.UpsertNode(Node("gpu", 2, "64"));
  e.UpsertNode(Node("cpu-only", 0, "64"));
  json out = e.Filter(Args(CpuPod("c", "4"), {"gpu", "cpu-only", "unknown"}));
  EXPECT_EQ(out["NodeNames"], json::array({"gpu", "cpu-only", "unknown"}));
  auto s = Scores(e, CpuPod("c", "4"), {"gpu", "cpu-only"});
  EXPECT_EQ(s["cpu-only"], 10);
  EXPECT_LT(s["gpu"], 10);
  out = e.Filter(Args(VgpuPod("v", "1"), {"gpu", "cpu-only"}));
  EXPECT_EQ(out["NodeNames"], json::array({"gpu"}));
  EXPECT_THAT(out["FailedAndUnresolvableNodes"]["cpu-only"].get<std::string>(),
              HasSubstr("no gpulet vGPU GPUs"));
  // Without all_pods the same pod is not scored (all zero) and a GPU-less node is not kept.
  Extender plain(nullptr, {});
  plain.UpsertNode(Node("gpu", 2, "64"));
  plain.UpsertNode(Node("cpu-only", 0, "64"));
  EXPECT_EQ(plain.Snapshot().nodes.size(), 1u);
  auto z = Scores(plain, CpuPod("c", "4"), {"gpu", "cpu-only"});
  EXPECT_EQ(z["gpu"], 0);
  EXPECT_EQ(z["cpu-only"], 0);
}

// A prioritize reserves the CPU-only pod's CPU on its node until its bind, so the next decision
// counts a pod still in flight (as it does for GPUs).
TEST(ExtenderCpu, AllPodsReservesCpuInFlight) {
  testing::FakeApiServer api;
  ASSERT_TRUE(api.Start());
  api.CreateNode(Node("a", 1, "32"));
  api.CreateNode(Node("b", 0, "32"));
  k8s::Config c;
  c.server = api.url();
  c.max_attempts = 1;
  k8s::Client client(c);
  ExtenderOptions o;
  o.all_pods = true;
  Extender e(&client, o);
  ASSERT_TRUE(e.Sync().ok());
  json first = CpuPod("first", "30");
  api.CreatePod(first);
  auto s = Scores(e, first, {"a", "b"});
  EXPECT_EQ(s["b"], 10);
  auto cpu_free_b = [&e] { return NodeNamed(e.Snapshot(), "b")->cpu_milli_free; };
  EXPECT_EQ(cpu_free_b(), 2000) << "reserved at prioritize";
  // Bound by the extender: a plain Binding, no GPU annotations.
  json args = {{"PodName", "first"}, {"PodNamespace", "default"}, {"Node", "b"}};
  EXPECT_EQ(e.Bind(args)["Error"], "");
  json pod;
  api.GetPod("default", "first", &pod);
  EXPECT_EQ(pod["spec"]["nodeName"], "b");
  EXPECT_FALSE(pod["metadata"].contains("annotations") &&
               pod["metadata"]["annotations"].contains("gpulet.io/vgpu-node"));
  EXPECT_EQ(cpu_free_b(), 2000);
  // One booking: the bind took over the reservation, it did not count the pod a second time.
  EXPECT_EQ(e.booked_pods(), 1u);
}

}  // namespace
}  // namespace gpulet::scheduler
