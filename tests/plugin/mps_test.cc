// sharing.mps: the control daemon's commands and supervision (against testing/fake_mps, which
// records what it is told), the Allocate edits, and the device plugin starting / replacing /
// stopping daemons across reloads, as the kubelet emulator sees it.
#include "plugin/mps.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "plugin/plugin.h"
#include "plugin/resources.h"
#include "testing/gpu/fake_gpu.h"
#include "testing/kubelet/emulator.h"

namespace gpulet::plugin {
namespace {

namespace fs = std::filesystem;
using gpulet::testing::FakeGpuLayer;
using gpulet::testing::MakeInventory;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

constexpr uint64_t kGiB = 1ull << 30;

gpu::Inventory Gpus(int n) {
  gpu::Inventory inv = MakeInventory(n, {});
  for (auto& d : inv.devices) d.memory_bytes = 80 * kGiB, d.cc_major = 9, d.cc_minor = 0;
  return inv;
}

// A temp root with the fake under both names in bin/ and a record file.
class MpsFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-mps-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ + "/bin");
    const std::string fake = std::string(GPULET_BINARY_DIR) + "/testing/gpulet-fake-mps-control";
    ASSERT_TRUE(fs::exists(fake)) << fake;
    fs::create_symlink(fake, dir_ + "/bin/nvidia-cuda-mps-control");
    fs::create_symlink(fake, dir_ + "/bin/nvidia-smi");
    record_ = dir_ + "/record";
    ::setenv("GPULET_FAKE_MPS_RECORD", record_.c_str(), 1);
    options_.root = dir_ + "/mps";
    options_.bin_dir = dir_ + "/bin";
    options_.probe_interval = absl::Milliseconds(50);
  }
  void TearDown() override {
    ::unsetenv("GPULET_FAKE_MPS_RECORD");
    std::error_code ec;
    fs::remove_all(dir_, ec);  // a leaked fake daemon exits when its pipe directory goes
  }
  std::vector<std::string> Record() const {
    std::ifstream in(record_);
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
  }
  int Count(const std::string& needle) const {
    int n = 0;
    for (const auto& l : Record()) n += l.find(needle) != std::string::npos;
    return n;
  }
  bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 5s) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (pred()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return pred();
  }
  MpsShare Share(int gpus, int replicas, const std::string& name = "nvidia.com/gpu") {
    MpsShare s{name, {}, replicas};
    gpu::Inventory inv = Gpus(gpus);
    for (const auto& d : inv.devices)
      s.gpus.push_back({d.index, d.uuid, d.memory_bytes, d.cc_major, d.cc_minor});
    return s;
  }

  std::string dir_, record_;
  MpsOptions options_;
};

// 100/replicas percent of the threads and memory/replicas of pinned memory per GPU, in MiB.
TEST(MpsLimitsTest, CommandsFollowReplicas) {
  MpsShare s{"nvidia.com/gpu", {{0, "GPU-a", 80 * kGiB, 9, 0}, {3, "GPU-b", 16 * kGiB, 9, 0}}, 3};
  EXPECT_THAT(MpsLimitCommands(s),
              ::testing::ElementsAre("set_default_device_pinned_mem_limit 0 27306M",
                                     "set_default_device_pinned_mem_limit 3 5461M",
                                     "set_default_active_thread_percentage 33"));
  EXPECT_EQ(MpsPipeDir("/run/nvidia/mps", "nvidia.com/gpu"), "/run/nvidia/mps/nvidia.com/gpu/pipe");
  EXPECT_EQ(MpsLogDir("/run/nvidia/mps/", "nvidia.com/gpu"), "/run/nvidia/mps/nvidia.com/gpu/log");
  EXPECT_EQ(MpsShmDir("/run/nvidia/mps"), "/run/nvidia/mps/shm");
}

