// `gpulet scheduler` (the real binary, against the fake API server) under hostile HTTP clients on
// its extender and webhook ports: huge bodies, 100000-deep JSON, endless headers, slow clients,
// thousands of idle connections and concurrent large bodies. Throughout, /healthz answers within a
// second, and at the end the process is alive with its peak RSS under the Deployment's 256 MiB
// memory limit.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "httplib.h"
#include "testing/apiserver/fake_apiserver.h"
#include "testing/net/loopback.h"
#include "testing/process/spawn.h"

namespace gpulet {
namespace {
using testing_net::Connect;
using testing_net::FreePort;

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using std::chrono::milliseconds;

int64_t StatusKb(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

class SchedulerAbuse : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(api_.Start());
    api_.CreateNode(
        {{"metadata",
          {{"name", "gpu-node"},
           {"annotations", {{"gpulet.io/vgpu-gpus", R"([{"uuid":"GPU-a","memoryUnits":64}])"}}}}}});
    char tmpl[] = "/tmp/gpulet-sched-abuse-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ + "/kubeconfig") << api_.Kubeconfig();
    ext_ = FreePort();
    hook_ = FreePort();
    health_ = FreePort();
    pid_ = testing_process::SpawnLogged(
        {std::string(GPULET_BINARY_DIR) + "/bin/gpulet", "scheduler", "--kubeconfig",
         dir_ + "/kubeconfig", "--extender-listen", "127.0.0.1:" + std::to_string(ext_),
         "--webhook-listen", "127.0.0.1:" + std::to_string(hook_), "--health-listen",
         "127.0.0.1:" + std::to_string(health_)},
        dir_ + "/scheduler.log");
    auto deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline && Healthz(ext_) < 0)
      std::this_thread::sleep_for(milliseconds(50));
    ASSERT_GE(Healthz(ext_), 0) << Log();
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }
  std::string Log() {
    std::ifstream in(dir_ + "/scheduler.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // Milliseconds a GET /healthz took, -1 when it failed.
  static int64_t Healthz(int port) {
    auto t0 = Clock::now();
    httplib::Client cli("127.0.0.1", port);
    cli.set_connection_timeout(std::chrono::seconds(2));
    cli.set_read_timeout(std::chrono::seconds(2));
    auto r = cli.Get(port == 0 ? "/" : "/healthz");
    if (!r || r->status != 200) return -1;
    return std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
  }
  void ExpectResponsive(const std::string& after) {
    std::printf("after %s: VmHWM %lld KiB, VmRSS %lld KiB\n", after.c_str(),
                static_cast<long long>(StatusKb(pid_, "VmHWM")),
                static_cast<long long>(StatusKb(pid_, "VmRSS")));
    EXPECT_EQ(waitpid(pid_, nullptr, WNOHANG), 0) << "scheduler died after " << after << "\n"
                                                  << Log();
    for (int port : {ext_, health_}) {
      int64_t t = Healthz(port);
      EXPECT_GE(t, 0) << "healthz on " << port << " failed after " << after;
      EXPECT_LT(t, 1000) << "healthz on " << port << " after " << after;
    }
  }
  int Post(int port, const std::string& path, const std::string& body, bool tls = false) {
    std::unique_ptr<httplib::ClientImpl> cli;
    if (tls) {
      auto c = std::make_unique<httplib::SSLClient>("127.0.0.1", port);
      c->enable_server_certificate_verification(false);
      cli = std::move(c);
    } else {
      cli = std::make_unique<httplib::ClientImpl>("127.0.0.1", port);
    }
    cli->set_read_timeout(std::chrono::seconds(10));
    cli->set_write_timeout(std::chrono::seconds(10));
    auto r = cli->Post(path, body, "application/json");
    return r ? r->status : 0;
  }

  testing::FakeApiServer api_;
  std::string dir_;
  pid_t pid_ = -1;
  int ext_ = 0, hook_ = 0, health_ = 0;
};

TEST_F(SchedulerAbuse, StaysUpResponsiveAndUnderItsMemoryLimit) {
  // Huge bodies: refused by size before they are read.
  // (413, or the connection closed under the client while it was still sending the body.)
  for (int status : {Post(ext_, "/scheduler/filter", std::string(4 << 20, '[')),
                     Post(hook_, "/validate", std::string(4 << 20, '['), true)}) {
    EXPECT_TRUE(status == 413 || status == 0) << status;
  }
  ExpectResponsive("4 MiB bodies");
  // Deep JSON under the size limit: refused by depth (no DOM of 2 million arrays).
  EXPECT_EQ(Post(ext_, "/scheduler/filter", std::string((1 << 20) - 100, '[')), 400);
  EXPECT_EQ(Post(hook_, "/validate", std::string((1 << 20) - 100, '['), true), 400);
  // The 200 KB 100000-deep array inside a Node object that used to overflow the re-serialiser.
  std::string deep =
      R"({"Pod":{"metadata":{"uid":"u"},"spec":{"containers":[]}},"Nodes":{"items":[)" +
      std::string(100000, '[') + std::string(100000, ']') + "]}}";
  EXPECT_EQ(Post(ext_, "/scheduler/filter", deep), 400);
  ExpectResponsive("deep JSON");

  // Endless headers: cut after 64 KiB.
  {
    int fd = Connect(ext_);
    std::string line = "POST /scheduler/filter HTTP/1.1\r\nHost: x\r\n";
    std::string block;
    for (int i = 0; i < 1000; ++i)
      block += "X-A: bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\r\n";
    send(fd, line.data(), line.size(), MSG_NOSIGNAL);
    size_t sent = 0;
    for (int i = 0; i < 2000; ++i) {
      ssize_t n = send(fd, block.data(), block.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0)
        sent += static_cast<size_t>(n);
      else if (errno == EAGAIN)
        std::this_thread::sleep_for(milliseconds(2));
      else
        break;
    }
    EXPECT_LT(sent, size_t{16} << 20);
    close(fd);
  }
  ExpectResponsive("endless headers");

  // Slow clients (a byte every 200 ms) on both ports, far more than the workers.
  std::vector<int> slow;
  for (int i = 0; i < 64; ++i) {
    slow.push_back(Connect(ext_));
    slow.push_back(Connect(hook_));
  }
  std::atomic<bool> stop{false};
  std::thread dribble([&] {
    const std::string req = "POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n";
    for (size_t i = 0; !stop; i = (i + 1) % req.size()) {
      for (int fd : slow) send(fd, &req[i], 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      std::this_thread::sleep_for(milliseconds(200));
    }
  });
  std::this_thread::sleep_for(milliseconds(1000));
  ExpectResponsive("128 slow clients");

  // Thousands of idle connections.
  std::vector<int> idle;
  for (int i = 0; i < 3000; ++i) {
    int fd = Connect(i % 2 ? ext_ : hook_);
    if (fd >= 0) idle.push_back(fd);
  }
  std::this_thread::sleep_for(milliseconds(300));
  ExpectResponsive("3000 idle connections");

  // Concurrent large, shallow bodies (the DOM's worst case, ~30x the text) on both ports.
  std::string wide = "[";
  while (wide.size() < (1 << 20) - 1000) wide += "{},";
  wide += "{}]";
  std::vector<std::thread> big;
  std::atomic<int> answered{0};
  for (int i = 0; i < 24; ++i) {
    big.emplace_back([&, i] {
      for (int k = 0; k < 3; ++k) {
        if (Post(i % 2 ? ext_ : hook_, i % 2 ? "/scheduler/filter" : "/validate", wide,
                 i % 2 == 0) > 0) {
          ++answered;
        }
      }
    });
  }
  std::this_thread::sleep_for(milliseconds(500));
  ExpectResponsive("24 concurrent 1 MiB bodies");
  for (auto& t : big) t.join();
  EXPECT_GT(answered.load(), 0);
  stop = true;
  dribble.join();
  for (int fd : slow) close(fd);
  for (int fd : idle) close(fd);

  ExpectResponsive("all of it");
  int64_t hwm = StatusKb(pid_, "VmHWM");
  std::printf("gpulet scheduler peak RSS under abuse: %lld KiB\n", static_cast<long long>(hwm));
  EXPECT_GT(hwm, 0);
#if defined(__SANITIZE_ADDRESS__)
  // ASan's quarantine and shadow memory roughly triple the peak (738 MiB seen): the bound holds for
  // the release build, which is what the Deployment runs.
  std::printf("peak RSS bound (256 MiB) not checked: AddressSanitizer build\n");
#else
  EXPECT_LT(hwm, 256 * 1024) << "peak RSS above the Deployment's 256 MiB limit";
#endif
  // A real request still works.
  json args = {{"Pod",
                {{"metadata", {{"uid", "u1"}}},
                 {"spec",
                  {{"containers", json::array({{{"name", "c"},
                                                {"resources",
                                                 {{"limits",
                                                   {{"tencent.com/vcuda-core", 30},
                                                    {"tencent.com/vcuda-memory", 8}}}}}}})}}}}},
               {"NodeNames", {"gpu-node"}}};
  httplib::Client cli("127.0.0.1", ext_);
  auto r = cli.Post("/scheduler/filter", args.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body)["NodeNames"], json::array({"gpu-node"})) << r->body;
}

}  // namespace
}  // namespace gpulet
