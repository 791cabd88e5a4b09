// The reboot readiness controller against the in-repo fake API server over real HTTP.
#include "node/readiness.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "testing/apiserver/fake_apiserver.h"

namespace gpulet::node {
namespace {

using k8s::json;

class ReadinessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.Start());
    k8s::Config cfg;
    cfg.server = server_.url();
    cfg.max_attempts = 2;
    cfg.initial_backoff = std::chrono::milliseconds(1);
    client_ = std::make_unique<k8s::Client>(cfg);
    server_.CreateNode(
        {{"metadata", {{"name", "gpu-1"}}},
         {"spec", {{"taints", json::array({{{"key", "other"}, {"effect", "NoExecute"}}})}}},
         {"status", {{"nodeInfo", {{"bootID", "boot-A"}}}}}});
  }
  json Node() {
    json n;
    EXPECT_TRUE(server_.GetNode("gpu-1", &n));
    return n;
  }
  bool HasTaint(const json& node, const std::string& key) {
    if (!node["spec"].contains("taints")) return false;
    for (const auto& t : node["spec"]["taints"])
      if (t["key"] == key) return true;
    return false;
  }
  json GpuPod(const std::string& name, bool controlled, const std::string& phase,
              const std::string& reason) {
    json pod = {
        {"metadata", {{"name", name}, {"namespace", "default"}}},
        {"spec",
         {{"nodeName", "gpu-1"},
          {"containers", json::array({{{"name", "c"},
                                       {"resources", {{"limits", {{"nvidia.com/gpu", "1"}}}}}}})}}},
        {"status", {{"phase", phase}, {"reason", reason}}}};
    if (controlled)
      pod["metadata"]["ownerReferences"] = json::array({{{"apiVersion", "apps/v1"},
                                                         {"kind", "ReplicaSet"},
                                                         {"name", "rs"},
                                                         {"uid", "u1"},
                                                         {"controller", true}}});
    return pod;
  }
  ReadinessOptions Options() {
    ReadinessOptions o;
    o.node_name = "gpu-1";
    return o;
  }

  // Time by hand, for the remediation window.
  class ManualClock : public Clock {
   public:
    TimePoint Now() const override { return now_; }
    int64_t UnixSeconds() const override { return 1700000000; }
    void SleepFor(Duration d) override { now_ += d; }
    void Advance(Duration d) { now_ += d; }

   private:
    TimePoint now_{std::chrono::seconds(1000)};
  };

  testing::FakeApiServer server_;
  std::unique_ptr<k8s::Client> client_;
  ManualClock clock_;
};

ValidationReport Report(bool ok) {
  return ValidationReport{
      {{"driver", true, "8 GPUs"}, {"device-plugin", ok, ok ? "ok" : "not registered"}}};
}

// A boot that was never validated taints the node and keeps the ready label off until validation
// passes.
TEST_F(ReadinessTest, TaintsUntilValidatedThenLabelsAndUntaints) {
  bool ok = false;
  ReadinessController c(
      client_.get(), [&] { return Report(ok); }, Options());
  auto s = c.ReconcileOnce();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, NodeStackState::kNotReady);
  json n = Node();
  EXPECT_TRUE(HasTaint(n, "gpulet.io/gpu-stack-not-ready"));
  EXPECT_TRUE(HasTaint(n, "other")) << "foreign taints must be kept";
  EXPECT_FALSE(n["metadata"].contains("labels") &&
               n["metadata"]["labels"].contains("gpulet.io/gpu-stack"));

  ok = true;
  s = c.ReconcileOnce();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, NodeStackState::kReady);
  n = Node();
  EXPECT_FALSE(HasTaint(n, "gpulet.io/gpu-stack-not-ready"));
  EXPECT_TRUE(HasTaint(n, "other"));
  EXPECT_EQ(n["metadata"]["labels"]["gpulet.io/gpu-stack"], "ready");
  EXPECT_EQ(n["metadata"]["annotations"]["gpulet.io/validated-boot-id"], "boot-A");
}

