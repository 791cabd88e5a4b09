// The scheduler extender's verbs on state fed directly (no HTTP): filter reasons, wire shapes,
// binpack vs spread, whole vs fractional exclusivity, bad pods.
#include "scheduler/extender.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "testing/common/fake_clock.h"

namespace gpulet::scheduler {
namespace {

using ::testing::HasSubstr;

json Node(const std::string& name, int gpus, int units) {
  json list = json::array();
  for (int i = 0; i < gpus; ++i) {
    list.push_back(
        {{"uuid", name + "-GPU-" + std::to_string(i)}, {"index", i}, {"memoryUnits", units}});
  }
  return {{"metadata", {{"name", name}, {"annotations", {{"gpulet.io/vgpu-gpus", list.dump()}}}}}};
}

json Pod(const std::string& name, int cores, int mem, const std::string& policy = "") {
  json limits = {{"tencent.com/vcuda-core", cores}};
  if (mem) limits["tencent.com/vcuda-memory"] = mem;
  json pod = {
      {"metadata", {{"name", name}, {"namespace", "default"}, {"uid", "uid-" + name}}},
      {"spec",
       {{"containers", json::array({{{"name", "c"}, {"resources", {{"limits", limits}}}}})}}}};
  if (!policy.empty()) pod["metadata"]["annotations"] = {{"gpulet.io/vgpu-policy", policy}};
  return pod;
}

// A pod bound to `node` with its GPUs recorded, as the extender's bind leaves it.
json Bound(json pod, const std::string& node, const std::string& gpus) {
  pod["spec"]["nodeName"] = node;
  pod["metadata"]["annotations"]["gpulet.io/vgpu-node"] = node;
  pod["metadata"]["annotations"]["gpulet.io/vgpu-gpus-0"] = gpus;
  return pod;
}

json Args(const json& pod, std::vector<std::string> nodes) {
  return {{"Pod", pod}, {"NodeNames", nodes}, {"Nodes", nullptr}};
}

// Filter keeps nodes where one GPU fits and says why the others fail, per node.
TEST(Extender, FilterReasons) {
  Extender e(nullptr, {});
  e.UpsertNode(Node("big", 2, 318));
  e.UpsertNode(Node("small", 2, 63));
  json out = e.Filter(Args(Pod("p", 30, 100), {"big", "small", "cpu-only"}));
  EXPECT_EQ(out["NodeNames"], json::array({"big"}));
  EXPECT_THAT(out["FailedNodes"]["small"].get<std::string>(), HasSubstr("vGPU:"));
  EXPECT_THAT(out["FailedAndUnresolvableNodes"]["cpu-only"].get<std::string>(),
              HasSubstr("no gpulet vGPU GPUs"));
  EXPECT_EQ(out["Error"], "");
}

// Full Node objects (nodeCacheCapable: false) are not echoed by default: the answer is an error
// that says how to configure kube-scheduler, and nothing of the request is re-serialised.
TEST(Extender, FilterRefusesNodeObjectsByDefault) {
  Extender e(nullptr, {});
  e.UpsertNode(Node("a", 1, 64));
  json args = {{"Pod", Pod("p", 30, 8)}, {"Nodes", {{"items", json::array({Node("a", 1, 64)})}}}};
  json out = e.Filter(args);
  EXPECT_THAT(out["Error"].get<std::string>(), HasSubstr("nodeCacheCapable: true"));
  EXPECT_TRUE(out["Nodes"].is_null());
}

// With the opt-out (--extender-echo-node-objects) the answer carries the kept Node objects.
TEST(Extender, FilterWithNodeObjects) {
  ExtenderOptions o;
  o.echo_node_objects = true;
  Extender e(nullptr, o);
  e.UpsertNode(Node("a", 1, 64));
  e.UpsertNode(Node("b", 1, 64));
  e.UpsertPod(Bound(Pod("x", 80, 8), "a", "a-GPU-0"));
  json args = {{"Pod", Pod("p", 30, 8)},
               {"Nodes", {{"items", json::array({Node("a", 1, 64), Node("b", 1, 64)})}}}};
  json out = e.Filter(args);
  ASSERT_EQ(out["Nodes"]["items"].size(), 1u);
  EXPECT_EQ(out["Nodes"]["items"][0]["metadata"]["name"], "b");
  EXPECT_TRUE(out["NodeNames"].is_null());
}

// A pod breaking the rules fails on every node with the rule's message.
TEST(Extender, InvalidPodFailsEverywhere) {
  Extender e(nullptr, {});
  e.UpsertNode(Node("a", 1, 64));
  json out = e.Filter(Args(Pod("p", 150, 8), {"a"}));
  EXPECT_EQ(out["NodeNames"], json::array());
  EXPECT_THAT(out["FailedAndUnresolvableNodes"]["a"].get<std::string>(),
              HasSubstr("multiple of 100"));
}

// Binpack prefers the fuller node; spread the emptier one; the annotation picks per pod.
TEST(Extender, BinpackAndSpread) {
  Extender e(nullptr, {});
  e.UpsertNode(Node("busy", 2, 64));
  e.UpsertNode(Node("idle", 2, 64));
  e.UpsertPod(Bound(Pod("x", 50, 8), "busy", "busy-GPU-0"));
  auto score = [&](const json& pod) {
    std::map<std::string, int64_t> s;
    for (const auto& h : e.Prioritize(Args(pod, {"busy", "idle"}))) s[h["Host"]] = h["Score"];
    return s;
  };
  auto bp = score(Pod("p", 20, 4));
  EXPECT_GT(bp["busy"], bp["idle"]);
  auto sp = score(Pod("p", 20, 4, "spread"));
  EXPECT_GT(sp["idle"], sp["busy"]);
  for (const auto& [h, s] : bp) {
    EXPECT_GE(s, 0);
    EXPECT_LE(s, 10);
  }
  // Unknown policy: all zero, not a crash.
  auto bad = score(Pod("p", 20, 4, "nonsense"));
  EXPECT_EQ(bad["busy"], 0);
}

// fgd and gpulet score against the workload derived from the pods the extender sees: with mostly
// 60-core pods around, a 30-core pod goes to the idle GPU (the busy one would keep a 40-core
// remainder no 60-core pod can use), where binpack (best-fit) fills the busy GPU. Once the
// 60-core pods are gone the workload no longer penalises the remainder.
TEST(Extender, FgdAndGpuletRankByDerivedWorkload) {
  Extender e(nullptr, {.workload_refresh = std::chrono::milliseconds(0)});
  e.UpsertNode(Node("busy", 1, 64));
  e.UpsertNode(Node("idle", 1, 64));
  e.UpsertPod(Bound(Pod("x", 30, 4), "busy", "busy-GPU-0"));
  for (int i = 0; i < 3; ++i) e.UpsertPod(Pod("big" + std::to_string(i), 60, 8));  // pending
  auto score = [&](const std::string& policy) {
    std::map<std::string, int64_t> s;
    for (const auto& h : e.Prioritize(Args(Pod("p", 30, 4, policy), {"busy", "idle"}))) {
      s[h["Host"]] = h["Score"];
    }
    return s;
  };
  auto bp = score("binpack");
  EXPECT_GT(bp["busy"], bp["idle"]);
  for (const char* p : {"fgd", "gpulet"}) {
    auto s = score(p);
    EXPECT_GT(s["idle"], s["busy"]) << p;
  }
  // The derived workload: 30-core and 60-core classes, weighted by the pods seen (1 and 3).
  placement::Workload w = e.workload();
  ASSERT_EQ(w.classes.size(), 2u);
  EXPECT_EQ(w.classes[0].shape.containers[0].milli, 600);
  EXPECT_DOUBLE_EQ(w.classes[0].weight, 0.75);
  for (int i = 0; i < 3; ++i) e.RemovePod(Pod("big" + std::to_string(i), 60, 8));
  // Equal scores now: the first candidate (kube-scheduler's order) alone gets the top score.
  auto after = score("fgd");
  EXPECT_EQ(after["busy"], 10);
  EXPECT_EQ(after["idle"], 9);
  ASSERT_EQ(e.workload().classes.size(), 1u);
}

// A changed pod set rebuilds the workload at most once per workload_refresh, timed by the
// extender's clock: within the interval a decision uses the last workload, after it a new one.
TEST(Extender, WorkloadRefreshRunsOnItsClock) {
  testing::FakeClock clock;
  Extender e(nullptr, {.workload_refresh = std::chrono::seconds(1), .clock = &clock});
  e.UpsertNode(Node("n", 1, 64));
  e.UpsertPod(Pod("a", 30, 4));
  json args = Args(Pod("p", 30, 4, "fgd"), {"n"});
  e.Prioritize(args);  // the first decision builds it
  ASSERT_EQ(e.workload().classes.size(), 1u);
  e.UpsertPod(Pod("b", 60, 8));
  clock.Advance(std::chrono::milliseconds(999));
  e.Prioritize(args);
  EXPECT_EQ(e.workload().classes.size(), 1u);
  clock.Advance(std::chrono::milliseconds(2));
  e.Prioritize(args);
  EXPECT_EQ(e.workload().classes.size(), 2u);
}

// prioritize reuses filter's scores for the same pod only while nothing changed: a pod bound in
// between (here making "idle" the fuller node) changes the ranking.
TEST(Extender, PrioritizeAfterStateChangeRescores) {
  Extender e(nullptr, {});
  e.UpsertNode(Node("busy", 1, 64));
  e.UpsertNode(Node("idle", 1, 64));
  e.UpsertPod(Bound(Pod("x", 30, 4), "busy", "busy-GPU-0"));
  json args = Args(Pod("p", 20, 4), {"busy", "idle"});
  auto score = [&] {
    std::map<std::string, int64_t> s;
    for (const auto& h : e.Prioritize(args)) s[h["Host"]] = h["Score"];
    return s;
  };
  ASSERT_EQ(e.Filter(args)["NodeNames"].size(), 2u);
  auto before = score();
  EXPECT_GT(before["busy"], before["idle"]);
  e.Filter(args);
  e.UpsertPod(Bound(Pod("y", 60, 4), "idle", "idle-GPU-0"));
  auto after = score();
  EXPECT_GT(after["idle"], after["busy"]);
  // A candidate that filter did not see is scored too (not left at 0 by a stale reuse).
  e.Filter(Args(Pod("p", 20, 4), {"busy"}));
  auto both = score();
  EXPECT_GT(both["idle"], both["busy"]);
}

// A GPU booked whole takes no share, and a GPU with a share cannot be booked whole.
TEST(Extender, WholeAndFractionalNeverShare) {
  Extender e(nullptr, {});
  e.UpsertNode(Node("n", 2, 64));
  e.UpsertPod(Bound(Pod("whole", 100, 0), "n", "n-GPU-0"));
  e.UpsertPod(Bound(Pod("share", 10, 1), "n", "n-GPU-1"));
  EXPECT_EQ(e.Filter(Args(Pod("w", 100, 0), {"n"}))["NodeNames"], json::array());
  EXPECT_EQ(e.Filter(Args(Pod("s", 90, 1), {"n"}))["NodeNames"], json::array({"n"}));
  EXPECT_EQ(e.Filter(Args(Pod("s", 91, 1), {"n"}))["NodeNames"], json::array());
  // Releasing the whole pod frees its GPU.
  e.RemovePod(Pod("whole", 100, 0));
  EXPECT_EQ(e.Filter(Args(Pod("w", 100, 0), {"n"}))["NodeNames"], json::array({"n"}));
}

// Pods that arrive before their node are counted once the node appears; a node update keeps them.
TEST(Extender, PodBeforeNodeAndNodeUpdates) {
  Extender e(nullptr, {});
  e.UpsertPod(Bound(Pod("x", 60, 8), "n", "n-GPU-0"));
  e.UpsertNode(Node("n", 1, 64));
  EXPECT_EQ(e.Snapshot().nodes[0].gpus[0].free_milli, 400);
  e.UpsertNode(Node("n", 1, 64));
  EXPECT_EQ(e.Snapshot().nodes[0].gpus[0].free_milli, 400);
  EXPECT_EQ(e.booked_pods(), 1u);
  // Finished pods give their share back.
  json done = Bound(Pod("x", 60, 8), "n", "n-GPU-0");
  done["status"]["phase"] = "Succeeded";
  e.UpsertPod(done);
  EXPECT_EQ(e.Snapshot().nodes[0].gpus[0].free_milli, 1000);
}

// The cluster's order on a new node (found by cluster.install_uninstall): the Node shows its vGPU
// capacity before the agent's inventory annotation, so the extender binds a pod onto a GPU of the
// capacity's made-up names; the agent, which cannot map that name, places the pod itself on a real
// GPU and records it on the pod; the inventory arrives after. The booking must then follow the pod
// to that GPU (it stayed on the made-up index, and the next binpack pod went to the wrong GPU).
TEST(Extender, APodPlacedBeforeTheInventoryFollowsItsRealGpu) {
  Extender e(nullptr, {});
  json capacity = {{"metadata", {{"name", "n"}}},
                   {"status",
                    {{"allocatable",
                      {{"tencent.com/vcuda-core", "200"}, {"tencent.com/vcuda-memory", "128"}}}}}};
  e.UpsertNode(capacity);
  ASSERT_EQ(e.GpuUuids()["n"], (std::vector<std::string>{"n-gpu0", "n-gpu1"}));
  e.UpsertPod(Bound(Pod("a", 30, 4), "n", "n-gpu0"));   // the extender's bind
  e.UpsertPod(Bound(Pod("a", 30, 4), "n", "n-GPU-1"));  // the agent's record: the second GPU
  e.UpsertNode(Node("n", 2, 64));                       // the inventory, at last
  auto c = e.Snapshot();
  ASSERT_EQ(c.nodes.size(), 1u);
  EXPECT_EQ(c.nodes[0].gpus[0].free_milli, 1000) << "nothing is on the first GPU";
  EXPECT_EQ(c.nodes[0].gpus[1].free_milli, 700) << "a's 30 cores are on the second";
  EXPECT_EQ(e.booked_pods(), 1u);
  // And the other order: the inventory first, the agent's record after.
  Extender f(nullptr, {});
  f.UpsertNode(capacity);
  f.UpsertPod(Bound(Pod("a", 30, 4), "n", "n-gpu0"));
  f.UpsertNode(Node("n", 2, 64));
  f.UpsertPod(Bound(Pod("a", 30, 4), "n", "n-GPU-1"));
  c = f.Snapshot();
  EXPECT_EQ(c.nodes[0].gpus[0].free_milli, 1000);
  EXPECT_EQ(c.nodes[0].gpus[1].free_milli, 700);
}

// Found by cluster.nodes: the kubelet admitted two like pods in the other order, and the agent
// swapped their GPUs and recorded them one pod at a time. The first record puts a on b's GPU, full
// until b's record moves b away; a must be counted then, or its GPU looks free and a third pod is
// bound onto it.
TEST(Extender, APodRecordedOnAGpuAnotherStillHoldsIsCountedWhenItFrees) {
  Extender e(nullptr, {});
  e.UpsertNode(Node("n", 2, 64));
  e.UpsertPod(Bound(Pod("a", 90, 8), "n", "n-GPU-0"));
  e.UpsertPod(Bound(Pod("b", 90, 8), "n", "n-GPU-1"));
  e.UpsertPod(Bound(Pod("a", 90, 8), "n", "n-GPU-1"));  // the agent's swap, a first
  EXPECT_EQ(e.Filter(Args(Pod("c", 90, 8), {"n"}))["NodeNames"], json::array({"n"}))
      << "for now a is not counted anywhere";
  e.UpsertPod(Bound(Pod("b", 90, 8), "n", "n-GPU-0"));  // then b
  auto c = e.Snapshot();
  ASSERT_EQ(c.nodes.size(), 1u);
  EXPECT_EQ(c.nodes[0].gpus[0].free_milli, 100) << "b on the first GPU";
  EXPECT_EQ(c.nodes[0].gpus[1].free_milli, 100) << "a counted on the second";
  EXPECT_EQ(e.Filter(Args(Pod("c", 90, 8), {"n"}))["NodeNames"], json::array());
  // Ending b frees only b's share.
  e.RemovePod(Pod("b", 90, 8));
  c = e.Snapshot();
  EXPECT_EQ(c.nodes[0].gpus[0].free_milli, 1000);
  EXPECT_EQ(c.nodes[0].gpus[1].free_milli, 100);
}

// Without the inventory annotation, capacity is split evenly across cores/100 GPUs.
TEST(Extender, NodeFromCapacity) {
  Extender e(nullptr, {});
  e.UpsertNode({{"metadata", {{"name", "n"}}},
                {"status",
                 {{"allocatable",
                   {{"tencent.com/vcuda-core", "800"}, {"tencent.com/vcuda-memory", "2560"}}}}}});
  auto c = e.Snapshot();
  ASSERT_EQ(c.nodes.size(), 1u);
  ASSERT_EQ(c.nodes[0].gpus.size(), 8u);
  EXPECT_EQ(c.nodes[0].gpus[0].memory_total_bytes, 320ll * 256 * 1024 * 1024);
}

// The agent's node annotation is untrusted input: wrong types, huge values, deep nesting and
// endless lists are refused with a reason (the node then offers no vGPU GPUs) instead of an
// exception out of the watch callback (which aborted `gpulet scheduler`: exit 134).
TEST(Extender, MalformedNodeAnnotationIsSkipped) {
  Extender e(nullptr, {});
  auto node = [](const std::string& name, const std::string& annotation) {
    return json{
        {"metadata", {{"name", name}, {"annotations", {{"gpulet.io/vgpu-gpus", annotation}}}}}};
  };
  for (const std::string& bad :
       {std::string(R"([1, {"uuid":"GPU-a","memoryUnits":64}])"),
        std::string(R"([{"uuid":"GPU-a","memoryUnits":"64"}])"),
        std::string(R"([{"uuid":7,"memoryUnits":64}])"),
        std::string(R"([{"uuid":"GPU-a","memoryUnits":64,"healthy":"yes"}])"),
        std::string(R"([{"uuid":"GPU-a","memoryUnits":18446744073709551615}])"),
        std::string(R"([{"uuid":"GPU,b","memoryUnits":64}])"), std::string(R"({"uuid":"GPU-a"})"),
        std::string(100000, '[')}) {
    e.UpsertNode(node("bad", bad));
    EXPECT_TRUE(e.Snapshot().nodes.empty()) << bad.substr(0, 80);
  }
  json many = json::array();
  for (int i = 0; i < 1000; ++i) many.push_back({{"memoryUnits", 1}});
  e.UpsertNode(node("bad", many.dump()));
  EXPECT_TRUE(e.Snapshot().nodes.empty());
  // Capacity is bounded too: 10^18 cores is not 10^16 GPUs.
  e.UpsertNode({{"metadata", {{"name", "cap"}}},
                {"status",
                 {{"capacity",
                   {{"tencent.com/vcuda-core", "1000000000000000000"},
                    {"tencent.com/vcuda-memory", "9000000000000000000"}}}}}});
  auto c = e.Snapshot();
  ASSERT_EQ(c.nodes.size(), 1u);
  EXPECT_EQ(c.nodes[0].gpus.size(), static_cast<size_t>(kMaxNodeGpus));
  // A good annotation still works after all that.
  e.UpsertNode(Node("good", 2, 64));
  EXPECT_EQ(e.Snapshot().nodes.size(), 2u);
}

TEST(Extender, NodeGpuAnnotationErrorsSayWhere) {
  auto r = vgpu::DecodeNodePool(R"([{"memoryUnits":1},{"memoryUnits":-3}])");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("gpulet.io/vgpu-gpus[1].memoryUnits"));
}

// vcuda values that would overflow (memory units * 256 MiB in uint64, whole GPUs in int32) are
// refused by the shared rules before any arithmetic.
TEST(Extender, HugeRequestsAreRefusedNotWrapped) {
  Extender e(nullptr, {});
  e.UpsertNode(Node("a", 1, 64));
  for (auto [cores, mem] : {std::pair<int64_t, int64_t>{30, int64_t{1} << 40},
                            {int64_t{100} << 34, 0},
                            {100LL * 3000000000LL, 0}}) {
    json pod = Pod("p", 1, 1);
    pod["spec"]["containers"][0]["resources"]["limits"] = {{"tencent.com/vcuda-core", cores}};
    if (mem) pod["spec"]["containers"][0]["resources"]["limits"]["tencent.com/vcuda-memory"] = mem;
    json out = e.Filter(Args(pod, {"a"}));
    EXPECT_EQ(out["NodeNames"], json::array()) << cores << " " << mem;
    EXPECT_THAT(out["FailedAndUnresolvableNodes"]["a"].get<std::string>(), HasSubstr("too large"));
  }
}

TEST(Extender, Dns1123Names) {
  EXPECT_TRUE(IsDns1123Label("default"));
  EXPECT_TRUE(IsDns1123Subdomain("gpu-node-1.example.com"));
  for (const char* bad : {"", "-a", "a-", "A", "a_b", "a/b", "..", "a..b", "a%2Fb"}) {
    EXPECT_FALSE(IsDns1123Subdomain(bad)) << bad;
  }
  EXPECT_FALSE(IsDns1123Label("a.b"));
  EXPECT_FALSE(IsDns1123Label(std::string(64, 'a')));
}

// Bind validates the names before anything reaches an API path.
TEST(Extender, BindRefusesNamesThatAreNotKubernetesNames) {
  Extender e(nullptr, {});
  EXPECT_THAT(e.Bind({{"PodName", "p"}, {"PodNamespace", "../kube-system"}, {"Node", "n"}})["Error"]
                  .get<std::string>(),
              HasSubstr("DNS-1123"));
  EXPECT_THAT(e.Bind({{"PodName", "p/binding"}, {"PodNamespace", "d"}, {"Node", "n"}})["Error"]
                  .get<std::string>(),
              HasSubstr("DNS-1123"));
  EXPECT_THAT(e.Bind({{"PodName", "p"}, {"PodNamespace", "d"}, {"Node", "n?x=1"}})["Error"]
                  .get<std::string>(),
              HasSubstr("DNS-1123"));
  EXPECT_THAT(
      e.Bind({{"PodName", 5}, {"PodNamespace", "d"}, {"Node", "n"}})["Error"].get<std::string>(),
      HasSubstr("required"));
}

// Bind without an API client reports an error in the wire shape instead of crashing.
TEST(Extender, BindNeedsApi) {
  Extender e(nullptr, {});
  json out = e.Bind({{"PodName", "p"}, {"PodNamespace", "default"}, {"Node", "n"}});
  EXPECT_THAT(out["Error"].get<std::string>(), HasSubstr("no API server client"));
  EXPECT_THAT(e.Bind(json::object())["Error"].get<std::string>(), HasSubstr("required"));
}

}  // namespace
}  // namespace gpulet::scheduler

