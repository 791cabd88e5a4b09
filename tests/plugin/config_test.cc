#include "plugin/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

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
)",
                       "cfg.yaml");
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
  EXPECT_THAT(c.status().message(),
              HasSubstr("a.yaml:4: flags.plugin.passDeviceSpec: unknown key"));
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
  auto m = ParseConfig(
      "sharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 1}\n", "f.yaml");
  EXPECT_THAT(m.status().message(), HasSubstr("f.yaml:4: sharing.mps.resources.replicas"));
}

// A count that would be expanded is bounded first, and the bound is named: a billion replicas
// used to grow the plugin to 2.5 GB, silent and deaf to SIGTERM, until bad_alloc.
TEST(ConfigTest, ReplicasAreBoundedBeforeExpansion) {
  for (const char* n : {"1000000000", "1025", "99999999999999999999", "-3"}) {
    auto c = ParseConfig(absl::StrCat("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                                      "    - name: nvidia.com/gpu\n      replicas: ",
                                      n, "\n"),
                         "big.yaml");
    ASSERT_FALSE(c.ok()) << n;
    EXPECT_THAT(c.status().message(),
                HasSubstr(absl::StrCat("big.yaml:6: sharing.timeSlicing.resources.replicas: \"", n,
                                       "\" must be an integer 2..1024 (replicas per GPU)")))
        << c.status();
  }
  auto ok = ParseConfig(
      "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 1024}\n",
      "max.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->time_slicing[0].replicas, 1024);
}

// Flag beats environment beats file, per setting, with NVIDIA's variable names.
TEST(ConfigTest, PrecedenceFlagOverEnvOverFile) {
  char path[] = "/tmp/gpulet-cfg-XXXXXX";
  int fd = mkstemp(path);
  std::string text =
      "flags:\n  migStrategy: single\n  plugin:\n    deviceIDStrategy: index\n"
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
  EXPECT_EQ(c->mig_strategy, MigStrategy::kNone);  // flag
  EXPECT_EQ(c->id_strategy, IdStrategy::kUuid);    // env over file
  EXPECT_TRUE(c->pass_device_specs);               // file
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
  src.env = {{"DP_DISABLE_HEALTHCHECKS", "48,79"},
             {"DP_ENABLE_HEALTHCHECKS", "13"},
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

namespace gpulet::plugin {
namespace {

// Audit of every key of NVIDIA's config v1 (k8s-device-plugin v0.20 api/config/v1: flags.go,
// resources.go, replicas.go, sharing.go, imex.go): each one either does what NVIDIA's plugin does
// (the check looks at the value gpulet took), is accepted and ignored with a note naming the key
// and why, or is refused with an error naming the key and why.
TEST(NvidiaKeysTest, EveryKeyAppliedIgnoredWithWhyOrRefusedWithWhy) {
  enum Outcome { kApplied, kNoted, kSilent, kRefused };
  struct Row {
    const char* key;
    const char* yaml;
    Outcome outcome;
    std::function<bool(const Config&)> check;  // kApplied
    const char* message;                       // kNoted / kRefused: must appear
  };
  const std::vector<Row> rows = {
      {"version", "version: v1\n", kApplied, [](const Config&) { return true; }, ""},
      {"flags.migStrategy", "flags: {migStrategy: single}\n", kApplied,
       [](const Config& c) { return c.mig_strategy == MigStrategy::kSingle; }, ""},
      {"flags.failOnInitError", "flags: {failOnInitError: false}\n", kApplied,
       [](const Config& c) { return !c.fail_on_init_error; }, ""},
      {"flags.mpsRoot", "flags: {mpsRoot: /var/mps}\n", kApplied,
       [](const Config& c) { return c.mps_root == "/var/mps"; }, ""},
      {"flags.nvidiaDriverRoot", "flags: {nvidiaDriverRoot: /run/nvidia/driver}\n", kApplied,
       [](const Config& c) { return c.DevRoot() == "/run/nvidia/driver"; }, ""},
      {"flags.nvidiaDevRoot", "flags: {nvidiaDevRoot: /dev-root}\n", kApplied,
       [](const Config& c) { return c.DevRoot() == "/dev-root"; }, ""},
      {"flags.gdrcopyEnabled", "flags: {gdrcopyEnabled: true}\n", kApplied,
       [](const Config& c) { return c.gdrcopy; }, ""},
      {"flags.gdsEnabled", "flags: {gdsEnabled: true}\n", kApplied,
       [](const Config& c) { return c.gds; }, ""},
      {"flags.mofedEnabled", "flags: {mofedEnabled: true}\n", kApplied,
       [](const Config& c) { return c.mofed; }, ""},
      {"flags.gdrcopyEnabled+cdi",
       "flags: {gdrcopyEnabled: true, plugin: {deviceListStrategy: cdi-cri}}\n",
       kRefused,
       {},
       "flags.gdrcopyEnabled with a CDI deviceListStrategy (cdi-annotations, cdi-cri) is not "
       "supported: gpulet's CDI spec defines no such device"},
      {"flags.useNodeFeatureAPI", "flags: {useNodeFeatureAPI: true}\n", kSilent, {}, ""},
      {"flags.deviceDiscoveryStrategy", "flags: {deviceDiscoveryStrategy: nvml}\n", kApplied,
       [](const Config&) { return true; }, ""},
      {"flags.deviceDiscoveryStrategy=tegra",
       "flags: {deviceDiscoveryStrategy: tegra}\n",
       kRefused,
       {},
       "t.yaml:1: flags.deviceDiscoveryStrategy: tegra is not supported: gpulet "
       "discovers GPUs through NVML only"},
      {"flags.plugin.passDeviceSpecs", "flags: {plugin: {passDeviceSpecs: true}}\n", kApplied,
       [](const Config& c) { return c.pass_device_specs; }, ""},
      {"flags.plugin.deviceListStrategy",
       "flags: {plugin: {deviceListStrategy: [volume-mounts, cdi-annotations]}}\n", kApplied,
       [](const Config& c) { return c.list.volume_mounts && c.list.cdi_annotations; }, ""},
      {"flags.plugin.deviceIDStrategy", "flags: {plugin: {deviceIDStrategy: index}}\n", kApplied,
       [](const Config& c) { return c.id_strategy == IdStrategy::kIndex; }, ""},
      {"flags.plugin.cdiAnnotationPrefix", "flags: {plugin: {cdiAnnotationPrefix: x.io/}}\n",
       kApplied, [](const Config& c) { return c.cdi_annotation_prefix == "x.io/"; }, ""},
      {"flags.plugin.nvidiaCTKPath",
       "flags: {plugin: {nvidiaCTKPath: /usr/bin/nvidia-ctk}}\n",
       kNoted,
       {},
       "t.yaml:1: flags.plugin.nvidiaCTKPath: accepted and ignored: gpulet writes its "
       "CDI specs itself"},
      {"flags.plugin.containerDriverRoot",
       "flags: {plugin: {containerDriverRoot: /driver-root}}\n",
       kNoted,
       {},
       "flags.plugin.containerDriverRoot: accepted and ignored: gpulet finds the "
       "driver through flags.nvidiaDriverRoot"},
      {"flags.plugin.sharedDevicesAllocationPolicy",
       "flags: {plugin: {sharedDevicesAllocationPolicy: packed}}\n", kApplied,
       [](const Config& c) { return c.shared_policy == SharedPolicy::kPacked; }, ""},
      {"flags.gfd (oneshot, noTimestamp, sleepInterval, outputFile, machineTypeFile)",
       "flags:\n  gfd: {oneshot: true, noTimestamp: true, sleepInterval: 60s, outputFile: /x, "
       "machineTypeFile: /y}\n",
       kSilent,
       {},
       ""},
      {"resources.gpus", "resources:\n  gpus: [{pattern: '*T4*', name: t4}]\n", kApplied,
       [](const Config& c) { return c.gpus.size() == 1 && c.gpus[0].name == "nvidia.com/t4"; }, ""},
      {"resources.mig", "resources:\n  mig: [{pattern: 1g.5gb, name: small}]\n", kApplied,
       [](const Config& c) { return c.migs.size() == 1 && c.migs[0].name == "nvidia.com/small"; },
       ""},
      {"sharing.timeSlicing.*",
       "sharing:\n  timeSlicing:\n    renameByDefault: true\n    failRequestsGreaterThanOne: true\n"
       "    resources:\n    - {name: gpu, replicas: 3, devices: 1, rename: g3}\n",
       kApplied,
       [](const Config& c) {
         return c.time_slicing.size() == 1 && c.time_slicing[0].replicas == 3 &&
                c.time_slicing[0].rename == "nvidia.com/g3" &&
                c.time_slicing[0].device_count == 1 && c.fail_requests_greater_than_one &&
                c.rename_by_default && !c.UsesMps();
       },
       ""},
      {"sharing.mps.*",
       "sharing:\n  mps:\n    renameByDefault: true\n    failRequestsGreaterThanOne: false\n"
       "    resources:\n    - {name: nvidia.com/gpu, replicas: 4, devices: all}\n",
       kApplied,
       [](const Config& c) {
         return c.UsesMps() && c.mps[0].replicas == 4 &&
                c.mps[0].rename == "nvidia.com/gpu.shared" && !c.FailSharedRequestsGreaterThanOne();
       },
       ""},
      {"sharing.mps failRequestsGreaterThanOne default",
       "sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 2}\n", kApplied,
       [](const Config& c) { return c.FailSharedRequestsGreaterThanOne(); }, ""},
      {"sharing.mps.resources.devices (not all)",
       "sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 2, devices: [0]}\n",
       kRefused,
       {},
       "t.yaml:4: sharing.mps.resources.devices: MPS shares every GPU of a resource"},
      {"sharing.mps + sharing.timeSlicing",
       "sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2}]\n  mps:\n"
       "    resources: [{name: gpu, replicas: 2}]\n",
       kRefused,
       {},
       "sharing.mps: sharing.timeSlicing and sharing.mps are mutually exclusive"},
      {"sharing.mps + migStrategy mixed",
       "flags: {migStrategy: mixed}\nsharing:\n  mps:\n    resources: [{name: gpu, replicas: 2}]\n",
       kRefused,
       {},
       "sharing.mps: not supported with migStrategy mixed"},
      {"imex.channelIDs", "imex: {channelIDs: [0]}\n", kApplied,
       [](const Config& c) { return c.imex_channels == std::vector<int>{0}; }, ""},
      {"imex.channelIDs=[1]",
       "imex: {channelIDs: [1]}\n",
       kRefused,
       {},
       "t.yaml:1: imex.channelIDs: only [] or [0] are valid"},
      {"imex.required", "imex: {channelIDs: [0], required: true}\n", kApplied,
       [](const Config& c) { return c.imex_required; }, ""},
      {"imex.channelIDs+cdi",
       "imex: {channelIDs: [0]}\nflags: {plugin: {deviceListStrategy: cdi-annotations}}\n",
       kRefused,
       {},
       "imex.channelIDs with a CDI deviceListStrategy"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.key);
    absl::StatusOr<Config> c = ParseConfig(row.yaml, "t.yaml");
    if (c.ok()) {
      absl::Status v = Validate(*c);
      if (!v.ok()) c = v;
    }
    switch (row.outcome) {
      case kApplied:
        ASSERT_TRUE(c.ok()) << c.status();
        EXPECT_TRUE(row.check(*c));
        EXPECT_TRUE(c->notes.empty()) << c->notes.front();
        break;
      case kSilent:
        ASSERT_TRUE(c.ok()) << c.status();
        EXPECT_TRUE(c->notes.empty());
        break;
      case kNoted:
        ASSERT_TRUE(c.ok()) << c.status();
        ASSERT_EQ(c->notes.size(), 1u);
        EXPECT_THAT(c->notes[0], HasSubstr(row.message));
        break;
      case kRefused:
        ASSERT_FALSE(c.ok());
        EXPECT_THAT(c.status().message(), HasSubstr(row.message));
        break;
    }
  }
}

// Every setting's default is recorded for `--help` (issue 32.8: flags showed VALUE and no
// default), and is the truth: given as a flag it changes nothing in the loaded Config.
TEST(ConfigTest, EverySettingHasATrueDefault) {
  auto base = LoadConfig({});
  ASSERT_TRUE(base.ok()) << base.status();
  for (const Setting& s : Settings()) {
    const char* d = DefaultOf(s);
    ASSERT_NE(d, nullptr) << s.key << " has no default for --help";
    if (*d == 0) continue;  // "unset": no text sets it
    ConfigSources src;
    src.flags[s.key] = d;
    auto c = LoadConfig(src);
    ASSERT_TRUE(c.ok()) << "--" << s.flag << "=" << d << ": " << c.status();
    EXPECT_TRUE(*c == *base) << "--" << s.flag << "=" << d << " is not the default";
  }
  // The comparison sees a change: a non-default value differs.
  ConfigSources other;
  other.flags["gpulet.vgpu.policy"] = "spread";
  auto c = LoadConfig(other);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(*c == *base);
}

}  // namespace
}  // namespace gpulet::plugin
