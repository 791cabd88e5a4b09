#include "metrics/server.h"

#include <httplib.h>

#include <chrono>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gpulet::metrics {

absl::StatusOr<std::pair<std::string, int>> ParseListenAddress(std::string_view saddr) {
  absl::string_view address(saddr.data(), saddr.size()), host, port;
  if (!address.empty() && address.front() == '[') {
    size_t close = address.find(']');
    if (close == absl::string_view::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("listen address '", address, "': expected [ipv6]:port"));
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("listen address '", address, "': expected host:port or :port"));
    }
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  int p = 0;
  if (!absl::SimpleAtoi(port, &p) || p < 0 || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", address, "': port '", port, "' is not 0..65535"));
  }
  return std::make_pair(host.empty() ? std::string("0.0.0.0") : std::string(host), p);
}

namespace {

using Clk = std::chrono::steady_clock;

// Serves `body` plus a small per-request `tail` without copying the body; `body` usually points
// into a snapshot and shares its ownership, so the snapshot stays alive until the last byte is
// written even if a new one is published meanwhile.
void ServeSnapshot(httplib::Response& res, std::shared_ptr<const std::string> body,
                   std::string tail, std::string_view content_type,
                   std::atomic<double>* duration_out, Clk::time_point start) {
  size_t body_size = body->size();
  auto tail_ptr = std::make_shared<std::string>(std::move(tail));
  size_t total = body_size + tail_ptr->size();
  res.set_content_provider(
      total, std::string(content_type),
      [body, tail_ptr, body_size, total, duration_out, start](
          size_t offset, size_t length, httplib::DataSink& sink) {
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

std::unique_ptr<httplib::Server> NewServer(int threads) {
  auto s = std::make_unique<httplib::Server>();
  s->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // A stuck or slow client must not pin a worker forever.
  s->set_read_timeout(5, 0);
  s->set_write_timeout(10, 0);
  // cpp-httplib holds one worker per open keep-alive connection (polling it) until it idles out,
  // and /health (the kubelet's probes) shares those workers. Prometheus scrapes every 15-60 s, so
  // a longer idle time only keeps workers pinned between scrapes; reconnecting costs ~0.1 ms.
  s->set_keep_alive_timeout(5);
  s->set_tcp_nodelay(true);
  // httplib's default also sets SO_REUSEPORT, which lets a second exporter bind the same port and
  // silently take half the scrapes; keep only SO_REUSEADDR so a busy port is an error.
  s->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  return s;
}

absl::StatusOr<int> Bind(httplib::Server& s, const std::string& address) {
  auto hp = ParseListenAddress(address);
  if (!hp.ok()) return hp.status();
  auto [host, port] = *hp;
  if (port == 0) {
    int p = s.bind_to_any_port(host);
    if (p <= 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
    return p;
  }
  if (!s.bind_to_port(host, port)) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, " (address in use or not permitted)"));
  }
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

absl::Status MetricsServer::Start() {
  http_ = NewServer(options_.threads);
  http_->Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    Clk::time_point start = Clk::now();
    std::shared_ptr<const Snapshot> snap = sampler_->snapshot();
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
  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    std::shared_ptr<const Snapshot> snap = sampler_->snapshot();
    // Unhealthy only when sampling itself is stuck; a missing NVML or kubelet is reported by the
    // *_up gauges, and restarting the exporter would not bring them back.
    auto age = Clk::now() - snap->taken;
    auto limit = 3 * sampler_->options().interval + std::chrono::seconds(30);
    bool ok = snap->self.cycles > 0 && age < limit;
    res.status = ok ? 200 : 503;
    res.set_content(absl::StrCat(ok ? "ok" : "sampling stalled", "\nnvml_up ",
                                 snap->self.nvml_up, "\nkubelet_up ", snap->self.kubelet_up, "\n"),
                    "text/plain; charset=utf-8");
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
    gpu_manager_http_ = NewServer(2);
    gpu_manager_http_->Get("/metric", [this](const httplib::Request&, httplib::Response& res) {
      std::shared_ptr<const Snapshot> snap = sampler_->snapshot();
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
  if (http_) http_->stop();
  if (gpu_manager_http_) gpu_manager_http_->stop();
  if (thread_.joinable()) thread_.join();
  if (gpu_manager_thread_.joinable()) gpu_manager_thread_.join();
}

}  // namespace gpulet::metrics
