#include "kubelet/server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string_view>

#include "spdlog/sinks/base_sink.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "testing/common/fake_clock.h"
#include "testing/kubelet/emulator.h"

namespace gpulet::kubelet {
namespace {

using namespace std::chrono_literals;

// A resource whose devices the test edits.
class TestResource : public Resource {
 public:
  TestResource(std::string name, int n) : name_(std::move(name)) {
    for (int i = 0; i < n; ++i) devices_.push_back({"dev-" + std::to_string(i), true, i % 2});
  }
  const std::string& name() const override { return name_; }
  std::vector<DeviceState> Devices() const override {
    absl::MutexLock l(&mu_);
    return devices_;
  }
  const ChangeNotifier* changes() const override { return &changes_; }
  absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocate(
      const std::vector<std::string>& ids) override {
    v1beta1::ContainerAllocateResponse r;
    for (const auto& id : ids)
      if (id.rfind("dev-", 0) != 0)
        return absl::InvalidArgumentError("unknown device ID \"" + id + "\"");
    (*r.mutable_envs())["TEST_DEVICES"] = ids.front();
    return r;
  }
  absl::StatusOr<std::vector<std::string>> Preferred(const std::vector<std::string>& available,
                                                     const std::vector<std::string>& must,
                                                     int size) override {
    return std::vector<std::string>(available.end() - size, available.end());  // the last ones
  }
  void SetHealthy(int i, bool h) {
    {
      absl::MutexLock l(&mu_);
      devices_[i].healthy = h;
    }
    changes_.Notify();
  }

 private:
  std::string name_;
  mutable absl::Mutex mu_;
  std::vector<DeviceState> devices_;
  ChangeNotifier changes_;
};

struct ServerTest : ::testing::Test {
  ServerTest() { std::filesystem::create_directories(dir); }
  ~ServerTest() override { std::filesystem::remove_all(dir); }
  std::string dir = "/tmp/dp-srv-" + std::to_string(getpid());
  ManagerOptions Options() {
    ManagerOptions o;
    o.plugin_dir = dir;
    return o;
  }
};

TEST(SocketNameTest, NvidiaNaming) {
  EXPECT_EQ(SocketNameFor("nvidia.com/gpu"), "nvidia-gpu.sock");
  EXPECT_EQ(SocketNameFor("nvidia.com/mig-1g.5gb"), "nvidia-mig-1g.5gb.sock");
  EXPECT_EQ(SocketNameFor("tencent.com/vcuda-core"), "tencent-vcuda-core.sock");
}

// Registration, the live ListAndWatch stream, preferred allocation and Allocate, all through the
// emulator's real gRPC client.
TEST_F(ServerTest, RegistersAndStreamsHealth) {
  emu::KubeletEmulator kubelet({.device_plugin_dir = dir});
  ASSERT_TRUE(kubelet.Start().ok());
  PluginManager m(Options());
  auto res = std::make_shared<TestResource>("example.com/widget", 4);
  ASSERT_TRUE(m.SetResources({res}).ok());
  ASSERT_TRUE(kubelet.WaitForAllocatable("example.com/widget", 4, 5000ms).ok());
  auto state = kubelet.Resource("example.com/widget");
  ASSERT_TRUE(state.has_value());
  EXPECT_TRUE(state->preferred_allocation);
  EXPECT_EQ(state->endpoint, "example-widget.sock");
  EXPECT_THAT(state->devices[1].numa_nodes, ::testing::ElementsAre(1));
  res->SetHealthy(2, false);
  ASSERT_TRUE(kubelet.WaitForAllocatable("example.com/widget", 3, 5000ms).ok());
  res->SetHealthy(2, true);
  ASSERT_TRUE(kubelet.WaitForAllocatable("example.com/widget", 4, 5000ms).ok());
  auto pods = emu::ParsePods(R"(apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  containers:
  - name: c
    image: x
    resources: {limits: {example.com/widget: 1}}
)",
                             "pod.yaml");
  ASSERT_TRUE(pods.ok()) << pods.status();
  auto st = kubelet.AddPod((*pods)[0]);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->phase, emu::PodPhase::kRunning) << st->message;
  // The emulator asked for a preference, and the resource prefers the last device.
  EXPECT_EQ(st->containers[0].response.envs().at("TEST_DEVICES"), "dev-3");
  EXPECT_EQ(m.Status()[0].registrations, 1);
}

