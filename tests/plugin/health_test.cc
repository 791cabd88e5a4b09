#include "plugin/health.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "testing/common/fake_clock.h"
#include "testing/gpu/fake_gpu.h"

namespace gpulet::plugin {
namespace {

using gpulet::testing::AddMig;
using gpulet::testing::FakeClock;
using gpulet::testing::FakeGpuLayer;
using gpulet::testing::MakeInventory;
using ::testing::HasSubstr;

// Application-level XIDs (RESTART_APP / IGNORE buckets) never make a device unhealthy by default;
// reset / reboot buckets and unknown XIDs do; the environment overrides both ways.
TEST(XidTest, ClassificationAndOverrides) {
  HealthConfig cfg;
  for (uint64_t x : {13, 31, 43, 45, 68, 94}) EXPECT_FALSE(IsCriticalXid(x, cfg)) << x;
  for (uint64_t x : {48, 64, 74, 79, 95, 109, 119, 999}) EXPECT_TRUE(IsCriticalXid(x, cfg)) << x;
  EXPECT_EQ(ClassifyXid(79), XidBucket::kRestartBm);
  cfg.disabled_xids = {79};
  EXPECT_FALSE(IsCriticalXid(79, cfg));
  cfg.enabled_xids = {79, 13};
  EXPECT_TRUE(IsCriticalXid(79, cfg));  // DP_ENABLE_HEALTHCHECKS wins
  EXPECT_TRUE(IsCriticalXid(13, cfg));
  cfg = {};
  cfg.xids_disabled = true;
  EXPECT_FALSE(IsCriticalXid(48, cfg));
}

struct Fixture : ::testing::Test {
  Fixture() : inv(MakeInventory(4, {})) {
    AddMig(inv, 2, {"3g.20gb", "3g.20gb"});
    layer = std::make_unique<FakeGpuLayer>(inv);
    cfg.hold_down = absl::Seconds(10);
    cfg.probe_interval = absl::Seconds(1);
    cfg.unhealthy_devices_file = dir + "/unhealthy.json";
    std::filesystem::create_directories(dir);
  }
  ~Fixture() override { std::filesystem::remove_all(dir); }
  std::unique_ptr<HealthMonitor> Make() {
    return std::make_unique<HealthMonitor>(layer.get(), inv, cfg, &clock);
  }
  void Tick(int seconds = 1) {
    clock.Advance(std::chrono::seconds(seconds));
    mon->CheckOnce();
  }
  std::string dir =
      std::filesystem::temp_directory_path() / ("dp-health-" + std::to_string(getpid()));
  gpu::Inventory inv;
  std::unique_ptr<FakeGpuLayer> layer;
  HealthConfig cfg;
  FakeClock clock;
  std::unique_ptr<HealthMonitor> mon;
};

// A critical XID marks the GPU at once and moves changes(); it recovers only after probes have
// answered normally for the whole hold-down; an application XID changes nothing.
TEST_F(Fixture, XidMarksThenRecoversAfterHoldDown) {
  mon = Make();
  mon->Start();
  const uint64_t g0 = mon->changes()->generation();
  layer->Emit(3, 13);
  EXPECT_TRUE(mon->Healthy(3));
  EXPECT_EQ(mon->changes()->generation(), g0);
  layer->Emit(3, 79);
  EXPECT_FALSE(mon->Healthy(3));
  EXPECT_THAT(mon->Reason(3), HasSubstr("XID 79 (RESTART_BM)"));
  EXPECT_GT(mon->changes()->generation(), g0);
  mon->Stop();  // drive the checker by hand from here
  layer->SetDeviceError(3, absl::UnavailableError("GPU is lost"));
  for (int i = 0; i < 30; ++i) Tick();
  EXPECT_FALSE(mon->Healthy(3));               // lost: never recovers while the probe fails
  layer->SetDeviceError(3, absl::OkStatus());  // reset
  Tick();
  EXPECT_FALSE(mon->Healthy(3));
  for (int i = 0; i < 9; ++i) Tick();
  EXPECT_FALSE(mon->Healthy(3));
  Tick();
  EXPECT_TRUE(mon->Healthy(3)) << mon->Reason(3);
}

// An XID on a MIG device (GI/CI ids) marks that MIG device only.
TEST_F(Fixture, MigXidMarksOnlyThatMigDevice) {
  mon = Make();
  gpu::Event e;
  e.device_index = 2;
  e.data = 48;
  e.gpu_instance_id = 2;  // AddMig numbers GIs from 1
  e.compute_instance_id = 0;
  mon->OnEvent(e);
  EXPECT_TRUE(mon->Healthy(2, 0));
  EXPECT_FALSE(mon->Healthy(2, 1));
  EXPECT_TRUE(mon->Healthy(2));
}

// NVML failing everywhere takes every device out, re-initialises with growing backoff, and
// brings everything back when it answers.
TEST_F(Fixture, NvmlDownThenRecovery) {
  mon = Make();
  layer->SetNvmlDown(true);
  Tick();
  EXPECT_TRUE(mon->nvml_down());
  for (uint32_t i = 0; i < 4; ++i) EXPECT_FALSE(mon->Healthy(i));
  EXPECT_FALSE(mon->Healthy(2, 1));
  int before = layer->reinits();
  for (int i = 0; i < 20; ++i) {
    clock.Advance(std::chrono::milliseconds(100));
    mon->CheckOnce();
  }
  int tries = layer->reinits() - before;
  EXPECT_GE(tries, 3);
  EXPECT_LE(tries, 6);  // backoff 100ms, 200ms, 400ms, 800ms ... not 20 tries
  layer->SetNvmlDown(false);
  Tick(40);
  EXPECT_FALSE(mon->nvml_down());
  for (uint32_t i = 0; i < 4; ++i) EXPECT_TRUE(mon->Healthy(i)) << mon->Reason(i);
}

// One lost GPU is that GPU only, not the whole node.
TEST_F(Fixture, OneLostGpuIsNotNvmlDown) {
  mon = Make();
  layer->SetDeviceError(1, absl::UnavailableError("GPU is lost"));
  Tick();
  EXPECT_FALSE(mon->nvml_down());
  EXPECT_FALSE(mon->Healthy(1));
  EXPECT_TRUE(mon->Healthy(0));
}

// The isolation file takes devices out live; a malformed edit is reported and the last good
// list is kept; removing the file puts them back.
TEST_F(Fixture, IsolationFile) {
  mon = Make();
  EXPECT_TRUE(mon->Healthy(0));
  std::ofstream(cfg.unhealthy_devices_file)
      << R"({"index": [0, "2:1"], "uuid": [")" << inv.devices[3].uuid << "\"]}";
  const uint64_t g = mon->changes()->generation();
  Tick();
  EXPECT_GT(mon->changes()->generation(), g);
  EXPECT_FALSE(mon->Healthy(0));
  EXPECT_THAT(mon->Reason(0), HasSubstr("isolated by"));
  EXPECT_FALSE(mon->Healthy(2, 1));
  EXPECT_TRUE(mon->Healthy(2, 0));
  EXPECT_FALSE(mon->Healthy(3));
  std::ofstream(cfg.unhealthy_devices_file) << "{\"index\": [1,\n";
  Tick();
  EXPECT_THAT(mon->isolation_status().message(), HasSubstr("unhealthy.json:2:"));
  EXPECT_FALSE(mon->Healthy(0));  // last good list kept
  EXPECT_TRUE(mon->Healthy(1));
  std::ofstream(cfg.unhealthy_devices_file) << "{\"gpus\": [1]}";
  Tick();
  EXPECT_THAT(mon->isolation_status().message(), HasSubstr("unknown key \"gpus\""));
  std::filesystem::remove(cfg.unhealthy_devices_file);
  Tick();
  EXPECT_TRUE(mon->isolation_status().ok());
  EXPECT_TRUE(mon->Healthy(0));
}

// Hostile or mistyped isolation files: a number too large for a double (1e999) is an error naming
// the file, not an abort of the agent (nlohmann throws out_of_range there, not parse_error); wrong
// types are errors; entries naming no device of the node are reported, not silently "isolated".
TEST_F(Fixture, IsolationFileHostileInput) {
  auto huge = ParseIsolation(R"({"index":[1e999]})", "iso.json");
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(huge.status().message(), HasSubstr("iso.json: not usable JSON"));
  EXPECT_FALSE(ParseIsolation(R"({"index":[-1]})", "iso.json").ok());
  EXPECT_FALSE(ParseIsolation(R"({"index":[1.5]})", "iso.json").ok());
  EXPECT_FALSE(ParseIsolation(R"({"uuid":[{}]})", "iso.json").ok());
  mon = Make();
  std::ofstream(cfg.unhealthy_devices_file) << R"({"index":[1e999]})";
  Tick();
  EXPECT_FALSE(mon->isolation_status().ok());
  std::ofstream(cfg.unhealthy_devices_file) << R"({"index":[0, 99, "0:7"], "uuid":["GPU-nope"]})";
  Tick();
  EXPECT_TRUE(mon->isolation_status().ok());
  EXPECT_FALSE(mon->Healthy(0));
  EXPECT_THAT(mon->isolation_unmatched(),
              ::testing::UnorderedElementsAre("index 99", "index 0:7", "uuid GPU-nope"));
}

// DP_DISABLE_HEALTHCHECKS=all: no XID or probe marks anything.
TEST_F(Fixture, DisabledChecks) {
  cfg.disabled = true;
  mon = Make();
  gpu::Event e;
  e.device_index = 1;
  e.data = 79;
  mon->OnEvent(e);
  layer->SetNvmlDown(true);
  Tick();
  EXPECT_TRUE(mon->Healthy(1));
  EXPECT_FALSE(mon->nvml_down());
}

}  // namespace
}  // namespace gpulet::plugin