// A new boot ID (the node rebooted) removes the ready label and taints again until revalidated.
TEST_F(ReadinessTest, NewBootIdRetaints) {
  bool ok = true;
  ReadinessController c(
      client_.get(), [&] { return Report(ok); }, Options());
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);
  ASSERT_TRUE(client_
                  ->PatchNodeStatus("gpu-1", k8s::PatchType::kMerge,
                                    {{"status", {{"nodeInfo", {{"bootID", "boot-B"}}}}}})
                  .ok());
  ok = false;
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kNotReady);
  json n = Node();
  EXPECT_TRUE(HasTaint(n, "gpulet.io/gpu-stack-not-ready"));
  EXPECT_FALSE(n["metadata"]["labels"].contains("gpulet.io/gpu-stack"));
  ok = true;
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);
  EXPECT_EQ(Node()["metadata"]["annotations"]["gpulet.io/validated-boot-id"], "boot-B");
}

// Controller-owned pods rejected during the window are deleted; bare ones are kept and counted;
// healthy and non-GPU pods are left alone.
TEST_F(ReadinessTest, RemediatesOnlyControllerOwnedRejectedGpuPods) {
  server_.CreatePod(GpuPod("owned", true, "Failed", "UnexpectedAdmissionError"));
  server_.CreatePod(GpuPod("bare", false, "Failed", "UnexpectedAdmissionError"));
  server_.CreatePod(GpuPod("running", true, "Running", ""));
  server_.CreatePod(GpuPod("out-of", true, "Failed", "OutOfnvidia.com/gpu"));
  server_.CreatePod(GpuPod("evicted", true, "Failed", "Evicted"));
  json cpu = GpuPod("cpu-only", true, "Failed", "UnexpectedAdmissionError");
  cpu["spec"]["containers"][0]["resources"]["limits"] = {{"cpu", "1"}};
  server_.CreatePod(cpu);
  ReadinessController c(
      client_.get(), [] { return Report(true); }, Options(), &clock_);
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);
  json p;
  EXPECT_FALSE(server_.GetPod("default", "owned", &p));
  EXPECT_TRUE(server_.GetPod("default", "bare", &p));
  EXPECT_TRUE(server_.GetPod("default", "running", &p));
  EXPECT_TRUE(server_.GetPod("default", "cpu-only", &p));
  EXPECT_FALSE(server_.GetPod("default", "out-of", &p));
  EXPECT_TRUE(server_.GetPod("default", "evicted", &p)) << "other failures are not ours to heal";
  EXPECT_EQ(c.deleted_pods(), 2);
  EXPECT_EQ(c.reported_bare_pods(), 1);
  // The bare pod gets one Warning event, about it, that `kubectl describe pod bare` shows.
  std::vector<json> events = server_.Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["type"], "Warning");
  EXPECT_EQ(events[0]["reason"], "GPUStackNotReadyAtAdmission");
  EXPECT_EQ(events[0]["metadata"]["namespace"], "default");
  EXPECT_EQ(events[0]["involvedObject"]["kind"], "Pod");
  EXPECT_EQ(events[0]["involvedObject"]["name"], "bare");
  EXPECT_EQ(events[0]["source"]["host"], "gpu-1");
  EXPECT_NE(events[0]["message"].get<std::string>().find("delete and recreate"), std::string::npos);
  // A later pass within the window heals pods rejected since (the real kubelet posts its verdict
  // seconds after it starts, after the agent's first pass); the bare pod is not reported again.
  clock_.Advance(std::chrono::seconds(30));
  server_.CreatePod(GpuPod("owned2", true, "Failed", "UnexpectedAdmissionError"));
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);
  EXPECT_FALSE(server_.GetPod("default", "owned2", &p));
  EXPECT_EQ(server_.Events().size(), 1u) << "the bare pod is reported once per boot";
  // Past the window: no more passes (no delete/recreate storm, no list every interval forever).
  clock_.Advance(std::chrono::seconds(91));
  server_.CreatePod(GpuPod("owned3", true, "Failed", "UnexpectedAdmissionError"));
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);
  EXPECT_TRUE(server_.GetPod("default", "owned3", &p));
  EXPECT_EQ(c.deleted_pods(), 3);
}

// The agent starting on a boot validated earlier (it was restarted, or the kubelet came back first
// after a reboot the agent had validated before): it looks for rejected pods for the window too.
TEST_F(ReadinessTest, AgentRestartOnValidatedBootHealsLateRejections) {
  ReadinessController first(
      client_.get(), [] { return Report(true); }, Options(), &clock_);
  ASSERT_EQ(*first.ReconcileOnce(), NodeStackState::kReady);
  ReadinessController c(
      client_.get(), [] { return Report(true); }, Options(), &clock_);
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);  // nothing rejected yet
  clock_.Advance(std::chrono::seconds(10));  // the window's next look (remediate_every)
  server_.CreatePod(GpuPod("late", true, "Failed", "UnexpectedAdmissionError"));
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);
  json p;
  EXPECT_FALSE(server_.GetPod("default", "late", &p))
      << "rejected after the first pass, still healed";
}

