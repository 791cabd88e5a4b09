// An HTTP(S) server for endpoints that anyone on the network can reach (the scheduler extender, the
// admission webhook): cpp-httplib's routing and request parsing, with the connection handling
// replaced so that no client can exhaust it.
//
// cpp-httplib 0.11 (Debian's) gives every connection a worker thread from the moment it is
// accepted until it closes, applies its read timeout per recv() (a client sending one byte every
// few seconds holds a worker forever), and reads any number of header lines. Here instead:
//   * one epoll thread receives: it does TLS handshakes and reads requests without blocking into
//     the connection's buffer, and hands a connection to a worker only once a whole request (head
//     and Content-Length body) is there, so slow clients hold buffers, never workers; idle and
//     keep-alive connections cost a file descriptor, and at `max_connections` the longest-idle one
//     is closed to admit the newest;
//   * a request (the first one with its TLS handshake) must arrive within `request_timeout` of its
//     first byte, its head within `max_header_bytes` (else 431); all connections together hold at
//     most 32 MiB of request bytes;
//   * a Content-Length above `max_body_bytes` is answered 413 before the body is read; chunked
//     bodies are refused (411): they cannot be bounded before they are read;
//   * TLS (when given a context) is TLS 1.2 or newer; a context with client verification makes the
//     handshake demand a certificate, and `client_names` then also restricts its subject.
// ParseUntrustedJson() is the other half: bodies are parsed only below a nesting depth and within
// a process-wide budget of bytes being parsed at once (the DOM costs up to ~30x the text).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
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
  int workers = 8;
  int max_connections = 1024;
  int max_requests_per_connection = 1000;
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
  bool process_and_close_socket(socket_t sock) override;
  void PollLoop();
  void WorkLoop();
  void Serve(Conn* c);
  void ReceiveLocked(Conn* c);
  void RefuseLocked(Conn* c, int status, const char* reason);
  void CloseLocked(Conn* c);
  bool Authorized(Conn* c) const;

  const ServerLimits limits_;
  SSL_CTX* tls_;
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
