// End to end: a 4-node simulated cluster in the fake API server, the extender served over HTTP,
// and a stand-in for kube-scheduler that calls filter -> prioritize -> bind for each pod. The test
// keeps its own accounting from the pods' annotations (not from the extender) and checks no GPU is
// ever over 100 cores or its memory, across an extender restart and concurrent binds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "scheduler/extender.h"
#include "testing/apiserver/fake_apiserver.h"

namespace gpulet::scheduler {
namespace {

json NodeObj(const std::string& name, int gpus, int units) {
  json list = json::array();
  for (int i = 0; i < gpus; ++i) {
    list.push_back(
        {{"uuid", "GPU-" + name + "-" + std::to_string(i)}, {"index", i}, {"memoryUnits", units}});
  }
  return {{"metadata", {{"name", name}, {"annotations", {{"gpulet.io/vgpu-gpus", list.dump()}}}}},
          {"status",
           {{"capacity",
             {{"tencent.com/vcuda-core", std::to_string(gpus * 100)},
              {"tencent.com/vcuda-memory", std::to_string(gpus * units)}}}}}};
}

json PodObj(const std::string& name, int cores, int mem) {
  json limits = {{"tencent.com/vcuda-core", std::to_string(cores)}};
  if (mem) limits["tencent.com/vcuda-memory"] = std::to_string(mem);
  return {
      {"metadata", {{"name", name}, {"namespace", "default"}}},
      {"spec",
       {{"containers", json::array({{{"name", "main"}, {"resources", {{"limits", limits}}}}})}}}};
}

// The extender behind its HTTP endpoint, restartable. Without `watch` it only lists at start,
// so what keeps it from double-booking is its own reservation at bind (as when the watch lags).
class ExtenderProcess {
 public:
  explicit ExtenderProcess(const std::string& api_url, bool watch = true,
                           ExtenderOptions options = {}) {
    k8s::Config c;
    c.server = api_url;
    c.initial_backoff = std::chrono::milliseconds(1);
    client_ = std::make_unique<k8s::Client>(c);
    extender_ = std::make_unique<Extender>(client_.get(), std::move(options));
    EXPECT_TRUE(extender_->Sync().ok());
    if (watch) extender_->StartWatching();
    extender_->Register(server_, "/scheduler");
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~ExtenderProcess() {
    server_.stop();
    thread_.join();
    extender_->StopWatching();
  }
  json Post(const std::string& verb, const json& body) {
    httplib::Client cli("127.0.0.1", port_);
    auto r = cli.Post("/scheduler/" + verb, body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200);
    return r ? json::parse(r->body, nullptr, false) : json();
  }
  Extender& extender() { return *extender_; }
  int port() const { return port_; }

 private:
  std::unique_ptr<k8s::Client> client_;
  std::unique_ptr<Extender> extender_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
};

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(api_.Start());
    // 4 nodes: two with 2 x 16 GiB-class GPUs (63 units), two with 2 x 80 GiB-class (318).
    caps_ = {{"v100-a", {2, 63}}, {"v100-b", {2, 63}}, {"h100-a", {2, 318}}, {"h100-b", {2, 318}}};
    for (const auto& [n, c] : caps_) api_.CreateNode(NodeObj(n, c.first, c.second));
  }

  // kube-scheduler's scheduling cycle: filter, prioritize, highest score wins (ties: first).
  // Returns the node, or "" when no node passed the filter.
  std::string Decide(ExtenderProcess& ext, const json& pod) {
    std::vector<std::string> names;
    for (const auto& [n, c] : caps_) names.push_back(n);
    json args = {{"Pod", pod}, {"NodeNames", names}, {"Nodes", nullptr}};
    json filtered = ext.Post("filter", args);
    if (filtered["NodeNames"].empty()) return "";
    args["NodeNames"] = filtered["NodeNames"];
    if (filtered["NodeNames"].size() == 1) return filtered["NodeNames"][0];  // as kube-scheduler
    json prio = ext.Post("prioritize", args);
    std::string best;
    int64_t best_score = -1;
    for (const auto& h : prio) {
      if (h["Score"].get<int64_t>() > best_score) {
        best_score = h["Score"];
        best = h["Host"];
      }
    }
    return best;
  }
  // Its binding cycle: the extender's bind verb. Returns the error ("" when bound).
  std::string BindTo(ExtenderProcess& ext, const json& pod, const std::string& node) {
    json res = ext.Post("bind", {{"PodName", pod["metadata"]["name"]},
                                 {"PodNamespace", "default"},
                                 {"PodUID", pod["metadata"]["uid"]},
                                 {"Node", node}});
    return res.value("Error", "?");
  }

