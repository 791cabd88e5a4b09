#include "k8s/guarded_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gpulet::k8s {
namespace {

using Clock = std::chrono::steady_clock;

int MillisLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

// Waits for `events` on `fd` until `deadline`; false on timeout or error.
bool WaitFd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    int ms = MillisLeft(deadline);
    if (ms == 0) return false;
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, ms);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

// Never prompts: an encrypted key is an error, not a question on the terminal.
int NoPassphrase(char*, int, int, void*) { return -1; }

}  // namespace

// One client connection: its socket, TLS state, a read buffer that survives between requests
// (pipelined bytes), and the current request's deadline and byte allowance.
struct GuardedServer::Conn {
  int fd = -1;
  SSL* ssl = nullptr;
  bool handshaken = false;
  std::string peer_ip;
  int peer_port = -1;
  Clock::time_point idle_since;
  Clock::time_point deadline;
  size_t allowance = 0;
  int served = 0;
  char buf[16384];
  size_t pos = 0, len = 0;
  bool buffered() const { return pos < len || (ssl && SSL_pending(ssl) > 0); }
};

namespace {

class ConnStream : public httplib::Stream {
 public:
  ConnStream(int fd, SSL* ssl, char* buf, size_t cap, size_t* pos, size_t* len,
             Clock::time_point deadline, size_t* allowance, const std::string& ip, int port)
      : fd_(fd), ssl_(ssl), buf_(buf), cap_(cap), pos_(pos), len_(len), deadline_(deadline),
        allowance_(allowance), ip_(ip), port_(port) {}

  bool is_readable() const override { return *pos_ < *len_ || WaitFd(fd_, POLLIN, deadline_); }
  bool is_writable() const override { return WaitFd(fd_, POLLOUT, deadline_); }

  ssize_t read(char* ptr, size_t size) override {
    if (*pos_ >= *len_ && !Fill()) return -1;
    size_t n = std::min(size, *len_ - *pos_);
    memcpy(ptr, buf_ + *pos_, n);
    *pos_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    size_t done = 0;
    while (done < size) {
      if (MillisLeft(deadline_) == 0) return -1;
      size_t chunk = std::min<size_t>(size - done, 1 << 20);
      if (ssl_) {
        ERR_clear_error();
        int n = SSL_write(ssl_, ptr + done, static_cast<int>(chunk));
        if (n > 0) {
          done += static_cast<size_t>(n);
          continue;
        }
        int e = SSL_get_error(ssl_, n);
        if (e == SSL_ERROR_WANT_WRITE ? !WaitFd(fd_, POLLOUT, deadline_)
            : e == SSL_ERROR_WANT_READ ? !WaitFd(fd_, POLLIN, deadline_)
                                       : true) {
          return -1;
        }
      } else {
        ssize_t n = ::send(fd_, ptr + done, chunk, MSG_NOSIGNAL);
        if (n > 0) {
          done += static_cast<size_t>(n);
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
          if (!WaitFd(fd_, POLLOUT, deadline_)) return -1;
        } else {
          return -1;
        }
      }
    }
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = ip_;
    port = port_;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t l = sizeof a;
    ip.clear();
    port = -1;
    if (getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &l) != 0) return;
    char host[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
      auto* s = reinterpret_cast<sockaddr_in*>(&a);
      inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
      port = ntohs(s->sin_port);
    } else if (a.ss_family == AF_INET6) {
      auto* s = reinterpret_cast<sockaddr_in6*>(&a);
      inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
      port = ntohs(s->sin6_port);
    }
    ip = host;
  }
  socket_t socket() const override { return fd_; }

 private:
  // Reads more bytes into the buffer within the deadline and the request's allowance.
  bool Fill() {
    *pos_ = *len_ = 0;
    if (*allowance_ == 0) return false;
    size_t want = std::min(cap_, *allowance_);
    for (;;) {
      if (MillisLeft(deadline_) == 0) return false;
      ssize_t n;
      if (ssl_) {
        ERR_clear_error();
        int r = SSL_read(ssl_, buf_, static_cast<int>(want));
        if (r > 0) {
          n = r;
        } else {
          int e = SSL_get_error(ssl_, r);
          if (e == SSL_ERROR_WANT_READ && WaitFd(fd_, POLLIN, deadline_)) continue;
          if (e == SSL_ERROR_WANT_WRITE && WaitFd(fd_, POLLOUT, deadline_)) continue;
          return false;
        }
      } else {
        n = ::recv(fd_, buf_, want, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
          if (WaitFd(fd_, POLLIN, deadline_)) continue;
          return false;
        }
        if (n <= 0) return false;
      }
      *len_ = static_cast<size_t>(n);
      *allowance_ -= static_cast<size_t>(n);
      return true;
    }
  }

