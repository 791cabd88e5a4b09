// `gpulet sim` end to end: the real gpulet-sim and gpulet binaries as processes. Bad inputs need
// only gpulet-sim; the node runs need the real agent (`gpulet agent`) and skip without it.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "k8s/podresources/v1/api.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kBin = std::string(GPULET_BINARY_DIR) + "/bin/";
const std::string kSrc = GPULET_SOURCE_DIR;

struct Result {
  int code = -1;
  std::string out;
};

// Runs a shell command, returning its exit code and merged stdout/stderr.
Result Shell(const std::string& cmd) {
  Result r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

class SimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access((kBin + "gpulet-sim").c_str(), X_OK) != 0)
      GTEST_SKIP() << "gpulet-sim is not built (cmake --build build --target gpulet-sim)";
    char tmpl[] = "/tmp/gsim-XXXXXX";
    root_ = mkdtemp(tmpl);
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }
  std::string Sim(const std::string& args) {
    return kBin + "gpulet-sim --sim-root " + root_ + " " + args;
  }
  static bool AgentBuilt() {
    return access((kBin + "gpulet").c_str(), X_OK) == 0 &&
           Shell(kBin + "gpulet agent --help").code == 0;
  }
  std::string root_;
};

// A sim root holds one machine: `gpulet info --simulate pcie-t4` on a dgx-h100 node's root is
// refused, naming both, and leaves that node's state as it was (it used to rewrite it silently,
// after which fault commands refused the running node's GPU numbers); the same machine is fine.
TEST_F(SimTest, SecondSimulateOnARootIsRefused) {
  if (!AgentBuilt()) GTEST_SKIP() << "gpulet is not built";
  std::string info = kBin + "gpulet info --sim-root " + root_ + " --simulate ";
  ASSERT_EQ(Shell(info + "dgx-h100").code, 0);
  Result r = Shell(info + "pcie-t4");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("holds the simulated node of machine dgx-h100"));
  std::ifstream node(root_ + "/control/node");
  std::string text((std::istreambuf_iterator<char>(node)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("machine dgx-h100"));
  EXPECT_EQ(Shell(info + "dgx-h100").code, 0);
}

// `gpulet labels` inputs it used to accept silently: --replicas 0 is refused; MIG_STRATEGY in the
// environment is honoured (as `gpulet device-plugin` honours it) and checked.
TEST_F(SimTest, LabelsInputs) {
  if (!AgentBuilt()) GTEST_SKIP() << "gpulet is not built";
  std::string out = root_ + "/labels";
  std::string base = kBin +
                     "gpulet labels --oneshot --no-timestamp --simulate a100-mig --sim-root " +
                     root_ + " --output " + out;
  Result r = Shell(base + " --replicas 0");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--replicas"));
  r = Shell("MIG_STRATEGY=mixed " + base);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream f(out);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("nvidia.com/mig.strategy=mixed"));
  r = Shell("MIG_STRATEGY=bogus " + base);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--mig-strategy"));
}

// A DaemonSet written for NVIDIA's device plugin starts: its flags (and their environment
// variables) are accepted, each with a warning saying what gpulet does instead; a discovery
// strategy gpulet cannot honour (tegra) stops the start with a message. They used to exit 109.
TEST_F(SimTest, NvidiaDevicePluginFlagsAccepted) {
  if (!AgentBuilt()) GTEST_SKIP() << "gpulet is not built";
  fs::create_directories(root_ + "/dp");
  std::string base = kBin + "gpulet device-plugin --simulate pcie-t4 --sim-root " + root_ +
                     "/sim --device-plugin-dir " + root_ + "/dp --kubelet-socket '' ";
  Result r = Shell("MPS_ROOT=/run/nvidia/mps timeout -s INT 3 " + base +
                   "--container-driver-root /driver-root --device-discovery-strategy auto "
                   "--imex-channel-ids 0 --nvidia-ctk-path /usr/bin/nvidia-ctk");
  EXPECT_THAT(r.out, Not(HasSubstr("The following argument")));
  // MPS_ROOT / --mps-root is a setting of gpulet's now (sharing.mps): no warning for it.
  EXPECT_THAT(r.out, Not(HasSubstr("--mps-root")));
  for (const char* flag :
       {"--container-driver-root=/driver-root", "--device-discovery-strategy=auto",
        "--imex-channel-ids=0", "--nvidia-ctk-path=/usr/bin/nvidia-ctk"})
    EXPECT_THAT(r.out, HasSubstr(std::string(flag) + " (NVIDIA device-plugin flag) is accepted "
                                                     "and ignored"));
  r = Shell(base + "--device-discovery-strategy tegra");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out,
              HasSubstr("--device-discovery-strategy tegra: gpulet discovers GPUs through NVML"));
}

