// The GPU layer on simulated nodes: the conformance suite over every built-in profile, the facts of
// each profile (checked against reference/hardware.md, not against the profile files), live fault
// injection through the control log, and bad inputs.
#include <dlfcn.h>
#include <link.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "abi/nvml_api.h"
#include "conformance.h"
#include "fake_nvml/control.h"
#include "fake_nvml/fault_cli.h"
#include "fake_nvml/machine.h"
#include "gmock/gmock.h"
#include "gpu/nvml/nvml_layer.h"
#include "gpu/open.h"

namespace gpulet::gpu::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
namespace fs = std::filesystem;

INSTANTIATE_TEST_SUITE_P(Profiles, GpuLayerConformance,
                         ::testing::Values("dgx-h100", "dgx1-v100", "a100-mig", "pcie-t4",
                                           "dgx2-v100"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

class SimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-gpu-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    layer_.reset();
    fs::remove_all(root_);
  }
  absl::StatusOr<std::unique_ptr<GpuLayer>> Open(const std::string& profile) {
    GpuOptions o;
    o.simulate = profile;
    o.sim_root = root_;
    return OpenGpuLayer(o);
  }
  void Start(const std::string& profile) {
    auto l = Open(profile);
    ASSERT_TRUE(l.ok()) << l.status();
    layer_ = *std::move(l);
    inv_ = *layer_->GetInventory();
  }
  void Inject(const std::string& line) {
    auto f = sim::ParseFault(line);
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_TRUE(sim::InjectFault(root_, *f).ok());
  }
  std::string WriteFile(const std::string& name, const std::string& text) {
    std::string p = root_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }

  std::string root_;
  std::unique_ptr<GpuLayer> layer_;
  Inventory inv_;
};

// Collects events from a subscription; Wait() blocks (bounded) until `n` have arrived.
struct EventSink {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Event> events;
  GpuLayer::EventCallback Callback() {
    return [this](const Event& e) {
      std::lock_guard<std::mutex> l(mu);
      events.push_back(e);
      cv.notify_all();
    };
  }
  bool Wait(size_t n) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::seconds(10), [&] { return events.size() >= n; });
  }
};

// DGX H100 (hardware.md): 8 H100s, NV18 between every pair, GPUs 0-3 on NUMA 0 and 4-7 on NUMA 1.
TEST_F(SimTest, DgxH100Inventory) {
  Start("dgx-h100");
  ASSERT_EQ(inv_.devices.size(), 8u);
  EXPECT_EQ(inv_.driver_version, "550.54.15");
  EXPECT_EQ(inv_.cuda_driver_version, 12040);
  for (const Device& d : inv_.devices) {
    EXPECT_EQ(d.name, "NVIDIA H100 80GB HBM3");
    EXPECT_EQ(d.architecture, "Hopper");
    EXPECT_EQ(d.memory_bytes, 81559ull << 20);
    EXPECT_EQ(d.sm_count, 132u);
    EXPECT_EQ(d.cc_major * 10 + d.cc_minor, 90);
    EXPECT_EQ(d.power_limit_mw, 700000u);
    EXPECT_EQ(d.numa_node, d.index < 4 ? 0 : 1);
    EXPECT_EQ(d.minor, d.index);
    EXPECT_TRUE(d.mig_capable);
    EXPECT_FALSE(d.mig_enabled);
    for (const Device& e : inv_.devices) {
      if (e.index != d.index) {
        EXPECT_EQ(inv_.topology[d.index][e.index].nvlinks, 18);
      }
    }
  }
  // The driver-visible files production code reads through host_root were materialised.
  EXPECT_TRUE(fs::exists(root_ + "/proc/driver/nvidia/version"));
  EXPECT_TRUE(fs::exists(root_ + "/proc/driver/nvidia-caps/mig-minors"));
  EXPECT_TRUE(fs::exists(root_ + "/dev/nvidia7"));
  std::ifstream devices(root_ + "/proc/devices");
  std::string text((std::istreambuf_iterator<char>(devices)), {});
  EXPECT_THAT(text, HasSubstr(" nvidia-uvm\n"));
  EXPECT_THAT(text, HasSubstr(" nvidia-caps\n"));
}