  // Both cycles, one after the other. Returns the node, or "" when no node passed the filter;
  // bind errors are test failures.
  std::string Schedule(ExtenderProcess& ext, const json& pod, std::string* bind_error = nullptr) {
    std::string best = Decide(ext, pod);
    if (best.empty()) return "";
    std::string err = BindTo(ext, pod, best);
    if (bind_error) {
      *bind_error = err;
    } else {
      EXPECT_EQ(err, "") << pod["metadata"]["name"];
    }
    return err.empty() ? best : "";
  }

  // Independent accounting from the API server: per GPU UUID, cores and units held by bound pods.
  void CheckNoGpuOverbooked(int* bound_pods) {
    std::map<std::string, std::pair<int, int>> used;
    std::map<std::string, int> units;
    for (const auto& [n, c] : caps_) {
      for (int i = 0; i < c.first; ++i) units["GPU-" + n + "-" + std::to_string(i)] = c.second;
    }
    *bound_pods = 0;
    for (const json& p : api_.Pods()) {
      // Unbound pods have no spec.nodeName at all, as on kube-apiserver.
      if (p["spec"].value("nodeName", "").empty()) continue;
      ++*bound_pods;
      const json& ann = p["metadata"]["annotations"];
      ASSERT_EQ(ann["gpulet.io/vgpu-node"], p["spec"]["nodeName"]);
      const json& lim = p["spec"]["containers"][0]["resources"]["limits"];
      int cores = std::stoi(lim["tencent.com/vcuda-core"].get<std::string>());
      int mem = lim.contains("tencent.com/vcuda-memory")
                    ? std::stoi(lim["tencent.com/vcuda-memory"].get<std::string>())
                    : 0;
      std::string gpus = ann["gpulet.io/vgpu-gpus-0"];
      std::vector<std::string> list;
      for (size_t s = 0, e; s < gpus.size(); s = e + 1) {
        e = gpus.find(',', s);
        if (e == std::string::npos) e = gpus.size();
        list.push_back(gpus.substr(s, e - s));
      }
      ASSERT_EQ(list.size(), cores >= 100 ? size_t(cores / 100) : 1u) << p.dump();
      for (const auto& g : list) {
        ASSERT_TRUE(units.count(g)) << g;
        ASSERT_EQ(g.rfind("GPU-" + p["spec"]["nodeName"].get<std::string>() + "-", 0), 0u);
        used[g].first += cores >= 100 ? 100 : cores;
        used[g].second += cores >= 100 ? units[g] : mem;
      }
    }
    for (const auto& [g, u] : used) {
      EXPECT_LE(u.first, 100) << g;
      EXPECT_LE(u.second, units[g]) << g;
    }
  }

