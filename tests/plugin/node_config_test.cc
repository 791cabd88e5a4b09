// Per-node configs: the Node label picks a file of the config directory; label and ConfigMap
// changes re-register resources live; an unknown name or a bad file is a Warning Event on the
// Node and the last good config stays. Fake API server + kubelet emulator over real sockets.
#include "plugin/node_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "k8s/client.h"
#include "plugin/plugin.h"
#include "testing/apiserver/fake_apiserver.h"
#include "testing/gpu/fake_gpu.h"
#include "testing/kubelet/emulator.h"

namespace gpulet::plugin {
namespace {

namespace fs = std::filesystem;
using gpulet::testing::FakeGpuLayer;
using gpulet::testing::MakeInventory;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::string TimeSliced(int replicas) {
  return "version: v1\ngpulet:\n  health: {unhealthyDevicesFile: \"\"}\nsharing:\n  timeSlicing:\n"
         "    resources:\n    - {name: nvidia.com/gpu, replicas: " +
         std::to_string(replicas) + "}\n";
}
const char kPlain[] = "version: v1\ngpulet:\n  health: {unhealthyDevicesFile: \"\"}\n";

class NodeConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-nodecfg-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    cm_ = dir_ + "/configs";
    fs::create_directories(cm_);
    fs::create_directories(dir_ + "/dp");
    ASSERT_TRUE(api_.Start());
    k8s::Config kc;
    kc.server = api_.url();
    kc.max_attempts = 2;
    client_ = std::make_unique<k8s::Client>(kc);
    emu::EmulatorOptions eo;
    eo.device_plugin_dir = dir_ + "/dp";
    kubelet_ = std::make_unique<emu::KubeletEmulator>(eo);
    ASSERT_TRUE(kubelet_->Start().ok());
  }
  void TearDown() override {
    watcher_.reset();
    dp_.reset();
    kubelet_->Stop();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // The ConfigMap volume as kubelet writes it: files in a timestamped directory, `..data` a
  // symlink to it, each key a symlink through `..data`; an update swaps `..data` atomically.
  void WriteConfigMap(const std::map<std::string, std::string>& files) {
    const std::string ts = "..gen" + std::to_string(++generation_);
    fs::create_directories(cm_ + "/" + ts);
    for (const auto& [k, v] : files) std::ofstream(cm_ + "/" + ts + "/" + k) << v;
    fs::create_symlink(ts, cm_ + "/..data_tmp");
    fs::rename(cm_ + "/..data_tmp", cm_ + "/..data");
    for (const auto& [k, v] : files)
      if (!fs::is_symlink(cm_ + "/" + k)) fs::create_symlink("..data/" + k, cm_ + "/" + k);
  }

  void CreateNode(const std::string& label) {
    nlohmann::json node = {
        {"apiVersion", "v1"},
        {"kind", "Node"},
        {"metadata", {{"name", "node-a"}, {"labels", nlohmann::json::object()}}}};
    if (!label.empty()) node["metadata"]["labels"][kDefaultConfigNodeLabel] = label;
    api_.CreateNode(node);
  }
  void Label(const std::string& value) {
    nlohmann::json patch = {{"metadata", {{"labels", {{kDefaultConfigNodeLabel, value}}}}}};
    ASSERT_TRUE(client_->PatchNode("node-a", k8s::PatchType::kMerge, patch).ok());
  }

  // As RunDevicePlugin wires them.
  void StartPlugin(const std::string& default_name = "plain") {
    NodeConfigOptions no;
    no.dir = cm_;
    no.default_name = default_name;
    no.node_name = "node-a";
    no.api = client_.get();
    no.recheck = absl::Milliseconds(200);
    watcher_ = std::make_unique<NodeConfigWatcher>(
        no, [this](const std::string& path) { return dp_->ReloadFrom(path); });
    auto initial = watcher_->Initial();
    ASSERT_TRUE(initial.ok()) << initial.status();
    DevicePlugin::Options o;
    o.manager.plugin_dir = dir_ + "/dp";
    o.sources.file = *initial;
    o.watch_file = false;
    auto cfg = LoadConfig(o.sources);
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    dp_ = std::make_unique<DevicePlugin>(&layer_, o, *cfg);
    ASSERT_TRUE(dp_->Start().ok());
    watcher_->Start(*initial);
  }

  std::vector<nlohmann::json> EventsWithReason(const std::string& reason) {
    std::vector<nlohmann::json> out;
    for (const auto& e : api_.Events())
      if (e.value("reason", "") == reason) out.push_back(e);
    return out;
  }
  bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 5s) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (pred()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return pred();
  }

  std::string dir_, cm_;
  int generation_ = 0;
  gpulet::testing::FakeApiServer api_;
  std::unique_ptr<k8s::Client> client_;
  std::unique_ptr<emu::KubeletEmulator> kubelet_;
  gpu::Inventory inv_ = MakeInventory(2, {});
  FakeGpuLayer layer_{inv_};
  std::unique_ptr<DevicePlugin> dp_;
  std::unique_ptr<NodeConfigWatcher> watcher_;
};