// DGX-1 hybrid cube-mesh: the NVLink matrix of reference/hardware.md, SYS where there is no link.
TEST_F(SimTest, Dgx1V100TopologyMatchesHardwareReference) {
  const int kLinks[8][8] = {{0, 2, 1, 1, 2, 0, 0, 0}, {2, 0, 1, 2, 0, 1, 0, 0},
                            {1, 1, 0, 2, 0, 0, 2, 0}, {1, 2, 2, 0, 0, 0, 0, 1},
                            {2, 0, 0, 0, 0, 2, 1, 1}, {0, 1, 0, 0, 2, 0, 1, 2},
                            {0, 0, 2, 0, 1, 1, 0, 2}, {0, 0, 0, 1, 1, 2, 2, 0}};
  Start("dgx1-v100");
  ASSERT_EQ(inv_.devices.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(inv_.devices[i].name, "Tesla V100-SXM2-16GB");
    EXPECT_EQ(inv_.devices[i].numa_node, i < 4 ? 0 : 1);
    for (int j = 0; j < 8; ++j) {
      if (i == j) continue;
      EXPECT_EQ(inv_.topology[i][j].nvlinks, kLinks[i][j]) << "GPU" << i << "-GPU" << j;
      if (kLinks[i][j] == 0) {
        EXPECT_STREQ(PcieRelationName(inv_.topology[i][j].pcie), "SYS");
      }
    }
  }
}

// a100-mig: mixed layouts with the GPU/compute instance ids and profile names NVML yields.
TEST_F(SimTest, A100MigDevices) {
  Start("a100-mig");
  ASSERT_EQ(inv_.devices.size(), 4u);
  auto profiles = [&](int gpu) {
    std::vector<std::string> p;
    for (const MigDevice& m : inv_.devices[gpu].mig_devices) p.push_back(m.profile);
    return p;
  };
  EXPECT_EQ(profiles(0), std::vector<std::string>(7, "1g.5gb"));
  EXPECT_EQ(profiles(1), (std::vector<std::string>{"3g.20gb", "2g.10gb", "1g.5gb"}));
  EXPECT_EQ(profiles(2), (std::vector<std::string>{"3g.20gb", "3g.20gb"}));
  EXPECT_TRUE(inv_.devices[3].mig_capable);
  EXPECT_FALSE(inv_.devices[3].mig_enabled);
  EXPECT_TRUE(inv_.devices[3].mig_devices.empty());
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(inv_.devices[0].mig_devices[i].gpu_instance_id, 7u + i);
    EXPECT_EQ(inv_.devices[0].mig_devices[i].compute_instance_id, 0u);
    EXPECT_EQ(inv_.devices[0].mig_devices[i].sm_count, 14u);
  }
  EXPECT_EQ(inv_.devices[1].mig_devices[0].memory_bytes, 19968ull << 20);
  EXPECT_EQ(inv_.topology[0][1].nvlinks, 4);
}

// Profile names follow the device plugin's rounding (memory fraction up to eighths, whole GiB).
TEST(MigProfileName, RoundsLikeTheDevicePlugin) {
  const uint64_t a100_40 = 40960ull << 20, h100_80 = 81559ull << 20;
  EXPECT_EQ(MigProfileName(1, 1, 4864, a100_40), "1g.5gb");
  EXPECT_EQ(MigProfileName(2, 2, 9984, a100_40), "2g.10gb");
  EXPECT_EQ(MigProfileName(7, 7, 40192, a100_40), "7g.40gb");
  EXPECT_EQ(MigProfileName(3, 1, 19968, a100_40), "1c.3g.20gb");
  EXPECT_EQ(MigProfileName(1, 1, 9856, h100_80), "1g.10gb");
}

// pcie-t4: no NVLink at all; the pair shares a host bridge.
TEST_F(SimTest, PcieT4HasNoNvlink) {
  Start("pcie-t4");
  ASSERT_EQ(inv_.devices.size(), 2u);
  EXPECT_EQ(inv_.devices[0].name, "Tesla T4");
  EXPECT_EQ(inv_.topology[0][1].nvlinks, 0);
  EXPECT_STREQ(PcieRelationName(inv_.topology[0][1].pcie), "PHB");
  auto t = layer_->GetTelemetry(0);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->memory_temp_c.has_value()) << "GDDR6 boards report no memory temperature";
  EXPECT_FALSE(t->fan_speed_pct.has_value()) << "a passive board has no fan";
}

