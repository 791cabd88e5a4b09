// Two replicas of `gpulet scheduler --leader-elect` (the real binary) against the fake API
// server: exactly one answers the extender's verbs and carries the leader label on its pod; a
// replica stopped with SIGTERM hands over within a few retry periods, one killed with SIGKILL
// after the lease duration; pods bound through both leaders in turn never over-commit a GPU.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "testing/apiserver/fake_apiserver.h"
#include "testing/net/loopback.h"
#include "testing/process/spawn.h"

namespace gpulet {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr char kLabel[] = "gpulet.io/extender-leader";

json NodeObj(const std::string& name) {
  json gpus = json::array();
  for (int i = 0; i < 2; ++i) {
    gpus.push_back(
        {{"uuid", "GPU-" + name + "-" + std::to_string(i)}, {"index", i}, {"memoryUnits", 320}});
  }
  return {
      {"metadata", {{"name", name}, {"annotations", {{"gpulet.io/vgpu-gpus", gpus.dump()}}}}},
      {"status",
       {{"capacity", {{"tencent.com/vcuda-core", "200"}, {"tencent.com/vcuda-memory", "640"}}}}}};
}

json VgpuPod(const std::string& name, int cores) {
  json limits = {{"tencent.com/vcuda-core", std::to_string(cores)},
                 {"tencent.com/vcuda-memory", "8"}};
  return {
      {"metadata", {{"name", name}, {"namespace", "default"}}},
      {"spec",
       {{"containers", json::array({{{"name", "main"}, {"resources", {{"limits", limits}}}}})}}}};
}

struct Replica {
  std::string name;
  int port = 0;
  pid_t pid = -1;
};

class SchedulerHa : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(api_.Start());
    char tmpl[] = "/tmp/gpulet-sched-ha-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ + "/kubeconfig") << api_.Kubeconfig();
    for (const char* n : {"n1", "n2"}) api_.CreateNode(NodeObj(n));
    for (const char* r : {"sched-a", "sched-b"}) {
      api_.CreatePod({{"metadata", {{"name", r}, {"namespace", "gpulet-system"}}},
                      {"spec", {{"containers", json::array({{{"name", "scheduler"}}})}}}});
    }
  }
  void TearDown() override {
    for (auto& [n, r] : replicas_) {
      if (r.pid > 0) {
        kill(r.pid, SIGKILL);
        waitpid(r.pid, nullptr, 0);
      }
    }
    std::filesystem::remove_all(dir_);
  }
  void Start(const std::string& name) {
    Replica& r = replicas_[name];
    r.name = name;
    r.port = testing_net::FreePort();
    std::vector<std::string> argv = {std::string(GPULET_BINARY_DIR) + "/bin/gpulet",
                                     "scheduler",
                                     "--kubeconfig",
                                     dir_ + "/kubeconfig",
                                     "--extender-listen",
                                     "127.0.0.1:" + std::to_string(r.port),
                                     "--webhook-listen",
                                     "",
                                     "--leader-elect",
                                     "--leader-elect-lease-duration",
                                     "4s",
                                     "--leader-elect-renew-deadline",
                                     "2s",
                                     "--leader-elect-retry-period",
                                     "100ms"};
    testing_process::SpawnOptions o;
    o.log = dir_ + "/" + name + ".log";
    o.env = {{"POD_NAME", name}, {"POD_NAMESPACE", "gpulet-system"}};
    r.pid = testing_process::Spawn(argv, o);
    ASSERT_GT(r.pid, 0);
  }
  void Stop(const std::string& name, int sig) {
    Replica& r = replicas_[name];
    kill(r.pid, sig);
    waitpid(r.pid, nullptr, 0);
    r.pid = -1;
  }
  // HTTP status of a filter call on the replica (0: no answer).
  int FilterStatus(const std::string& name, const json& pod) {
    httplib::Client cli("127.0.0.1", replicas_[name].port);
    cli.set_connection_timeout(std::chrono::seconds(1));
    json args = {{"Pod", pod}, {"NodeNames", {"n1", "n2"}}, {"Nodes", nullptr}};
    auto res = cli.Post("/scheduler/filter", args.dump(), "application/json");
    return res ? res->status : 0;
  }
  // The replicas answering the verbs now.
  std::vector<std::string> Serving() {
    std::vector<std::string> out;
    for (auto& [n, r] : replicas_) {
      if (r.pid > 0 && FilterStatus(n, VgpuPod("probe", 10)) == 200) out.push_back(n);
    }
    return out;
  }
  // Waits until exactly one replica serves; its name ("" on timeout).
  std::string WaitLeader(milliseconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      auto s = Serving();
      if (s.size() == 1) return s[0];
      std::this_thread::sleep_for(milliseconds(20));
    }
    return "";
  }
  std::string LabelOf(const std::string& pod) {
    json p;
    if (!api_.GetPod("gpulet-system", pod, &p)) return "?";
    return p["metadata"].value("labels", json::object()).value(kLabel, "");
  }
  // The label follows leadership a moment later (the leader labels itself once it serves, so
  // that the Service never routes to a replica that does not answer yet): waits up to 3 s.
  std::string LabelSoon(const std::string& pod, const std::string& want) {
    std::string got;
    for (int i = 0; i < 150 && (got = LabelOf(pod)) != want; ++i) {
      std::this_thread::sleep_for(milliseconds(20));
    }
    return got;
  }
  // kube-scheduler's part for one pod on the leader: filter, prioritize, bind.
  std::string Schedule(const std::string& leader, const json& pod) {
    httplib::Client cli("127.0.0.1", replicas_[leader].port);
    json args = {{"Pod", pod}, {"NodeNames", {"n1", "n2"}}, {"Nodes", nullptr}};
    auto f = cli.Post("/scheduler/filter", args.dump(), "application/json");
    if (!f || f->status != 200) return "filter failed";
    json kept = json::parse(f->body)["NodeNames"];
    if (kept.empty()) return "no node";
    args["NodeNames"] = kept;
    auto p = cli.Post("/scheduler/prioritize", args.dump(), "application/json");
    if (!p || p->status != 200) return "prioritize failed";
    std::string best;
    int64_t top = -1;
    for (const auto& h : json::parse(p->body)) {
      if (h["Score"].get<int64_t>() > top) top = h["Score"], best = h["Host"];
    }
    json b = {{"PodName", pod["metadata"]["name"]},
              {"PodNamespace", "default"},
              {"PodUID", pod["metadata"]["uid"]},
              {"Node", best}};
    auto r = cli.Post("/scheduler/bind", b.dump(), "application/json");
    if (!r || r->status != 200) return "bind failed";
    return json::parse(r->body).value("Error", "?");
  }
  // Per GPU, cores granted by bound pods; every GPU at most 100.
  void CheckNoOvercommit(int* bound) {
    std::map<std::string, int> cores;
    *bound = 0;
    for (const json& p : api_.Pods()) {
      if (p["metadata"]["namespace"] != "default" || p["spec"].value("nodeName", "").empty())
        continue;
      ++*bound;
      int c = std::stoi(p["spec"]["containers"][0]["resources"]["limits"]["tencent.com/vcuda-core"]
                            .get<std::string>());
      cores[p["metadata"]["annotations"]["gpulet.io/vgpu-gpus-0"]] += c;
    }
    for (const auto& [g, c] : cores) EXPECT_LE(c, 100) << g;
  }

  testing::FakeApiServer api_;
  std::string dir_;
  std::map<std::string, Replica> replicas_;
};

