// The exporter's HTTP side (cpp-httplib): GET /metrics (Prometheus text 0.0.4, or OpenMetrics 1.0
// when the Accept header asks), GET /health, and optionally GPU Manager's GET /metric on its own
// port (:5678 in GPU Manager). Every response is the sampler's latest pre-rendered snapshot,
// written straight from the shared immutable buffer (no copy, no rendering, no lock held while
// writing), followed by one per-scrape line: the previous scrape's duration.
//
// Thread-safe. Owns its listener threads; the sampler must outlive it.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "metrics/sampler.h"

namespace httplib {
class Server;
}

namespace gpulet::metrics {

struct ServerOptions {
  std::string address = ":9400";     // [host]:port; ":9400" = every IPv4 address; port 0 = any
  std::string gpu_manager_address;   // GPU Manager's /metric listener; empty = off
  int threads = 4;                   // worker threads per listener
};

// "host:port", ":port" or "[v6]:port" -> (host, port). InvalidArgument naming the flag value.
absl::StatusOr<std::pair<std::string, int>> ParseListenAddress(std::string_view address);

class MetricsServer {
 public:
  MetricsServer(Sampler* sampler, ServerOptions options);
  ~MetricsServer();

  // Binds both listeners and serves in the background. An error names the address that failed.
  absl::Status Start();
  void Stop();

  int port() const { return port_; }
  int gpu_manager_port() const { return gpu_manager_port_; }

 private:
  Sampler* sampler_;
  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_, gpu_manager_http_;
  std::thread thread_, gpu_manager_thread_;
  int port_ = 0, gpu_manager_port_ = 0;
  std::atomic<double> last_scrape_seconds_{0}, last_gpu_manager_scrape_seconds_{0};
};

}  // namespace gpulet::metrics