  int fd_;
  SSL* ssl_;
  char* buf_;
  size_t cap_;
  size_t *pos_, *len_;
  Clock::time_point deadline_;
  size_t* allowance_;
  std::string ip_;
  int port_;
};

// Runs the accept loop's per-connection task at once on the accepting thread: the task only
// hands the socket to the poller.
class InlineQueue : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

}  // namespace

GuardedServer::GuardedServer(ServerLimits limits, SSL_CTX* tls)
    : limits_(std::move(limits)), tls_(tls) {
  set_payload_max_length(limits_.max_body_bytes);
  new_task_queue = [] { return new InlineQueue; };
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  poller_ = std::thread([this] { PollLoop(); });
  for (int i = 0; i < std::max(1, limits_.workers); ++i) {
    workers_.emplace_back([this] { WorkLoop(); });
  }
}

GuardedServer::~GuardedServer() {
  Shutdown();
  if (tls_) SSL_CTX_free(tls_);
}

void GuardedServer::Shutdown() {
  if (stopping_.exchange(true)) return;
  stop();
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
  work_cv_.notify_all();
  if (poller_.joinable()) poller_.join();
  for (auto& t : workers_) t.join();
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [fd, c] : conns_) {
    if (c->ssl) SSL_free(c->ssl);
    ::close(fd);
  }
  conns_.clear();
  ready_.clear();
  ::close(epfd_);
  ::close(wake_fd_);
}

size_t GuardedServer::open_connections() const {
  std::lock_guard<std::mutex> l(mu_);
  return conns_.size();
}

bool GuardedServer::process_and_close_socket(socket_t sock) {
  if (stopping_) {
    ::close(sock);
    return false;
  }
  int flags = fcntl(sock, F_GETFL);
  fcntl(sock, F_SETFL, flags | O_NONBLOCK);
  int one = 1;
  setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto c = std::make_unique<Conn>();
  c->fd = sock;
  sockaddr_storage a{};
  socklen_t l = sizeof a;
  if (getpeername(sock, reinterpret_cast<sockaddr*>(&a), &l) == 0) {
    char host[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
      auto* s = reinterpret_cast<sockaddr_in*>(&a);
      inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
      c->peer_port = ntohs(s->sin_port);
    } else if (a.ss_family == AF_INET6) {
      auto* s = reinterpret_cast<sockaddr_in6*>(&a);
      inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
      c->peer_port = ntohs(s->sin6_port);
    }
    c->peer_ip = host;
  }
  if (tls_) {
    c->ssl = SSL_new(tls_);
    if (!c->ssl) {
      ::close(sock);
      return false;
    }
    SSL_set_fd(c->ssl, sock);
    SSL_set_mode(c->ssl, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  }
  c->idle_since = Clock::now();
  // The first request (its TLS handshake included) gets request_timeout from the connection.
  c->deadline = c->idle_since + limits_.request_timeout;
  Conn* evict = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (conns_.size() >= static_cast<size_t>(std::max(1, limits_.max_connections))) {
      // Full: the longest-idle parked connection makes room (connections being served are not in
      // epoll's interest set only while a worker holds them; those are never evicted here).
      Conn* oldest = nullptr;
      for (auto& [fd, cc] : conns_) {
        if (cc->deadline != Clock::time_point::max() &&
            (!oldest || cc->idle_since < oldest->idle_since)) {
          oldest = cc.get();
        }
      }
      evict = oldest;
    }
  }
  if (evict) {
    ++dropped_;
    Close(evict);
  }
  Conn* raw = c.get();
  {
    std::lock_guard<std::mutex> lk(mu_);
    conns_[sock] = std::move(c);
  }
  Park(raw);  // (only the poller, on this connection's deadline, can close it from here on)
  return true;
}

void GuardedServer::Park(Conn* c) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLONESHOT | EPOLLRDHUP;
  ev.data.fd = c->fd;
  // Under the lock together with the state change: once parked, the poller or an eviction may
  // close `c` at any moment.
  std::lock_guard<std::mutex> l(mu_);
  if (c->served > 0) {
    c->idle_since = Clock::now();
    c->deadline = c->idle_since;  // not max(): parked, may be expired or evicted
  }
  if (epoll_ctl(epfd_, EPOLL_CTL_MOD, c->fd, &ev) != 0) epoll_ctl(epfd_, EPOLL_CTL_ADD, c->fd, &ev);
}