// The 16-GPU scale profile: every pair NV6 through NVSwitch.
TEST_F(SimTest, Dgx2Has16GpusOnNvswitch) {
  Start("dgx2-v100");
  ASSERT_EQ(inv_.devices.size(), 16u);
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      if (i != j) {
        EXPECT_EQ(inv_.topology[i][j].nvlinks, 6);
      }
    }
  }
}

// XID: a subscriber receives the code promptly; a MIG XID carries its GPU/compute instance ids.
TEST_F(SimTest, XidReachesSubscriber) {
  Start("a100-mig");
  EventSink sink;
  auto sub = layer_->Subscribe(sink.Callback());
  auto t0 = std::chrono::steady_clock::now();
  Inject("xid gpu=3 code=79");
  ASSERT_TRUE(sink.Wait(1));
  auto latency = std::chrono::steady_clock::now() - t0;
  Inject("xid gpu=0 code=94 gi=9 ci=0");
  ASSERT_TRUE(sink.Wait(2));
  EXPECT_EQ(sink.events[0].type, Event::Type::kXid);
  EXPECT_EQ(sink.events[0].device_index, 3u);
  EXPECT_EQ(sink.events[0].data, 79u);
  EXPECT_EQ(sink.events[0].uuid, inv_.devices[3].uuid);
  EXPECT_EQ(sink.events[0].gpu_instance_id, Event::kAllInstances);
  EXPECT_EQ(sink.events[1].device_index, 0u);
  EXPECT_EQ(sink.events[1].gpu_instance_id, 9u);
  EXPECT_EQ(sink.events[1].compute_instance_id, 0u);
  RecordProperty(
      "xid_latency_us",
      static_cast<int>(std::chrono::duration_cast<std::chrono::microseconds>(latency).count()));
}

// ECC: the event is delivered and the counters move.
TEST_F(SimTest, EccEventAndCounters) {
  Start("dgx-h100");
  EventSink sink;
  auto sub = layer_->Subscribe(sink.Callback());
  Inject("ecc gpu=2 type=dbe");
  ASSERT_TRUE(sink.Wait(1));
  EXPECT_EQ(sink.events[0].type, Event::Type::kDoubleBitEcc);
  auto t = layer_->GetTelemetry(2);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->ecc_dbe_volatile.value_or(0), 1u);
  EXPECT_EQ(t->ecc_dbe_aggregate.value_or(0), 1u);
  EXPECT_EQ(layer_->GetTelemetry(3)->ecc_dbe_volatile.value_or(99), 0u);
}

// A destroyed subscription receives nothing more.
TEST_F(SimTest, UnsubscribeStopsDelivery) {
  Start("pcie-t4");
  EventSink a, b;
  auto sa = layer_->Subscribe(a.Callback());
  auto sb = layer_->Subscribe(b.Callback());
  sb.reset();
  Inject("xid gpu=1 code=13");
  ASSERT_TRUE(a.Wait(1));
  Inject("xid gpu=1 code=31");
  ASSERT_TRUE(a.Wait(2));
  std::lock_guard<std::mutex> l(b.mu);
  EXPECT_TRUE(b.events.empty());
}