// The per-node config flags the helm chart templates against, on both commands.
TEST_F(SimTest, PerNodeConfigFlags) {
  if (!AgentBuilt()) GTEST_SKIP() << "gpulet is not built";
  for (const char* cmd : {"agent", "device-plugin"}) {
    Result r = Shell(kBin + "gpulet " + cmd + " --help");
    EXPECT_EQ(r.code, 0) << r.out;
    for (const char* flag : {"--config-dir", "--config-default", "--config-node-label"})
      EXPECT_THAT(r.out, HasSubstr(flag)) << cmd;
    EXPECT_THAT(r.out, HasSubstr("nvidia.com/device-plugin.config")) << cmd;
  }
  Result r = Shell(kBin + "gpulet device-plugin --simulate pcie-t4 --config-dir " + root_ +
                   " --config-file " + root_ + "/x");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--config-file and --config-dir exclude each other"));
}

// One command-line convention (issue 22): every usage error exits 2 (CLI11's own codes were 105,
// 106, 109) with a "did you mean" for a mistyped flag or command; help and version exit 0.
TEST_F(SimTest, OneCliConvention) {
  if (!AgentBuilt()) GTEST_SKIP() << "gpulet is not built";
  Result r = Shell(kBin + "gpulet exporter --adress :1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("Did you mean --address?"));
  r = Shell(kBin + "gpulet infoo");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("Did you mean info?"));
  r = Shell(kBin + "gpulet-sched simulate --nodes x --pods y --jobs 0");
  EXPECT_EQ(r.code, 2) << r.out;
  r = Shell(kBin + "gpulet-sim --simulate nope --bogus");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(Shell(kBin + "gpulet --help").code, 0);
  EXPECT_EQ(Shell(kBin + "gpulet --version").code, 0);
}

// Durations in one syntax (10s, 500ms, 720h) on every command: the scheduler's flags took bare
// milliseconds and hours (CLI11 integers: "5s" was refused), the others Go durations; a bare number
// is refused where it never had a unit, and kept with a deprecation warning where it had one.
TEST_F(SimTest, DurationsInOneSyntax) {
  if (!AgentBuilt()) GTEST_SKIP() << "gpulet is not built";
  const std::string sched = kBin + "gpulet scheduler --kubeconfig " + root_ + "/none ";
  Result r = Shell(sched + "--tls-renew-check 5x");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out,
              HasSubstr("--tls-renew-check \"5x\": expected a duration like 10s, 500ms or 720h"));
  // Accepted in the one syntax: the run goes on to the (missing) kubeconfig.
  r = Shell(sched + "--tls-renew-check 5s --tls-renew-before 720h --workload-refresh 500ms");
  EXPECT_THAT(r.out, Not(HasSubstr("--tls-renew"))) << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr("--workload-refresh"))) << r.out;
  r = Shell(sched + "--workload-refresh 250");
  EXPECT_THAT(r.out, HasSubstr("--workload-refresh 250: a bare number is read as milliseconds "
                               "(deprecated); write 250ms"));
  r = Shell(kBin + "gpulet exporter --simulate pcie-t4 --sim-root " + root_ + " --interval 10");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--interval \"10\": expected a duration with its unit"));
}

// Without a kubelet the agent says so (it used to print nothing for as long as it waited), and at
// start it says where its metrics and labels are.
TEST_F(SimTest, AgentSaysWhatItWaitsForAndWhereItServes) {
  if (!AgentBuilt()) GTEST_SKIP() << "gpulet is not built";
  fs::create_directories(root_ + "/dp");
  Result r = Shell("timeout -s INT 3 " + kBin + "gpulet agent --simulate pcie-t4 --sim-root " +
                   root_ + "/sim --device-plugin-dir " + root_ +
                   "/dp --metrics-address "
                   "127.0.0.1:0 --labels-output " +
                   root_ + "/features");
  EXPECT_THAT(r.out, HasSubstr("waiting for the kubelet: " + root_ + "/dp/kubelet.sock"));
  EXPECT_TRUE(
      std::regex_search(r.out, std::regex("metrics: http://127\\.0\\.0\\.1:[1-9][0-9]*/metrics")))
      << r.out;
  EXPECT_THAT(r.out, HasSubstr("labels: " + root_ + "/features"));
}