// No kubelet yet: registration is retried with backoff and succeeds once it appears; the plugin
// neither crashes nor gives up, and says that it waits and when the kubelet appeared (it used to
// wait silently).
TEST_F(ServerTest, RetriesUntilKubeletAppears) {
  std::ostringstream log;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  struct Restore {
    std::shared_ptr<spdlog::logger> l;
    ~Restore() { spdlog::set_default_logger(l); }
  } restore{previous};
  PluginManager m(Options());
  ASSERT_TRUE(m.SetResources({std::make_shared<TestResource>("example.com/widget", 2)}).ok());
  std::this_thread::sleep_for(500ms);
  auto s = m.Status();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_FALSE(s[0].registered);
  emu::KubeletEmulator kubelet({.device_plugin_dir = dir});
  ASSERT_TRUE(kubelet.Start().ok());
  EXPECT_TRUE(kubelet.WaitForAllocatable("example.com/widget", 2, 5000ms).ok());
  m.Stop();
  EXPECT_THAT(log.str(), ::testing::HasSubstr("waiting for the kubelet: " + dir +
                                              "/kubelet.sock does not exist yet"));
  EXPECT_THAT(log.str(), ::testing::HasSubstr("the kubelet appeared at " + dir + "/kubelet.sock"));
}

// A kubelet restart (its directory cleaned, kubelet.sock recreated) is followed by a new
// registration well within a second; a removed plugin socket is served again.
TEST_F(ServerTest, ReRegistersAfterKubeletRestart) {
  auto kubelet =
      std::make_unique<emu::KubeletEmulator>(emu::EmulatorOptions{.device_plugin_dir = dir});
  ASSERT_TRUE(kubelet->Start().ok());
  PluginManager m(Options());
  ASSERT_TRUE(m.SetResources({std::make_shared<TestResource>("example.com/widget", 2)}).ok());
  ASSERT_TRUE(kubelet->WaitForAllocatable("example.com/widget", 2, 5000ms).ok());
  kubelet->Stop();
  kubelet = std::make_unique<emu::KubeletEmulator>(emu::EmulatorOptions{.device_plugin_dir = dir});
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(kubelet->Start().ok());  // removes our socket, like the kubelet
  ASSERT_TRUE(kubelet->WaitForAllocatable("example.com/widget", 2, 5000ms).ok());
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, 2s);  // generous; the contract (< 1 s) is reported by the e2e test
  EXPECT_GE(m.Status()[0].serves, 2);
  ::unlink((dir + "/example-widget.sock").c_str());
  for (int i = 0; i < 50 && !std::filesystem::exists(dir + "/example-widget.sock"); ++i)
    std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(std::filesystem::exists(dir + "/example-widget.sock"));
}

// The registration backoff waits on the manager's clock: while a test clock stands still, a
// kubelet that refuses (here kubelet.sock is no socket) is tried once, not every 100-400 ms of
// real time; moving the clock past the backoff brings the next try.
TEST_F(ServerTest, RegistrationBackoffFollowsTheClock) {
  // Counts the "retrying in" warnings as they are logged (the test reads it while the manager
  // logs).
  struct Tries : spdlog::sinks::base_sink<std::mutex> {
    std::atomic<int> n{0};
    void sink_it_(const spdlog::details::log_msg& m) override {
      if (std::string_view(m.payload.data(), m.payload.size()).find("retrying in") !=
          std::string_view::npos)
        ++n;
    }
    void flush_() override {}
  };
  auto sink = std::make_shared<Tries>();
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  struct Restore {
    std::shared_ptr<spdlog::logger> l;
    ~Restore() { spdlog::set_default_logger(l); }
  } restore{previous};
  auto tries = [&sink] { return sink->n.load(); };
  { std::ofstream(dir + "/kubelet.sock") << "not a socket"; }
  gpulet::testing::FakeClock clock;
  ManagerOptions o = Options();
  o.clock = &clock;
  o.poll_interval = absl::Milliseconds(20);
  o.register_timeout = absl::Milliseconds(200);
  PluginManager m(o);
  ASSERT_TRUE(m.SetResources({std::make_shared<TestResource>("example.com/widget", 1)}).ok());
  for (int i = 0; i < 250 && tries() < 1; ++i) std::this_thread::sleep_for(20ms);
  std::this_thread::sleep_for(800ms);  // real time, four times the 100-400 ms backoff
  EXPECT_EQ(tries(), 1);
  clock.Advance(100ms);  // the first backoff
  for (int i = 0; i < 250 && tries() < 2; ++i) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(tries(), 2);
  m.Stop();
}

// A missing directory or a resource offered twice is an error, not a crash.
TEST_F(ServerTest, BadSetup) {
  ManagerOptions o = Options();
  o.plugin_dir = dir + "/missing";
  PluginManager bad(o);
  EXPECT_THAT(bad.SetResources({std::make_shared<TestResource>("example.com/a", 1)}).message(),
              ::testing::HasSubstr("does not exist"));
  PluginManager m(Options());
  auto a = std::make_shared<TestResource>("example.com/a", 1);
  EXPECT_EQ(m.SetResources({a, a}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpulet::kubelet
