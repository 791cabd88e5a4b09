// gpulet agent as a DRA driver, end to end: the real binary on the simulated dgx-h100 with GPUs 4-7
// under DRA (--dra-gpus) and 0-3 through the device plugin (kubelet emulator), the fake API server
// holding the node, its ResourceSlice and the claims, and a kubelet-side gRPC client.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/fs.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "k8s/dra/v1/api.grpc.pb.h"
#include "k8s/pluginregistration/v1/api.grpc.pb.h"
#include "testing/apiserver/fake_apiserver.h"
#include "testing/kubelet/emulator.h"
#include "testing/process/spawn.h"
#include "testing/runtime/fixtures.h"

namespace gpulet {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;
using std::chrono::milliseconds;
namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;

std::string Built(const std::string& p) { return std::string(GPULET_BINARY_DIR) + "/" + p; }

template <typename F>
bool Eventually(F f, milliseconds timeout = milliseconds(15000)) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return f();
}

class DraAgent : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* f : {"bin/gpulet", "bin/gpulet-sim"})
      if (access(Built(f).c_str(), X_OK) != 0) GTEST_SKIP() << Built(f) << " not built";
    dir_ = runtime::testing::MakeTempDir("dra-agent");
    std::string why;
    if (!runtime::testing::MakeDriverRoot(dir_ + "/driver", 8, &why)) GTEST_SKIP() << why;
    emu::EmulatorOptions eo;
    eo.device_plugin_dir = dir_ + "/kubelet/device-plugins";
    eo.pod_resources_socket = dir_ + "/kubelet/pod-resources/kubelet.sock";
    emu_ = std::make_unique<emu::KubeletEmulator>(eo);
    ASSERT_TRUE(emu_->Start().ok());
    ASSERT_TRUE(api_.Start());
    api_.CreateNode({{"metadata", {{"name", "node-1"}}}});
    std::ofstream(dir_ + "/kubeconfig") << api_.Kubeconfig();
  }
  void TearDown() override {
    StopAgent();
    if (emu_) emu_->Stop();
    if (!dir_.empty()) stdfs::remove_all(dir_);
  }
  void StartAgent() {
    std::vector<std::string> argv = {Built("bin/gpulet"),
                                     "agent",
                                     "--simulate",
                                     "dgx-h100",
                                     "--sim-root",
                                     dir_ + "/root",
                                     "--device-plugin-dir",
                                     emu_->device_plugin_dir(),
                                     "--pod-resources-socket",
                                     emu_->pod_resources_socket(),
                                     "--metrics-address",
                                     "127.0.0.1:0",
                                     "--labels-output",
                                     dir_ + "/features",
                                     "--node-name",
                                     "node-1",
                                     "--kubeconfig",
                                     dir_ + "/kubeconfig",
                                     "--dra-gpus",
                                     "4,5,6,7",
                                     "--dra-kubelet-dir",
                                     dir_ + "/kubelet",
                                     "--dra-cdi-dir",
                                     dir_ + "/cdi",
                                     "--dra-state-dir",
                                     dir_ + "/dra",
                                     "--cdi-driver-root",
                                     dir_ + "/driver",
                                     "--cdi-hook-path",
                                     "",
                                     "--health-hold-down",
                                     "60s"};
    agent_ = testing_process::SpawnLogged(argv, dir_ + "/agent.log");
  }
  void StopAgent() {
    if (agent_ <= 0) return;
    kill(agent_, SIGTERM);
    int status = 0;
    waitpid(agent_, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "agent status " << status << Log();
    agent_ = -1;
  }
  std::string Log() {
    auto t = ReadFileToString(dir_ + "/agent.log");
    return t.ok() ? *t : "";
  }
  json Slice() {
    json s;
    api_.GetObject("resourceslices", "", "node-1-gpu.gpulet.io", &s);
    return s;
  }
  size_t SliceDevices() {
    json s = Slice();
    return s.is_object() && s["spec"].contains("devices") ? s["spec"]["devices"].size() : 0;
  }
  std::string Socket(const std::string& rel) { return dir_ + "/kubelet/" + rel; }

  drav1::NodePrepareResourceResponse Prepare(const json& claim) {
    // The driver publishes its slice before it serves (a slice the API refuses must not keep it
    // from serving), so a published slice does not mean the kubelet's sockets are up yet.
    EXPECT_TRUE(Eventually([&] {
      return access(Socket("plugins_registry/gpu.gpulet.io-reg.sock").c_str(), F_OK) == 0;
    })) << Log();
    pluginregistration::PluginInfo info;
    auto reg = pluginregistration::Registration::NewStub(
        grpc::CreateChannel("unix:" + Socket("plugins_registry/gpu.gpulet.io-reg.sock"),
                            grpc::InsecureChannelCredentials()));
    grpc::ClientContext c1;
    c1.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    c1.set_wait_for_ready(true);  // a socket bound a moment before it listens is not a failure
    EXPECT_TRUE(reg->GetInfo(&c1, pluginregistration::InfoRequest(), &info).ok());
    auto stub = drav1::DRAPlugin::NewStub(
        grpc::CreateChannel("unix:" + info.endpoint(), grpc::InsecureChannelCredentials()));
    drav1::NodePrepareResourcesRequest req;
    auto* c = req.add_claims();
    c->set_namespace_(claim["metadata"]["namespace"]);
    c->set_name(claim["metadata"]["name"]);
    c->set_uid(claim["metadata"]["uid"]);
    drav1::NodePrepareResourcesResponse resp;
    grpc::ClientContext c2;
    c2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    c2.set_wait_for_ready(true);
    EXPECT_TRUE(stub->NodePrepareResources(&c2, req, &resp).ok());
    auto it = resp.claims().find(claim["metadata"]["uid"].get<std::string>());
    if (it == resp.claims().end()) {
      ADD_FAILURE() << "no answer for the claim" << Log();
      return {};
    }
    return it->second;
  }

  std::string dir_;
  std::unique_ptr<emu::KubeletEmulator> emu_;
  testing::FakeApiServer api_;
  pid_t agent_ = -1;
};

