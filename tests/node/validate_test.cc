// The validation's device-plugin step against the kubelet emulator's PodResources API and the
// fake API server: a node whose GPUs are all DRA's has no device-plugin resources, which is right
// once the DRA driver's ResourceSlices of the node hold devices (before, the agent's node stayed
// tainted "the device plugin is not registered", found on the real cluster).
#include "node/validate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "k8s/client.h"
#include "runtime/engine_config.h"
#include "testing/apiserver/fake_apiserver.h"
#include "testing/kubelet/emulator.h"
#include "testing/runtime/fixtures.h"

namespace gpulet::node {
namespace {

using nlohmann::json;

class DevicePluginStep : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = runtime::testing::MakeTempDir("validate");
    emu::EmulatorOptions eo;
    eo.device_plugin_dir = dir_ + "/kubelet/device-plugins";
    eo.pod_resources_socket = dir_ + "/kubelet/pod-resources/kubelet.sock";
    emu_ = std::make_unique<emu::KubeletEmulator>(eo);
    ASSERT_TRUE(emu_->Start().ok());
    ASSERT_TRUE(api_.Start());
    api_.CreateNode({{"metadata", {{"name", "node-1"}}}});
    k8s::Config cfg;
    cfg.server = api_.url();
    cfg.max_attempts = 2;
    client_ = std::make_unique<k8s::Client>(cfg);
    o_.pod_resources_socket = emu_->pod_resources_socket();
    o_.node_name = "node-1";
    o_.client = client_.get();
  }
  void TearDown() override {
    if (emu_) emu_->Stop();
    std::filesystem::remove_all(dir_);
  }
  void Slice(const std::string& name, const std::string& node, const std::string& driver,
             int devices) {
    json d = json::array();
    for (int i = 0; i < devices; ++i) d.push_back({{"name", "gpu-" + std::to_string(i)}});
    api_.CreateObject("resourceslices", {{"metadata", {{"name", name}}},
                                         {"spec",
                                          {{"driver", driver},
                                           {"nodeName", node},
                                           {"pool", {{"name", node}, {"generation", 1}}},
                                           {"devices", d}}}});
  }
  std::string dir_;
  std::unique_ptr<emu::KubeletEmulator> emu_;
  testing::FakeApiServer api_;
  std::unique_ptr<k8s::Client> client_;
  ValidateOptions o_;
};

TEST_F(DevicePluginStep, NoResourcesWithoutDraIsNotReady) {
  StepResult s = ValidateDevicePlugin(o_);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.detail.find("the device plugin is not registered"), std::string::npos) << s.detail;
}

TEST_F(DevicePluginStep, EveryGpuThroughDraIsReadyOnceItsSliceHoldsDevices) {
  o_.dra_driver = "gpu.gpulet.io";
  Slice("other-node-gpu", "node-2", "gpu.gpulet.io", 8);  // another node's: does not count
  Slice("node-1-other-driver", "node-1", "example.com", 4);
  StepResult s = ValidateDevicePlugin(o_);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.detail.find("no ResourceSlice of gpu.gpulet.io for node node-1 holds a device yet"),
            std::string::npos)
      << s.detail;

  Slice("node-1-gpu", "node-1", "gpu.gpulet.io", 2);
  s = ValidateDevicePlugin(o_);
  EXPECT_TRUE(s.ok) << s.detail;
  EXPECT_EQ(s.detail,
            "2 devices in gpu.gpulet.io ResourceSlices; no device-plugin GPU resources (every GPU "
            "through DRA)");
}

TEST_F(DevicePluginStep, AnUnreachableApiServerIsNamed) {
  o_.dra_driver = "gpu.gpulet.io";
  api_.InjectFailures(100, 500);
  StepResult s = ValidateDevicePlugin(o_);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.detail.find("cannot list the ResourceSlices of gpu.gpulet.io"), std::string::npos)
      << s.detail;
}

}  // namespace
}  // namespace gpulet::node

