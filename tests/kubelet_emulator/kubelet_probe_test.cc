// The kubelet probe's scenarios (testing/kubelet/probe.h) on the kubelet emulator: its transcript
// must be the one the real kubelet v1.34 wrote on the test cluster (kubelet_probe.expected;
// tests/cluster/test_kubelet_probe.py runs the same steps there and checks the same file).
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "testing/kubelet/emulator.h"
#include "testing/kubelet/probe.h"

namespace gpulet::emu {
namespace {

namespace fs = std::filesystem;
constexpr auto kWait = std::chrono::milliseconds(5000);

PodSpec ProbePod(const std::string& name, int n, const std::string& node = "") {
  PodSpec p;
  p.name = name;
  p.node_name = node;
  p.containers.push_back({.name = "main",
                          .image = "gpulet.test/busybox:1",
                          .env = {},
                          .limits = {{probe::kResource, std::to_string(n)}},
                          .requests = {}});
  return p;
}

std::vector<std::string> Expected() {
  std::ifstream f(std::string(GPULET_SOURCE_DIR) +
                  "/tests/kubelet_emulator/kubelet_probe.expected");
  std::vector<std::string> out;
  for (std::string l; std::getline(f, l);)
    if (!l.empty() && l[0] != '#') out.push_back(l);
  return out;
}

class KubeletProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kprobe-XXXXXX";
    root_ = mkdtemp(tmpl);
    dir_ = root_ + "/device-plugins";
    EmulatorOptions o;
    o.device_plugin_dir = dir_;
    o.node_name = "gpulet-node";
    emu_ = std::make_unique<KubeletEmulator>(o);
    ASSERT_TRUE(emu_->Start().ok());
    plugin_ = std::make_unique<probe::ProbePlugin>(dir_);
  }
  void TearDown() override {
    plugin_.reset();
    emu_.reset();
    fs::remove_all(root_);
  }

  // What kubectl shows of the Node (capacity and allocatable of the probe resource).
  void NoteNode() {
    auto r = emu_->Resource(probe::kResource);
    plugin_->Note(absl::StrCat("node: capacity=", r ? r->capacity : 0,
                               " allocatable=", r ? r->allocatable : 0));
  }
  // What kubectl shows of a pod: phase, and status.reason and message when there is one. The
  // emulator keeps the last event's reason for a Running pod too ("Started"), where the API's
  // status has none: only Pending and Failed pods carry one (what gpulet reads).
  void NotePod(const std::string& name) {
    auto p = emu_->GetPod("default", name);
    ASSERT_TRUE(p);
    std::string line = absl::StrCat("pod ", name, ": ", PodPhaseName(p->phase));
    bool has_reason = p->phase == PodPhase::kPending || p->phase == PodPhase::kFailed;
    if (has_reason && !p->reason.empty())
      absl::StrAppend(&line, " ", p->reason, " \"", p->message, "\"");
    plugin_->Note(line);
  }
  void NotePodResources() {
    for (const auto& l : probe::PodResourcesView(emu_->pod_resources_socket())) plugin_->Note(l);
  }

  std::string root_, dir_;
  std::unique_ptr<KubeletEmulator> emu_;
  std::unique_ptr<probe::ProbePlugin> plugin_;
};

// The steps of tests/cluster/test_kubelet_probe.py, in the same order.
TEST_F(KubeletProbeTest, TranscriptMatchesTheRealKubelet) {
  probe::ProbePlugin& p = *plugin_;
  p.Note("register_bad_version: " + probe::TryRegister(dir_, "v1beta2", probe::kResource));
  p.Note("register_bad_name: " + probe::TryRegister(dir_, "v1beta1", "probe-dev"));
  ASSERT_TRUE(p.Serve());
  p.Register();
  ASSERT_TRUE(emu_->WaitForAllocatable(probe::kResource, 4, kWait).ok());
  NoteNode();

  // A pod of 2 through the scheduler.
  ASSERT_TRUE(emu_->AddPod(ProbePod("probe-kp-1", 2)).ok());
  ASSERT_TRUE(emu_->WaitForPodPhase("default", "probe-kp-1", PodPhase::kRunning, kWait).ok());
  NotePod("probe-kp-1");
  NotePodResources();

  // dev-0 unhealthy.
  p.SetHealthy(0, false);
  ASSERT_TRUE(emu_->WaitForAllocatable(probe::kResource, 3, kWait).ok());
  NoteNode();
  NotePodResources();

  // A pod of 1, where the plugin prefers an unknown device.
  ASSERT_TRUE(emu_->AddPod(ProbePod("probe-kp-2", 1)).ok());
  emu_->WaitIdle(kWait);
  NotePod("probe-kp-2");
  // A pod of 2 bound to the node directly: the kubelet's own admission.
  ASSERT_TRUE(emu_->AddPod(ProbePod("probe-kp-3", 2, "gpulet-node")).ok());
  emu_->WaitIdle(kWait);
  NotePod("probe-kp-3");
  NotePodResources();

  // A kubelet restart: the plugin sees kubelet.sock replaced and registers again.
  emu_->Stop();
  ASSERT_TRUE(emu_->Start().ok());
  struct stat st {};
  p.Note(std::string("kubelet.sock replaced; plugin socket ") +
         (stat(p.socket().c_str(), &st) == 0 ? "kept" : "removed"));
  p.Stop();
  ASSERT_TRUE(p.Serve());
  p.Register();
  ASSERT_TRUE(emu_->WaitForAllocatable(probe::kResource, 3, kWait).ok());
  NoteNode();
  NotePodResources();

  // The plugin goes away.
  p.Stop();
  ASSERT_TRUE(emu_->WaitForAllocatable(probe::kResource, 0, kWait).ok());
  NoteNode();

  std::vector<std::string> got = p.Lines();
  std::string transcript;
  for (const auto& l : got) transcript += l + "\n";
  EXPECT_EQ(got, Expected()) << "the emulator's transcript:\n" << transcript;
}

}  // namespace
}  // namespace gpulet::emu