  testing::FakeApiServer api_;
  std::map<std::string, std::pair<int, int>> caps_;
};

// Twenty fractional pods of mixed sizes through filter/prioritize/bind, with the extender
// restarted after the tenth: nothing lost or double-booked, no GPU over 100 cores or its memory.
TEST_F(ClusterTest, TwentyPodsWithRestart) {
  const int shapes[20][2] = {{30, 20},  {50, 40}, {20, 8},  {70, 60}, {10, 4},   {100, 0}, {25, 30},
                             {40, 200}, {60, 10}, {15, 2},  {35, 50}, {45, 100}, {5, 1},   {80, 30},
                             {20, 250}, {30, 20}, {55, 16}, {10, 63}, {40, 10},  {5, 5}};
  auto ext = std::make_unique<ExtenderProcess>(api_.url());
  int placed = 0, unschedulable = 0;
  for (int i = 0; i < 20; ++i) {
    json pod = api_.CreatePod(PodObj("pod-" + std::to_string(i), shapes[i][0], shapes[i][1]));
    std::string node = Schedule(*ext, pod);
    node.empty() ? ++unschedulable : ++placed;
    // Wait for the watch to deliver the bind before the next pod (as the real scheduler would
    // see the cache update); the extender's own reservation already covers the gap.
    int bound = 0;
    CheckNoGpuOverbooked(&bound);
    ASSERT_EQ(bound, placed);
    if (i == 9) {
      placement::Cluster before = ext->extender().Snapshot();
      ext.reset();  // the extender process goes away mid-way ...
      ext = std::make_unique<ExtenderProcess>(api_.url());  // ... and comes back
      placement::Cluster after = ext->extender().Snapshot();
      ASSERT_EQ(before.nodes.size(), after.nodes.size());
      for (size_t n = 0; n < before.nodes.size(); ++n) {
        for (size_t g = 0; g < before.nodes[n].gpus.size(); ++g) {
          EXPECT_EQ(before.nodes[n].gpus[g].free_milli, after.nodes[n].gpus[g].free_milli);
          EXPECT_EQ(before.nodes[n].gpus[g].memory_free_bytes,
                    after.nodes[n].gpus[g].memory_free_bytes);
        }
      }
      EXPECT_EQ(ext->extender().booked_pods(), size_t(placed));
    }
  }
  EXPECT_GE(placed, 18) << "unschedulable: " << unschedulable;
  // Deleting a pod gives its share back (through the watch).
  std::string victim = "pod-1";
  json v;
  ASSERT_TRUE(api_.GetPod("default", victim, &v));
  size_t booked = ext->extender().booked_pods();
  ASSERT_TRUE(api_.DeletePod("default", victim));
  for (int i = 0; i < 400 && ext->extender().booked_pods() == booked; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(ext->extender().booked_pods(), booked - 1);
}

// Eight 30-core pods bound to one 2-GPU node at once: binds are serialised, six fit (three per
// GPU) and the rest are refused with a reason; nothing over 100 cores. No watch: the binds'
// own reservations must do it.
TEST_F(ClusterTest, ConcurrentBindsOnOneNode) {
  ExtenderProcess ext(api_.url(), /*watch=*/false);
  std::vector<json> pods;
  for (int i = 0; i < 8; ++i)
    pods.push_back(api_.CreatePod(PodObj("c" + std::to_string(i), 30, 4)));
  std::vector<std::string> errors(8);
  // Connections opened beforehand (keep-alive, as kube-scheduler holds them): eight connects at
  // once overflow cpp-httplib's listen backlog of 5 and cost a 1 s SYN retransmit.
  std::vector<std::unique_ptr<httplib::Client>> clients;
  for (int i = 0; i < 8; ++i) {
    clients.push_back(std::make_unique<httplib::Client>("127.0.0.1", ext.port()));
    clients.back()->set_keep_alive(true);
    ASSERT_TRUE(clients.back()->Get("/scheduler/healthz"));
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      json body = {{"PodName", pods[i]["metadata"]["name"]},
                   {"PodNamespace", "default"},
                   {"PodUID", pods[i]["metadata"]["uid"]},
                   {"Node", "v100-a"}};
      auto r = clients[i]->Post("/scheduler/bind", body.dump(), "application/json");
      errors[i] = r && r->status == 200 ? json::parse(r->body, nullptr, false).value("Error", "?")
                                        : "no answer";
    });
  }
  for (auto& t : threads) t.join();
  int ok = 0;
  for (const auto& e : errors) {
    if (e.empty()) {
      ++ok;
    } else {
      EXPECT_THAT(e, ::testing::HasSubstr("no longer fits on v100-a"));
    }
  }
  EXPECT_EQ(ok, 6);
  int bound = 0;
  CheckNoGpuOverbooked(&bound);
  EXPECT_EQ(bound, 6);
}

