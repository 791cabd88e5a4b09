// The exporter's HTTP side (cpp-httplib): GET /metrics (Prometheus text 0.0.4, or OpenMetrics 1.0
// when the Accept header asks), GET /health, and optionally GPU Manager's GET /metric on its own
// port (:5678 in GPU Manager). Every response is the sampler's latest pre-rendered snapshot,
// written straight from the shared immutable buffer (no copy, no rendering, no lock held while
// writing), followed by one per-scrape line: the previous scrape's duration.
//
// The port is reachable from every pod of the node, so a client must not be able to take the
// agent down (it also serves the device plugin) or keep /health from its liveness probe:
//  - connections wait for their request in ONE poller thread, not in a worker: idle keep-alive
//    connections and clients that dribble their request head cost a socket and a buffer, never a
//    worker; a worker only runs complete request heads;
//  - a request head is at most `max_request_head_bytes` (this also bounds the header count, which
//    cpp-httplib 0.11 does not limit) and must arrive within `head_deadline` of its first byte;
//    else 431 / the connection is closed; idle keep-alive connections close after `idle_timeout`;
//  - methods other than GET/HEAD get 405 and any request body (Content-Length > 0, or
//    Transfer-Encoding) gets 413, both before a byte of the body is read, then the connection is
//    closed;
//  - no worker ever waits on a client that does not read: a response the socket cannot take at
//    once is handed to the poller, which sends the rest as the client reads (and reads nothing
//    more from it meanwhile), within `write_deadline`; responses held that way are at most
//    kMaxHeldResponseBytes in all (past that the connection is closed);
//  - GET/HEAD /health is answered by the poller itself, never queued behind the scrape workers, so
//    clients that keep every worker busy cannot fail the kubelet's liveness probe (the agent is
//    also the device plugin: a failed probe restarts it);
//  - at most `max_connections` are open per listener, and `max_connections_per_peer` from one
//    address (beyond either, the oldest waiting connections are closed, so a new probe gets in).
// Memory is therefore bounded by about max_connections x max_request_head_bytes plus the held
// responses' cap.
//
// Thread-safe. Owns its listener threads; the sampler must outlive it.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "metrics/sampler.h"

namespace gpulet::http {
class GuardedServer;  // the one guarded front end (http/guarded_server.h), with the limits above
}  // namespace gpulet::http

namespace gpulet::metrics {

struct ServerOptions {
  std::string address = ":9400";    // [host]:port; ":9400" = every IPv4 address; port 0 = any
  std::string gpu_manager_address;  // GPU Manager's /metric listener; empty = off
  int threads = 4;                  // worker threads per listener (complete requests only)
  size_t max_request_head_bytes = 16 << 10;         // request line + headers
  std::chrono::milliseconds head_deadline{5000};    // first byte of a request to its blank line
  std::chrono::milliseconds idle_timeout{5000};     // keep-alive connection without a request
  std::chrono::milliseconds write_deadline{10000};  // one whole response
  int max_connections = 128;                        // open connections per listener
  int max_connections_per_peer = 16;                // of those, from one IP address
};

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
  std::pair<int, std::string> Health() const;  // /health's status and body
  Sampler* sampler_;
  ServerOptions options_;
  std::unique_ptr<http::GuardedServer> http_, gpu_manager_http_;
  std::thread thread_, gpu_manager_thread_;
  int port_ = 0, gpu_manager_port_ = 0;
  std::atomic<double> last_scrape_seconds_{0}, last_gpu_manager_scrape_seconds_{0};
};

}  // namespace gpulet::metrics
