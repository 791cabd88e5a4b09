// The hand-over from the node side to the interposer, end to end: the real agent (gpulet agent on
// the fake NVML) serves the vcuda resources to the kubelet emulator over real sockets; a vGPU pod
// is admitted; the env and mounts its Allocate returned are applied to a process (as the container
// runtime would: mounts map container paths to host paths) that LD_PRELOADs libgpulet-vcuda.so
// over the fake libcuda.so.1. Allocations within the pod's vcuda-memory succeed, one past it fails.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include "common/fs.h"
#include "testing/apiserver/fake_apiserver.h"
#include "testing/kubelet/emulator.h"
#include "testing/process/spawn.h"

namespace gpulet {
namespace {

namespace stdfs = std::filesystem;
using std::chrono::milliseconds;
constexpr uint64_t kMiB = 1 << 20;

std::string Built(const std::string& p) { return std::string(GPULET_BINARY_DIR) + "/" + p; }

using testing_process::RunCaptured;

// A Pending pod bound to node-1 by the extender onto the pool GPU: one container "app" asking 30
// cores and 2 memory units, the extender's annotations plus `extra`.
nlohmann::json BoundSharePod(const std::string& name, const std::string& bind_time,
                             nlohmann::json extra = nlohmann::json::object()) {
  using nlohmann::json;
  json limits = {{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "2"}};
  json ann = {{"gpulet.io/vgpu-node", "node-1"},
              {"gpulet.io/vgpu-gpus-0", "GPU-face0000-0000-0000-0000-000000000001"},
              {"gpulet.io/vgpu-bind-time", bind_time}};
  ann.update(extra);
  return {{"metadata", {{"name", name}, {"namespace", "default"}, {"annotations", ann}}},
          {"spec",
           {{"nodeName", "node-1"},
            {"containers", json::array({{{"name", "app"}, {"resources", {{"limits", limits}}}}})}}},
          {"status", {{"phase", "Pending"}}}};
}

class Handover : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* f : {"bin/gpulet", "lib/libgpulet-vcuda.so", "lib/fake_cuda/libcuda.so.1",
                          "tests/vcuda_probe"})
      if (access(Built(f).c_str(), R_OK) != 0) GTEST_SKIP() << Built(f) << " not built";
    std::string t = (stdfs::temp_directory_path() / "vgpu-handover-XXXXXX").string();
    dir_ = mkdtemp(t.data());
    emu::EmulatorOptions eo;
    eo.device_plugin_dir = dir_ + "/kubelet/device-plugins";
    eo.pod_resources_socket = dir_ + "/kubelet/pod-resources/kubelet.sock";
    emu_ = std::make_unique<emu::KubeletEmulator>(eo);
    ASSERT_TRUE(emu_->Start().ok());
  }
  void TearDown() override {
    if (agent_ > 0) {
      kill(agent_, SIGTERM);
      int status = 0;
      waitpid(agent_, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "agent status " << status;
    }
    if (emu_) emu_->Stop();
    if (!dir_.empty()) stdfs::remove_all(dir_);
  }
  // The real agent on the fake NVML, GPU 1 in the vGPU pool, state under the temp dir.
  void StartAgent(const std::vector<std::string>& extra = {},
                  const std::string& reconcile_interval = "200ms") {
    std::vector<std::string> argv = {
        Built("bin/gpulet"),
        "agent",
        "--simulate",
        std::string(GPULET_SOURCE_DIR) + "/tests/vgpu/handover-machine.yaml",
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
        "--vgpu-gpus",
        "1",
        "--vgpu-state-dir",
        dir_ + "/vgpu",
        "--metrics-vgpu-accounting-dir",
        dir_ + "/vgpu",
        "--vgpu-library",
        Built("lib/libgpulet-vcuda.so"),
        "--vgpu-reconcile-interval",
        reconcile_interval};
    argv.insert(argv.end(), extra.begin(), extra.end());
    agent_ = testing_process::SpawnLogged(argv, dir_ + "/agent.log");
    for (const char* r : {"tencent.com/vcuda-core", "tencent.com/vcuda-memory", "nvidia.com/gpu"})
      ASSERT_TRUE(emu_->WaitForUpdate(r, 0, milliseconds(20000)).ok()) << r << "\n" << Log();
  }
  // Submits the 30-core / 2-unit pod "share" to the kubelet emulator and waits until it runs.
  void RunSharePod(std::optional<emu::PodStatus>* out) {
    auto pods = emu::ParsePods(R"(apiVersion: v1
kind: Pod
metadata: {name: share}
spec:
  containers:
  - name: app
    image: cuda
    resources:
      limits: {tencent.com/vcuda-core: 30, tencent.com/vcuda-memory: 2}
)",
                               "share.yaml");
    ASSERT_TRUE(pods.ok()) << pods.status();
    ASSERT_TRUE(emu_->AddPod((*pods)[0]).ok());
    auto st =
        emu_->WaitForPodPhase("default", "share", emu::PodPhase::kRunning, milliseconds(10000));
    ASSERT_TRUE(st.ok()) << st.status() << "\n" << Log();
    ASSERT_EQ(st->containers.size(), 1u);
    *out = *std::move(st);
  }
  std::string Log() {
    auto t = ReadFileToString(dir_ + "/agent.log");
    return t.ok() ? *t : "";
  }
  template <class F>
  bool Eventually(F f) {
    for (int i = 0; i < 100; ++i, std::this_thread::sleep_for(milliseconds(50)))
      if (f()) return true;
    return false;
  }

  std::string dir_;
  std::unique_ptr<emu::KubeletEmulator> emu_;
  pid_t agent_ = -1;
};

