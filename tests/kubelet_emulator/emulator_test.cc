// The kubelet emulator against a small in-test device plugin over real unix-socket gRPC.
#include "testing/kubelet/emulator.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "k8s/podresources/v1/api.grpc.pb.h"
#include "tests/kubelet_emulator/test_plugin.h"

namespace gpulet::emu {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;
using testplugin::Dev;
using testplugin::TestPlugin;
constexpr auto kWait = std::chrono::milliseconds(5000);

class EmulatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kemu-XXXXXX";
    root_ = mkdtemp(tmpl);
    dir_ = root_ + "/device-plugins";
  }
  void TearDown() override {
    plugins_.clear();
    emu_.reset();
    fs::remove_all(root_);
  }

  KubeletEmulator& Start(bool scheduler = true) {
    EmulatorOptions o;
    o.device_plugin_dir = dir_;
    o.scheduler = scheduler;
    emu_ = std::make_unique<KubeletEmulator>(o);
    EXPECT_TRUE(emu_->Start().ok());
    return *emu_;
  }

  TestPlugin& Plugin(std::vector<Dev> devs, const std::string& resource = "example.com/gpu",
                     const std::string& endpoint = "test.sock") {
    plugins_.push_back(std::make_unique<TestPlugin>(dir_, endpoint, resource, std::move(devs)));
    EXPECT_TRUE(plugins_.back()->Serve());
    return *plugins_.back();
  }

  static std::vector<Dev> Four() {
    return {{"d0", true, 0}, {"d1", true, 0}, {"d2", true, 1}, {"d3", true, 1}};
  }

  static PodSpec Pod(const std::string& name, int64_t n,
                     const std::string& res = "example.com/gpu") {
    auto pods =
        ParsePods("apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + name +
                      "\nspec:\n  containers:\n  - name: main\n    image: busybox\n    resources:\n"
                      "      limits:\n        " +
                      res + ": " + std::to_string(n) + "\n",
                  name + ".yaml");
    EXPECT_TRUE(pods.ok()) << pods.status();
    return pods->front();
  }

  std::string root_, dir_;
  std::unique_ptr<KubeletEmulator> emu_;
  std::vector<std::unique_ptr<TestPlugin>> plugins_;
};

// A valid registration is accepted; ListAndWatch sets capacity (all) and allocatable (healthy).
TEST_F(EmulatorTest, RegistersAndTracksAllocatable) {
  auto& emu = Start();
  auto devs = Four();
  devs[3].healthy = false;
  auto& p = Plugin(devs);
  ASSERT_TRUE(p.Register().ok());
  ASSERT_TRUE(emu.WaitForAllocatable("example.com/gpu", 3, kWait).ok());
  auto r = emu.Resource("example.com/gpu");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->capacity, 4);
  EXPECT_EQ(r->allocated, 0);
  EXPECT_TRUE(r->connected);
  EXPECT_EQ(r->endpoint, "test.sock");
  EXPECT_EQ(emu.registrations(), 1);
}

// Register rejects an unsupported version and non-extended resource names with the kubelet's words.
TEST_F(EmulatorTest, RegisterRejectsBadVersionAndName) {
  auto& emu = Start();
  auto& p = Plugin(Four());
  grpc::Status s = p.Register("v1alpha1");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.error_message(), HasSubstr("requested API version \"v1alpha1\" is not supported"));
  for (const char* bad : {"gpu", "cpu", "kubernetes.io/gpu", "requests.example.com/gpu",
                          "example.com/", "Example_.com/gpu"}) {
    s = p.Register("v1beta1", bad);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_THAT(s.error_message(),
                HasSubstr("the ResourceName \"" + std::string(bad) + "\" is invalid"));
  }
  EXPECT_EQ(emu.registrations(), 0);
  EXPECT_TRUE(emu.Resources().empty());
}

// A health change in ListAndWatch reaches the emulator as a new generation with a timestamp.
TEST_F(EmulatorTest, HealthChangeIsAnUpdate) {
  auto& emu = Start();
  auto& p = Plugin(Four());
  ASSERT_TRUE(p.Register().ok());
  ASSERT_TRUE(emu.WaitForAllocatable("example.com/gpu", 4, kWait).ok());
  auto before = *emu.Resource("example.com/gpu");
  p.SetHealth("d2", false);
  auto after = emu.WaitForUpdate("example.com/gpu", before.generation, kWait);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->allocatable, 3);
  EXPECT_GE(after->updated_at, before.updated_at);
  EXPECT_FALSE(after->devices[2].healthy);
  EXPECT_THAT(after->devices[2].numa_nodes, ElementsAre(1));
}