// GPU lost: calls on it are Unavailable, other GPUs keep working; reset brings it back.
TEST_F(SimTest, LostGpuThenReset) {
  Start("dgx-h100");
  Inject("lost gpu=5");
  EXPECT_EQ(layer_->GetTelemetry(5).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(layer_->GetTelemetry(5).status().message()), HasSubstr("GPU is lost"));
  EXPECT_EQ(layer_->ProbeDevice(5).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(layer_->GetTelemetry(4).ok());
  // Re-reading the inventory while it is lost keeps its last known identity and index.
  ASSERT_TRUE(layer_->Reinit().ok());
  EXPECT_EQ(layer_->GetInventory()->devices[5].uuid, inv_.devices[5].uuid);
  EXPECT_EQ(layer_->ProbeDevice(5).code(), absl::StatusCode::kUnavailable);
  Inject("reset gpu=5");
  EXPECT_TRUE(layer_->ProbeDevice(5).ok());
  EXPECT_TRUE(layer_->GetTelemetry(5).ok());
}

// Driver failure: every call fails and Reinit fails until the driver is back; then Reinit recovers.
TEST_F(SimTest, NvmlFailureThenRecoveryViaReinit) {
  Start("dgx-h100");
  Inject("nvml-fail");
  EXPECT_EQ(layer_->GetTelemetry(0).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(layer_->ProbeDevice(0).code(), absl::StatusCode::kUnavailable);
  absl::Status st = layer_->Reinit();
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(std::string(st.message()), HasSubstr("nvml-fail"));
  EXPECT_EQ(layer_->GetTelemetry(0).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(layer_->GetInventory().ok()) << "the last good inventory stays readable";
  Inject("nvml-ok");
  ASSERT_TRUE(layer_->Reinit().ok());
  EXPECT_TRUE(layer_->GetTelemetry(0).ok());
  // Events flow again after recovery.
  EventSink sink;
  auto sub = layer_->Subscribe(sink.Callback());
  Inject("xid gpu=1 code=48");
  EXPECT_TRUE(sink.Wait(1));
}

// Telemetry changes injected from outside are what the next sample reports.
TEST_F(SimTest, TelemetryChangeIsVisible) {
  Start("dgx-h100");
  auto before = layer_->GetTelemetry(0);
  ASSERT_TRUE(before.ok());
  Inject("set gpu=0 gpu_temp_c=85 gpu_util_pct=97 fb_used_mib=40000 power_usage_mw=650000");
  auto t = layer_->GetTelemetry(0);
  ASSERT_TRUE(t.ok());
  EXPECT_NE(before->gpu_temp_c, t->gpu_temp_c);
  EXPECT_EQ(t->gpu_temp_c, 85u);
  EXPECT_EQ(t->gpu_util_pct, 97u);
  EXPECT_EQ(t->fb_used_bytes, 40000ull << 20);
  EXPECT_EQ(t->power_usage_mw, 650000u);
  EXPECT_EQ(layer_->GetTelemetry(1)->gpu_util_pct, 0u);
}

// Faults cross processes: a separate process appends to the control log; a node started later
// replays the state faults (lost) but not old events.
TEST_F(SimTest, FaultFromAnotherProcess) {
  Start("dgx-h100");
  EventSink sink;
  auto sub = layer_->Subscribe(sink.Callback());
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto a = sim::ParseFault("xid gpu=6 code=119");
    auto b = sim::ParseFault("lost gpu=7");
    _exit(sim::InjectFault(root_, *a).ok() && sim::InjectFault(root_, *b).ok() ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_TRUE(sink.Wait(1));
  EXPECT_EQ(sink.events[0].data, 119u);
  EXPECT_EQ(layer_->ProbeDevice(7).code(), absl::StatusCode::kUnavailable);
}

// Fault writers check the node: no node at the path, or a GPU it does not have, is a clear error.
TEST_F(SimTest, InjectFaultValidates) {
  auto f = sim::ParseFault("xid gpu=3 code=79");
  ASSERT_TRUE(f.ok());
  absl::Status st = sim::InjectFault(root_ + "/nothing", *f);
  EXPECT_THAT(std::string(st.message()), HasSubstr("no simulated node"));
  Start("pcie-t4");
  st = sim::InjectFault(root_, *f);
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(st.message()), HasSubstr("0..1"));
  EXPECT_FALSE(sim::ParseFault("xid gpu=1").ok());
  EXPECT_FALSE(sim::ParseFault("set gpu=1 bogus=3").ok());
  EXPECT_FALSE(sim::ParseFault("explode gpu=1").ok());
}

// The fault command line drives the same log: xid reaches a subscriber, set changes telemetry, and
// bad invocations fail with status 1 instead of writing anything.
TEST_F(SimTest, FaultCommandLine) {
  Start("dgx-h100");
  EventSink sink;
  auto sub = layer_->Subscribe(sink.Callback());
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "fault");
    args.push_back("--sim-root");
    args.push_back(root_);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return sim::RunFaultCommand(static_cast<int>(argv.size()), argv.data());
  };
  EXPECT_EQ(run({"xid", "--gpu", "3", "--code", "79"}), 0);
  ASSERT_TRUE(sink.Wait(1));
  EXPECT_EQ(sink.events[0].device_index, 3u);
  EXPECT_EQ(sink.events[0].data, 79u);
  EXPECT_EQ(run({"set", "--gpu", "1", "--temp", "91", "--value", "fan_speed_pct=40"}), 0);
  EXPECT_EQ(layer_->GetTelemetry(1)->gpu_temp_c, 91u);
  EXPECT_EQ(layer_->GetTelemetry(1)->fan_speed_pct, 40u);
  EXPECT_EQ(layer_->GetTelemetry(1)->gpu_util_pct, 0u) << "only the given keys change";
  EXPECT_EQ(run({"lost", "--gpu", "2"}), 0);
  EXPECT_EQ(layer_->ProbeDevice(2).code(), absl::StatusCode::kUnavailable);
  auto log_size = fs::file_size(sim::ControlLogPath(root_));
  EXPECT_NE(run({"xid", "--gpu", "9", "--code", "79"}), 0) << "no GPU 9";
  EXPECT_NE(run({"xid", "--gpu", "1"}), 0) << "missing --code";
  EXPECT_NE(run({"set", "--gpu", "1", "--value", "bogus=1"}), 0);
  EXPECT_NE(run({"set", "--gpu", "1"}), 0) << "nothing to set";
  EXPECT_NE(run({"ecc", "--gpu", "1", "--type", "tbe"}), 0);
  EXPECT_EQ(fs::file_size(sim::ControlLogPath(root_)), log_size);
}

// ---- bad inputs -------------------------------------------------------------------------------

// An unknown built-in name lists the built-ins.
TEST_F(SimTest, UnknownProfile) {
  auto l = Open("dgx-h900");
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("unknown profile 'dgx-h900'"));
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("dgx-h100"));
}