// A GPU in the vGPU pool is offered only as vcuda units (100 cores, 4 x 256 MiB for 1 GiB), never
// as nvidia.com/gpu; a 30-core / 2-unit pod gets the pool GPU and its limits; the env and mounts of
// that Allocate, applied to a process over the fake driver, let it allocate exactly the 512 MiB
// limit (4 x 128 MiB succeed, the 5th fails), while the same program without them gets the whole
// 1 GiB GPU. Deleting the pod releases its grant and accounting directory.
TEST_F(Handover, AllocateResponseLimitsTheProcess) {
  StartAgent();
  EXPECT_EQ(emu_->Resource("tencent.com/vcuda-core")->capacity, 100);
  EXPECT_EQ(emu_->Resource("tencent.com/vcuda-memory")->capacity, 4);
  auto whole = emu_->Resource("nvidia.com/gpu");
  ASSERT_EQ(whole->devices.size(), 1u);
  EXPECT_EQ(whole->devices[0].id, "GPU-face0000-0000-0000-0000-000000000000");

  std::optional<emu::PodStatus> st;
  ASSERT_NO_FATAL_FAILURE(RunSharePod(&st));
  const auto& resp = st->containers[0].response;
  std::map<std::string, std::string> env(resp.envs().begin(), resp.envs().end());
  EXPECT_EQ(env["NVIDIA_VISIBLE_DEVICES"], "GPU-face0000-0000-0000-0000-000000000001");
  EXPECT_EQ(env["GPULET_VGPU_MEMORY_LIMIT"], std::to_string(512 * kMiB));
  EXPECT_EQ(env["GPULET_VGPU_CORE_LIMIT"], "30");
  // The runtime's bind mounts: an env value naming a container path means the host file.
  std::string accounting_host;
  for (const auto& m : resp.mounts()) {
    for (auto& [k, v] : env)
      if (v == m.container_path()) v = m.host_path();
    if (m.container_path() == env.at("GPULET_VGPU_ACCOUNTING") ||
        m.host_path() == env.at("GPULET_VGPU_ACCOUNTING"))
      accounting_host = m.host_path();
  }
  ASSERT_EQ(env["LD_PRELOAD"], Built("lib/libgpulet-vcuda.so"));
  ASSERT_FALSE(accounting_host.empty());
  ASSERT_TRUE(stdfs::exists(accounting_host));
  std::map<std::string, std::string> driver = {
      {"LD_LIBRARY_PATH", Built("lib/fake_cuda")},
      {"FAKE_CUDA_DEVICE_COUNT", "2"},
      {"FAKE_CUDA_DEVICE_MEMORY", std::to_string(1024 * kMiB)},
      {"ASAN_OPTIONS", "verify_asan_link_order=0:detect_leaks=0"}};
  std::map<std::string, std::string> container = driver;
  container.insert(env.begin(), env.end());
  // The fake's contexts cost no device memory (FAKE_CUDA_CONTEXT_BYTES is 0): charge none, so the
  // whole 512 MiB limit is there for allocations (context charging: tests/vgpu/interposer
  // DriverHeld).
  container["GPULET_VGPU_CONTEXT_BYTES"] = "0";
  const std::vector<std::string> probe = {Built("tests/vcuda_probe"), "device", "1",
                                          std::to_string(128 * kMiB)};
  auto [rc, out] = RunCaptured(probe, container);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("held " + std::to_string(512 * kMiB) + "\n"));
  // Control: without the Allocate's edits the same program fills the whole fake GPU.
  auto [rc0, out0] = RunCaptured(probe, driver);
  ASSERT_EQ(rc0, 0) << out0;
  EXPECT_THAT(out0, ::testing::HasSubstr("held " + std::to_string(1024 * kMiB) + "\n"));

  // The pod file names the pod for the metrics once the agent learnt it from PodResources.
  std::string pod_dir = stdfs::path(accounting_host).parent_path().parent_path().string();
  EXPECT_TRUE(Eventually([&] {
    auto t = ReadFileToString(pod_dir + "/pod");
    return t.ok() && *t == "default/share\n";
  })) << Log();
  // Deleting the pod releases the grant: the accounting directory goes.
  ASSERT_TRUE(emu_->DeletePod("default", "share").ok());
  EXPECT_TRUE(Eventually([&] { return !stdfs::exists(pod_dir); })) << Log();
}