// A plugin that goes away leaves its capacity but no allocatable devices.
TEST_F(EmulatorTest, VanishedPluginMeansAllocatableZero) {
  auto& emu = Start();
  auto& p = Plugin(Four());
  ASSERT_TRUE(p.Register().ok());
  ASSERT_TRUE(emu.WaitForAllocatable("example.com/gpu", 4, kWait).ok());
  p.Stop();
  ASSERT_TRUE(emu.WaitForAllocatable("example.com/gpu", 0, kWait).ok());
  auto r = *emu.Resource("example.com/gpu");
  EXPECT_EQ(r.capacity, 4);
  EXPECT_FALSE(r.connected);
}

// Allocate gets the plugin's preferred devices, the response is recorded, PreStart is called.
TEST_F(EmulatorTest, AllocateFlowUsesPreferenceAndPreStart) {
  auto& emu = Start();
  auto& p = Plugin(Four());
  p.preferred = true;
  p.pre_start = true;
  p.preference = {"d3", "d1"};
  ASSERT_TRUE(p.Register().ok());
  ASSERT_TRUE(emu.WaitForAllocatable("example.com/gpu", 4, kWait).ok());
  auto st = emu.AddPod(Pod("two", 2));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->phase, PodPhase::kRunning) << st->message;
  EXPECT_THAT(p.last_preferred_available(), UnorderedElementsAre("d0", "d1", "d2", "d3"));
  ASSERT_EQ(st->containers.size(), 1u);
  EXPECT_THAT(st->containers[0].devices["example.com/gpu"], ElementsAre("d3", "d1"));
  const auto& resp = st->containers[0].response;
  EXPECT_EQ(resp.envs().at("TEST_VISIBLE_DEVICES"), "d3,d1");
  EXPECT_EQ(resp.devices_size(), 2);
  EXPECT_EQ(resp.cdi_devices(0).name(), "example.com/dev=d3");
  EXPECT_EQ(resp.mounts(0).host_path(), "/host/lib");
  EXPECT_EQ(resp.annotations().at("example.com/devices"), "d3,d1");
  EXPECT_THAT(p.allocate_calls(), ElementsAre(ElementsAre("d3", "d1")));
  EXPECT_THAT(p.prestart_calls(), ElementsAre(ElementsAre("d3", "d1")));
  auto r = *emu.Resource("example.com/gpu");
  EXPECT_EQ(r.allocated, 2);
  // A second pod sees only the remaining devices.
  auto st2 = emu.AddPod(Pod("more", 2));
  ASSERT_TRUE(st2.ok());
  EXPECT_THAT(st2->containers[0].devices["example.com/gpu"], UnorderedElementsAre("d0", "d2"));
  EXPECT_THAT(p.last_preferred_available(), UnorderedElementsAre("d0", "d2"));
}

// Without room, a scheduled pod waits Pending with the scheduler's words and runs once devices
// free.
TEST_F(EmulatorTest, InsufficientDevicesPendingThenRunning) {
  auto& emu = Start();
  auto& p = Plugin(Four());
  ASSERT_TRUE(p.Register().ok());
  ASSERT_TRUE(emu.WaitForAllocatable("example.com/gpu", 4, kWait).ok());
  ASSERT_EQ(emu.AddPod(Pod("big", 3))->phase, PodPhase::kRunning);
  auto st = emu.AddPod(Pod("waits", 2));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase, PodPhase::kPending);
  EXPECT_EQ(st->reason, "Unschedulable");
  EXPECT_EQ(st->message, "0/1 nodes are available: 1 Insufficient example.com/gpu.");
  ASSERT_TRUE(emu.DeletePod("default", "big").ok());
  auto run = emu.WaitForPodPhase("default", "waits", PodPhase::kRunning, kWait);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->containers[0].devices["example.com/gpu"].size(), 2u);
}