// A machine file that does not exist is named in the error.
TEST_F(SimTest, MissingMachineFile) {
  auto l = Open(root_ + "/absent.yaml");
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("absent.yaml"));
}

// Garbled YAML: file:line of the syntax error.
TEST_F(SimTest, GarbledMachineFile) {
  std::string p = WriteFile("bad.yaml", "name: x\ngpus:\n  - uuid: [unclosed\n    name: y\n");
  auto l = Open(p);
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(std::string(l.status().message()), StartsWith(p + ":"));
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("YAML syntax error"));
}

// Semantic errors name the line, the field and what is wrong.
TEST(MachineFile, ErrorsNameLineAndField) {
  const std::string gpu =
      "gpus:\n"
      "  - name: Tesla T4\n"
      "    memory_mib: 15360\n"
      "    pci_bus_id: \"00000000:3B:00.0\"\n";
  struct Case {
    std::string yaml, want;
  } cases[] = {
      {gpu + "    uuid: GPU-1234\n", "m.yaml:5: gpus[0].uuid: bad UUID 'GPU-1234'"},
      {gpu + "    uuid: GPU-5a367384-d845-e8ec-9c9d-2d5e8a50b041\n    colour: red\n",
       "m.yaml:6: gpus[0]: unknown key 'colour'"},
      {gpu + "    uuid: GPU-5a367384-d845-e8ec-9c9d-2d5e8a50b041\n    numa_node: two\n",
       "m.yaml:6: gpus[0].numa_node: bad value 'two'"},
      {"gpus:\n  - name: Tesla T4\n    uuid: GPU-5a367384-d845-e8ec-9c9d-2d5e8a50b041\n"
       "    memory_mib: 15360\n",
       "m.yaml:2: gpus[0]: missing field 'pci_bus_id'"},
      {gpu + "    uuid: GPU-5a367384-d845-e8ec-9c9d-2d5e8a50b041\n    telemetry: {gpu_temp: 3}\n",
       "m.yaml:6: gpus[0].telemetry: unknown key 'gpu_temp'"},
      {"name: x\n", "m.yaml:1: missing field 'gpus'"},
      {gpu + "    uuid: GPU-5a367384-d845-e8ec-9c9d-2d5e8a50b041\nnvlink:\n  - [0, 1]\n",
       "m.yaml:7: nvlink[0]: expected 1 columns"},
  };
  for (const Case& c : cases) {
    auto m = sim::ParseMachine(c.yaml, "m.yaml");
    ASSERT_FALSE(m.ok()) << c.yaml;
    EXPECT_THAT(std::string(m.status().message()), StartsWith(c.want)) << c.yaml;
  }
}