TEST_F(DraAgent, SplitsGpusFollowsXidAndKeepsClaimsOverRestart) {
  StartAgent();
  // The device plugin serves only GPUs 0-3; DRA publishes 4-7.
  ASSERT_TRUE(emu_->WaitForAllocatable("nvidia.com/gpu", 4, milliseconds(20000)).ok()) << Log();
  ASSERT_TRUE(Eventually([&] { return SliceDevices() == 4; })) << Log();
  for (const auto& d : Slice()["spec"]["devices"])
    EXPECT_THAT(std::vector<std::string>({"gpu-4", "gpu-5", "gpu-6", "gpu-7"}),
                ::testing::Contains(d["name"].get<std::string>()));
  EXPECT_EQ(Slice()["spec"]["devices"][0]["attributes"]["nvlinkDomain"]["int"], 0);

  // A claim on GPU 5, prepared through the kubelet API.
  json claim = api_.CreateObject("resourceclaims",
                                 {{"metadata", {{"name", "c1"}, {"namespace", "default"}}},
                                  {"status",
                                   {{"allocation",
                                     {{"devices",
                                       {{"results", json::array({{{"request", "gpu"},
                                                                  {"driver", "gpu.gpulet.io"},
                                                                  {"pool", "node-1"},
                                                                  {"device", "gpu-5"}}})}}}}}}}});
  auto r = Prepare(claim);
  ASSERT_EQ(r.error(), "") << Log();
  ASSERT_EQ(r.devices_size(), 1);
  std::string cdi_id = r.devices(0).cdi_device_ids(0);
  std::string spec =
      dir_ + "/cdi/gpu.gpulet.io-claim_" + claim["metadata"]["uid"].get<std::string>() + ".json";
  EXPECT_TRUE(stdfs::exists(spec));

  // XID 79 on GPU 5: it leaves the slice.
  auto t0 = std::chrono::steady_clock::now();
  std::string out;
  ASSERT_EQ(runtime::testing::Sh(Built("bin/gpulet-sim") +
                                     " fault xid --gpu 5 --code 79 --sim-root " + dir_ + "/root",
                                 &out),
            0)
      << out;
  ASSERT_TRUE(Eventually([&] { return SliceDevices() == 3; })) << Log();
  std::printf(
      "figure: XID (gpulet-sim fault) -> ResourceSlice without the GPU: %.1f ms\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  for (const auto& d : Slice()["spec"]["devices"]) EXPECT_NE(d["name"], "gpu-5");

  // Restart: the prepared claim is still known; a repeated prepare answers the same IDs.
  StopAgent();
  EXPECT_TRUE(stdfs::exists(spec));
  StartAgent();
  auto again = Prepare(claim);
  ASSERT_EQ(again.error(), "") << Log();
  EXPECT_EQ(again.devices(0).cdi_device_ids(0), cdi_id);
  EXPECT_THAT(Log(), ::testing::HasSubstr("1 prepared claims from"));
}

}  // namespace
}  // namespace gpulet