// 48 clients per MPS server from compute capability 7.5 on, 16 before.
TEST(MpsLimitsTest, ReplicasBoundedByServerClients) {
  MpsShare s{"nvidia.com/gpu", {{2, "GPU-v", 16 * kGiB, 7, 0}}, 16};
  EXPECT_TRUE(ValidateMpsShare(s).ok());
  s.replicas = 17;
  EXPECT_THAT(ValidateMpsShare(s).message(), HasSubstr("17 replicas on GPU 2 (compute capability "
                                                       "7.0) exceed the 16 clients"));
  s.gpus[0].cc_minor = 5;
  s.replicas = 48;
  EXPECT_TRUE(ValidateMpsShare(s).ok());
  s.replicas = 49;
  EXPECT_FALSE(ValidateMpsShare(s).ok());
}

// Start: compute mode, daemon with its directories in the environment, limits, health; a killed
// daemon is started again with its limits; Stop: quit, compute mode back, log dir gone.
TEST_F(MpsFixture, DaemonStartsSupervisesAndStops) {
  MpsDaemon d(Share(2, 4), options_);
  ASSERT_TRUE(d.Start().ok());
  EXPECT_TRUE(d.healthy());
  const std::string pipe = options_.root + "/nvidia.com/gpu/pipe";
  const std::string log = options_.root + "/nvidia.com/gpu/log";
  auto rec = Record();
  ASSERT_GE(rec.size(), 5u);
  EXPECT_EQ(rec[0], "smi -i " + gpulet::testing::Uuid("GPU", 0) + " -c EXCLUSIVE_PROCESS");
  EXPECT_EQ(rec[1], "smi -i " + gpulet::testing::Uuid("GPU", 1) + " -c EXCLUSIVE_PROCESS");
  EXPECT_THAT(rec, Contains(HasSubstr("daemon pipe=" + pipe + " log=" + log)));
  EXPECT_THAT(rec, Contains("cmd pipe=" + pipe + " set_default_device_pinned_mem_limit 0 20480M"));
  EXPECT_THAT(rec, Contains("cmd pipe=" + pipe + " set_default_device_pinned_mem_limit 1 20480M"));
  EXPECT_THAT(rec, Contains("cmd pipe=" + pipe + " set_default_active_thread_percentage 25"));
  EXPECT_TRUE(fs::exists(options_.root + "/nvidia.com/gpu/.started"));
  EXPECT_TRUE(fs::exists(options_.root + "/shm"));
  auto answer = d.Command("get_default_active_thread_percentage");
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(*answer, "25\n");

  // The daemon dies: the supervisor notices, starts it again and sets the limits again.
  std::ifstream pidfile(pipe + "/nvidia-cuda-mps-control.pid");
  pid_t pid = 0;
  pidfile >> pid;
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  ASSERT_TRUE(WaitFor([&] { return d.restarts() >= 1 && Count("daemon pipe=") == 2; }))
      << d.restarts();
  ASSERT_TRUE(WaitFor([&] { return Count("set_default_active_thread_percentage 25") == 2; }));
  ASSERT_TRUE(WaitFor([&] { return d.healthy(); }));
  EXPECT_EQ(Count("set_default_device_pinned_mem_limit 0 20480M"), 2);

  d.Stop();
  EXPECT_FALSE(d.healthy());
  EXPECT_EQ(Count("cmd pipe=" + pipe + " quit"), 1);
  EXPECT_EQ(Count("-c DEFAULT"), 2);
  EXPECT_FALSE(fs::exists(log));
  EXPECT_FALSE(fs::exists(options_.root + "/nvidia.com/gpu/.started"));
  EXPECT_FALSE(d.Command("get_default_active_thread_percentage").ok());
}

// A daemon that already answers (the agent restarted while clients ran) is adopted, not doubled.
TEST_F(MpsFixture, RunningDaemonAdopted) {
  MpsDaemon first(Share(1, 2), options_);
  ASSERT_TRUE(first.Start().ok());
  MpsDaemon second(Share(1, 2), options_);
  ASSERT_TRUE(second.Start().ok());
  EXPECT_EQ(Count("daemon pipe="), 1);
  EXPECT_EQ(Count("set_default_active_thread_percentage 50"), 2);
  second.Stop();
  first.Stop();
}