// Every built-in profile parses (they are embedded in the library, so a broken one breaks
// --simulate).
TEST(MachineFile, BuiltinsParse) {
  auto names = sim::BuiltinProfiles();
  EXPECT_GE(names.size(), 5u);
  for (const std::string& n : names) EXPECT_TRUE(sim::LoadMachine(n).ok()) << n;
}

// Unreadable or garbled sysfs: the NUMA node is -1 (with a warning), never a failure.
TEST_F(SimTest, UnreadableSysfsGivesUnknownNuma) {
  Start("dgx-h100");
  fs::remove(root_ + "/sys/bus/pci/devices/0000:1b:00.0/numa_node");
  WriteFile("sys/bus/pci/devices/0000:43:00.0/numa_node", "garbage\n");
  ASSERT_TRUE(layer_->Reinit().ok());
  auto inv = layer_->GetInventory();
  EXPECT_EQ(inv->devices[0].numa_node, -1);
  EXPECT_EQ(inv->devices[1].numa_node, -1);
  EXPECT_EQ(inv->devices[2].numa_node, 0);
}

// The host seam (gpu::Machine): a simulated node without --sim-root gets one private sim root,
// which its parts reach through node_root() and Path() (the fake's /proc and /dev are there), and
// which goes with the Machine; with --sim-root that root is the node's and is kept; a failed open
// leaves no private root behind. Before the Machine the device plugin made a second temporary
// root of its own, and the DRA driver asked whether the node was simulated.
TEST_F(SimTest, MachineOwnsThePrivateSimRootAndNamesTheNodesPaths) {
  const std::string tmp = root_ + "/tmp";
  fs::create_directories(tmp);
  const char* old_tmpdir = getenv("TMPDIR");
  std::string saved = old_tmpdir ? old_tmpdir : "";
  setenv("TMPDIR", tmp.c_str(), 1);
  auto private_roots = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(tmp))
      n += e.path().filename().string().rfind("gpulet-sim-", 0) == 0;
    return n;
  };
  {
    GpuOptions o;
    o.simulate = "a100-mig";
    auto m = Machine::Open(o);
    ASSERT_TRUE(m.ok()) << m.status();
    const std::string root = (*m)->node_root();
    EXPECT_EQ(fs::path(root).parent_path(), fs::path(tmp));
    EXPECT_EQ(private_roots(), 1);
    EXPECT_EQ((*m)->kernel_root(), root);
    EXPECT_EQ((*m)->Path("/proc/driver/nvidia-caps/mig-minors"),
              root + "/proc/driver/nvidia-caps/mig-minors");
    EXPECT_TRUE(fs::exists((*m)->Path("/proc/driver/nvidia-caps/mig-minors")))
        << "the fake wrote the node's kernel state under the root the parts read";
    auto inv = (*m)->gpus().GetInventory();
    ASSERT_TRUE(inv.ok()) << inv.status();
    EXPECT_FALSE(inv->devices.empty());
  }
  EXPECT_EQ(private_roots(), 0) << "the private sim root went with the Machine";
  {
    GpuOptions o;
    o.simulate = "dgx-h100";
    o.sim_root = root_ + "/node";
    auto m = Machine::Open(o);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->node_root(), o.sim_root);
    EXPECT_EQ(private_roots(), 0);
  }
  EXPECT_TRUE(fs::exists(root_ + "/node/control")) << "a given sim root is the node's: kept";
  GpuOptions bad;
  bad.simulate = root_ + "/no-such-machine.yaml";
  EXPECT_FALSE(Machine::Open(bad).ok());
  EXPECT_EQ(private_roots(), 0) << "a failed open leaves no private root";
  if (old_tmpdir)
    setenv("TMPDIR", saved.c_str(), 1);
  else
    unsetenv("TMPDIR");
}

