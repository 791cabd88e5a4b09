// `gpulet device-plugin --config-dir` as a process: NODE_NAME and KUBECONFIG point it at the fake
// API server, the kubelet emulator serves its device-plugin directory. A label switch on the Node
// re-registers the resource without a restart (same pid); an unknown name is a Warning Event.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "k8s/client.h"
#include "testing/apiserver/fake_apiserver.h"
#include "testing/kubelet/emulator.h"
#include "testing/process/spawn.h"

namespace gpulet {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

TEST(NodeConfigE2E, LabelSwitchReRegistersWithoutRestart) {
  const std::string bin = std::string(GPULET_BINARY_DIR) + "/bin/gpulet";
  if (access(bin.c_str(), X_OK) != 0) GTEST_SKIP() << "gpulet is not built";
  char tmpl[] = "/tmp/gpulet-nodecfg-e2e-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  fs::create_directories(dir + "/configs");
  fs::create_directories(dir + "/dp");
  std::ofstream(dir + "/configs/ts4") << "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                                         "    - {name: nvidia.com/gpu, replicas: 4}\n";
  std::ofstream(dir + "/configs/whole") << "version: v1\n";

  testing::FakeApiServer api;
  ASSERT_TRUE(api.Start());
  api.CreateNode(
      {{"apiVersion", "v1"},
       {"kind", "Node"},
       {"metadata",
        {{"name", "node-e2e"}, {"labels", {{"nvidia.com/device-plugin.config", "ts4"}}}}}});
  std::ofstream(dir + "/kubeconfig") << api.Kubeconfig();
  emu::EmulatorOptions eo;
  eo.device_plugin_dir = dir + "/dp";
  emu::KubeletEmulator kubelet(eo);
  ASSERT_TRUE(kubelet.Start().ok());

  setenv("NODE_NAME", "node-e2e", 1);
  setenv("KUBECONFIG", (dir + "/kubeconfig").c_str(), 1);
  pid_t pid = testing_process::SpawnLogged(
      {bin, "device-plugin", "--simulate", "pcie-t4", "--device-plugin-dir", dir + "/dp",
       "--config-dir", dir + "/configs", "--config-default", "whole", "--unhealthy-devices-file",
       ""},
      dir + "/log");
  unsetenv("NODE_NAME");
  unsetenv("KUBECONFIG");
  auto log = [&] {
    std::ifstream in(dir + "/log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_TRUE(kubelet.WaitForAllocatable("nvidia.com/gpu", 8, 10s).ok()) << log();

  k8s::Config kc;
  kc.server = api.url();
  k8s::Client client(kc);
  auto label = [&](const std::string& v) {
    return client.PatchNode("node-e2e", k8s::PatchType::kMerge,
                            {{"metadata", {{"labels", {{"nvidia.com/device-plugin.config", v}}}}}});
  };
  ASSERT_TRUE(label("whole").ok());
  EXPECT_TRUE(kubelet.WaitForAllocatable("nvidia.com/gpu", 2, 10s).ok()) << log();
  ASSERT_TRUE(label("nope").ok());
  bool event = false;
  for (int i = 0; i < 500 && !event; ++i) {
    for (const auto& e : api.Events())
      event |= e.value("reason", "") == "UnknownDevicePluginConfig" &&
               e["involvedObject"].value("name", "") == "node-e2e";
    if (!event) std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(event) << log();
  EXPECT_EQ(kubelet.Resource("nvidia.com/gpu")->devices.size(), 2u);
  EXPECT_EQ(waitpid(pid, nullptr, WNOHANG), 0) << "the plugin restarted or exited: " << log();
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << log();
  EXPECT_THAT(log(), HasSubstr("device plugin config \"whole\" applied (was \"ts4\")"));
  kubelet.Stop();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gpulet