// The label picks the config; switching it re-registers the resource (4 replicas -> none); a new
// ConfigMap content of the config in force is applied; removing the label goes to the default.
TEST_F(NodeConfigTest, LabelAndConfigMapChangesApplyLive) {
  WriteConfigMap({{"ts4", TimeSliced(4)}, {"plain", kPlain}});
  CreateNode("ts4");
  StartPlugin();
  ASSERT_TRUE(kubelet_->WaitForAllocatable("nvidia.com/gpu", 8, 5s).ok());
  EXPECT_EQ(watcher_->current(), "ts4");

  Label("plain");
  ASSERT_TRUE(kubelet_->WaitForAllocatable("nvidia.com/gpu", 2, 5s).ok());
  EXPECT_EQ(watcher_->current(), "plain");
  ASSERT_TRUE(WaitFor([&] { return !EventsWithReason("DevicePluginConfigApplied").empty(); }));
  auto applied = EventsWithReason("DevicePluginConfigApplied");
  EXPECT_EQ(applied.back()["involvedObject"]["name"], "node-a");
  EXPECT_THAT(applied.back()["message"].get<std::string>(),
              HasSubstr("\"plain\" applied (was \"ts4\")"));

  // kubelet updates the mounted ConfigMap: the config in force changes content.
  WriteConfigMap({{"ts4", TimeSliced(4)}, {"plain", TimeSliced(3)}});
  ASSERT_TRUE(kubelet_->WaitForAllocatable("nvidia.com/gpu", 6, 5s).ok());

  // The label goes away: the default (plain) stays in force, nothing to do.
  nlohmann::json patch = {{"metadata", {{"labels", {{kDefaultConfigNodeLabel, nullptr}}}}}};
  ASSERT_TRUE(client_->PatchNode("node-a", k8s::PatchType::kMerge, patch).ok());
  Label("ts4");
  ASSERT_TRUE(kubelet_->WaitForAllocatable("nvidia.com/gpu", 8, 5s).ok());
  EXPECT_TRUE(EventsWithReason("UnknownDevicePluginConfig").empty());
  EXPECT_TRUE(EventsWithReason("InvalidDevicePluginConfig").empty());
}

// An unknown name: a Warning Event naming it, and the last good config keeps serving; a bad file:
// an Event naming the file and line, last good kept; fixing it applies it.
TEST_F(NodeConfigTest, UnknownNameAndBadYamlKeepLastGood) {
  WriteConfigMap({{"ts4", TimeSliced(4)}, {"plain", kPlain}});
  CreateNode("ts4");
  StartPlugin();
  ASSERT_TRUE(kubelet_->WaitForAllocatable("nvidia.com/gpu", 8, 5s).ok());

  Label("nope");
  ASSERT_TRUE(WaitFor([&] { return !EventsWithReason("UnknownDevicePluginConfig").empty(); }));
  auto unknown = EventsWithReason("UnknownDevicePluginConfig");
  EXPECT_EQ(unknown[0]["type"], "Warning");
  EXPECT_EQ(unknown[0]["involvedObject"]["kind"], "Node");
  EXPECT_EQ(unknown[0]["involvedObject"]["name"], "node-a");
  EXPECT_THAT(unknown[0]["message"].get<std::string>(),
              HasSubstr("node label nvidia.com/device-plugin.config=\"nope\" names no config in " +
                        cm_ + " (have: plain, ts4); keeping config \"ts4\""));
  std::this_thread::sleep_for(500ms);  // re-checks must not repeat the Event
  EXPECT_EQ(EventsWithReason("UnknownDevicePluginConfig").size(), 1u);
  EXPECT_EQ(watcher_->current(), "ts4");
  EXPECT_EQ(kubelet_->Resource("nvidia.com/gpu")->devices.size(), 8u);

  Label("ts4");
  WriteConfigMap({{"ts4", "version: v1\nsharing:\n  timeSlicing: [\n"}, {"plain", kPlain}});
  ASSERT_TRUE(WaitFor([&] { return !EventsWithReason("InvalidDevicePluginConfig").empty(); }));
  auto bad = EventsWithReason("InvalidDevicePluginConfig");
  EXPECT_THAT(bad[0]["message"].get<std::string>(), HasSubstr(cm_ + "/ts4:4: not valid YAML"));
  EXPECT_THAT(bad[0]["message"].get<std::string>(), HasSubstr("keeping config \"ts4\""));
  EXPECT_EQ(kubelet_->Resource("nvidia.com/gpu")->devices.size(), 8u);

  // A valid YAML that does not validate is reported the same way, with its line.
  WriteConfigMap({{"ts4", TimeSliced(1)}, {"plain", kPlain}});
  ASSERT_TRUE(WaitFor([&] { return EventsWithReason("InvalidDevicePluginConfig").size() == 2; }));
  EXPECT_THAT(EventsWithReason("InvalidDevicePluginConfig")[1]["message"].get<std::string>(),
              HasSubstr(cm_ + "/ts4:7: sharing.timeSlicing.resources.replicas"));

  WriteConfigMap({{"ts4", TimeSliced(2)}, {"plain", kPlain}});
  ASSERT_TRUE(kubelet_->WaitForAllocatable("nvidia.com/gpu", 4, 5s).ok());
}

// At start, an unknown label name falls back to the default (with the Event); without a label and
// without a default the only file is used; an unknown default name stops the start.
TEST_F(NodeConfigTest, InitialChoice) {
  WriteConfigMap({{"ts4", TimeSliced(4)}});
  CreateNode("missing");
  NodeConfigOptions no;
  no.dir = cm_;
  no.node_name = "node-a";
  no.api = client_.get();
  NodeConfigWatcher w(no, [](const std::string&) { return absl::OkStatus(); });
  auto path = w.Initial();
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, cm_ + "/ts4");
  EXPECT_EQ(EventsWithReason("UnknownDevicePluginConfig").size(), 1u);

  NodeConfigOptions none = no;
  none.api = nullptr;
  none.default_name = "other";
  NodeConfigWatcher w2(none, [](const std::string&) { return absl::OkStatus(); });
  EXPECT_THAT(w2.Initial().status().message(),
              HasSubstr("the default config \"other\" names no config in"));
  EXPECT_THAT(ConfigNames(cm_), ::testing::ElementsAre("ts4"));
}

}  // namespace
}  // namespace gpulet::plugin