// A missing NVML library is one clear error naming it and what to check.
TEST(OpenGpuLayer, MissingNvmlLibrary) {
  GpuOptions o;
  o.nvml_library = "/nonexistent/libnvidia-ml.so.1";
  auto l = OpenGpuLayer(o);
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(std::string(l.status().message()),
              StartsWith("cannot load NVML library '/nonexistent/libnvidia-ml.so.1': "));
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("--simulate"));
}

// A library named by path that is not a whole ELF shared object is refused with the reason before
// dlopen maps it: a truncated copy of libnvidia-ml.so.1 killed the process with SIGBUS inside
// dlopen, and a text file is named as such.
TEST_F(SimTest, TruncatedOrForeignLibraryIsRefusedBeforeDlopen) {
  const std::string real = std::string(GPULET_BINARY_DIR) + "/lib/fake/libnvidia-ml.so.1";
  const std::string cut = root_ + "/libnvidia-ml.so.1";
  std::filesystem::copy_file(real, cut);
  std::filesystem::resize_file(cut, std::filesystem::file_size(real) / 2);
  GpuOptions o;
  o.nvml_library = cut;
  auto l = OpenGpuLayer(o);
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(std::string(l.status().message()),
              StartsWith("cannot load NVML library '" + cut + "': truncated: "));
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("past the end of the"));
  { std::ofstream(root_ + "/text.so") << "not a library\n"; }
  o.nvml_library = root_ + "/text.so";
  l = OpenGpuLayer(o);
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("not a 64-bit ELF shared library"));
}

// A library without the newer symbols (old driver): the _v1 fallbacks serve the inventory, and what
// has no fallback (energy, memory temperature, MIG attributes, NVSwitch link types) is left unset.
TEST_F(SimTest, LegacyLibraryDegrades) {
  NvmlBackendOptions o;
  o.library = std::string(GPULET_BINARY_DIR) + "/lib/fake-legacy/libnvidia-ml.so.1";
  o.simulate = true;
  o.machine = "dgx-h100";
  o.sim_root = o.host_root = root_;
  auto l = OpenNvmlGpuLayer(o);
  ASSERT_TRUE(l.ok()) << l.status();
  auto inv = (*l)->GetInventory();
  ASSERT_EQ(inv->devices.size(), 8u);
  EXPECT_EQ(inv->devices[0].memory_bytes, 81559ull << 20) << "nvmlDeviceGetMemoryInfo fallback";
  EXPECT_EQ(inv->devices[0].sm_count, 0u) << "no nvmlDeviceGetAttributes_v2";
  EXPECT_EQ(inv->topology[0][1].nvlinks, 0) << "NVSwitch links need the remote device type";
  EXPECT_STREQ(PcieRelationName(inv->topology[0][1].pcie), "NODE");
  auto t = (*l)->GetTelemetry(0);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->total_energy_mj.has_value());
  EXPECT_FALSE(t->memory_temp_c.has_value());
  EXPECT_TRUE(t->gpu_temp_c.has_value());
  EXPECT_TRUE(t->throttle_reasons.has_value()) << "ThrottleReasons fallback";
  EventSink sink;
  auto sub = (*l)->Subscribe(sink.Callback());
  Inject("xid gpu=0 code=45");
  EXPECT_TRUE(sink.Wait(1)) << "nvmlEventSetWait fallback";
}

