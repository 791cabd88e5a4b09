// node::OwnerDeletion (the uninstall-on-delete container's question: is this pod's DaemonSet being
// deleted?) against the in-repo fake API server over real HTTP: the watch's answer for background
// and foreground deletion, a rolling update that must not count, and the one GET at termination
// when the watch has not answered.
#include "node/owner_deletion.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "testing/apiserver/fake_apiserver.h"

namespace gpulet::node {
namespace {

using k8s::json;
using namespace std::chrono_literals;

class OwnerDeletionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.Start());
    k8s::Config cfg;
    cfg.server = server_.url();
    cfg.max_attempts = 1;
    client_ = std::make_unique<k8s::Client>(cfg);
    ds_ = server_.CreateObject(
        "daemonsets", {{"metadata", {{"name", "gpulet-node"}, {"namespace", "gpulet-system"}}},
                       {"spec", {{"template", {{"spec", {{"priority", 1}}}}}}}});
    server_.CreatePod({{"metadata",
                        {{"name", "gpulet-node-abcde"},
                         {"namespace", "gpulet-system"},
                         {"ownerReferences", json::array({{{"apiVersion", "apps/v1"},
                                                           {"kind", "DaemonSet"},
                                                           {"name", "gpulet-node"},
                                                           {"uid", ds_["metadata"]["uid"]},
                                                           {"controller", true}}})}}},
                       {"spec", {{"nodeName", "gpu-1"}}}});
    owner_ = std::make_unique<OwnerDeletion>(client_.get(), "gpulet-system", "gpulet-node-abcde");
  }
  void TearDown() override { owner_->Stop(); }

  // Start and wait until the owner is learnt and its first list is in (a watch then follows).
  void StartWatching() {
    owner_->Start(10ms);
    for (int i = 0; i < 500 && owner_->owner().empty(); ++i) std::this_thread::sleep_for(10ms);
    ASSERT_EQ(owner_->owner(), "gpulet-node");
    // The list went out; wait for the watch request after it.
    int64_t gets = server_.request_count("GET");
    for (int i = 0; i < 500 && server_.request_count("GET") < gets + 1; ++i)
      std::this_thread::sleep_for(10ms);
    std::this_thread::sleep_for(100ms);
  }
  bool WaitSeen() {
    for (int i = 0; i < 500 && !owner_->deletion_seen(); ++i) std::this_thread::sleep_for(10ms);
    return owner_->deletion_seen();
  }
  json Ds() {
    json ds;
    EXPECT_TRUE(server_.GetObject("daemonsets", "gpulet-system", "gpulet-node", &ds));
    return ds;
  }

  testing::FakeApiServer server_;
  std::unique_ptr<k8s::Client> client_;
  json ds_;
  std::unique_ptr<OwnerDeletion> owner_;
};

TEST_F(OwnerDeletionTest, BackgroundDeletionSeenByTheWatchDecidesEvenWhenTheApiRefusesLater) {
  StartWatching();
  EXPECT_FALSE(owner_->deletion_seen());
  ASSERT_TRUE(
      client_->Call("DELETE", "/apis/apps/v1/namespaces/gpulet-system/daemonsets/gpulet-node")
          .ok());
  ASSERT_TRUE(WaitSeen());
  // The release's RBAC goes in the same pass: every later request is refused.
  server_.InjectFailures(1000, 403);
  OwnerDeletion::Verdict v = owner_->Decide(0ms);
  EXPECT_TRUE(v.deleting);
  EXPECT_EQ(v.reason, "DaemonSet gpulet-system/gpulet-node was deleted");
}

TEST_F(OwnerDeletionTest, ForegroundDeletionTimestampCounts) {
  StartWatching();
  json ds = Ds();
  ds["metadata"]["deletionTimestamp"] = "2026-11-26T11:00:00Z";
  ASSERT_TRUE(server_.UpdateObject("daemonsets", ds));
  ASSERT_TRUE(WaitSeen());
  EXPECT_EQ(owner_->Decide(0ms).reason, "DaemonSet gpulet-system/gpulet-node is being deleted");
}

TEST_F(OwnerDeletionTest, RollingUpdateOfTheTemplateDoesNotCount) {
  StartWatching();
  json ds = Ds();
  ds["spec"]["template"]["spec"]["priority"] = 2;
  ASSERT_TRUE(server_.UpdateObject("daemonsets", ds));
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(owner_->deletion_seen());
  OwnerDeletion::Verdict v = owner_->Decide(0ms);
  EXPECT_FALSE(v.deleting);
  EXPECT_NE(v.reason.find("stays"), std::string::npos) << v.reason;
}

TEST_F(OwnerDeletionTest, DeletedBeforeTheWatchStartedIsSeenByTheFirstList) {
  ASSERT_TRUE(
      client_->Call("DELETE", "/apis/apps/v1/namespaces/gpulet-system/daemonsets/gpulet-node")
          .ok());
  owner_->Start(10ms);
  ASSERT_TRUE(WaitSeen());
  EXPECT_EQ(owner_->Decide(0ms).reason, "DaemonSet gpulet-system/gpulet-node is gone");
}

TEST_F(OwnerDeletionTest, WithoutTheWatchOneGetDecides) {
  // Not started (say the API was unreachable until now): the pod, then the DaemonSet, are read.
  EXPECT_FALSE(owner_->Decide(0ms).deleting);
  ASSERT_TRUE(
      client_->Call("DELETE", "/apis/apps/v1/namespaces/gpulet-system/daemonsets/gpulet-node")
          .ok());
  EXPECT_EQ(owner_->Decide(0ms).reason, "DaemonSet gpulet-system/gpulet-node is gone");
  // Deleted and made again under the same name: ours is gone all the same.
  server_.CreateObject("daemonsets",
                       {{"metadata", {{"name", "gpulet-node"}, {"namespace", "gpulet-system"}}}});
  EXPECT_EQ(owner_->Decide(0ms).reason, "DaemonSet gpulet-system/gpulet-node was replaced");
}

TEST_F(OwnerDeletionTest, AnErrorAtTerminationKeepsTheConfiguration) {
  server_.InjectFailures(1000, 403);
  OwnerDeletion::Verdict v = owner_->Decide(0ms);
  EXPECT_FALSE(v.deleting);
  EXPECT_NE(v.reason.find("cannot tell whether this pod's DaemonSet is being deleted"),
            std::string::npos)
      << v.reason;
}

TEST_F(OwnerDeletionTest, APodWithoutADaemonSetOwnerIsNamed) {
  absl::Status st = owner_->LearnOwner({{"metadata", {{"name", "x"}}}});
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("is not owned by a DaemonSet"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace gpulet::node