// With API access (--node-name, --kubeconfig) the Allocate finds its pod in the API server: the
// extender's GPU annotation is honoured, the container is named in the response and on the pod
// (assigned), the pool is published on the node, and deleting the pod from the API releases it.
TEST_F(Handover, WithApiServerFindsThePod) {
  testing::FakeApiServer api;
  ASSERT_TRUE(api.Start());
  api.CreateNode({{"metadata", {{"name", "node-1"}}}});
  using nlohmann::json;
  json pod = api.CreatePod(BoundSharePod("share", "1"));
  std::string uid = pod["metadata"]["uid"];
  std::ofstream(dir_ + "/kubeconfig") << api.Kubeconfig();
  StartAgent({"--node-name", "node-1", "--kubeconfig", dir_ + "/kubeconfig"});
  std::optional<emu::PodStatus> st;
  ASSERT_NO_FATAL_FAILURE(RunSharePod(&st));
  const auto& resp = st->containers[0].response;
  EXPECT_EQ(resp.annotations().at("gpulet.io/vgpu-container"), "default/share/app");
  EXPECT_EQ(resp.envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-face0000-0000-0000-0000-000000000001");
  EXPECT_EQ(resp.envs().at("GPULET_VGPU_MEMORY_LIMIT"), std::to_string(512 * kMiB));
  json now;
  ASSERT_TRUE(api.GetPod("default", "share", &now));
  EXPECT_EQ(now["metadata"]["annotations"]["gpulet.io/vgpu-assigned"], "true");
  auto pod_file = ReadFileToString(dir_ + "/vgpu/" + uid + "/pod");
  EXPECT_TRUE(pod_file.ok() && *pod_file == "default/share\n");
  EXPECT_TRUE(Eventually([&] {
    json node;
    return api.GetNode("node-1", &node) && node["metadata"].contains("annotations") &&
           node["metadata"]["annotations"]
                   .value("gpulet.io/vgpu-gpus", "")
                   .find("\"memoryUnits\":4") != std::string::npos;
  })) << Log();
  ASSERT_TRUE(api.DeletePod("default", "share"));
  EXPECT_TRUE(Eventually([&] { return !stdfs::exists(dir_ + "/vgpu/" + uid); })) << Log();
}

// The kubelet admits like pods in its own order, not their bind times': here b, bound after a, is
// admitted alone, and its Allocate is taken for a's. Right after the grant (not a reconcile
// interval later: an hour here) the agent reads the kubelet's record and gives the grant to b,
// with b's soft limit in the limits file, before b's container would start; a is unserved again.
TEST_F(Handover, AGrantFollowsThePodTheKubeletAdmitted) {
  testing::FakeApiServer api;
  ASSERT_TRUE(api.Start());
  api.CreateNode({{"metadata", {{"name", "node-1"}}}});
  using nlohmann::json;
  std::string a_uid = api.CreatePod(BoundSharePod("a", "1"))["metadata"]["uid"];
  api.CreatePod(BoundSharePod("share", "2", {{"tencent.com/vcuda-core-limit", "90"}}));
  std::ofstream(dir_ + "/kubeconfig") << api.Kubeconfig();
  StartAgent({"--node-name", "node-1", "--kubeconfig", dir_ + "/kubeconfig"}, "1h");
  std::optional<emu::PodStatus> st;
  ASSERT_NO_FATAL_FAILURE(RunSharePod(&st));  // the kubelet admits "share" only
  EXPECT_EQ(st->containers[0].response.annotations().at("gpulet.io/vgpu-container"),
            "default/a/app");  // the guess: bound first
  auto assigned = [&](const char* pod) {
    json now;
    return api.GetPod("default", pod, &now)
               ? now["metadata"]["annotations"].value("gpulet.io/vgpu-assigned", "")
               : "";
  };
  EXPECT_TRUE(Eventually([&] { return assigned("share") == "true"; })) << Log();
  EXPECT_TRUE(Eventually([&] { return assigned("a") == "false"; })) << Log();
  auto checkpoint = ReadFileToString(dir_ + "/vgpu/assignments.json");
  ASSERT_TRUE(checkpoint.ok());
  json grants = json::parse(*checkpoint)["grants"];
  ASSERT_EQ(grants.size(), 1u) << *checkpoint;
  EXPECT_EQ(grants[0]["pod"], "share");
  std::string mount;
  for (const auto& m : st->containers[0].response.mounts())
    if (m.container_path() == "/var/run/gpulet/vgpu/limits") mount = m.host_path();
  EXPECT_THAT(ReadFileToString(mount).value_or(""),
              ::testing::HasSubstr("GPULET_VGPU_CORE_CEILING=90\n"));

  // An agent stopped between a grant and its correction leaves the guess in its checkpoint: the
  // next one checks it against the kubelet's record as it starts (the interval is still an hour).
  kill(agent_, SIGTERM);
  int status = 0;
  waitpid(agent_, &status, 0);
  agent_ = -1;
  grants[0]["pod"] = "a";
  grants[0]["podUID"] = a_uid;
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/vgpu/assignments.json",
                              json{{"version", 1}, {"grants", grants}}.dump())
                  .ok());
  StartAgent({"--node-name", "node-1", "--kubeconfig", dir_ + "/kubeconfig"}, "1h");
  EXPECT_TRUE(Eventually([&] {
    auto now = ReadFileToString(dir_ + "/vgpu/assignments.json");
    return now.ok() && json::parse(*now)["grants"][0]["pod"] == "share";
  })) << Log();
}