// What a validated node costs the API server: within the remediation window its pods are listed
// at most every remediate_every (not every pass); past it a pass is one GET of the Node, nothing
// else (the taint is checked on that Node, not re-read). Before: two GETs a pass and a list every
// pass of the window, every 2 s.
TEST_F(ReadinessTest, AValidatedNodeCostsOneGetAPass) {
  ReadinessController c(
      client_.get(), [] { return Report(true); }, Options(), &clock_);
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);
  auto gets = [&] { return server_.request_count("GET"); };
  int64_t g0 = gets();
  clock_.Advance(std::chrono::seconds(2));
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);
  EXPECT_EQ(gets() - g0, 1) << "2 s later, within the window: the Node only, no list yet";
  clock_.Advance(std::chrono::seconds(8));
  int64_t g1 = gets();
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);
  EXPECT_EQ(gets() - g1, 2) << "10 s after the last look: the Node and one list of its pods";
  clock_.Advance(std::chrono::minutes(3));
  for (int i = 0; i < 3; ++i) {
    int64_t g = gets();
    int64_t other = server_.request_count("PATCH") + server_.request_count("POST") +
                    server_.request_count("DELETE");
    ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);
    EXPECT_EQ(gets() - g, 1) << "past the window, pass " << i;
    EXPECT_EQ(server_.request_count("PATCH") + server_.request_count("POST") +
                  server_.request_count("DELETE"),
              other);
  }
}

// Watched (as under Start()), a validated node costs no request a pass: the Node comes from the
// watch, which shows the controller's own writes before it is trusted. Before: one GET a pass,
// 2 a minute per node at rest, 2000 a minute at 1000 nodes.
TEST_F(ReadinessTest, AWatchedNodeCostsNoRequestAPass) {
  ReadinessController c(
      client_.get(), [] { return Report(true); }, Options(), &clock_);
  ASSERT_TRUE(c.WatchNode(std::chrono::seconds(5)));
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);  // tainted, validated, labelled
  clock_.Advance(std::chrono::minutes(3));                // past the remediation window
  // The watch delivers the last write (the taint lifted) soon; until then a pass GETs.
  for (int i = 0; i < 100 && HasTaint(Node(), "gpulet.io/gpu-stack-not-ready"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);
  int64_t gets = server_.request_count("GET"), patches = server_.request_count("PATCH");
  for (int i = 0; i < 5; ++i) ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);
  EXPECT_EQ(server_.request_count("GET") - gets, 0) << "5 passes at rest";
  EXPECT_EQ(server_.request_count("PATCH") - patches, 0);
}

// Under Start(), a change to the Node wakes a pass at once: the ready label removed by hand is
// back within a second, although the next pass at rest is an hour away (the old loop waited).
TEST_F(ReadinessTest, AWatchedChangeWakesAPass) {
  ReadinessOptions o = Options();
  o.remediate_window = std::chrono::milliseconds(0);
  o.steady_interval = std::chrono::hours(1);
  ReadinessController c(
      client_.get(), [] { return Report(true); }, o);
  c.Start();
  auto labelled = [&] {
    json n = Node();
    return n["metadata"].contains("labels") &&
           n["metadata"]["labels"].value("gpulet.io/gpu-stack", "") == "ready" &&
           !HasTaint(n, "gpulet.io/gpu-stack-not-ready");
  };
  auto within = [&](std::chrono::milliseconds limit) {
    auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      if (labelled()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  };
  ASSERT_TRUE(within(std::chrono::seconds(5))) << "validated at start";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the loop now waits an hour
  // The label removed by hand: the node is no longer "ready", so the pass re-validates it.
  ASSERT_TRUE(client_
                  ->PatchNode("gpu-1", k8s::PatchType::kMerge,
                              {{"metadata", {{"labels", {{"gpulet.io/gpu-stack", nullptr}}}}}})
                  .ok());
  EXPECT_TRUE(within(std::chrono::seconds(2))) << "the watch's event woke a pass";
  c.Stop();
}

// API server errors surface as a Status, never a crash; the next pass recovers.
TEST_F(ReadinessTest, ApiErrorsAreReturned) {
  ReadinessController c(
      client_.get(), [] { return Report(true); }, Options());
  server_.InjectFailures(10, 500);
  EXPECT_FALSE(c.ReconcileOnce().ok());
  server_.InjectFailures(0, 500);
  auto s = c.ReconcileOnce();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, NodeStackState::kReady);
}

