// Exporter benchmarks for 8 GPUs x 128 containers (16 pods per GPU through time-slicing replica
// IDs, default families gpulet + dcgm).
//
// Method:
//  * BM_ScrapeProcess: starts the real `gpulet exporter --simulate dgx-h100 --interval 1s` (fake
//    NVML through dlopen) with an in-process PodResources server listing 128 containers, waits
//    until a scrape shows all 128 containers and the NVLink rates (second cycle on), then times
//    GET /metrics over loopback, one scrape per iteration, 2000 iterations. Each arm waits and
//    scrapes with its own encoding only (the exporter keeps only the variants scraped lately).
//    The client (ScrapeClient below) is a keep-alive HTTP/1.1 client on a plain socket reading
//    with large recv() calls into one reused 4 MiB buffer, as Prometheus does (Go's io.Copy
//    into a bytes.Buffer: reads as large as the free buffer, no poll per read). It reconnects
//    when the server closes the connection (httplib: every 5th request), inside the timed
//    scrape. Until 2026-11-22 (session 3) the client was httplib::Client, which reads 4 KiB per
//    recv() with a poll() before each (~190 of each per 766 KiB body) and grows the body string
//    as it goes: 0.39 ms of CPU per identity scrape at load 0.1 and 1.15 ms at load 2.5, against
//    the exporter's ~0.15 ms, so most of the old identity figures was the client's (arg 2).
//    Counters: p50_ms / p99_ms from every iteration's latency; body_kib the response size on the
//    wire; rss_mib / hwm_mib the exporter's VmRSS / VmHWM after the scrapes, anon_mib its
//    RssAnon (VmRSS less the pages of the binary and shared libraries); server_cpu_us the
//    exporter's user+system CPU (/proc/<pid>/stat, all threads, 10 ms tick over the whole loop)
//    per scrape, including the ~1.3 ms sampling cycle that runs about once a second;
//    server_blocks its voluntary context switches per scrape (summed over its threads: waiting
//    for the next request counts 1, a full socket buffer or a reconnect adds more);
//    client_recvs the client's recv() calls per scrape.
//    Arg 0: "Accept-Encoding: identity" (curl); arg 1: "Accept-Encoding: gzip" as Prometheus sends
//    it (the client does not decompress, so the figure is the exporter's side alone); arg 2: the
//    identity scrape through httplib::Client (the method before session 3), kept to show the
//    client's share of the figure (client_recvs is not counted for it).
//    GPULET_BENCH_BINARY=<prefix>/bin/gpulet runs another build of the exporter (its fake NVML
//    is looked up at <prefix>/lib/fake: symlink <prefix>/lib to build/lib) for A/B runs of one
//    change; GPULET_BENCH_DUMP=<file> keeps the last body.
//  * BM_SampleCycle: one sampling cycle (read 8 GPUs, attribute 128 containers, render text and
//    OpenMetrics) in-process; Google Benchmark's CPU time column is the CPU time per cycle.
//    _SimulatedNvml reads the fake libnvidia-ml.so.1 through the production dlopen layer;
//    _InProcessLayer uses a C++ fake GpuLayer (rendering cost alone); _GzipOpenMetrics adds the
//    per-cycle compression a Prometheus scraper (OpenMetrics + gzip) causes.
#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "gpu/open.h"
#include "metrics/sampler.h"
#include "testing/gpu/fake_gpu.h"
#include "testing/metrics/expo_util.h"
#include "testing/metrics/pod_server.h"
#include "testing/process/spawn.h"

extern char** environ;