// A Binding that fails with a 500 may have been written: the pod's GPUs stay booked (as its
// reservation) and kube-scheduler's retry of the same pod binds on them. A definite refusal (422:
// nothing written) frees them at once.
TEST_F(ClusterTest, FailedBindKeepsTheBookingARefusedOneFreesIt) {
  ExtenderProcess ext(api_.url());
  json pod = api_.CreatePod(PodObj("p", 50, 10));
  api_.InjectFailures(100, 500, "POST");
  std::string err;
  Schedule(ext, pod, &err);
  EXPECT_THAT(err, ::testing::HasSubstr("HTTP 500"));
  api_.InjectFailures(0, 500);
  EXPECT_EQ(ext.extender().booked_pods(), 1u);
  EXPECT_FALSE(Schedule(ext, pod).empty()) << "the pod's own reservation does not block it";
  EXPECT_EQ(ext.extender().booked_pods(), 1u);

  json refused = api_.CreatePod(PodObj("q", 50, 10));
  api_.InjectFailures(100, 422, "POST");
  Schedule(ext, refused, &err);
  EXPECT_THAT(err, ::testing::HasSubstr("HTTP 422"));
  api_.InjectFailures(0, 422);
  EXPECT_EQ(ext.extender().booked_pods(), 1u) << "only p's booking is left";
}

// The rest of a large cluster (Nodes without vGPU, pods asking for none) is listed in pages and
// not held; a vGPU pod on the list's last page is still booked where its annotations say.
TEST_F(ClusterTest, ListsInPagesAndHoldsOnlyTheVgpuPart) {
  const int n = k8s::kListPage + 100;
  for (int i = 0; i < n; ++i) {
    std::string name = absl::StrCat("plain-", i);
    api_.CreateNode(
        {{"metadata", {{"name", name}}}, {"status", {{"capacity", {{"nvidia.com/gpu", "8"}}}}}});
    api_.CreatePod({{"metadata", {{"name", absl::StrCat("p-", i)}, {"namespace", "default"}}},
                    {"spec",
                     {{"nodeName", name},
                      {"containers",
                       json::array({{{"name", "main"},
                                     {"resources", {{"limits", {{"nvidia.com/gpu", "1"}}}}}}})}}},
                    {"status", {{"phase", "Running"}}}});
  }
  json bound = PodObj("zz-bound", 60, 10);
  bound["spec"]["nodeName"] = "h100-a";
  // What the list trims away (other annotations, managedFields, env) must not change the booking.
  bound["metadata"]["annotations"] = {
      {"gpulet.io/vgpu-node", "h100-a"},
      {"gpulet.io/vgpu-gpus-0", "GPU-h100-a-0"},
      {"kubectl.kubernetes.io/last-applied-configuration", std::string(20000, 'x')}};
  bound["metadata"]["managedFields"] = json::array({{{"manager", "kubectl"}}});
  bound["spec"]["containers"][0]["env"] = json::array({{{"name", "A"}, {"value", "b"}}});
  api_.CreatePod(bound);
  ExtenderProcess ext(api_.url());
  EXPECT_EQ(ext.extender().Snapshot().nodes.size(), caps_.size());
  EXPECT_EQ(ext.extender().booked_pods(), 1u);
  // 60 of GPU-h100-a-0's cores are booked: a 50-core pod goes anywhere but there.
  json pod = api_.CreatePod(PodObj("next", 50, 10));
  EXPECT_FALSE(Schedule(ext, pod).empty());
  std::string gpu;
  for (const json& p : api_.Pods())
    if (p["metadata"]["name"] == "next")
      gpu = p["metadata"]["annotations"]["gpulet.io/vgpu-gpus-0"];
  EXPECT_FALSE(gpu.empty());
  EXPECT_NE(gpu, "GPU-h100-a-0");
}

