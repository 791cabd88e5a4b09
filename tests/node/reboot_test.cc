// The reboot scenario of the install issue, end to end: a node comes back with a new boot ID, the
// kubelet (emulator) starts before the device plugin and rejects a controller-owned GPU pod with
// UnexpectedAdmissionError; the readiness controller taints the node, validates driver, runtime and
// plugin (the real `gpulet agent` on a simulated dgx-h100), labels, untaints and deletes the
// rejected pod; the controller recreates it and it runs. Needs root (device nodes in the host
// root).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "node/install.h"
#include "node/readiness.h"
#include "node/validate.h"
#include "testing/apiserver/fake_apiserver.h"
#include "testing/cluster/node_sync.h"
#include "testing/kubelet/emulator.h"
#include "testing/process/spawn.h"
#include "testing/runtime/fixtures.h"

namespace gpulet::node {
namespace {

namespace rt = gpulet::runtime::testing;
using k8s::json;

using testing_process::Spawn;

bool HasTaint(const json& node) {
  if (!node["spec"].contains("taints")) return false;
  for (const auto& t : node["spec"]["taints"])
    if (t["key"] == "gpulet.io/gpu-stack-not-ready") return true;
  return false;
}

TEST(RebootScenario, RejectedPodIsRecreatedAndRunsAndTaintIsCleared) {
  if (!rt::IsRoot()) GTEST_SKIP() << "needs root to mknod the host's device nodes";
  std::string agent = std::string(GPULET_BINARY_DIR) + "/bin/gpulet";
  if (::access(agent.c_str(), X_OK) != 0) GTEST_SKIP() << agent << " is not built";
  std::string dir = rt::MakeTempDir("reboot");
  std::string host = dir + "/host", sim = dir + "/sim", dp = dir + "/device-plugins";
  std::string podres = dir + "/pod-resources/kubelet.sock";
  std::filesystem::create_directories(dp);
  std::filesystem::create_directories(sim);
  std::string why;
  ASSERT_TRUE(rt::MakeDriverRoot(host, 8, &why)) << why;
  rt::WriteFile(host + "/etc/containerd/config.toml", "version = 2\n");

  // The node was installed and validated during its previous boot.
  InstallOptions io;
  io.host_root = host;
  io.artifacts_dir = GPULET_BINARY_DIR;
  io.restart_command = "none";
  io.gpu.simulate = "dgx-h100";
  io.gpu.sim_root = sim;
  auto installed = Install(io);
  ASSERT_TRUE(installed.ok()) << installed.status();

  testing::FakeApiServer api;
  ASSERT_TRUE(api.Start());
  k8s::Config cfg;
  cfg.server = api.url();
  k8s::Client client(cfg);
  api.CreateNode({{"metadata",
                   {{"name", "sim-node"},
                    {"labels", {{"gpulet.io/gpu-stack", "ready"}}},
                    {"annotations", {{"gpulet.io/validated-boot-id", "boot-1"}}}}},
                  {"status", {{"nodeInfo", {{"bootID", "boot-1"}}}}}});

  // Reboot: a fresh kubelet with a new boot ID; the device plugin is not up yet.
  emu::EmulatorOptions eo;
  eo.device_plugin_dir = dp;
  eo.pod_resources_socket = podres;
  eo.scheduler = false;  // bound pods meet the kubelet's own admission
  eo.node_name = "sim-node";
  emu::KubeletEmulator kubelet(eo);
  ASSERT_TRUE(kubelet.Start().ok());
  cluster::NodeSync sync(&client, "sim-node");
  sync.set_emulator(&kubelet);
  sync.set_boot_id("boot-2");
  cluster::ReplicaSetController rs(&client, "train", "sim-node", 1);
  ASSERT_TRUE(rs.SyncOnce().ok());
  ASSERT_TRUE(sync.SyncOnce().ok());
  json pod;
  ASSERT_TRUE(api.GetPod("default", "train-1", &pod));
  ASSERT_EQ(pod["status"]["phase"], "Failed") << pod.dump();
  // A fresh kubelet that does not know the resource yet says OutOf<resource>; one that knows it
  // from its checkpoint says UnexpectedAdmissionError. Both are the rejection being healed.
  std::string reason = pod["status"]["reason"];
  ASSERT_TRUE(reason == "UnexpectedAdmissionError" || reason == "OutOfnvidia.com/gpu") << reason;

  ValidateOptions vo;
  vo.host_root = host;
  vo.gpu.simulate = "dgx-h100";
  vo.gpu.sim_root = sim;
  vo.pod_resources_socket = podres;
  vo.node_name = "sim-node";
  vo.client = &client;
  ReadinessOptions ro;
  ro.node_name = "sim-node";
  ReadinessController ready(
      &client, [&] { return ValidateStack(vo); }, ro);
  auto st = ready.ReconcileOnce();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(*st, NodeStackState::kNotReady) << ready.last_report().FirstFailure();
  json node;
  ASSERT_TRUE(api.GetNode("sim-node", &node));
  EXPECT_TRUE(HasTaint(node)) << "new GPU pods must stay off the node until it validates";
  EXPECT_FALSE(node["metadata"]["labels"].contains("gpulet.io/gpu-stack"));

  // The agent comes up and registers.
  // Hermetic: labels into the test's directory, metrics on an ephemeral loopback port (the
  // defaults are the host's NFD directory and 0.0.0.0:9400).
  pid_t pid =
      Spawn({agent, "agent", "--simulate", "dgx-h100", "--sim-root", sim, "--device-plugin-dir", dp,
             "--pod-resources-socket", podres, "--metrics-address", "127.0.0.1:0",
             "--labels-output", dir + "/features.d/gpulet", "--vgpu-state-dir", dir + "/vgpu"});
  ASSERT_GT(pid, 0);
  absl::Status up = kubelet.WaitForAllocatable("nvidia.com/gpu", 8, std::chrono::seconds(20));
  bool running = false;
  for (int i = 0; i < 100 && up.ok() && !running; ++i) {
    ASSERT_TRUE(sync.SyncOnce().ok());
    st = ready.ReconcileOnce();
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_TRUE(rs.SyncOnce().ok());
    ASSERT_TRUE(sync.SyncOnce().ok());
    json p2;
    running = api.GetPod("default", "train-2", &p2) && p2["status"]["phase"] == "Running";
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(up.ok()) << up;
  EXPECT_TRUE(running) << "the recreated pod did not run; last report: "
                       << ready.last_report().FirstFailure();
  EXPECT_FALSE(api.GetPod("default", "train-1", &pod)) << "the rejected pod must be deleted";
  EXPECT_EQ(ready.deleted_pods(), 1);
  ASSERT_TRUE(api.GetNode("sim-node", &node));
  EXPECT_FALSE(HasTaint(node));
  EXPECT_EQ(node["metadata"]["labels"]["gpulet.io/gpu-stack"], "ready");
  EXPECT_EQ(node["metadata"]["annotations"]["gpulet.io/validated-boot-id"], "boot-2");
  EXPECT_EQ(node["status"]["capacity"]["nvidia.com/gpu"], "8");
  kubelet.Stop();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gpulet::node
