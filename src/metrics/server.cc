#include "metrics/server.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "http/guarded_server.h"
#include "http/listen_address.h"

namespace gpulet::metrics {

using Clk = std::chrono::steady_clock;

namespace {

// Serves `body` plus a small per-request `tail` without copying the body; `body` usually points
// into a snapshot and shares its ownership, so the snapshot stays alive until the last byte is
// written even if a new one is published meanwhile.
void ServeSnapshot(httplib::Response& res, std::shared_ptr<const std::string> body,
                   std::string tail, std::string_view content_type,
                   std::atomic<double>* duration_out, Clk::time_point start) {
  size_t body_size = body->size();
  if (body_size + tail.size() == 0) {
    // A length provider of 0 bytes would make cpp-httplib stream without a Content-Length and
    // never end the response (GPU Manager's /metric when no pod holds a GPU).
    res.set_content("", std::string(content_type));
    duration_out->store(std::chrono::duration<double>(Clk::now() - start).count());
    return;
  }
  auto tail_ptr = std::make_shared<std::string>(std::move(tail));
  size_t total = body_size + tail_ptr->size();
  res.set_content_provider(
      total, std::string(content_type),
      [body, tail_ptr, body_size, total, duration_out, start](size_t offset, size_t length,
                                                              httplib::DataSink& sink) {
        size_t end = offset + length;
        if (offset < body_size) {
          size_t n = std::min(end, body_size) - offset;
          if (!sink.write(body->data() + offset, n)) return false;
          offset += n;
        }
        if (offset >= body_size && offset < end) {
          if (!sink.write(tail_ptr->data() + (offset - body_size), end - offset)) return false;
        }
        if (end >= total) {
          duration_out->store(std::chrono::duration<double>(Clk::now() - start).count());
        }
        return true;
      });
}

std::string Tail(Format format, double last_scrape_seconds) {
  std::string out;
  ExpositionWriter w(format, &out);
  w.Family("gpulet_exporter_scrape_duration_seconds", MetricType::kGauge,
           "Time the previous /metrics response took, from request to last byte written.");
  w.Sample({}, last_scrape_seconds);
  w.Finish();
  return out;
}

// The limits of server.h on the one guarded front end (http::GuardedServer).
std::unique_ptr<http::GuardedServer> NewServer(const ServerOptions& o, int threads) {
  http::ServerLimits l;
  l.workers = threads;
  l.max_header_bytes = o.max_request_head_bytes;
  l.max_body_bytes = 0;  // GET and HEAD only: any body is refused unread
  l.methods = {"GET", "HEAD"};
  l.request_timeout = o.head_deadline;
  l.idle_timeout = o.idle_timeout;
  l.write_timeout = o.write_deadline;
  l.max_connections = o.max_connections;
  l.max_connections_per_peer = o.max_connections_per_peer;
  return std::make_unique<http::GuardedServer>(std::move(l));
}

absl::StatusOr<int> Bind(http::GuardedServer& s, const std::string& address) {
  auto hp = http::ParseListenAddress(address);
  if (!hp.ok()) return hp.status();
  auto [host, port] = *hp;
  if (port == 0) {
    int p = s.bind_to_any_port(host);
    if (p <= 0) return TcpListenFailed(host, port);
    return p;
  }
  if (!s.bind_to_port(host, port)) return TcpListenFailed(host, port);
  return port;
}

// stop() before the listener thread is inside its accept loop would be lost; Start() returns only
// once the loop runs (microseconds; bounded so a broken listener cannot hang Start).
void WaitRunning(httplib::Server& s) {
  for (int i = 0; i < 2000 && !s.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

}  // namespace

MetricsServer::MetricsServer(Sampler* sampler, ServerOptions options)
    : sampler_(sampler), options_(std::move(options)) {}

MetricsServer::~MetricsServer() { Stop(); }

// /health, answered on the front end's poller thread under its lock
// (http::GuardedServer::SetProbe): a snapshot pointer and a few fields, no lock of the sampler's,
// no I/O.
std::pair<int, std::string> MetricsServer::Health() const {
  std::shared_ptr<const Snapshot> snap = sampler_->snapshot();
  // Unhealthy only when sampling itself is stuck; a missing NVML or kubelet is reported by the
  // *_up gauges, and restarting the exporter would not bring them back.
  // On the sampler's clock: `taken` is a time point of that clock, not of the steady clock.
  auto age = sampler_->clock()->Now() - snap->taken;
  auto limit = 3 * sampler_->options().interval + std::chrono::seconds(30);
  bool ok = snap->self.cycles > 0 && age < limit;
  return {ok ? 200 : 503,
          absl::StrCat(ok ? "ok" : "sampling stalled", "\nnvml_up ", snap->self.nvml_up,
                       "\nkubelet_up ", snap->self.kubelet_up, "\n")};
}

absl::Status MetricsServer::Start() {
  http_ = NewServer(options_, options_.threads);
  http_->SetProbe("/health", [this] { return Health(); });
  http_->Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    Clk::time_point start = Clk::now();
    std::shared_ptr<const Snapshot> snap = sampler_->ScrapeSnapshot();
    bool om = WantsOpenMetrics(req.get_header_value("Accept"));
    Format f = om ? Format::kOpenMetrics : Format::kText;
    std::string tail = Tail(f, last_scrape_seconds_.load());
    std::shared_ptr<const std::string> body(snap, om ? &snap->openmetrics : &snap->text);
    res.set_header("Vary", "Accept-Encoding");
    const bool gzip = AcceptsGzip(req.get_header_value("Accept-Encoding"));
    sampler_->NoteRequest(f, gzip);
    // The body compressed once per cycle; this response's tail closes the gzip stream.
    const OpenGzip& gz = om ? snap->openmetrics_gz : snap->text_gz;
    if (gzip && !gz.data.empty()) {
      body = std::shared_ptr<const std::string>(snap, &gz.data);
      tail = GzipClose(gz, tail);
      res.set_header("Content-Encoding", "gzip");
    } else if (body->empty() && snap->sample) {
      // A variant nobody asked for lately was not rendered: render it now from the cycle's
      // sample (about a millisecond, no NVML or kubelet call), served uncompressed.
      auto rendered = std::make_shared<std::string>();
      Render(*snap->sample, sampler_->options().render, f, rendered.get());
      body = std::move(rendered);
    }
    ServeSnapshot(res, std::move(body), std::move(tail),
                  om ? kOpenMetricsContentType : kTextContentType, &last_scrape_seconds_, start);
  });
  http_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("gpulet exporter: /metrics /health\n", "text/plain; charset=utf-8");
  });
  absl::StatusOr<int> port = Bind(*http_, options_.address);
  if (!port.ok()) return port.status();
  port_ = *port;
  thread_ = std::thread([this] { http_->listen_after_bind(); });
  WaitRunning(*http_);

  if (!options_.gpu_manager_address.empty()) {
    gpu_manager_http_ = NewServer(options_, 2);
    gpu_manager_http_->Get("/metric", [this](const httplib::Request&, httplib::Response& res) {
      std::shared_ptr<const Snapshot> snap = sampler_->ScrapeSnapshot();
      ServeSnapshot(res, std::shared_ptr<const std::string>(snap, &snap->gpu_manager), "",
                    kTextContentType, &last_gpu_manager_scrape_seconds_, Clk::now());
    });
    absl::StatusOr<int> gm = Bind(*gpu_manager_http_, options_.gpu_manager_address);
    if (!gm.ok()) {
      Stop();
      return gm.status();
    }
    gpu_manager_port_ = *gm;
    gpu_manager_thread_ = std::thread([this] { gpu_manager_http_->listen_after_bind(); });
    WaitRunning(*gpu_manager_http_);
  }
  return absl::OkStatus();
}

void MetricsServer::Stop() {
  if (http_) http_->Shutdown();
  if (gpu_manager_http_) gpu_manager_http_->Shutdown();
  if (thread_.joinable()) thread_.join();
  if (gpu_manager_thread_.joinable()) gpu_manager_thread_.join();
}

}  // namespace gpulet::metrics