// A pod bound with spec.nodeName meets kubelet admission: UnexpectedAdmissionError wording.
TEST_F(EmulatorTest, NodeNamePodRejectedWithUnexpectedAdmissionError) {
  auto& emu = Start();
  auto& p = Plugin(Four());
  ASSERT_TRUE(p.Register().ok());
  ASSERT_TRUE(emu.WaitForAllocatable("example.com/gpu", 4, kWait).ok());
  PodSpec pod = Pod("bound", 5);
  pod.node_name = "sim-node";
  auto st = emu.AddPod(pod);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase, PodPhase::kFailed);
  EXPECT_EQ(st->reason, "UnexpectedAdmissionError");
  EXPECT_EQ(st->message,
            "Pod was rejected: Allocate failed due to requested number of devices unavailable for "
            "example.com/gpu. "
            "Requested: 5, Available: 4, which is unexpected");
  // A failed pod holds nothing and is not retried.
  EXPECT_EQ(emu.Resource("example.com/gpu")->allocated, 0);
}

// The kubelet takes a plugin's options from GetDevicePluginOptions, which it calls while
// answering Register, not from the RegisterRequest (seen on the real kubelet v1.34:
// kubelet_probe.expected): a plugin that registers with preferred allocation but answers
// GetDevicePluginOptions without it is never asked for a preference.
TEST_F(EmulatorTest, OptionsComeFromGetDevicePluginOptions) {
  auto& emu = Start();
  auto& p = Plugin(Four());
  p.preferred = false;
  p.register_preferred = true;
  p.preference = {"d3"};
  ASSERT_TRUE(p.Register().ok());
  ASSERT_TRUE(emu.WaitForAllocatable("example.com/gpu", 4, kWait).ok());
  EXPECT_FALSE(emu.Resource("example.com/gpu")->preferred_allocation);
  auto st = emu.AddPod(Pod("x", 1));
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->phase, PodPhase::kRunning);
  EXPECT_TRUE(p.last_preferred_available().empty());  // GetPreferredAllocation never called
  EXPECT_THAT(p.allocate_calls(), ElementsAre(ElementsAre("d0")));
}

// With the scheduler off, every pod meets kubelet admission; no healthy devices has its own words.
TEST_F(EmulatorTest, NoHealthyDevicesWording) {
  auto& emu = Start(/*scheduler=*/false);
  auto& p = Plugin({{"d0", false, -1}});
  ASSERT_TRUE(p.Register().ok());
  ASSERT_TRUE(emu.WaitForUpdate("example.com/gpu", 0, kWait).ok());
  auto st = emu.AddPod(Pod("x", 1));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase, PodPhase::kFailed);
  EXPECT_EQ(st->message,
            "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate "
            "unhealthy devices "
            "example.com/gpu, which is unexpected");
}

// A resource nobody advertises: Pending (scheduled) or OutOf<res> (bound), with clear reasons.
TEST_F(EmulatorTest, UnadvertisedResource) {
  auto& emu = Start();
  auto st = emu.AddPod(Pod("vgpu", 30, "tencent.com/vcuda-core"));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase, PodPhase::kPending);
  EXPECT_EQ(st->message, "0/1 nodes are available: 1 Insufficient tencent.com/vcuda-core.");
  PodSpec bound = Pod("bound", 30, "tencent.com/vcuda-core");
  bound.node_name = "sim-node";
  st = emu.AddPod(bound);
  EXPECT_EQ(st->phase, PodPhase::kFailed);
  EXPECT_EQ(st->reason, "OutOftencent.com/vcuda-core");
  EXPECT_THAT(st->message, HasSubstr("Node didn't have enough resource: tencent.com/vcuda-core, "
                                     "requested: 30, used: 0, capacity: 0"));
}

// The plugin's Allocate error becomes the kubelet's UnexpectedAdmissionError with grpc-go wording.
TEST_F(EmulatorTest, AllocateErrorFailsPod) {
  auto& emu = Start();
  auto& p = Plugin(Four());
  p.allocate_error = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "unknown device d9");
  ASSERT_TRUE(p.Register().ok());
  ASSERT_TRUE(emu.WaitForAllocatable("example.com/gpu", 4, kWait).ok());
  auto st = emu.AddPod(Pod("x", 1));
  EXPECT_EQ(st->phase, PodPhase::kFailed);
  EXPECT_EQ(st->message,
            "Pod was rejected: Allocate failed due to rpc error: code = InvalidArgument desc = "
            "unknown device d9, "
            "which is unexpected");
}