// `gpulet info --json` gives scripts the same facts as the table: GPUs, MIG devices, topology.
TEST_F(SimTest, InfoJson) {
  if (!AgentBuilt()) GTEST_SKIP() << "gpulet is not built";
  Result r =
      Shell(kBin + "gpulet info --json --simulate a100-mig --sim-root " + root_ + " 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\"driverVersion\""));
  EXPECT_THAT(r.out, HasSubstr("\"uuid\": \"GPU-"));
  EXPECT_THAT(r.out, HasSubstr("\"profile\": \""));
  EXPECT_THAT(r.out, HasSubstr("\"topology\": ["));
  EXPECT_THAT(r.out, Not(HasSubstr("Legend")));
}

// One lost GPU does not hide the others: `gpulet info` lists them and flags the lost one as
// nvidia-smi does, in the table and in --json (it printed one error and listed nothing).
TEST_F(SimTest, InfoListsTheOthersWhenOneGpuIsLost) {
  if (!AgentBuilt()) GTEST_SKIP() << "gpulet is not built";
  const std::string info = kBin + "gpulet info --simulate dgx-h100 --sim-root " + root_;
  ASSERT_EQ(Shell(info + " >/dev/null 2>&1").code, 0);
  ASSERT_EQ(Shell(kBin + "gpulet sim fault lost --gpu 1 --sim-root " + root_).code, 0);
  Result r = Shell(info + " 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("GPU 0: NVIDIA H100"));
  EXPECT_THAT(r.out, HasSubstr("GPU 1: Unable to determine the device handle: GPU is lost\n"));
  EXPECT_THAT(r.out, HasSubstr("GPU 7: NVIDIA H100"));
  EXPECT_THAT(r.out, HasSubstr("GPU1\tN/A\t X \tN/A"));
  r = Shell("(" + info + " --json 2>/dev/null)");  // the lost GPU's warning goes to stderr
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["gpus"].size(), 8u) << r.out;
  EXPECT_EQ(j["gpus"][1]["error"], "GPU is lost");
  EXPECT_FALSE(j["gpus"][1].contains("uuid"));
  EXPECT_EQ(j["gpus"][2]["index"], 2);
  EXPECT_FALSE(j["gpus"][2].contains("error"));
}