// The fake is reached only by dlopen: this test binary does not link it, and its C ABI answers
// like NVML (status codes for bad arguments, small buffers, unsupported queries, lost GPUs).
TEST_F(SimTest, FakeLibraryCAbi) {
  // The executable does not link NVML: no DT_NEEDED entry names it.
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void*) {
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
          auto* dyn =
              reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
          const char* strtab = nullptr;
          for (auto* d = dyn; d->d_tag != DT_NULL; ++d) {
            if (d->d_tag == DT_STRTAB) strtab = reinterpret_cast<const char*>(d->d_un.d_ptr);
          }
          for (auto* d = dyn; strtab && d->d_tag != DT_NULL; ++d) {
            if (d->d_tag == DT_NEEDED) {
              EXPECT_EQ(std::string(strtab + d->d_un.d_val).find("nvidia-ml"), std::string::npos);
            }
          }
        }
        return 1;  // the first object is the executable itself
      },
      nullptr);
  std::string path = std::string(GPULET_BINARY_DIR) + "/lib/fake/libnvidia-ml.so.1";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  auto sym = [&](const char* n) {
    void* p = dlsym(h, n);
    EXPECT_NE(p, nullptr) << n;
    return p;
  };
  reinterpret_cast<void (*)(const char*, const char*)>(sym("gpuletSimConfigure"))("dgx-h100",
                                                                                  root_.c_str());
  auto init = reinterpret_cast<nvmlInitFn>(sym("nvmlInit_v2"));
  auto shutdown = reinterpret_cast<nvmlShutdownFn>(sym("nvmlShutdown"));
  auto count = reinterpret_cast<nvmlDeviceGetCountFn>(sym("nvmlDeviceGetCount_v2"));
  auto by_index =
      reinterpret_cast<nvmlDeviceGetHandleByIndexFn>(sym("nvmlDeviceGetHandleByIndex_v2"));
  auto uuid = reinterpret_cast<nvmlDeviceGetStringFn>(sym("nvmlDeviceGetUUID"));
  auto fan = reinterpret_cast<nvmlDeviceGetUintFn>(sym("nvmlDeviceGetFanSpeed"));
  auto pci = reinterpret_cast<nvmlDeviceGetPciInfoFn>(sym("nvmlDeviceGetPciInfo_v3"));
  unsigned n = 0;
  EXPECT_EQ(count(&n), NVML_ERROR_UNINITIALIZED);
  ASSERT_EQ(init(), NVML_SUCCESS);
  EXPECT_EQ(count(&n), NVML_SUCCESS);
  EXPECT_EQ(n, 8u);
  nvmlDevice_t d = nullptr;
  EXPECT_EQ(by_index(8, &d), NVML_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(by_index(1, &d), NVML_SUCCESS);
  char small[8];
  EXPECT_EQ(uuid(d, small, sizeof small), NVML_ERROR_INSUFFICIENT_SIZE);
  unsigned v = 0;
  EXPECT_EQ(fan(d, &v), NVML_ERROR_NOT_SUPPORTED) << "SXM boards have no fan";
  EXPECT_EQ(uuid(reinterpret_cast<nvmlDevice_t>(&v), small, sizeof small),
            NVML_ERROR_INVALID_ARGUMENT);
  nvmlPciInfo_t p{};
  ASSERT_EQ(pci(d, &p), NVML_SUCCESS);
  EXPECT_STREQ(p.busId, "00000000:43:00.0");
  EXPECT_EQ(p.bus, 0x43u);
  // Every NVML symbol is exported (NVIDIA's Go binaries abort on a missing one); what the fake
  // does not model answers NOT_SUPPORTED, as a driver without the feature does.
  using VgpuMeta = nvmlReturn_t (*)(nvmlDevice_t, void*, unsigned*);
  auto meta = reinterpret_cast<VgpuMeta>(dlsym(h, "nvmlDeviceGetVgpuMetadata"));
  ASSERT_NE(meta, nullptr) << "every NVML symbol is exported";
  char buf[256];
  unsigned len = sizeof buf;
  EXPECT_EQ(meta(d, buf, &len), NVML_ERROR_NOT_SUPPORTED);
  Inject("lost gpu=1");
  EXPECT_EQ(uuid(d, small, sizeof small), NVML_ERROR_GPU_IS_LOST);
  EXPECT_EQ(shutdown(), NVML_SUCCESS);
  EXPECT_EQ(shutdown(), NVML_ERROR_UNINITIALIZED);
  dlclose(h);
}

}  // namespace
}  // namespace gpulet::gpu::testing