// API-server validation of code-built pods: requests without limits, requests != limits.
TEST_F(EmulatorTest, AddPodValidatesRequests) {
  auto& emu = Start();
  PodSpec pod = Pod("x", 1);
  pod.containers[0].requests["example.com/gpu"] = "2";
  auto st = emu.AddPod(pod);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.status().message()),
              HasSubstr("must be equal to example.com/gpu limit of 1"));
  pod.containers[0].limits.clear();
  st = emu.AddPod(pod);
  EXPECT_THAT(std::string(st.status().message()),
              HasSubstr("Limit must be set for non overcommitable resources"));
  EXPECT_TRUE(emu.Pods().empty());
  pod = Pod("dup", 0);
  EXPECT_TRUE(emu.AddPod(pod).ok());
  EXPECT_EQ(emu.AddPod(pod).status().code(), absl::StatusCode::kAlreadyExists);
}

// PodResources List / Get / GetAllocatableResources report the allocation with NUMA topology.
TEST_F(EmulatorTest, PodResourcesReportsAllocations) {
  auto& emu = Start();
  auto& p = Plugin(Four());
  p.preferred = true;
  p.preference = {"d0", "d2"};
  ASSERT_TRUE(p.Register().ok());
  ASSERT_TRUE(emu.WaitForAllocatable("example.com/gpu", 4, kWait).ok());
  ASSERT_EQ(emu.AddPod(Pod("train", 2))->phase, PodPhase::kRunning);
  auto ch =
      grpc::CreateChannel("unix:" + emu.pod_resources_socket(), grpc::InsecureChannelCredentials());
  auto stub = v1::PodResourcesLister::NewStub(ch);
  {
    grpc::ClientContext ctx;
    v1::ListPodResourcesResponse resp;
    ASSERT_TRUE(stub->List(&ctx, {}, &resp).ok());
    ASSERT_EQ(resp.pod_resources_size(), 1);
    const auto& pr = resp.pod_resources(0);
    EXPECT_EQ(pr.name(), "train");
    EXPECT_EQ(pr.namespace_(), "default");
    ASSERT_EQ(pr.containers_size(), 1);
    EXPECT_EQ(pr.containers(0).name(), "main");
    std::map<std::string, int64_t> numa;
    for (const auto& d : pr.containers(0).devices()) {
      EXPECT_EQ(d.resource_name(), "example.com/gpu");
      ASSERT_EQ(d.device_ids_size(), 1);
      ASSERT_EQ(d.topology().nodes_size(), 1);
      numa[d.device_ids(0)] = d.topology().nodes(0).id();
    }
    EXPECT_EQ(numa, (std::map<std::string, int64_t>{{"d0", 0}, {"d2", 1}}));
  }
  {
    grpc::ClientContext ctx;
    v1::AllocatableResourcesResponse resp;
    ASSERT_TRUE(stub->GetAllocatableResources(&ctx, {}, &resp).ok());
    EXPECT_EQ(resp.devices_size(), 4);
  }
  {
    grpc::ClientContext ctx;
    v1::GetPodResourcesRequest req;
    req.set_pod_name("nope");
    req.set_pod_namespace("default");
    v1::GetPodResourcesResponse resp;
    grpc::Status s = stub->Get(&ctx, req, &resp);
    // As the real kubelet v1.34 (kubelet_probe.expected): a Go error, so gRPC code Unknown.
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNKNOWN);
    EXPECT_EQ(s.error_message(), "pod nope in namespace default not found");
  }
}