// An unknown profile is refused before anything starts, naming the profile.
TEST_F(SimTest, UnknownProfile) {
  Result r = Shell(Sim("--simulate no-such-node"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--simulate no-such-node"));
}

// A bad pod file is refused with file:line before anything starts.
TEST_F(SimTest, BadPodYamlNamesFileAndLine) {
  std::string f = root_ + "/bad.yaml";
  std::ofstream(f) << "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n"
                      "  - name: c\n    image: i\n    resources:\n      limits:\n"
                      "        nvidia.com/gpu: half\n";
  Result r = Shell(Sim("--simulate dgx-h100 --agent-binary /bin/true " + f));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr(f + ":10: spec.containers[0].resources.limits[nvidia.com/gpu]"));
}

// A missing agent binary is named, with how to build it.
TEST_F(SimTest, MissingAgentBinary) {
  Result r = Shell(Sim("--simulate dgx-h100 --agent-binary /nonexistent/gpulet"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("agent binary not found: /nonexistent/gpulet"));
}

// An agent that dies before registering is reported with its exit status, and nothing hangs.
TEST_F(SimTest, AgentExitingEarlyIsReported) {
  Result r = Shell(Sim("--simulate dgx-h100 --agent-binary /bin/false"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("the agent exited (status 1) before registering"));
  EXPECT_FALSE(fs::exists(root_ + "/kubelet/device-plugins/kubelet.sock"));  // cleaned up
}

// A fault aimed at a sim root without a running node says so.
TEST_F(SimTest, FaultWithoutNode) {
  Result r = Shell(kBin + "gpulet-sim fault xid --gpu 3 --code 79 --sim-root " + root_);
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("no simulated node at " + root_));
  r = Shell(kBin + "gpulet-sim fault xid --gpu 3 --sim-root " + root_);
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("--code"));
}

// Values a fault cannot carry are refused before anything is written, exit 2, with the real range
// and the flag as typed: a negative temperature or XID used to wrap (the exporter then served
// 4294967256 C), a percentage over 100 or a P-state over 15 was taken, and a negative --gpu
// printed CLI11's 309-digit upper bound.
TEST_F(SimTest, FaultValuesAreBoundedAndSigned) {
  struct Try {
    std::string args, says;
  };
  const std::vector<Try> tries = {
      {"set --gpu 1 --temp -40", "--temp '-40' is out of range: want a whole number 0..200"},
      {"set --gpu 1 --temp 201", "--temp '201' is out of range: want a whole number 0..200"},
      {"set --gpu 1 --util 101", "--util '101' is out of range: want a whole number 0..100"},
      {"set --gpu 1 --value pstate=16",
       "--value pstate '16' is out of range: want a whole number 0..15"},
      {"set --gpu 1 --value gpu_util_pct=-1", "(NVML reports it unsigned)"},
      {"set --gpu 1 --value bogus=1", "bad --value 'bogus=1' (want KEY=N"},
      {"set --gpu 1", "nothing to set"},
      {"xid --gpu 3 --code -5", "--code '-5' is out of range: want a whole number 0..4294967295"},
      {"xid --gpu 3 --code 4294967296", "want a whole number 0..4294967295"},
      {"xid --gpu 3 --code 79x", "--code '79x' is out of range"},
  };
  for (const Try& t : tries) {
    Result r = Shell(kBin + "gpulet-sim fault " + t.args + " --sim-root " + root_);
    EXPECT_EQ(r.code, 2) << t.args << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr("gpulet sim fault " + t.args.substr(0, t.args.find(' ')) + ": "))
        << t.args;
    EXPECT_THAT(r.out, HasSubstr(t.says)) << t.args;
  }
  Result r = Shell(kBin + "gpulet-sim fault xid --gpu -1 --code 79 --sim-root " + root_);
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("'-1' is not an index 0..1023")) << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr("1797"))) << r.out;
  EXPECT_FALSE(fs::exists(root_ + "/control/faults.log")) << "a refused fault was written";
}

// A fault aimed at a MIG device (--gi/--ci) is refused on a GPU without MIG, and for an
// instance the GPU does not have, naming what it has (it faulted the whole GPU instead).
TEST_F(SimTest, MigFaultNeedsAMigDevice) {
  if (!AgentBuilt()) GTEST_SKIP() << "gpulet is not built";
  ASSERT_EQ(Shell(kBin + "gpulet info --simulate a100-mig --sim-root " + root_).code, 0);
  const std::string xid = kBin + "gpulet-sim fault xid --code 43 --sim-root " + root_;
  Result r = Shell(xid + " --gpu 3 --gi 1 --ci 0");  // GPU 3 of a100-mig has MIG disabled
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.out,
              HasSubstr("GPU 3 of the simulated node at " + root_ + " does not have MIG enabled"));
  r = Shell(xid + " --gpu 1 --gi 2");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.out,
              HasSubstr("GPU 1 has no MIG device gi=2 (its MIG devices, gi:ci: 1:0 5:0 13:0)"));
  EXPECT_THAT(Shell(xid + " --gpu 1 --ci 0").out, HasSubstr("--ci needs --gi"));
  r = Shell(xid + " --gpu -1");  // was "bad value in 'gpu=-1'", after the parse
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--gpu"));
  EXPECT_EQ(Shell(xid + " --gpu 1 --gi 5 --ci 0").code, 0);
  EXPECT_EQ(Shell(xid + " --gpu 3").code, 0);
  std::ifstream log(root_ + "/control/faults.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
}

// `gpulet sim` forwards to gpulet-sim, --help included.
TEST_F(SimTest, GpuletForwardsToRunner) {
  if (access((kBin + "gpulet").c_str(), X_OK) != 0) GTEST_SKIP() << "gpulet is not built";
  Result r = Shell(kBin + "gpulet sim --help");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--serve"));
  r = Shell(kBin + "gpulet sim --simulate no-such-node --sim-root " + root_);
  EXPECT_EQ(r.code, 2) << r.out;
}