TEST_F(SchedulerHa, OneLeaderHandsOverOnStopAndOnDeath) {
  Start("sched-a");
  Start("sched-b");
  std::string first = WaitLeader(milliseconds(10000));
  ASSERT_FALSE(first.empty()) << "no single leader";
  std::string second = first == "sched-a" ? "sched-b" : "sched-a";
  EXPECT_EQ(LabelSoon(first, "true"), "true");
  EXPECT_EQ(LabelOf(second), "");
  EXPECT_EQ(FilterStatus(second, VgpuPod("probe", 10)), 503);  // the follower refuses

  // Pods bound through the first leader.
  int placed = 0;
  for (int i = 0; i < 3; ++i) {
    json pod = api_.CreatePod(VgpuPod("p" + std::to_string(i), 40));
    std::this_thread::sleep_for(milliseconds(50));
    if (Schedule(first, pod).empty()) ++placed;
  }
  EXPECT_EQ(placed, 3);

  // SIGTERM: the Lease is released, the follower leads within a few retry periods.
  auto t0 = std::chrono::steady_clock::now();
  Stop(first, SIGTERM);
  ASSERT_EQ(WaitLeader(milliseconds(5000)), second);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(2500));  // the lease is 4 s
  EXPECT_EQ(LabelOf(first), "");                                         // removed on the way out
  EXPECT_EQ(LabelSoon(second, "true"), "true");

  // The new leader knows the first one's binds: the next pods fill the GPUs without overlap.
  for (int i = 3; i < 6; ++i) {
    json pod = api_.CreatePod(VgpuPod("p" + std::to_string(i), 40));
    std::this_thread::sleep_for(milliseconds(50));
    if (Schedule(second, pod).empty()) ++placed;
  }
  EXPECT_EQ(placed, 6);

  // SIGKILL of the leader (no release): the restarted replica takes over after the lease
  // duration (4 s), not before.
  Start(first);
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_EQ(Serving(), std::vector<std::string>{second});
  t0 = std::chrono::steady_clock::now();
  Stop(second, SIGKILL);
  ASSERT_EQ(WaitLeader(milliseconds(12000)), first);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, milliseconds(3000));
  EXPECT_LT(took, milliseconds(10000));
  for (int i = 6; i < 8; ++i) {
    json pod = api_.CreatePod(VgpuPod("p" + std::to_string(i), 40));
    std::this_thread::sleep_for(milliseconds(50));
    if (Schedule(first, pod).empty()) ++placed;
  }
  int bound = 0;
  CheckNoOvercommit(&bound);
  EXPECT_EQ(bound, placed);
  EXPECT_EQ(placed, 8);  // 4 GPUs x two 40-core pods
  // A ninth does not fit: the filter keeps no node.
  json last = api_.CreatePod(VgpuPod("p8", 40));
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(Schedule(first, last), "no node");
}

// Bad durations are refused before anything starts, naming the flag.
TEST_F(SchedulerHa, BadDurationsAreUsageErrors) {
  std::vector<std::string> argv = {std::string(GPULET_BINARY_DIR) + "/bin/gpulet",
                                   "scheduler",
                                   "--kubeconfig",
                                   dir_ + "/kubeconfig",
                                   "--webhook-listen",
                                   "",
                                   "--leader-elect",
                                   "--leader-elect-renew-deadline",
                                   "20s"};
  pid_t pid = testing_process::Spawn(argv, {.log = dir_ + "/bad.log"});
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_EQ(WEXITSTATUS(status), 2);
  std::ifstream in(dir_ + "/bad.log");
  std::string log((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(log.find("longer than the renew deadline"), std::string::npos) << log;
}

}  // namespace
}  // namespace gpulet