// The pool's inventory annotation is on the Node as soon as the agent serves, not one reconcile
// interval later (an hour here): the extender places against it, and without it knows the node's
// GPUs only by made-up names (cluster.install_uninstall's first vGPU pod hit that window).
TEST_F(Handover, PublishesItsInventoryAtOnce) {
  testing::FakeApiServer api;
  ASSERT_TRUE(api.Start());
  api.CreateNode({{"metadata", {{"name", "node-1"}}}});
  std::ofstream(dir_ + "/kubeconfig") << api.Kubeconfig();
  StartAgent({"--node-name", "node-1", "--kubeconfig", dir_ + "/kubeconfig"}, "1h");
  EXPECT_TRUE(Eventually([&] {
    nlohmann::json node;
    return api.GetNode("node-1", &node) && node["metadata"].contains("annotations") &&
           node["metadata"]["annotations"]
                   .value("gpulet.io/vgpu-gpus", "")
                   .find("GPU-face0000-0000-0000-0000-000000000001") != std::string::npos;
  })) << Log();
}

// A pool selection naming a GPU the node does not have stops the agent with a message naming it.
TEST_F(Handover, UnknownPoolGpuIsAnError) {
  auto [rc, out] = RunCaptured(
      {Built("bin/gpulet"), "agent", "--simulate",
       std::string(GPULET_SOURCE_DIR) + "/tests/vgpu/handover-machine.yaml", "--sim-root",
       dir_ + "/root", "--device-plugin-dir", emu_->device_plugin_dir(), "--metrics-address",
       "127.0.0.1:0", "--labels-output", dir_ + "/features", "--vgpu-gpus", "7"},
      {});
  EXPECT_NE(rc, 0);
  EXPECT_THAT(out, ::testing::HasSubstr("gpulet.vgpu.gpus: vGPU GPU \"7\" is not on this node"));
}

}  // namespace
}  // namespace gpulet
