// An HTTP(S) server for endpoints that anyone on the network (or on the node) can reach: the
// scheduler extender, the admission webhook, the exporter's /metrics. cpp-httplib's routing and
// request parsing, with the connection handling replaced so that no client can exhaust it.
//
// cpp-httplib 0.11 (Debian's) gives every connection a worker thread from the moment it is
// accepted until it closes, applies its read timeout per recv() (a client sending one byte every
// few seconds holds a worker forever), and reads any number of header lines. Here instead:
//   * one epoll thread receives: it does TLS handshakes and reads requests without blocking into
//     the connection's buffer, and hands a connection to a worker only once a whole request (head
//     and Content-Length body) is there, so slow clients hold buffers, never workers; idle and
//     keep-alive connections cost a file descriptor;
//   * at `max_connections` the longest-idle connection is closed to admit the newest, and at
//     `max_connections_per_peer` from one address that address's longest-idle one (a flood from
//     one pod cannot crowd out the kubelet's probe, which always comes on a new connection);
//   * a request (the first one with its TLS handshake) must arrive within `request_timeout` of its
//     first byte, its head within `max_header_bytes` (else 431); all connections together hold at
//     most 32 MiB of request bytes;
//   * a method outside `methods` is answered 405, a Content-Length above `max_body_bytes` 413,
//     both before the body is read; chunked bodies are refused (411): they cannot be bounded
//     before they are read;
//   * no worker waits on a client that does not read: what the socket does not take at once is
//     held for the poller, which sends it as the client reads (reading nothing more from it
//     meanwhile) within `write_timeout`; held responses are at most 16 MiB in all, past which
//     such a client is cut off;
//   * the probe path (SetProbe) is answered by the poller itself, never queued behind the
//     workers, so clients that keep every worker busy cannot fail a liveness probe;
//   * TLS (when given a context) is TLS 1.2 or newer; a context with client verification makes the
//     handshake demand a certificate, and `client_names` then also restricts its subject.
// ParseUntrustedJson() is the other half: bodies are parsed only below a nesting depth and within
// a process-wide budget of bytes being parsed at once (the DOM costs up to ~30x the text).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace gpulet::http {

struct ServerLimits {
  size_t max_body_bytes = 1 << 20;
  size_t max_header_bytes = 64 << 10;               // request line and headers
  std::chrono::milliseconds request_timeout{5000};  // handshake + one request, first byte to last
  std::chrono::milliseconds idle_timeout{30000};    // keep-alive wait for the next request
  std::chrono::milliseconds write_timeout{10000};   // one response, first byte to last
  int workers = 8;
  int max_connections = 1024;
  int max_connections_per_peer = 0;  // from one IP address; 0: only max_connections
  int max_requests_per_connection = 1000;
  std::vector<std::string> methods;  // the methods served; empty: any
  // TLS client certificates: when non-empty, the certificate's subject CN (or a DNS SAN) must be
  // one of these (the context must verify client certificates for this to mean anything).
  std::vector<std::string> client_names;
};

class GuardedServer : public httplib::Server {
 public:
  // `tls`: serve HTTPS with this context (ownership taken; see ServerTlsContext); null: HTTP.
  explicit GuardedServer(ServerLimits limits, SSL_CTX* tls = nullptr);
  ~GuardedServer() override;
  GuardedServer(const GuardedServer&) = delete;
  GuardedServer& operator=(const GuardedServer&) = delete;

  bool is_valid() const override { return true; }
  // The liveness probe's answer (status and body), computed on the poller thread: it must be cheap
  // and never block. GET and HEAD of `path` (with or without a query) get it with
  // `Connection: close`. Set before listening.
  using Probe = std::function<std::pair<int, std::string>()>;
  void SetProbe(std::string path, Probe probe);
  // As httplib's, then a listen backlog of SOMAXCONN instead of the library's compiled-in 5 (a
  // burst of connections would otherwise wait in SYN retries, seconds each).
  bool bind_to_port(const std::string& host, int port, int socket_flags = 0);
  int bind_to_any_port(const std::string& host, int socket_flags = 0);
  SSL_CTX* ssl_context() const { return tls_; }
  const ServerLimits& limits() const { return limits_; }
  // Stops the listener (as stop()) and closes every connection; handlers have returned after it.
  void Shutdown();

  // Counters for tests and logs.
  size_t open_connections() const;
  uint64_t dropped_connections() const { return dropped_.load(); }

 private:
  struct Conn;
  // Request bytes all connections together may hold in their buffers.
  static constexpr size_t kMaxBufferedBytes = 32 << 20;
  // Response bytes held for clients that do not read, all connections together (an uncompressed
  // /metrics of 8 GPUs x 128 containers is about 1 MiB, gzip 43 KiB).
  static constexpr size_t kMaxHeldBytes = 16 << 20;
  class ConnStream;
  bool process_and_close_socket(socket_t sock) override;
  void PollLoop();
  void WorkLoop();
  void Serve(Conn* c);
  void ReceiveLocked(Conn* c);
  void RefuseLocked(Conn* c, int status, const char* reason);
  bool AnswerProbeLocked(Conn* c, size_t request_bytes);
  void FlushLocked(Conn* c);
  void WatchLocked(Conn* c, uint32_t events);
  void CloseAfterAnswerLocked(Conn* c);
  void AwaitNextLocked(Conn* c);
  void AdmitLocked(const Conn& c);
  void CloseLocked(Conn* c);
  bool Authorized(Conn* c) const;

  const ServerLimits limits_;
  SSL_CTX* tls_;
  std::string probe_path_;
  Probe probe_;
  std::atomic<size_t> held_{0};  // bytes in every connection's `out`
  int epfd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::deque<Conn*> ready_;
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;  // by fd
  std::atomic<uint64_t> dropped_{0};
  size_t buffered_ = 0;  // bytes in all connections' buffers (under mu_)
  std::thread poller_;
  std::vector<std::thread> workers_;
};

// An SSL_CTX for GuardedServer: `cert_pem` (leaf first, then any chain) and `key_pem`, TLS 1.2 at
// least; with `client_ca_pem`, client certificates are required and verified against it.
// Encrypted keys are refused (never a passphrase prompt).
absl::StatusOr<SSL_CTX*> ServerTlsContext(const std::string& cert_pem, const std::string& key_pem,
                                          const std::string& client_ca_pem = "");

// A parsed request body together with its share of the parse budget (released with it).
struct UntrustedJson {
  nlohmann::json value;
  std::shared_ptr<void> lease;
};

// Parses `text` as JSON when it nests no deeper than `max_depth` arrays/objects, waiting up to
// `wait` for the process-wide parse budget. InvalidArgument names the problem (depth, syntax);
// ResourceExhausted when the budget stays taken.
// Bodies under 64 KiB do not count against (or wait for) the budget.
absl::StatusOr<UntrustedJson> ParseUntrustedJson(
    std::string_view text, int max_depth = 64,
    std::chrono::milliseconds wait = std::chrono::milliseconds(250));
// Bytes of request text that may be in parsed form at once, process-wide (default 8 MiB; one
// body larger than the budget is still parsed when nothing else is).
void SetUntrustedJsonBudget(size_t bytes);

}  // namespace gpulet::http