// kube-scheduler decides the next pod before the previous pod's bind arrives (its binding cycle
// runs asynchronously). Eight 60-core pods, one per GPU at most, all decided before any bind:
// each decision counts the ones before it (the extender reserved their GPUs at prioritize), so
// every bind succeeds on a GPU of its own. The binds read the pods from the watch cache: no GET,
// one POST (the Binding, carrying the assignment) each.
TEST_F(ClusterTest, BindsInFlightAreCounted) {
  ExtenderProcess ext(api_.url());
  std::vector<json> pods;
  for (int i = 0; i < 8; ++i)
    pods.push_back(api_.CreatePod(PodObj("f" + std::to_string(i), 60, 4)));
  for (int i = 0; i < 400 && ext.extender().Snapshot().nodes.size() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the watch delivers the pods
  std::vector<std::string> chosen;
  for (const json& p : pods) chosen.push_back(Decide(ext, p));
  EXPECT_EQ(ext.extender().reserved_pods(), 8u);
  int64_t gets = api_.request_count("GET"), posts = api_.request_count("POST");
  for (size_t i = 0; i < pods.size(); ++i) {
    ASSERT_FALSE(chosen[i].empty()) << i;
    EXPECT_EQ(BindTo(ext, pods[i], chosen[i]), "") << i;
  }
  EXPECT_EQ(api_.request_count("GET") - gets, 0);
  EXPECT_EQ(api_.request_count("POST") - posts, 8);
  EXPECT_EQ(ext.extender().reserved_pods(), 0u);
  int bound = 0;
  CheckNoGpuOverbooked(&bound);
  EXPECT_EQ(bound, 8);
  // A ninth does not fit anywhere: the filter says so instead of a bind refusing it.
  EXPECT_EQ(Decide(ext, api_.CreatePod(PodObj("f8", 60, 4))), "");
}

// A reservation follows the bind to whichever node kube-scheduler chose, ends when its pod is
// deleted, and expires when no bind comes.
TEST_F(ClusterTest, ReservationsFollowBindsAndExpire) {
  ExtenderProcess ext(api_.url(), true, {.reservation_ttl = std::chrono::milliseconds(200)});
  auto free_milli = [&](const std::string& node) {
    int64_t sum = 0;
    for (const auto& n : ext.extender().Snapshot().nodes) {
      for (const auto& g : n.gpus) sum += n.name == node ? g.free_milli : 0;
    }
    return sum;
  };
  json a = api_.CreatePod(PodObj("a", 60, 4));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::string reserved_on = Decide(ext, a);
  ASSERT_FALSE(reserved_on.empty());
  EXPECT_EQ(free_milli(reserved_on), 2000 - 600);
  std::string other = reserved_on == "h100-a" ? "h100-b" : "h100-a";
  EXPECT_EQ(BindTo(ext, a, other), "");  // another plugin outweighed the extender
  EXPECT_EQ(free_milli(reserved_on), 2000);
  EXPECT_EQ(free_milli(other), 2000 - 600);
  EXPECT_EQ(ext.extender().reserved_pods(), 0u);

  json b = api_.CreatePod(PodObj("b", 60, 4));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_FALSE(Decide(ext, b).empty());
  EXPECT_EQ(ext.extender().reserved_pods(), 1u);
  ASSERT_TRUE(api_.DeletePod("default", "b"));
  for (int i = 0; i < 400 && ext.extender().reserved_pods() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(ext.extender().reserved_pods(), 0u);

  json c = api_.CreatePod(PodObj("c", 60, 4));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_FALSE(Decide(ext, c).empty());
  EXPECT_EQ(ext.extender().reserved_pods(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // The next filter releases what expired (and c, decided again, reserves anew).
  json d = api_.CreatePod(PodObj("d", 60, 4));
  std::vector<std::string> names;
  for (const auto& [n, cap] : caps_) names.push_back(n);
  ext.Post("filter", {{"Pod", d}, {"NodeNames", names}, {"Nodes", nullptr}});
  EXPECT_EQ(ext.extender().reserved_pods(), 0u);
  int bound = 0;
  CheckNoGpuOverbooked(&bound);
  EXPECT_EQ(bound, 1);
}

}  // namespace
}  // namespace gpulet::scheduler