// The demo: 8 H100s advertised by the real agent; the example pods placed; the notebook waits
// Pending until vectoradd completes; the vGPU pod's state is explained; the agent stops cleanly.
TEST_F(SimTest, DemoWithRealAgent) {
  if (!AgentBuilt()) GTEST_SKIP() << "`gpulet agent` is not built yet (device plugin issue)";
  Result r = Shell(Sim("--simulate dgx-h100 " + kSrc + "/examples/*.yaml"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("Capacity:\n(  .*\n)*  nvidia\\.com/gpu: +8\n")))
      << r.out;
  EXPECT_TRUE(
      std::regex_search(r.out, std::regex("Allocatable:\n(  .*\n)*  nvidia\\.com/gpu: +8\n")))
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("default/cuda-vectoradd +Succeeded")));
  for (const char* pod : {"pytorch-ddp-train", "llm-serving", "embeddings", "notebook"})
    EXPECT_TRUE(std::regex_search(r.out, std::regex(std::string("default/") + pod + " +Running")))
        << pod << "\n"
        << r.out;
  // The notebook went Pending first, then Running after vectoradd completed.
  size_t pending = r.out.find("Unschedulable");
  size_t completed = r.out.find("Completed");
  size_t started = r.out.rfind("pod/default/notebook");
  EXPECT_NE(pending, std::string::npos);
  EXPECT_LT(pending, completed);
  EXPECT_LT(completed, started);
  EXPECT_THAT(r.out, HasSubstr("NVIDIA_VISIBLE_DEVICES=GPU-"));
  EXPECT_THAT(r.out, HasSubstr("no GPU is shared"));  // why the vGPU pod stays Pending
  EXPECT_TRUE(std::regex_search(r.out, std::regex("default/vgpu-inference +Pending")));
  EXPECT_THAT(r.out, HasSubstr("Agent stopped (exit status 0)"));
}

// The vGPU example alone: every H100 is shared (100 cores and 320 units of 256 MiB each), the pod
// runs with its 30 cores and 20 units, and its container gets the limits and the interposer.
TEST_F(SimTest, VgpuPodAloneSharesEveryGpu) {
  if (!AgentBuilt()) GTEST_SKIP() << "`gpulet agent` is not built yet (device plugin issue)";
  Result r = Shell(Sim("--simulate dgx-h100 " + kSrc + "/examples/05-vgpu.yaml"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex("Capacity:\n(  .*\n)*  tencent\\.com/vcuda-core: +800\n(  .*\n)*"
                        "  tencent\\.com/vcuda-memory: +2560\n")))
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("tencent\\.com/vcuda-core +30 +30\n"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("tencent\\.com/vcuda-memory +20 +20\n")))
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("default/vgpu-inference +Running"))) << r.out;
  EXPECT_THAT(r.out, HasSubstr("GPULET_VGPU_MEMORY_LIMIT=5368709120"));  // 20 x 256 MiB
  EXPECT_THAT(r.out, HasSubstr("GPULET_VGPU_CORE_LIMIT=30"));
  EXPECT_THAT(r.out, HasSubstr("LD_PRELOAD=/usr/lib/gpulet/libgpulet-vcuda.so"));
  EXPECT_THAT(r.out, Not(HasSubstr("nvidia.com/gpu:")));  // a shared GPU is not offered whole
  // Units print as ranges (30 IDs were a 1.5 KB line), with one occupancy line per GPU; no "//c"
  // annotation for a pod Allocate cannot name, and its accounting directory is explained.
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex("tencent\\.com/vcuda-core: GPU-[0-9a-f-]+::vc[0-9]+-vc[0-9]+(,vc[0-9]+"
                        "(-vc[0-9]+)?)*\n")))
      << r.out;
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex("\n  GPU-[0-9a-f-]+  vcuda-core 30/100  vcuda-memory 20/320\n")))
      << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n') < 60, true) << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr("=//c")));
  EXPECT_THAT(r.out, HasSubstr("without an API server Allocate cannot name the pod"));
}