namespace gpulet::scheduler {
namespace {

// Scoring is split between threads on large clusters; the answers must not depend on how many.
TEST(Extender, SameAnswersWithAnyNumberOfScoringThreads) {
  std::vector<std::string> names;
  std::vector<std::unique_ptr<Extender>> ex;
  for (int threads : {0, 1, 3}) {
    ex.push_back(std::make_unique<Extender>(nullptr, ExtenderOptions{.score_threads = threads}));
  }
  for (int n = 0; n < 500; ++n) {
    names.push_back(absl::StrCat("node-", n));
    for (auto& e : ex) e->UpsertNode(Node(names.back(), 4, 100 + (n % 7) * 30));
  }
  // Occupy GPUs unevenly so scores differ between nodes; some nodes cannot take the probe.
  for (int n = 0; n < 500; n += 3) {
    json p = Bound(Pod(absl::StrCat("b", n), 10 + n % 80, 1 + n % 90), names[n],
                   absl::StrCat(names[n], "-GPU-", n % 4));
    for (auto& e : ex) e->UpsertPod(p);
  }
  for (const char* policy : {"", "gpulet", "spread"}) {
    for (int cores : {20, 70, 100}) {
      json args = Args(Pod("probe", cores, 150, policy), names);
      const json want_f = ex[0]->Filter(args), want_p = ex[0]->Prioritize(args);
      EXPECT_FALSE(want_f["NodeNames"].empty()) << policy << " " << cores;
      for (size_t i = 1; i < ex.size(); ++i) {
        EXPECT_EQ(ex[i]->Filter(args), want_f) << policy << " " << cores;
        EXPECT_EQ(ex[i]->Prioritize(args), want_p) << policy << " " << cores;
      }
    }
  }
}

}  // namespace
}  // namespace gpulet::scheduler
