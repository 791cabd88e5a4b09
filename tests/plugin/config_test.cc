#include "plugin/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpulet::plugin {
namespace {

using ::testing::HasSubstr;

// NVIDIA's documented time-slicing example loads unchanged, with every field it sets.
TEST(ConfigTest, AcceptsNvidiaFileAsIs) {
  auto c = ParseConfig(R"(version: v1
flags:
  migStrategy: "mixed"
  failOnInitError: false
  nvidiaDriverRoot: "/run/nvidia/driver"
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: [envvar, cdi-cri]
    deviceIDStrategy: index
    nvidiaCTKPath: /usr/bin/nvidia-ctk
  gfd:
    oneshot: false
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 10
      devices: ["0", "GPU-abc"]
)", "cfg.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mig_strategy, MigStrategy::kMixed);
  EXPECT_FALSE(c->fail_on_init_error);
  EXPECT_EQ(c->driver_root, "/run/nvidia/driver");
  EXPECT_EQ(c->DevRoot(), "/run/nvidia/driver");
  EXPECT_TRUE(c->pass_device_specs);
  EXPECT_TRUE(c->list.envvar && c->list.cdi_cri && !c->list.volume_mounts);
  EXPECT_EQ(c->id_strategy, IdStrategy::kIndex);
  ASSERT_EQ(c->time_slicing.size(), 1u);
  EXPECT_EQ(c->time_slicing[0].replicas, 10);
  EXPECT_EQ(c->time_slicing[0].rename, "nvidia.com/gpu.shared");
  EXPECT_FALSE(c->time_slicing[0].all_devices);
  EXPECT_THAT(c->time_slicing[0].device_list, ::testing::ElementsAre("0", "GPU-abc"));
  EXPECT_TRUE(c->fail_requests_greater_than_one);
}

// An unknown key is reported with file:line and the key's full path.
TEST(ConfigTest, UnknownKeyNamesFileLineAndKey) {
  auto c = ParseConfig("version: v1\nflags:\n  plugin:\n    passDeviceSpec: true\n", "a.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("a.yaml:4: flags.plugin.passDeviceSpec: unknown key"));
}

// A bad value is reported with the line of the value and what is allowed.
TEST(ConfigTest, BadValueNamesLineAndChoices) {
  auto c = ParseConfig("version: v1\nflags:\n  migStrategy: bogus\n", "b.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("b.yaml:3: flags.migStrategy: \"bogus\""));
  EXPECT_THAT(c.status().message(), HasSubstr("none, single or mixed"));
  auto r = ParseConfig(
      "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1\n",
      "c.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("c.yaml:5: sharing.timeSlicing.resources.replicas"));
  auto y = ParseConfig("flags: [\n", "d.yaml");
  ASSERT_FALSE(y.ok());
  EXPECT_THAT(y.status().message(), HasSubstr("d.yaml:"));
  auto v = ParseConfig("version: v2\n", "e.yaml");
  EXPECT_THAT(v.status().message(), HasSubstr("e.yaml:1: version"));
  auto m = ParseConfig("sharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n",
                       "f.yaml");
  EXPECT_THAT(m.status().message(), HasSubstr("f.yaml:2: sharing.mps: MPS"));
}

// Flag beats environment beats file, per setting, with NVIDIA's variable names.
TEST(ConfigTest, PrecedenceFlagOverEnvOverFile) {
  char path[] = "/tmp/gpulet-cfg-XXXXXX";
  int fd = mkstemp(path);
  std::string text = "flags:\n  migStrategy: single\n  plugin:\n    deviceIDStrategy: index\n"
                     "    passDeviceSpecs: true\n";
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  ConfigSources src;
  src.file = path;
  src.env = {{"MIG_STRATEGY", "mixed"}, {"DEVICE_ID_STRATEGY", "uuid"}};
  src.flags = {{"flags.migStrategy", "none"}};
  auto c = LoadConfig(src);
  unlink(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mig_strategy, MigStrategy::kNone);   // flag
  EXPECT_EQ(c->id_strategy, IdStrategy::kUuid);     // env over file
  EXPECT_TRUE(c->pass_device_specs);                // file
}

// Bad environment values and flags name their source.
TEST(ConfigTest, BadEnvAndFlagNameTheirSource) {
  ConfigSources src;
  src.env = {{"DEVICE_LIST_STRATEGY", "envvar,carrier-pigeon"}};
  auto c = LoadConfig(src);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("environment DEVICE_LIST_STRATEGY"));
  EXPECT_THAT(c.status().message(), HasSubstr("carrier-pigeon"));
  src.env.clear();
  src.flags = {{"gpulet.checkpointDeviceIDStrategy", "serial"}};
  c = LoadConfig(src);
  EXPECT_THAT(c.status().message(), HasSubstr("flag --checkpoint-device-id-strategy"));
  src.flags.clear();
  src.file = "/nonexistent/gpulet.yaml";
  EXPECT_THAT(LoadConfig(src).status().message(), HasSubstr("/nonexistent/gpulet.yaml"));
  // A directory named as the config file is an error, not a run with defaults (issue 22).
  src.file = ::testing::TempDir();
  c = LoadConfig(src);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("is a directory"));
}

// DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS and the gpulet health keys.
TEST(ConfigTest, HealthSettings) {
  ConfigSources src;
  src.env = {{"DP_DISABLE_HEALTHCHECKS", "48,79"}, {"DP_ENABLE_HEALTHCHECKS", "13"},
             {"CHECKPOINT_DEVICE_ID_STRATEGY", "index"}};
  auto c = LoadConfig(src);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->health.disabled_xids, (std::set<uint64_t>{48, 79}));
  EXPECT_EQ(c->health.enabled_xids, (std::set<uint64_t>{13}));
  EXPECT_EQ(c->checkpoint_id_strategy, IdStrategy::kIndex);
  auto f = ParseConfig("gpulet:\n  health:\n    holdDown: 5s\n    unhealthyDevicesFile: /x.json\n",
                       "g.yaml");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->health.hold_down, absl::Seconds(5));
  EXPECT_EQ(f->health.unhealthy_devices_file, "/x.json");
  auto bad = ParseConfig("gpulet:\n  health:\n    holdDown: soon\n", "h.yaml");
  EXPECT_THAT(bad.status().message(), HasSubstr("h.yaml:3: gpulet.health.holdDown"));
  src.env = {{"DP_DISABLE_HEALTHCHECKS", "all"}};
  EXPECT_TRUE(LoadConfig(src)->health.disabled);
}

}  // namespace
}  // namespace gpulet::plugin