// The agent's exporter reports the vGPU pod's container under the agent's own grant, as it is
// wired in production (the grant checkpoint in the accounting directory): namespace, pod and the
// container's real name, although without an API server its accounting directory was made under a
// placeholder name before the pod was known; the limit is the grant's, 20 x 256 MiB.
TEST_F(SimTest, ExporterReportsTheVgpuContainerByItsGrant) {
  if (!AgentBuilt()) GTEST_SKIP() << "`gpulet agent` is not built yet (device plugin issue)";
  std::string log = root_ + "/../" + fs::path(root_).filename().string() + ".vgpu.out";
  pid_t pid = fork();
  if (pid == 0) {
    std::string cmd =
        Sim("--simulate dgx-h100 --serve " + kSrc + "/examples/05-vgpu.yaml > " + log + " 2>&1");
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), nullptr);
    _exit(127);
  }
  auto read_log = [&] {
    std::ifstream in(log);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  std::smatch url;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string banner;
  while (std::chrono::steady_clock::now() < deadline) {
    banner = read_log();
    if (banner.find("Serving") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(std::regex_search(banner, url,
                                std::regex("metrics: +(http://127\\.0\\.0\\.1:[0-9]+/metrics)")))
      << banner;
  const std::string want =
      "gpulet_vgpu_container_memory_limit_bytes{namespace=\"default\",pod=\"vgpu-inference\","
      "container=\"app\",gpu=\"";
  std::string text;
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    text = Shell("curl -sf " + url[1].str()).out;
    if (text.find(want) != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  if (text.empty() && Shell("command -v curl").code != 0) GTEST_SKIP() << "curl is not installed";
  std::smatch line;
  ASSERT_TRUE(
      std::regex_search(text, line,
                        std::regex(std::regex_replace(want, std::regex("[{}.\\[\\]]"), "\\$&") +
                                   "[0-9]+\",uuid=\"GPU-[0-9a-f-]+\"\\} ([0-9]+)\n")))
      << text;
  EXPECT_EQ(line[1].str(), "5368709120");
  EXPECT_THAT(text, Not(HasSubstr("container=\"c\"")));
  fs::remove(log);
}

// --serve keeps the node up: PodResources answers over its socket, an injected XID fault on one
// GPU takes it out of the allocatable set, SIGTERM stops everything with exit 0.
TEST_F(SimTest, ServeAnswersPodResourcesAndFaults) {
  if (!AgentBuilt()) GTEST_SKIP() << "`gpulet agent` is not built yet (device plugin issue)";
  std::string log = root_ + "/../" + fs::path(root_).filename().string() + ".out";
  pid_t pid = fork();
  if (pid == 0) {
    std::string cmd = Sim("--simulate dgx-h100 --serve > " + log + " 2>&1");
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), nullptr);
    _exit(127);
  }
  auto read_log = [&] {
    std::ifstream in(log);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_log().find("Serving") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_THAT(read_log(), HasSubstr("Serving")) << read_log();
  auto stub = v1::PodResourcesLister::NewStub(grpc::CreateChannel(
      "unix:" + root_ + "/kubelet/pod-resources/kubelet.sock", grpc::InsecureChannelCredentials()));
  auto healthy_gpus = [&] {
    grpc::ClientContext ctx;
    v1::AllocatableResourcesResponse resp;
    if (!stub->GetAllocatableResources(&ctx, {}, &resp).ok()) return -1;
    int n = 0;
    for (const auto& d : resp.devices()) n += d.resource_name() == "nvidia.com/gpu";
    return n;
  };
  EXPECT_EQ(healthy_gpus(), 8);
  // The banner's fault hint works as printed (it used to put --sim-root before the kind, which
  // the fault command refused), and the banner says where the metrics are.
  std::smatch hint;
  std::string banner = read_log();
  ASSERT_TRUE(std::regex_search(banner, hint, std::regex("faults: +gpulet sim (fault [^\n]*)")))
      << banner;
  EXPECT_TRUE(
      std::regex_search(banner, std::regex("metrics: +http://127\\.0\\.0\\.1:[0-9]+/metrics")))
      << banner;
  Result f = Shell(kBin + "gpulet-sim " + hint[1].str());
  EXPECT_EQ(f.code, 0) << f.out;
  // It says what it did (it used to print nothing on success).
  EXPECT_THAT(f.out, HasSubstr("gpulet sim fault xid: xid gpu=3 code=79 -> the node at " + root_));
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (healthy_gpus() != 7 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(healthy_gpus(), 7) << read_log();
  // --sim-root before the kind is understood too.
  f = Shell(kBin + "gpulet-sim fault --sim-root " + root_ + " xid --gpu 4 --code 79");
  EXPECT_EQ(f.code, 0) << f.out;
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (healthy_gpus() != 6 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(healthy_gpus(), 6) << read_log();
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << read_log();
  EXPECT_THAT(read_log(), HasSubstr("Received SIGTERM"));
  fs::remove(log);
}

}  // namespace