void GuardedServer::Close(Conn* c) {
  std::unique_ptr<Conn> owned;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = conns_.find(c->fd);
    if (it == conns_.end() || it->second.get() != c) return;
    owned = std::move(it->second);
    conns_.erase(it);
    std::erase(ready_, c);
    epoll_ctl(epfd_, EPOLL_CTL_DEL, c->fd, nullptr);
  }
  if (owned->ssl) {
    if (owned->handshaken) SSL_shutdown(owned->ssl);  // best effort, non-blocking
    SSL_free(owned->ssl);
  }
  ::close(owned->fd);
}

void GuardedServer::PollLoop() {
  std::vector<epoll_event> evs(256);
  while (!stopping_) {
    int n = epoll_wait(epfd_, evs.data(), static_cast<int>(evs.size()), 250);
    std::vector<Conn*> expired;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (int i = 0; i < n; ++i) {
        if (evs[i].data.fd == wake_fd_) continue;
        auto it = conns_.find(evs[i].data.fd);
        if (it == conns_.end()) continue;
        ready_.push_back(it->second.get());
      }
      // Parked connections past their wait: the first request's deadline, or idle_timeout.
      auto now = Clock::now();
      for (auto& [fd, c] : conns_) {
        if (std::find(ready_.begin(), ready_.end(), c.get()) != ready_.end()) continue;
        if (c->deadline == Clock::time_point::max()) continue;  // held by a worker
        Clock::time_point limit = c->served == 0 ? c->deadline : c->idle_since + limits_.idle_timeout;
        if (now >= limit) expired.push_back(c.get());
      }
      for (Conn* c : ready_) c->deadline = Clock::time_point::max();  // claimed
    }
    if (n > 0) work_cv_.notify_all();
    for (Conn* c : expired) Close(c);
  }
}

void GuardedServer::WorkLoop() {
  for (;;) {
    Conn* c = nullptr;
    {
      std::unique_lock<std::mutex> l(mu_);
      work_cv_.wait(l, [this] { return stopping_ || !ready_.empty(); });
      if (stopping_) return;
      c = ready_.front();
      ready_.pop_front();
    }
    Serve(c);
  }
}

bool GuardedServer::Authorized(Conn* c) const {
  if (limits_.client_names.empty()) return true;
  X509* peer = SSL_get1_peer_certificate(c->ssl);
  if (!peer) return false;
  bool ok = false;
  for (const std::string& name : limits_.client_names) {
    char cn[256] = {};
    if (X509_NAME_get_text_by_NID(X509_get_subject_name(peer), NID_commonName, cn, sizeof cn) > 0 &&
        name == cn) {
      ok = true;
    } else if (X509_check_host(peer, name.data(), name.size(), 0, nullptr) == 1) {
      ok = true;
    }
    if (ok) break;
  }
  X509_free(peer);
  return ok;
}

void GuardedServer::Serve(Conn* c) {
  bool first = c->served == 0;
  Clock::time_point deadline =
      first ? c->idle_since + limits_.request_timeout : Clock::now() + limits_.request_timeout;
  if (c->ssl && !c->handshaken) {
    for (;;) {
      ERR_clear_error();
      int r = SSL_accept(c->ssl);
      if (r == 1) break;
      int e = SSL_get_error(c->ssl, r);
      bool again = (e == SSL_ERROR_WANT_READ && WaitFd(c->fd, POLLIN, deadline)) ||
                   (e == SSL_ERROR_WANT_WRITE && WaitFd(c->fd, POLLOUT, deadline));
      if (!again) {
        Close(c);
        return;
      }
    }
    c->handshaken = true;
    if (!Authorized(c)) {
      Close(c);
      return;
    }
    if (!c->buffered() && !WaitFd(c->fd, POLLIN, deadline)) {
      Close(c);
      return;
    }
  }
  for (;;) {
    c->allowance = limits_.max_header_bytes + limits_.max_body_bytes;
    ConnStream strm(c->fd, c->ssl, c->buf, sizeof c->buf, &c->pos, &c->len, deadline,
                    &c->allowance, c->peer_ip, c->peer_port);
    ++c->served;
    bool last = stopping_ || c->served >= limits_.max_requests_per_connection;
    bool closed = false;
    SSL* ssl = c->ssl;
    bool ok = process_request(strm, last, closed,
                              [ssl](httplib::Request& req) { req.ssl = ssl; });
    if (!ok || closed || last) {
      Close(c);
      return;
    }
    // Pipelined bytes already here: serve them now (epoll would not report them).
    if (!c->buffered()) break;
    deadline = Clock::now() + limits_.request_timeout;
  }
  Park(c);
}

