// Bind is the extender's privileged verb (it writes GPU assignments and creates Bindings with a
// cluster-wide ServiceAccount): it must do only what kube-scheduler would legitimately ask. The
// fake API server holds the pods; each refusal names its reason and leaves the pod unbound.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "scheduler/extender.h"
#include "testing/apiserver/fake_apiserver.h"
#include "testing/common/fake_clock.h"

namespace gpulet::scheduler {
namespace {

using ::testing::HasSubstr;

class BindTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(api_.Start());
    api_.CreateNode(
        {{"metadata",
          {{"name", "gpu-node"},
           {"annotations", {{"gpulet.io/vgpu-gpus", R"([{"uuid":"GPU-a","memoryUnits":64}])"}}}}}});
    k8s::Config c;
    c.server = api_.url();
    c.max_attempts = 1;
    client_ = std::make_unique<k8s::Client>(c);
    ExtenderOptions o;
    o.clock = &clock_;
    ext_ = std::make_unique<Extender>(client_.get(), o);
    ASSERT_TRUE(ext_->Sync().ok());
  }
  json Pod(const std::string& name, bool vgpu = true) {
    json limits = vgpu ? json{{"tencent.com/vcuda-core", 30}, {"tencent.com/vcuda-memory", 8}}
                       : json{{"cpu", "1"}};
    return {
        {"metadata", {{"name", name}, {"namespace", "default"}}},
        {"spec",
         {{"containers", json::array({{{"name", "c"}, {"resources", {{"limits", limits}}}}})}}}};
  }
  std::string Bind(const std::string& name, const std::string& node = "gpu-node",
                   const std::string& uid = "") {
    json args = {{"PodName", name}, {"PodNamespace", "default"}, {"Node", node}};
    if (!uid.empty()) args["PodUID"] = uid;
    return ext_->Bind(args)["Error"].get<std::string>();
  }
  std::string NodeOf(const std::string& name) {
    json pod;
    api_.GetPod("default", name, &pod);
    return pod["spec"].value("nodeName", "");
  }

  testing::FakeApiServer api_;
  testing::FakeClock clock_;
  std::unique_ptr<k8s::Client> client_;
  std::unique_ptr<Extender> ext_;
};

TEST_F(BindTest, BindsAPendingVgpuPod) {
  api_.CreatePod(Pod("ok"));
  EXPECT_EQ(Bind("ok"), "");
  EXPECT_EQ(NodeOf("ok"), "gpu-node");
}

TEST_F(BindTest, RefusesPodsWithoutVgpuRequests) {
  api_.CreatePod(Pod("plain", false));
  EXPECT_THAT(Bind("plain"), HasSubstr("asks for no vGPU resources"));
  EXPECT_EQ(NodeOf("plain"), "");
}

TEST_F(BindTest, RefusesBoundAndNonPendingPods) {
  json bound = Pod("bound");
  bound["spec"]["nodeName"] = "other";
  api_.CreatePod(bound);
  EXPECT_THAT(Bind("bound"), HasSubstr("already bound to other"));
  api_.CreatePod(Pod("done"));
  api_.SetPodPhase("default", "done", "Succeeded");
  EXPECT_THAT(Bind("done"), HasSubstr("not Pending"));
  EXPECT_EQ(NodeOf("done"), "");
}

TEST_F(BindTest, RefusesPodsOfAnotherScheduler) {
  json pod = Pod("foreign");
  pod["spec"]["schedulerName"] = "someone-else";
  api_.CreatePod(pod);
  EXPECT_THAT(Bind("foreign"), HasSubstr("belongs to scheduler \"someone-else\""));
  EXPECT_EQ(NodeOf("foreign"), "");
}

TEST_F(BindTest, RefusesUnknownNodesAndWrongUids) {
  api_.CreatePod(Pod("p"));
  EXPECT_THAT(Bind("p", "no-such-node"), HasSubstr("node no-such-node"));
  EXPECT_THAT(Bind("p", "gpu-node", "not-its-uid"), HasSubstr("is not the pod asked for"));
  EXPECT_EQ(NodeOf("p"), "");
}

// A Binding whose outcome is unknown (a 5xx, a dropped connection, a 409 after our own first
// attempt went through) may have been written: the pod may be bound to the GPUs chosen, so they
// stay booked until the watch shows the pod or the reservation expires. Before, they were freed
// at once, and the scale harness's API cut over-committed a GPU: the next pods took the share of
// one whose Binding had gone through. One GPU, 30 cores a pod: a's bind fails with 503, b and c
// bind, d must not (a may hold 30); once a's reservation has expired without the pod seen bound,
// d fits.
TEST_F(BindTest, AnUnknownBindOutcomeKeepsTheGpusBooked) {
  for (const char* n : {"a", "b", "c", "d"}) api_.CreatePod(Pod(n));
  api_.InjectFailures(1, 503, "POST");
  EXPECT_THAT(Bind("a"), HasSubstr("503"));
  EXPECT_EQ(Bind("b"), "");
  EXPECT_EQ(Bind("c"), "");
  EXPECT_THAT(Bind("d"), HasSubstr("no longer fits")) << "a's 30 cores may be taken";
  EXPECT_EQ(NodeOf("d"), "");
  clock_.Advance(ExtenderOptions().reservation_ttl + std::chrono::seconds(1));
  EXPECT_EQ(Bind("d"), "") << "a's reservation expired without a bound pod";
}

// A definite refusal (403, 404, 422: nothing written) frees the GPUs at once.
TEST_F(BindTest, ARefusedBindFreesTheGpus) {
  for (const char* n : {"a", "b", "c", "d"}) api_.CreatePod(Pod(n));
  api_.InjectFailures(1, 403, "POST");
  EXPECT_THAT(Bind("a"), HasSubstr("403"));
  for (const char* n : {"b", "c", "d"}) EXPECT_EQ(Bind(n), "") << n;
}

}  // namespace
}  // namespace gpulet::scheduler