// Stop deletes the sockets; Start removes stale non-directory entries (but not the checkpoint or
// directories) and recreates kubelet.sock; the plugin must register again.
TEST_F(EmulatorTest, RestartRecreatesSocketsAndCleansStale) {
  auto& emu = Start();
  auto& p = Plugin(Four());
  ASSERT_TRUE(p.Register().ok());
  ASSERT_TRUE(emu.WaitForAllocatable("example.com/gpu", 4, kWait).ok());
  ASSERT_EQ(emu.AddPod(Pod("keep", 1))->phase, PodPhase::kRunning);
  emu.Stop();
  EXPECT_FALSE(fs::exists(emu.kubelet_socket()));
  EXPECT_FALSE(fs::exists(emu.pod_resources_socket()));
  EXPECT_EQ(emu.Resource("example.com/gpu")->allocatable, 0);
  std::ofstream(dir_ + "/stale.sock") << "x";
  fs::create_directory(dir_ + "/subdir");
  ASSERT_TRUE(emu.Start().ok());
  EXPECT_TRUE(fs::exists(emu.kubelet_socket()));
  EXPECT_FALSE(fs::exists(dir_ + "/stale.sock"));
  EXPECT_FALSE(fs::exists(p.socket()));  // the plugin's socket is stale too
  EXPECT_TRUE(fs::exists(dir_ + "/subdir"));
  EXPECT_TRUE(fs::exists(dir_ + "/kubelet_internal_checkpoint"));
  // The plugin notices and comes back: serve again, register again.
  p.Stop();
  ASSERT_TRUE(p.Serve());
  ASSERT_TRUE(p.Register().ok());
  ASSERT_TRUE(emu.WaitForAllocatable("example.com/gpu", 4, kWait).ok());
  EXPECT_EQ(emu.registrations(), 2);
  EXPECT_EQ(emu.Resource("example.com/gpu")->allocated, 1);  // the pod kept its device
}

// A new emulator on the same directory restores allocations from the checkpoint: the same pod
// gets the same devices without another Allocate, and other pods cannot take them.
TEST_F(EmulatorTest, CheckpointSurvivesNewEmulator) {
  std::vector<std::string> first;
  {
    auto& emu = Start();
    auto& p = Plugin(Four());
    ASSERT_TRUE(p.Register().ok());
    ASSERT_TRUE(emu.WaitForAllocatable("example.com/gpu", 4, kWait).ok());
    auto st = emu.AddPod(Pod("keep", 3));
    first = st->containers[0].devices["example.com/gpu"];
    emu_.reset();
    plugins_.clear();
  }
  auto& emu = Start();
  auto r = emu.Resource("example.com/gpu");
  ASSERT_TRUE(r);  // known from the checkpoint, unhealthy until the plugin is back
  EXPECT_EQ(r->capacity, 4);
  EXPECT_EQ(r->allocatable, 0);
  auto& p = Plugin(Four());
  ASSERT_TRUE(p.Register().ok());
  ASSERT_TRUE(emu.WaitForAllocatable("example.com/gpu", 4, kWait).ok());
  EXPECT_EQ(emu.Resource("example.com/gpu")->allocated, 3);
  EXPECT_EQ(emu.AddPod(Pod("other", 2))->phase, PodPhase::kPending);
  auto st = emu.AddPod(Pod("keep", 3));
  ASSERT_EQ(st->phase, PodPhase::kRunning) << st->message;
  EXPECT_EQ(st->containers[0].devices["example.com/gpu"], first);
  EXPECT_EQ(st->containers[0].response.envs().at("TEST_VISIBLE_DEVICES"),
            first[0] + "," + first[1] + "," + first[2]);
  EXPECT_TRUE(p.allocate_calls().empty());
}

// A corrupt checkpoint is one clear error from Start, not a crash.
TEST_F(EmulatorTest, CorruptCheckpointIsAnError) {
  fs::create_directories(dir_);
  std::ofstream(dir_ + "/kubelet_internal_checkpoint") << "{not json";
  EmulatorOptions o;
  o.device_plugin_dir = dir_;
  KubeletEmulator emu(o);
  absl::Status s = emu.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("kubelet_internal_checkpoint: corrupt checkpoint"));
}

// A pod with a simulated run time completes, frees its device, and a waiting pod takes it.
TEST_F(EmulatorTest, RunTimeCompletesAndFreesDevices) {
  auto& emu = Start();
  auto& p = Plugin({{"d0", true, 0}});
  ASSERT_TRUE(p.Register().ok());
  ASSERT_TRUE(emu.WaitForAllocatable("example.com/gpu", 1, kWait).ok());
  PodSpec quick = Pod("quick", 1);
  quick.run_time_ms = 100;
  ASSERT_EQ(emu.AddPod(quick)->phase, PodPhase::kRunning);
  EXPECT_TRUE(emu.HasTimedPods());
  ASSERT_EQ(emu.AddPod(Pod("next", 1))->phase, PodPhase::kPending);
  auto done = emu.WaitForPodPhase("default", "quick", PodPhase::kSucceeded, kWait);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->reason, "Completed");
  ASSERT_TRUE(emu.WaitForPodPhase("default", "next", PodPhase::kRunning, kWait).ok());
}

}  // namespace
}  // namespace gpulet::emu