namespace gpulet::metrics {
namespace {

constexpr int kGpus = 8, kContainers = 128;

// dgx-h100's UUIDs come from the GPU layer; containers are spread 16 per GPU as replicas.
std::vector<testing_metrics::FakeContainer> Containers(const std::vector<std::string>& uuids) {
  std::vector<testing_metrics::FakeContainer> out;
  for (int i = 0; i < kContainers; ++i) {
    out.push_back({absl::StrCat("team-", i % 7),
                   absl::StrCat("job-", i, "-7f9c4d-abcde"),
                   "worker",
                   "nvidia.com/gpu",
                   {absl::StrCat(uuids[i % uuids.size()], "::", i / uuids.size())}});
  }
  return out;
}

// A keep-alive HTTP/1.1 GET /metrics client on a loopback socket (method: header comment).
// Expects Content-Length framing (what the exporter sends); a 5 s receive timeout turns a stuck
// exporter into a failed scrape.
class ScrapeClient {
 public:
  ~ScrapeClient() {
    if (fd_ >= 0) close(fd_);
  }
  bool Connect(int port) {
    port_ = port;
    if (fd_ >= 0) close(fd_);
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{5, 0};  // a stuck exporter fails the benchmark instead of hanging it
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    buf_.resize(4 << 20);
    return connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  // GET /metrics; true on a complete 200 response (Content-Length framed), body in body().
  bool Get(const char* encoding) {
    // The server ends a keep-alive connection after a few requests (httplib's keep-alive max
    // count) and says so; reconnecting is part of the scrape, as for any client. After a failed
    // exchange the connection's state is unknown: start over.
    if (must_reconnect_ && !Connect(port_)) return false;
    bool ok = Exchange(encoding);
    if (!ok) must_reconnect_ = true;
    return ok;
  }
  std::string_view body() const { return body_; }
  uint64_t recvs() const { return recvs_; }

 private:
  bool Exchange(const char* encoding) {
    std::string req = absl::StrCat("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                                   "Accept-Encoding: ", encoding, "\r\n\r\n");
    if (send(fd_, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
      return false;
    }
    size_t have = 0, header_end = 0, total = 0;
    while (total == 0 || have < total) {
      if (have == buf_.size()) return false;  // larger than the benchmark expects
      ssize_t n = recv(fd_, buf_.data() + have, buf_.size() - have, 0);
      ++recvs_;
      if (n <= 0) return false;
      have += n;
      if (header_end == 0) {
        std::string_view v(buf_.data(), have);
        size_t e = v.find("\r\n\r\n");
        if (e == std::string_view::npos) continue;
        header_end = e + 4;
        size_t cl = v.substr(0, e).find("Content-Length: ");
        if (v.substr(0, 12) != "HTTP/1.1 200" || cl == std::string_view::npos) return false;
        must_reconnect_ = v.substr(0, e).find("Connection: close") != std::string_view::npos;
        total = header_end + std::strtoull(buf_.data() + cl + 16, nullptr, 10);
      }
    }
    body_ = std::string_view(buf_.data() + header_end, total - header_end);
    return have == total;
  }

  int fd_ = -1, port_ = 0;
  bool must_reconnect_ = false;
  uint64_t recvs_ = 0;
  std::vector<char> buf_;
  std::string_view body_;
};

double StatusField(pid_t pid, const char* field) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field, 0) == 0) return std::atof(line.c_str() + strlen(field)) / 1024.0;
  }
  return 0;
}

// CPU time (user + system, all threads) the process has used so far, in seconds.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(f)), {});
  size_t p = stat.rfind(')');  // the command name may contain spaces
  if (p == std::string::npos) return 0;
  std::istringstream rest(stat.substr(p + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {  // fields 14 and 15 (man proc)
    if (i == 14) utime = std::atof(field.c_str());
    if (i == 15) stime = std::atof(field.c_str());
  }
  return (utime + stime) / sysconf(_SC_CLK_TCK);
}

// Voluntary context switches (a thread blocking: socket buffer full, waiting for a request) summed
// over the process's threads: how often a scrape hands the CPU back, i.e. its exposure to
// scheduling delays on a busy machine.
double ProcessBlockingSwitches(pid_t pid) {
  double n = 0;
  std::error_code ec;
  for (const auto& t :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    std::ifstream f(t.path() / "status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) n += std::atof(line.c_str() + 24);
    }
  }
  return n;
}

void BM_ScrapeProcess(benchmark::State& state) {
  // GPULET_BENCH_BINARY runs another build of the exporter (A/B comparisons of one change).
  const char* other = getenv("GPULET_BENCH_BINARY");
  std::string bin = other ? other : std::string(GPULET_BINARY_DIR) + "/bin/gpulet";
  std::string tmpl = (std::filesystem::temp_directory_path() / "gpulet-bench-XXXXXX").string();
  std::string dir = mkdtemp(tmpl.data());
  gpu::GpuOptions go;
  go.simulate = "dgx-h100";
  auto layer = gpu::OpenGpuLayer(go);
  if (!layer.ok()) {
    state.SkipWithError("cannot open the simulated dgx-h100 (fake NVML not built?)");
    return;
  }
  std::vector<std::string> uuids;
  gpu::Inventory inv = *(*layer)->GetInventory();
  for (const auto& d : inv.devices) uuids.push_back(d.uuid);
  testing_metrics::PodResourcesServer pods(dir + "/kubelet.sock");
  pods.Set(Containers(uuids));
  pods.Start();

  std::string log = dir + "/exporter.log";
  std::vector<std::string> argv = {bin,
                                   "exporter",
                                   "--simulate",
                                   "dgx-h100",
                                   "--address",
                                   "127.0.0.1:0",
                                   "--pod-resources-socket",
                                   dir + "/kubelet.sock",
                                   "--vgpu-accounting-dir",
                                   "",
                                   "--interval",
                                   "1s"};
  // Its output (the port it listens on) to the log.
  pid_t pid = testing_process::SpawnLogged(argv, log);
  int port = 0;
  for (int i = 0; i < 200 && port == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream f(log);
    std::string s((std::istreambuf_iterator<char>(f)), {});
    if (size_t p = s.find("listening on port "); p != std::string::npos) {
      port = std::atoi(s.c_str() + p + 18);
    }
  }
  ScrapeClient c;
  const bool gzip = state.range(0) == 1, httplib_client = state.range(0) == 2;
  const char* encoding = gzip ? "gzip" : "identity";
  httplib::Client hc("127.0.0.1", port);
  hc.set_keep_alive(true);
  if (port == 0 || !c.Connect(port)) {
    state.SkipWithError("exporter did not start or refused the connection");  // loop won't run
  } else {
    // Wait for the full exposition: attribution (first PodResources answer) and the NVLink
    // rates, which need two sampling cycles. Scraped with the arm's own encoding, so that the
    // exporter holds what such a scraper makes it hold (it keeps only the variants scraped
    // lately): the gzip arm measures a Prometheus-like exporter, not one also kept for curl.
    // The exporter compresses a format from the cycle after its first gzip scrape on.
    bool full = false;
    for (int i = 0; i < 100 && !full; ++i) {
      if (!c.Get(encoding)) continue;
      const bool gzipped = c.body().starts_with("\x1f\x8b");  // the gzip magic
      std::string text = gzipped ? testing_metrics::Gunzip(c.body()) : std::string(c.body());
      full = text.find("job-127-") != std::string::npos &&
             text.find("DCGM_FI_PROF_NVLINK_TX_BYTES{") != std::string::npos && (!gzip || gzipped);
      if (!full) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!full) {
      state.SkipWithError("the exposition never showed the 128 containers and NVLink rates");
    }
  }
  std::vector<double> lat;
  size_t body = 0;
  double cpu0 = ProcessCpuSeconds(pid), switches0 = ProcessBlockingSwitches(pid);
  uint64_t recvs0 = c.recvs();
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    bool ok = false;
    if (httplib_client) {
      auto r = hc.Get("/metrics", {{"Accept-Encoding", "identity"}});
      ok = r && r->status == 200;
      if (ok) body = r->body.size();
    } else {
      ok = c.Get(encoding);
      body = c.body().size();
    }
    auto t1 = std::chrono::steady_clock::now();
    if (!ok) {
      state.SkipWithError("scrape failed");
      break;
    }
    lat.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  double server_cpu = ProcessCpuSeconds(pid) - cpu0;
  double server_switches = ProcessBlockingSwitches(pid) - switches0;
  // GPULET_BENCH_DUMP=<file> keeps the last response body for inspection.
  if (const char* dump = getenv("GPULET_BENCH_DUMP"); dump && !lat.empty()) {
    std::ofstream(dump) << c.body();
  }
  if (!lat.empty()) {
    // The exporter's CPU per scrape (includes the sampling cycles that ran meanwhile: about one
    // per second at --interval 1s, ~1.3 ms each).
    state.counters["server_cpu_us"] = server_cpu * 1e6 / lat.size();
    state.counters["server_blocks"] = server_switches / lat.size();
    state.counters["client_recvs"] = double(c.recvs() - recvs0) / lat.size();
    std::sort(lat.begin(), lat.end());
    state.counters["p50_ms"] = lat[lat.size() / 2];
    state.counters["p99_ms"] = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
    state.counters["body_kib"] = body / 1024.0;
    state.counters["rss_mib"] = StatusField(pid, "VmRSS:");
    state.counters["hwm_mib"] = StatusField(pid, "VmHWM:");
    // VmRSS = RssAnon (the process's own memory) + RssFile (shared library and binary pages).
    state.counters["anon_mib"] = StatusField(pid, "RssAnon:");
  }
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  pods.Stop();
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_ScrapeProcess)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Iterations(2000)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A fixed 128-container attribution, no kubelet round trips (the cache is filled once).
class FixedLister : public kubelet::PodResourcesLister {
 public:
  explicit FixedLister(std::vector<kubelet::PodDevice> d) : d_(std::move(d)) {}
  absl::StatusOr<std::vector<kubelet::PodDevice>> List() override { return d_; }
  std::vector<kubelet::PodDevice> d_;
};

void SampleCycle(benchmark::State& state, gpu::GpuLayer* layer, bool gzip = false) {
  std::vector<kubelet::PodDevice> devs;
  std::vector<std::string> uuids;
  gpu::Inventory inv = *layer->GetInventory();
  for (const auto& d : inv.devices) uuids.push_back(d.uuid);
  for (const auto& c : Containers(uuids))
    devs.push_back({c.ns, c.pod, c.container, c.resource, c.ids[0]});
  kubelet::PodResourcesCache cache(std::make_unique<FixedLister>(devs), std::chrono::hours(1));
  cache.RefreshNow();
  SamplerOptions so;
  so.hostname = "dgx-node-01";
  Sampler sampler(layer, nullptr, &cache, nullptr, nullptr, so);
  // As under Prometheus: OpenMetrics scraped with gzip, so each cycle also compresses that body.
  if (gzip) sampler.NoteRequest(Format::kOpenMetrics, true);
  for (auto _ : state) sampler.SampleOnce();
  auto snap = sampler.snapshot();
  state.counters[gzip ? "openmetrics_gz_kib" : "text_kib"] =
      (gzip ? snap->openmetrics_gz.data.size() : snap->text.size()) / 1024.0;
}

void BM_SampleCycle_SimulatedNvml(benchmark::State& state) {
  gpu::GpuOptions go;
  go.simulate = "dgx-h100";
  auto layer = gpu::OpenGpuLayer(go);
  if (!layer.ok()) {
    state.SkipWithError("cannot open the simulated dgx-h100");
    return;
  }
  SampleCycle(state, layer->get());
}
BENCHMARK(BM_SampleCycle_SimulatedNvml)->Unit(benchmark::kMicrosecond);

void BM_SampleCycle_InProcessLayer(benchmark::State& state) {
  testing::FakeGpuLayer g(kGpus);
  SampleCycle(state, &g);
}
BENCHMARK(BM_SampleCycle_InProcessLayer)->Unit(benchmark::kMicrosecond);

void BM_SampleCycle_InProcessLayer_GzipOpenMetrics(benchmark::State& state) {
  testing::FakeGpuLayer g(kGpus);
  SampleCycle(state, &g, /*gzip=*/true);
}
BENCHMARK(BM_SampleCycle_InProcessLayer_GzipOpenMetrics)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace gpulet::metrics

BENCHMARK_MAIN();
