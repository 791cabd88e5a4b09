// The exporter's HTTP server under hostile clients (any pod of the node can reach :9400): huge
// bodies, endless headers, long lines, slow and idle connections. The server must keep answering
// /health and /metrics and stay within a small memory bound. Also GPU Manager's /metric with
// nothing to report ends its response.
#include "metrics/server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/render.h"
#include "metrics/sampler.h"
#include "testing/gpu/fake_gpu.h"

namespace gpulet::metrics {
namespace {

using testing::FakeGpuLayer;
using Clk = std::chrono::steady_clock;

int64_t RssKiB() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return 0;
}

// A loopback connection to `port`, from the address `from` when given (any 127.x.y.z is this
// machine), with a receive buffer of `rcvbuf` bytes when given (a client that barely reads).
int Connect(int port, const char* from = nullptr, int rcvbuf = 0) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  if (from) {
    sockaddr_in me{};
    me.sin_family = AF_INET;
    inet_pton(AF_INET, from, &me.sin_addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&me), sizeof me) != 0) {
      close(fd);
      return -1;
    }
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return fd;
}

// Sends until done or the peer stops reading/closes; returns bytes sent.
size_t SendAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

// Everything the server sends until it closes (or 5 s pass).
std::string ReadUntilClose(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

class HttpAbuseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sampler_.SampleOnce();
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.gpu_manager_address = "127.0.0.1:0";
    o.threads = 2;
    o.head_deadline = std::chrono::milliseconds(500);
    o.idle_timeout = std::chrono::milliseconds(1000);
    o.max_connections = 64;
    server_ = std::make_unique<MetricsServer>(&sampler_, o);
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override { server_->Stop(); }

  // Seconds a fresh client takes to get /health (or -1 on failure).
  double HealthSeconds(const char* path = "/health") {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_connection_timeout(3, 0);
    c.set_read_timeout(3, 0);
    auto t0 = Clk::now();
    auto r = c.Get(path);
    if (!r || r->status != 200) return -1;
    return std::chrono::duration<double>(Clk::now() - t0).count();
  }

  FakeGpuLayer gpus_{2};
  Sampler sampler_{&gpus_, nullptr, nullptr, nullptr, nullptr, [] {
                     SamplerOptions so;
                     so.render.families = kDefaultFamilies | kGpuManagerFamilies;
                     return so;
                   }()};
  std::unique_ptr<MetricsServer> server_;
};

// GPU Manager's /metric with no pod holding a GPU: 200 with an empty body that ends
// (Content-Length: 0), scrape after scrape (it used to stream forever without a length).
TEST_F(HttpAbuseTest, GpuManagerMetricWithNothingToReportEnds) {
  httplib::Client c("127.0.0.1", server_->gpu_manager_port());
  c.set_read_timeout(2, 0);
  for (int i = 0; i < 5; ++i) {
    auto r = c.Get("/metric");
    ASSERT_TRUE(r) << "scrape " << i << ": " << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "");
    EXPECT_EQ(r->get_header_value("Content-Length"), "0");
  }
}

// A 64 MiB POST and a GET announcing a 64 MiB body are answered 405/413 before the body is read,
// and the connection is closed; the server's memory does not grow with the body.
TEST_F(HttpAbuseTest, BodiesAreRefusedUnread) {
  int64_t before = RssKiB();
  const std::string chunk(1 << 20, 'x');
  for (const char* method : {"POST", "GET"}) {
    int fd = Connect(server_->port());
    ASSERT_GE(fd, 0);
    std::string head = std::string(method) + " /metrics HTTP/1.1\r\nHost: x\r\n" +
                       "Content-Length: " + std::to_string(64 << 20) + "\r\n\r\n";
    SendAll(fd, head);
    size_t sent = 0;
    for (int i = 0; i < 64; ++i) {
      size_t n = SendAll(fd, chunk);
      sent += n;
      if (n < chunk.size()) break;
    }
    std::string resp = ReadUntilClose(fd);
    close(fd);
    EXPECT_EQ(resp.substr(0, 12),
              std::string("HTTP/1.1 ") + (std::string(method) == "POST" ? "405" : "413"))
        << method;
    EXPECT_LT(sent, size_t{64} << 20) << method << ": the server read the whole body";
  }
  EXPECT_LT(RssKiB() - before, 16 * 1024) << "KiB of growth";
  EXPECT_GE(HealthSeconds(), 0);
}