namespace gpulet::node {
namespace {

using ::testing::HasSubstr;

// Which device-plugin deliveries reach containers on which engines: CDI names need CDI in the
// engine's CRI (containerd >= 1.7, CRI-O >= 1.28; not cri-dockerd), the shim's strategies need the
// shim as default runtime, device specs work anywhere. A miss names the engine and both fixes.
TEST(GpuDelivery, WhatReachesContainersOnWhichEngine) {
  const GpuDelivery shipped{/*cdi_cri=*/true, /*through_shim=*/true, /*device_specs=*/false};
  EXPECT_TRUE(CheckGpuDelivery(shipped, "containerd://2.2.9", false).ok());
  EXPECT_TRUE(CheckGpuDelivery(shipped, "containerd://1.7.24", false).ok());
  EXPECT_TRUE(CheckGpuDelivery(shipped, "cri-o://1.30.2", false).ok());
  EXPECT_TRUE(CheckGpuDelivery(shipped, "", false).ok()) << "unknown version: not refused";
  EXPECT_TRUE(CheckGpuDelivery(shipped, "containerd://1.6.20", true).ok()) << "the shim acts";

  absl::Status old = CheckGpuDelivery(shipped, "containerd://1.6.20~ds1", false);
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(old.message(), HasSubstr("containerd://1.6.20~ds1 has no CDI in CRI"));
  EXPECT_THAT(old.message(), HasSubstr("not the engine's default runtime"));
  EXPECT_THAT(old.message(), HasSubstr("--set-as-default"));
  EXPECT_THAT(old.message(), HasSubstr("passDeviceSpecs"));
  EXPECT_FALSE(CheckGpuDelivery(shipped, "containerd://v1.6.8", false).ok());
  EXPECT_TRUE(CheckGpuDelivery(shipped, "containerd://1.7.11-k3s2", false).ok());
  EXPECT_FALSE(CheckGpuDelivery(shipped, "docker://27.3.1", false).ok());
  EXPECT_FALSE(CheckGpuDelivery(shipped, "cri-o://1.27.0", false).ok());

  const GpuDelivery cdi_only{true, false, false};
  EXPECT_FALSE(CheckGpuDelivery(cdi_only, "containerd://1.6.20", true).ok())
      << "the shim as default does not act on CDI names the engine drops";
  const GpuDelivery specs{false, true, true};
  EXPECT_TRUE(CheckGpuDelivery(specs, "containerd://1.6.20", false).ok());
  EXPECT_THAT(CheckGpuDelivery({}, "containerd://2.0.0", true).message(), HasSubstr("in no way"));
}

}  // namespace
}  // namespace gpulet::node

namespace gpulet::node {
namespace {

using ::testing::HasSubstr;

// ValidateGpuDelivery, what the agent reruns when its settings change, reads the engine under the
// host root and the engine's version from the Node: the shipped delivery reaches containers on
// containerd 2, not on containerd 1.6 until the shim is its default runtime; no delivery to check
// is OK, and an engine that cannot be found is named.
TEST_F(DevicePluginStep, DeliveryFollowsTheNodesEngineAndItsDefaultRuntime) {
  std::string root = dir_ + "/host";
  std::filesystem::create_directories(root + "/etc/containerd");
  { std::ofstream(root + "/etc/containerd/config.toml") << "version = 2\n"; }
  o_.host_root = root;
  EXPECT_TRUE(ValidateGpuDelivery(o_).ok()) << "no delivery set: nothing to check";
  o_.delivery = GpuDelivery{/*cdi_cri=*/true, /*through_shim=*/true, /*device_specs=*/false};
  auto version = [&](const std::string& v) {
    ASSERT_TRUE(
        client_
            ->PatchNodeStatus("node-1", k8s::PatchType::kMerge,
                              {{"status", {{"nodeInfo", {{"containerRuntimeVersion", v}}}}}})
            .ok());
  };
  version("containerd://2.1.4");
  EXPECT_TRUE(ValidateGpuDelivery(o_).ok());
  version("containerd://1.6.20");
  absl::Status old = ValidateGpuDelivery(o_);
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition) << old;
  EXPECT_THAT(old.message(), HasSubstr("containerd://1.6.20"));

  runtime::ConfigureOptions co;
  co.root = root;
  co.runtime_path = o_.prefix + "/bin/gpulet-container-runtime";
  co.enable_cdi = true;
  co.set_as_default = true;
  auto plan = runtime::PlanConfigure(co);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(runtime::ApplyChanges(*plan).ok());
  EXPECT_TRUE(ValidateGpuDelivery(o_).ok()) << "the shim is the default runtime";

  // The version unread (the API server failing) is not "unknown, so allowed".
  api_.InjectFailures(100, 500);
  absl::Status unread = ValidateGpuDelivery(o_);
  EXPECT_EQ(unread.code(), absl::StatusCode::kUnavailable) << unread;
  EXPECT_THAT(unread.message(), HasSubstr("cannot read node node-1's container engine version"));
  api_.InjectFailures(0, 500);

  o_.host_root = dir_ + "/no-engine";
  absl::Status none = ValidateGpuDelivery(o_);
  EXPECT_EQ(none.code(), absl::StatusCode::kNotFound) << none;
  EXPECT_THAT(none.message(), HasSubstr("no container engine found"));
}

}  // namespace
}  // namespace gpulet::node