// An unknown node name is a clear NotFound naming the node.
TEST_F(ReadinessTest, UnknownNode) {
  ReadinessOptions o = Options();
  o.node_name = "nope";
  ReadinessController c(
      client_.get(), [] { return Report(true); }, o);
  auto s = c.ReconcileOnce();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.status().message().find("nope"), std::string::npos);
}

}  // namespace
}  // namespace gpulet::node

namespace gpulet::node {
namespace {

// The settings can change within a validated boot (a new agent process after a rollout or helm
// upgrade, a reloaded config): each process checks them once on a validated boot and again after
// SettingsChanged(). Passing, the node is left as it is; failing, it is tainted and unlabelled
// until the whole stack validates again with the settings of then.
TEST_F(ReadinessTest, ChangedSettingsAreCheckedOnAValidatedBoot) {
  {
    ReadinessController first(
        client_.get(), [] { return Report(true); }, Options());
    ASSERT_EQ(*first.ReconcileOnce(), NodeStackState::kReady);
  }
  int checks = 0;
  absl::Status settings = absl::OkStatus();
  bool stack_ok = true;
  ReadinessOptions o = Options();
  o.settings_check = [&] {
    ++checks;
    return settings;
  };
  ReadinessController c(
      client_.get(), [&] { return Report(stack_ok); }, o);
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);
  EXPECT_EQ(checks, 1) << "a new process checks its settings on a validated boot";
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);
  EXPECT_EQ(checks, 1) << "once, not on every pass";
  EXPECT_FALSE(HasTaint(Node(), "gpulet.io/gpu-stack-not-ready"));

  settings = absl::FailedPreconditionError("GPU containers would start without their GPUs");
  stack_ok = false;  // the whole stack fails too while the bad settings hold
  c.SettingsChanged();
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kNotReady);
  EXPECT_EQ(checks, 2);
  json n = Node();
  EXPECT_TRUE(HasTaint(n, "gpulet.io/gpu-stack-not-ready"));
  EXPECT_TRUE(HasTaint(n, "other"));
  EXPECT_FALSE(n["metadata"]["labels"].contains("gpulet.io/gpu-stack"));
  EXPECT_EQ(c.last_report().FirstFailure(),
            "settings: GPU containers would start without their GPUs");
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kNotReady);
  EXPECT_TRUE(HasTaint(Node(), "gpulet.io/gpu-stack-not-ready"));

  // Fixed settings: the whole stack validates again on the same boot.
  settings = absl::OkStatus();
  stack_ok = true;
  c.SettingsChanged();
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kReady);
  n = Node();
  EXPECT_FALSE(HasTaint(n, "gpulet.io/gpu-stack-not-ready"));
  EXPECT_EQ(n["metadata"]["labels"]["gpulet.io/gpu-stack"], "ready");
  EXPECT_EQ(checks, 2) << "validating the whole stack covers the settings";
}

// A settings failure whose taint cannot be written is retried on the next pass, not forgotten.
TEST_F(ReadinessTest, AFailedSettingsCheckIsActedOnAfterApiErrors) {
  {
    ReadinessController first(
        client_.get(), [] { return Report(true); }, Options());
    ASSERT_EQ(*first.ReconcileOnce(), NodeStackState::kReady);
  }
  ReadinessOptions o = Options();
  int checks = 0;
  o.settings_check = [&] {
    if (++checks == 1) server_.InjectFailures(10, 500);  // the API fails after the GET
    return absl::FailedPreconditionError("no route");
  };
  ReadinessController c(
      client_.get(), [] { return Report(false); }, o);
  EXPECT_FALSE(c.ReconcileOnce().ok());
  server_.InjectFailures(0, 500);
  ASSERT_EQ(*c.ReconcileOnce(), NodeStackState::kNotReady);
  EXPECT_EQ(checks, 2);
  EXPECT_TRUE(HasTaint(Node(), "gpulet.io/gpu-stack-not-ready"));
}

}  // namespace
}  // namespace gpulet::node