// Endless headers and an endless request line: 431 once the head passes its limit (16 KiB),
// connection closed, memory bounded.
TEST_F(HttpAbuseTest, HeadsAreBounded) {
  int64_t before = RssKiB();
  int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  // Sent in small pieces so the test's own buffers do not count against the bound.
  SendAll(fd, "GET /health HTTP/1.1\r\nHost: x\r\n");
  std::string headers;
  for (int i = 0; i < 1000; ++i) headers += "X-A: b\r\n";
  for (int i = 0; i < 200 && SendAll(fd, headers) == headers.size(); ++i) {
  }
  std::string resp = ReadUntilClose(fd);
  close(fd);
  EXPECT_EQ(resp.substr(0, 12), "HTTP/1.1 431");

  fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  SendAll(fd, "GET /");
  const std::string line(64 << 10, 'a');
  for (int i = 0; i < 128 && SendAll(fd, line) == line.size(); ++i) {
  }
  resp = ReadUntilClose(fd);
  close(fd);
  EXPECT_EQ(resp.substr(0, 12), "HTTP/1.1 431");
  EXPECT_LT(RssKiB() - before, 16 * 1024) << "KiB of growth";
  EXPECT_GE(HealthSeconds(), 0);
}

// Slow clients (a header byte every 100 ms), idle connections that never send, and idle
// keep-alive connections, more of each than there are workers: /health and /metrics still answer
// within a fraction of a second, and slow heads are cut at their deadline.
TEST_F(HttpAbuseTest, SlowAndIdleClientsDoNotStarveProbes) {
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(Connect(server_->port()));
  std::vector<std::unique_ptr<httplib::Client>> kept;
  for (int i = 0; i < 10; ++i) {
    kept.push_back(std::make_unique<httplib::Client>("127.0.0.1", server_->port()));
    kept.back()->set_keep_alive(true);
    auto r = kept.back()->Get("/health");
    ASSERT_TRUE(r);
  }
  std::atomic<bool> stop{false};
  std::atomic<int> cut{0};
  std::vector<std::thread> slow;
  for (int i = 0; i < 8; ++i) {
    slow.emplace_back([&] {
      int fd = Connect(server_->port());
      SendAll(fd, "GET /health HTTP/1.1\r\n");
      while (!stop) {
        if (SendAll(fd, "X") != 1) {
          ++cut;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      close(fd);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  double worst = 0;
  for (int i = 0; i < 10; ++i) {
    double h = HealthSeconds(), m = HealthSeconds("/metrics");
    ASSERT_GE(h, 0) << "probe " << i;
    ASSERT_GE(m, 0) << "scrape " << i;
    worst = std::max({worst, h, m});
  }
  EXPECT_LT(worst, 0.5) << "seconds";
  // Within about a second the server has cut the slow heads (their sends start failing).
  auto until = Clk::now() + std::chrono::seconds(4);
  while (cut < 8 && Clk::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  stop = true;
  for (auto& t : slow) t.join();
  EXPECT_EQ(cut, 8);
  for (int fd : idle) close(fd);
}

// More connections than the cap: the oldest waiting ones are closed, a new probe still answers.
TEST_F(HttpAbuseTest, ConnectionFloodKeepsNewestServed) {
  std::vector<int> fds;
  for (int i = 0; i < 200; ++i) fds.push_back(Connect(server_->port()));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_GE(HealthSeconds(), 0);
  EXPECT_LT(HealthSeconds(), 0.5);
  char b;
  EXPECT_EQ(recv(fds.front(), &b, 1, 0), 0) << "the oldest idle connection was not closed";
  for (int fd : fds) close(fd);
}

// Clients that pipeline /metrics (more responses than the kernel's send buffer holds) and never
// read (tiny receive windows), four times as many as there are workers: the workers hand what the
// sockets do not take to the poller instead of waiting on them, and the poller answers /health
// itself, so every one-second probe succeeds and a normal scrape still gets its whole body.
// (Before: every worker blocked up to its write deadline on one such client, and 20 of 20 probes
// failed.)
TEST_F(HttpAbuseTest, ClientsThatNeverReadDoNotStarveProbes) {
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.threads = 2;
  o.write_deadline = std::chrono::milliseconds(8000);
  o.max_connections_per_peer = 1000;  // this test is about the workers, not the per-peer cap
  MetricsServer server(&sampler_, o);
  ASSERT_TRUE(server.Start().ok());
  std::string pipeline;
  for (int i = 0; i < 400; ++i) pipeline += "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  std::vector<int> stuck;
  for (int i = 0; i < 8; ++i) {
    int fd = Connect(server.port(), nullptr, /*rcvbuf=*/1024);
    ASSERT_GE(fd, 0);
    timeval tv{0, 200000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    SendAll(fd, pipeline);
    stuck.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int failed = 0;
  for (int i = 0; i < 12; ++i) {
    httplib::Client c("127.0.0.1", server.port());
    c.set_connection_timeout(1, 0);
    c.set_read_timeout(1, 0);
    auto r = c.Get("/health");
    if (!r || r->status != 200 || !absl::StartsWith(r->body, "ok")) ++failed;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(failed, 0) << "of 12 probes of /health";
  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(3, 0);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m) << "a scrape beside the stuck clients";
  EXPECT_EQ(m->status, 200);
  EXPECT_THAT(m->body, ::testing::HasSubstr("gpulet_exporter_scrape_duration_seconds"));
  EXPECT_EQ(std::to_string(m->body.size()), m->get_header_value("Content-Length"));
  // HEAD /health: the status and length, no body; a probe of another method is no probe.
  int fd = Connect(server.port());
  SendAll(fd, "HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string head = ReadUntilClose(fd);
  close(fd);
  EXPECT_TRUE(absl::StartsWith(head, "HTTP/1.1 200 OK\r\n")) << head;
  EXPECT_TRUE(absl::EndsWith(head, "\r\n\r\n")) << head;
  fd = Connect(server.port());
  SendAll(fd, "POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  EXPECT_THAT(ReadUntilClose(fd), ::testing::StartsWith("HTTP/1.1 405"));
  close(fd);
  for (int s : stuck) close(s);
  server.Stop();
}

// At most max_connections_per_peer connections from one address: past it that address's oldest
// are closed, while another address's connection stays open and is served.
TEST_F(HttpAbuseTest, ConnectionsPerPeerAreCapped) {
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.threads = 2;
  o.max_connections_per_peer = 4;
  o.idle_timeout = std::chrono::milliseconds(5000);
  MetricsServer server(&sampler_, o);
  ASSERT_TRUE(server.Start().ok());
  auto from = [&](const char* ip) {
    int fd = Connect(server.port(), ip);
    EXPECT_GE(fd, 0) << ip;
    return fd;
  };
  int other = from("127.0.0.2");
  std::vector<int> mine;
  for (int i = 0; i < 10; ++i) {
    mine.push_back(from("127.0.0.3"));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  char b;
  int closed = 0;
  for (int i = 0; i < 6; ++i) closed += recv(mine[i], &b, 1, MSG_DONTWAIT) == 0;
  EXPECT_EQ(closed, 6) << "the 6 oldest of 10 connections from one address";
  EXPECT_EQ(recv(mine.back(), &b, 1, MSG_DONTWAIT), -1) << "the newest is open";
  SendAll(other, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(ReadUntilClose(other), ::testing::StartsWith("HTTP/1.1 200 OK"));
  close(other);
  for (int fd : mine) close(fd);
  server.Stop();
}

}  // namespace
}  // namespace gpulet::metrics