// Errors name the step: no binary, or nvidia-smi refusing the compute mode.
TEST_F(MpsFixture, StartErrorsNameTheStep) {
  MpsOptions o = options_;
  o.bin_dir = dir_ + "/nothing";
  MpsDaemon missing(Share(1, 2), o);
  EXPECT_THAT(missing.Start().message(), HasSubstr("nothing/nvidia-smi is not an executable"));
  ::setenv("GPULET_FAKE_SMI_FAIL", "1", 1);
  MpsDaemon refused(Share(1, 2), options_);
  absl::Status s = refused.Start();
  ::unsetenv("GPULET_FAKE_SMI_FAIL");
  EXPECT_THAT(s.message(), HasSubstr("-c EXCLUSIVE_PROCESS failed (exit 3)"));
}

// Allocate as NVIDIA's: CUDA_MPS_PIPE_DIRECTORY and the pipe and shm mounts, also with CDI only;
// more than one replica is refused unless failRequestsGreaterThanOne is false.
TEST_F(MpsFixture, AllocateAddsPipeAndShm) {
  gpu::Inventory inv = Gpus(2);
  FakeGpuLayer layer(inv);
  HealthConfig hc;
  hc.unhealthy_devices_file = "";
  HealthMonitor health(&layer, inv, hc);
  auto cfg = ParseConfig(R"(version: v1
flags: {mpsRoot: /run/nvidia/mps}
sharing:
  mps:
    renameByDefault: true
    resources:
    - {name: nvidia.com/gpu, replicas: 4}
)",
                         "mps.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  std::vector<MpsShare> shares;
  auto rs = BuildResources(inv, *cfg, &health, "/nonexistent", &shares);
  ASSERT_TRUE(rs.ok()) << rs.status();
  ASSERT_EQ(rs->size(), 1u);
  EXPECT_EQ((*rs)[0]->name(), "nvidia.com/gpu.shared");
  EXPECT_EQ((*rs)[0]->Devices().size(), 8u);
  ASSERT_EQ(shares.size(), 1u);
  EXPECT_EQ(shares[0].resource, "nvidia.com/gpu.shared");
  EXPECT_EQ(shares[0].replicas, 4);
  EXPECT_EQ(shares[0].gpus.size(), 2u);
  const std::string u0 = gpulet::testing::Uuid("GPU", 0);
  auto r = (*rs)[0]->Allocate({u0 + "::1"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->envs().at("NVIDIA_VISIBLE_DEVICES"), u0);
  EXPECT_EQ(r->envs().at("CUDA_MPS_PIPE_DIRECTORY"), "/mps/nvidia.com/gpu.shared/pipe");
  ASSERT_EQ(r->mounts_size(), 2);
  EXPECT_EQ(r->mounts(0).host_path(), "/run/nvidia/mps/nvidia.com/gpu.shared/pipe");
  EXPECT_EQ(r->mounts(0).container_path(), "/mps/nvidia.com/gpu.shared/pipe");
  EXPECT_EQ(r->mounts(1).host_path(), "/run/nvidia/mps/shm");
  EXPECT_EQ(r->mounts(1).container_path(), "/dev/shm");
  // MPS fails requests of more than one replica by default (NVIDIA's default for MPS).
  auto two = (*rs)[0]->Allocate({u0 + "::1", u0 + "::2"});
  EXPECT_THAT(two.status().message(), HasSubstr("maximum request size"));

  Config cdi = *cfg;
  cdi.list = {false, false, false, true};
  cdi.mps_fail_requests_greater_than_one = false;
  auto rc = BuildResources(inv, cdi, &health, "/nonexistent");
  ASSERT_TRUE(rc.ok());
  auto c = (*rc)[0]->Allocate({u0 + "::1", u0 + "::2"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->envs().size(), 1u);
  EXPECT_EQ(c->envs().at("CUDA_MPS_PIPE_DIRECTORY"), "/mps/nvidia.com/gpu.shared/pipe");
  EXPECT_EQ(c->cdi_devices_size(), 1);
}

// IMEX channels as NVIDIA's: injected only when the channel's device node exists (env under
// envvar, a mount under volume-mounts, a device spec with passDeviceSpecs); imex.required makes a
// missing one an error.
TEST_F(MpsFixture, ImexChannelOnlyWhenItsNodeExists) {
  gpu::Inventory inv = Gpus(1);
  FakeGpuLayer layer(inv);
  HealthConfig hc;
  hc.unhealthy_devices_file = "";
  HealthMonitor health(&layer, inv, hc);
  auto cfg = ParseConfig(
      "imex: {channelIDs: [0]}\nflags: {plugin: {deviceListStrategy: "
      "[envvar, volume-mounts], passDeviceSpecs: true}}\n",
      "i.yaml");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const std::string host = dir_ + "/host";
  fs::create_directories(host + "/dev/nvidia-caps-imex-channels");
  auto missing = BuildResources(inv, *cfg, &health, host);
  ASSERT_TRUE(missing.ok()) << missing.status();
  auto r = (*missing)[0]->Allocate({gpulet::testing::Uuid("GPU", 0)});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->envs().contains("NVIDIA_IMEX_CHANNELS"));
  Config required = *cfg;
  required.imex_required = true;
  EXPECT_THAT(BuildResources(inv, required, &health, host).status().message(),
              HasSubstr("imex.required: IMEX channel /dev/nvidia-caps-imex-channels/channel0 "
                        "does not exist"));
  fs::create_symlink("/dev/null", host + "/dev/nvidia-caps-imex-channels/channel0");  // a char dev
  auto present = BuildResources(inv, required, &health, host);
  ASSERT_TRUE(present.ok()) << present.status();
  r = (*present)[0]->Allocate({gpulet::testing::Uuid("GPU", 0)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->envs().at("NVIDIA_IMEX_CHANNELS"), "0");
  bool mount = false, spec = false;
  for (const auto& m : r->mounts())
    mount |= m.container_path() == "/var/run/nvidia-container-devices/imex/0";
  for (const auto& d : r->devices())
    spec |= d.container_path() == "/dev/nvidia-caps-imex-channels/channel0";
  EXPECT_TRUE(mount);
  EXPECT_TRUE(spec);
}

// The feature labels of the config (gpu-feature-discovery's): sharing-strategy mps with the
// replicas of nvidia.com/gpu; time-slicing likewise; none without sharing.
TEST(MpsLabelsTest, SharingStrategyAndReplicas) {
  auto mps = ParseConfig("sharing:\n  mps:\n    resources: [{name: gpu, replicas: 4}]\n", "l.yaml");
  ASSERT_TRUE(mps.ok());
  EXPECT_EQ(LabelsOf(*mps).sharing_strategy, "mps");
  EXPECT_EQ(LabelsOf(*mps).replicas, 4);
  auto ts = ParseConfig(
      "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n"
      "    resources: [{name: gpu, replicas: 3}]\n",
      "l.yaml");
  ASSERT_TRUE(ts.ok());
  EXPECT_EQ(LabelsOf(*ts).sharing_strategy, "time-slicing");
  EXPECT_EQ(LabelsOf(*ts).replicas, 3);
  EXPECT_EQ(LabelsOf(*ts).mig_strategy, "mixed");
  EXPECT_EQ(LabelsOf(Config{}).sharing_strategy, "none");
  EXPECT_EQ(LabelsOf(Config{}).replicas, 1);
}

// NVIDIA's MPS refusals: migStrategy mixed, MIG devices, more replicas than the server takes.
TEST_F(MpsFixture, RefusalsNameWhy) {
  auto mixed = ParseConfig(
      "flags: {migStrategy: mixed}\nsharing:\n  mps:\n    resources:\n"
      "    - {name: nvidia.com/gpu, replicas: 2}\n",
      "m.yaml");
  ASSERT_TRUE(mixed.ok());
  EXPECT_THAT(Validate(*mixed).message(),
              HasSubstr("m.yaml:5: sharing.mps: not supported with migStrategy mixed"));

  gpu::Inventory inv = Gpus(1);
  gpulet::testing::AddMig(inv, 0, {"1g.10gb", "1g.10gb"});
  FakeGpuLayer layer(inv);
  HealthConfig hc;
  hc.unhealthy_devices_file = "";
  HealthMonitor health(&layer, inv, hc);
  auto single = ParseConfig(
      "flags: {migStrategy: single}\nsharing:\n  mps:\n    resources:\n"
      "    - {name: nvidia.com/gpu, replicas: 2}\n",
      "s.yaml");
  ASSERT_TRUE(single.ok());
  auto rs = BuildResources(inv, *single, &health, "/nonexistent");
  EXPECT_THAT(rs.status().message(), HasSubstr("MPS does not share MIG devices"));

  gpu::Inventory big = Gpus(1);
  FakeGpuLayer big_layer(big);
  HealthMonitor big_health(&big_layer, big, hc);
  auto many = ParseConfig(
      "sharing:\n  mps:\n    resources:\n"
      "    - {name: nvidia.com/gpu, replicas: 64}\n",
      "r.yaml");
  ASSERT_TRUE(many.ok());
  EXPECT_THAT(BuildResources(big, *many, &big_health, "/nonexistent").status().message(),
              HasSubstr("r.yaml:4: sharing.mps: nvidia.com/gpu: 64 replicas on GPU 0"));
}

// The device plugin starts the daemon before serving, keeps it across a reload that does not
// change the share, replaces it when the replicas change, and stops it when MPS is switched off.
TEST_F(MpsFixture, DevicePluginRunsDaemonsAcrossReloads) {
  emu::EmulatorOptions eo;
  eo.device_plugin_dir = dir_ + "/dp";
  fs::create_directories(eo.device_plugin_dir);
  emu::KubeletEmulator kubelet(eo);
  ASSERT_TRUE(kubelet.Start().ok());
  gpu::Inventory inv = Gpus(2);
  FakeGpuLayer layer(inv);
  const std::string file = dir_ + "/config.yaml";
  auto write = [&](const std::string& sharing) {
    std::ofstream(file) << "version: v1\nflags: {mpsRoot: " << options_.root
                        << "}\ngpulet:\n  health: {unhealthyDevicesFile: \"\"}\n  mps: {binDir: "
                        << options_.bin_dir << "}\nsharing:\n"
                        << sharing;
  };
  write("  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n");
  DevicePlugin::Options o;
  o.manager.plugin_dir = eo.device_plugin_dir;
  o.sources.file = file;
  o.mps_probe_interval = absl::Milliseconds(50);
  auto cfg = LoadConfig(o.sources);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  DevicePlugin dp(&layer, o, *cfg);
  ASSERT_TRUE(dp.Start().ok());
  ASSERT_TRUE(kubelet.WaitForAllocatable("nvidia.com/gpu", 8, 5s).ok());
  ASSERT_EQ(dp.mps_daemons().size(), 1u);
  EXPECT_EQ(Count("daemon pipe="), 1);

  ASSERT_TRUE(dp.Reload().ok());  // same share: the daemon stays
  EXPECT_EQ(Count("daemon pipe="), 1);
  EXPECT_EQ(Count(" quit"), 0);

  write("  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n");
  ASSERT_TRUE(dp.Reload().ok());
  ASSERT_TRUE(kubelet.WaitForAllocatable("nvidia.com/gpu", 4, 5s).ok());
  EXPECT_EQ(Count(" quit"), 1);
  EXPECT_EQ(Count("daemon pipe="), 2);
  EXPECT_EQ(Count("set_default_active_thread_percentage 50"), 1);

  // The daemon dies: its replicas turn Unhealthy until the supervisor has it back.
  std::ifstream pidfile(options_.root + "/nvidia.com/gpu/pipe/nvidia-cuda-mps-control.pid");
  pid_t pid = 0;
  pidfile >> pid;
  ASSERT_GT(pid, 0);
  ::kill(pid, SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return dp.mps_daemons().begin()->second->restarts() == 1; }));
  ASSERT_TRUE(kubelet.WaitForAllocatable("nvidia.com/gpu", 4, 5s).ok());

  write("  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 3}\n");
  ASSERT_TRUE(dp.Reload().ok());
  ASSERT_TRUE(kubelet.WaitForAllocatable("nvidia.com/gpu", 6, 5s).ok());
  EXPECT_TRUE(dp.mps_daemons().empty());
  EXPECT_EQ(Count(" quit"), 2);
  dp.Stop();
  kubelet.Stop();
}

}  // namespace
}  // namespace gpulet::plugin