absl::StatusOr<SSL_CTX*> ServerTlsContext(const std::string& cert_pem, const std::string& key_pem,
                                          const std::string& client_ca_pem) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (!ctx) return absl::InternalError("OpenSSL: cannot create a TLS context");
  auto fail = [ctx](std::string why) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(std::move(why));
  };
  // Explicitly, whatever the system's OpenSSL defaults: no TLS 1.0/1.1 (item of the hardening).
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  BIO* cb = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  X509* cert = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
  bool ok = cert && SSL_CTX_use_certificate(ctx, cert) == 1;
  if (cert) X509_free(cert);
  // The rest of the PEM is the chain.
  while (ok) {
    X509* extra = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
    if (!extra) break;
    if (SSL_CTX_add0_chain_cert(ctx, extra) != 1) X509_free(extra);
  }
  BIO_free(cb);
  ERR_clear_error();
  if (!ok) return fail("TLS: the serving certificate is not PEM");
  BIO* kb = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(kb, nullptr, &NoPassphrase, nullptr);
  BIO_free(kb);
  if (!key) {
    return fail(key_pem.find("ENCRYPTED") != std::string::npos
                    ? "TLS: the serving key is passphrase-protected; give an unencrypted key"
                    : "TLS: the serving key is not a PEM private key");
  }
  ok = SSL_CTX_use_PrivateKey(ctx, key) == 1 && SSL_CTX_check_private_key(ctx) == 1;
  EVP_PKEY_free(key);
  if (!ok) return fail("TLS: the serving key does not belong to the certificate");
  if (!client_ca_pem.empty()) {
    X509_STORE* store = SSL_CTX_get_cert_store(ctx);
    BIO* ab = BIO_new_mem_buf(client_ca_pem.data(), static_cast<int>(client_ca_pem.size()));
    int n = 0;
    while (X509* ca = PEM_read_bio_X509(ab, nullptr, nullptr, nullptr)) {
      X509_STORE_add_cert(store, ca);
      X509_free(ca);
      ++n;
    }
    BIO_free(ab);
    ERR_clear_error();
    if (n == 0) return fail("TLS: the client CA bundle holds no PEM certificate");
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return ctx;
}

// --- untrusted JSON -------------------------------------------------------------------------

int JsonDepth(std::string_view text, int stop_above) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > stop_above) return deepest;
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return deepest;
}

namespace {

struct ParseBudget {
  std::mutex mu;
  std::condition_variable cv;
  size_t limit = 8 << 20;
  size_t used = 0;
};

ParseBudget& Budget() {
  static ParseBudget* b = new ParseBudget;  // never destroyed: leases may outlive main()
  return *b;
}

}  // namespace

void SetUntrustedJsonBudget(size_t bytes) {
  std::lock_guard<std::mutex> l(Budget().mu);
  Budget().limit = bytes;
}

absl::StatusOr<UntrustedJson> ParseUntrustedJson(std::string_view text, int max_depth,
                                                 std::chrono::milliseconds wait) {
  if (int d = JsonDepth(text, max_depth); d > max_depth) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON nests deeper than ", max_depth, " levels"));
  }
  ParseBudget& b = Budget();
  size_t n = text.size();
  {
    std::unique_lock<std::mutex> l(b.mu);
    // One body alone may exceed the budget (it passed the size limit); otherwise wait for room.
    if (!b.cv.wait_for(l, wait, [&] { return b.used == 0 || b.used + n <= b.limit; })) {
      return absl::ResourceExhaustedError("busy: too many large requests being parsed");
    }
    b.used += n;
  }
  std::shared_ptr<void> lease(nullptr, [n](void*) {
    ParseBudget& b = Budget();
    {
      std::lock_guard<std::mutex> l(b.mu);
      b.used -= n;
    }
    b.cv.notify_all();
  });
  UntrustedJson out;
  out.value = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (out.value.is_discarded()) return absl::InvalidArgumentError("body is not valid JSON");
  out.lease = std::move(lease);
  return out;
}

}  // namespace gpulet::k8s
