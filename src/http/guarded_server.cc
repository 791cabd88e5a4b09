#include "http/guarded_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
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
#include "absl/strings/str_join.h"
#include "common/json.h"

namespace gpulet::http {
namespace {

using Clock = std::chrono::steady_clock;

// Never prompts: an encrypted key is an error, not a question on the terminal.
int NoPassphrase(char*, int, int, void*) { return -1; }

}  // namespace

// One client connection: its socket, TLS state, and the bytes received but not yet consumed. A
// request is read completely (head and Content-Length body) by the poller, without blocking,
// before a worker sees it: a slow client holds a buffer, never a worker.
struct GuardedServer::Conn {
  int fd = -1;
  SSL* ssl = nullptr;
  bool handshaken = false;
  std::string peer_ip;
  int peer_port = -1;
  Clock::time_point accepted;
  Clock::time_point idle_since;       // last request answered (keep-alive wait)
  Clock::time_point request_started;  // first byte of the request being received
  bool busy = false;                  // queued for or held by a worker
  int served = 0;
  std::string in;  // received bytes; a worker consumes from `pos`
  size_t pos = 0;
  // Response bytes the socket did not take at once, sent by the poller from `out_pos` as the
  // client reads (counted in held_); nothing more is read from the connection meanwhile.
  std::string out;
  size_t out_pos = 0;
  Clock::time_point write_started;
  bool close_after = false;  // close once `out` is sent
  bool holding() const { return out_pos < out.size(); }
};

namespace {

// Case-insensitive search for a header's value in a request head; npos when absent.
std::string_view HeaderValue(std::string_view head, std::string_view name) {
  size_t at = head.find("\r\n");
  while (at != std::string_view::npos && at + 2 < head.size()) {
    size_t line = at + 2;
    size_t end = head.find("\r\n", line);
    if (end == std::string_view::npos) end = head.size();
    std::string_view l = head.substr(line, end - line);
    if (l.size() > name.size() && l[name.size()] == ':' &&
        std::equal(name.begin(), name.end(), l.begin(),
                   [](char a, char b) { return std::tolower(a) == std::tolower(b); })) {
      std::string_view v = l.substr(name.size() + 1);
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
      return v;
    }
    at = end;
  }
  return std::string_view(nullptr, 0);
}

enum class Completeness {
  kIncomplete,
  kComplete,
  kTooLarge,
  kHeadersTooLarge,
  kNeedsLength,
  kMethodNotAllowed
};

// Whether `in` holds one whole request (head plus Content-Length body); `bytes` its size then.
Completeness RequestIn(std::string_view in, const ServerLimits& l, size_t* bytes = nullptr) {
  size_t head_end = in.substr(0, l.max_header_bytes + 4).find("\r\n\r\n");
  if (head_end == std::string_view::npos) {
    return in.size() >= l.max_header_bytes + 4 ? Completeness::kHeadersTooLarge
                                               : Completeness::kIncomplete;
  }
  std::string_view head = in.substr(0, head_end + 2);
  if (!l.methods.empty()) {
    std::string_view method = head.substr(0, head.find(' '));
    if (std::find(l.methods.begin(), l.methods.end(), method) == l.methods.end())
      return Completeness::kMethodNotAllowed;
  }
  // Chunked bodies cannot be bounded before they are read; API servers and kube-scheduler send
  // Content-Length.
  if (HeaderValue(head, "transfer-encoding").data() != nullptr) return Completeness::kNeedsLength;
  size_t length = 0;
  std::string_view cl = HeaderValue(head, "content-length");
  if (cl.data() != nullptr) {
    if (cl.empty() || cl.size() > 12 ||
        !std::all_of(cl.begin(), cl.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return Completeness::kNeedsLength;
    }
    length = std::stoull(std::string(cl));
    if (length > l.max_body_bytes) return Completeness::kTooLarge;
  }
  if (in.size() < head_end + 4 + length) return Completeness::kIncomplete;
  if (bytes) *bytes = head_end + 4 + length;
  return Completeness::kComplete;
}

// Sends from `data` without blocking: bytes taken (>= 0), or -1 when the connection is dead.
ssize_t SendSome(int fd, SSL* ssl, const char* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    size_t chunk = std::min<size_t>(size - done, 1 << 20);
    if (ssl) {
      ERR_clear_error();
      int n = SSL_write(ssl, data + done, static_cast<int>(chunk));
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      int e = SSL_get_error(ssl, n);
      if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) break;
      return -1;
    }
    ssize_t n = ::send(fd, data + done, chunk, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      return -1;
    }
  }
  return static_cast<ssize_t>(done);
}

// Runs the accept loop's per-connection task at once on the accepting thread: the task only
// hands the socket to the poller.
class InlineQueue : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

void PeerOf(int fd, std::string* ip, int* port) {
  sockaddr_storage a{};
  socklen_t l = sizeof a;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &l) != 0) return;
  char host[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    auto* s = reinterpret_cast<sockaddr_in*>(&a);
    inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
    *port = ntohs(s->sin_port);
  } else if (a.ss_family == AF_INET6) {
    auto* s = reinterpret_cast<sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
    *port = ntohs(s->sin6_port);
  }
  *ip = host;
}

}  // namespace

// A worker's view of its connection: reads come from the buffer (the poller has received the
// whole request); writes send what the socket takes now and hold the rest (and everything after
// it, to keep the order) for the poller, so a client that does not read never holds a worker.
class GuardedServer::ConnStream final : public httplib::Stream {
 public:
  ConnStream(GuardedServer& s, Conn& c) : s_(s), c_(c) {}

  bool is_readable() const override { return c_.pos < c_.in.size(); }
  bool is_writable() const override { return c_.fd >= 0; }  // what it does not take is held

  ssize_t read(char* ptr, size_t size) override {
    if (c_.pos >= c_.in.size()) return -1;
    size_t n = std::min(size, c_.in.size() - c_.pos);
    memcpy(ptr, c_.in.data() + c_.pos, n);
    c_.pos += n;
    return static_cast<ssize_t>(n);
  }

  // Fails only on a dead connection, or when the held bytes of all connections would pass their
  // cap (that client is cut off).
  ssize_t write(const char* ptr, size_t size) override {
    size_t done = 0;
    if (!c_.holding()) {
      ssize_t n = SendSome(c_.fd, c_.ssl, ptr, size);
      if (n < 0) return -1;
      done = static_cast<size_t>(n);
    }
    size_t rest = size - done;
    if (rest == 0) return static_cast<ssize_t>(size);
    if (s_.held_.fetch_add(rest) + rest > kMaxHeldBytes) {
      s_.held_.fetch_sub(rest);
      return -1;
    }
    if (!c_.holding()) {
      c_.out.clear();
      c_.out_pos = 0;
      c_.write_started = Clock::now();
    }
    c_.out.append(ptr + done, rest);
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.peer_ip;
    port = c_.peer_port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip.clear();
    port = -1;
  }
  socket_t socket() const override { return c_.fd; }

 private:
  GuardedServer& s_;
  Conn& c_;
};

GuardedServer::GuardedServer(ServerLimits limits, SSL_CTX* tls)
    : limits_(std::move(limits)), tls_(tls) {
  set_payload_max_length(limits_.max_body_bytes);
  // Announced in the Keep-Alive header and enforced in Serve(). A kept-alive connection costs no
  // worker while idle (it waits in the poller), so reconnecting every few requests buys nothing.
  set_keep_alive_max_count(static_cast<size_t>(std::max(1, limits_.max_requests_per_connection)));
  set_keep_alive_timeout(std::max<time_t>(
      1, std::chrono::duration_cast<std::chrono::seconds>(limits_.idle_timeout).count()));
  // httplib's default also sets SO_REUSEPORT, which lets a second process bind the same port and
  // silently take half the requests; keep only SO_REUSEADDR so a busy port is an error.
  set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
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

void GuardedServer::SetProbe(std::string path, Probe probe) {
  std::lock_guard<std::mutex> l(mu_);
  probe_path_ = std::move(path);
  probe_ = std::move(probe);
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

bool GuardedServer::bind_to_port(const std::string& host, int port, int socket_flags) {
  if (!httplib::Server::bind_to_port(host, port, socket_flags)) return false;
  ::listen(svr_sock_, SOMAXCONN);  // on a listening socket: only updates the backlog
  return true;
}

int GuardedServer::bind_to_any_port(const std::string& host, int socket_flags) {
  int port = httplib::Server::bind_to_any_port(host, socket_flags);
  if (port > 0) ::listen(svr_sock_, SOMAXCONN);
  return port;
}

size_t GuardedServer::open_connections() const {
  std::lock_guard<std::mutex> l(mu_);
  return conns_.size();
}

// Makes room for `c`: at max_connections the longest-idle connection not being served is closed,
// and at max_connections_per_peer the longest-idle one of c's address, so a new client always
// gets in (an attacker's idle connections cannot lock everyone out).
void GuardedServer::AdmitLocked(const Conn& c) {
  const size_t per_peer = static_cast<size_t>(std::max(0, limits_.max_connections_per_peer));
  Conn* oldest = nullptr;
  Conn* oldest_of_peer = nullptr;
  size_t of_peer = 0;
  for (auto& [fd, cc] : conns_) {
    bool same = per_peer > 0 && cc->peer_ip == c.peer_ip;
    of_peer += same;
    if (cc->busy) continue;
    if (!oldest || cc->idle_since < oldest->idle_since) oldest = cc.get();
    if (same && (!oldest_of_peer || cc->idle_since < oldest_of_peer->idle_since))
      oldest_of_peer = cc.get();
  }
  if (per_peer > 0 && of_peer >= per_peer && oldest_of_peer) {
    ++dropped_;
    CloseLocked(oldest_of_peer);
    return;
  }
  if (conns_.size() >= static_cast<size_t>(std::max(1, limits_.max_connections)) && oldest) {
    ++dropped_;
    CloseLocked(oldest);
  }
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
  PeerOf(sock, &c->peer_ip, &c->peer_port);
  if (tls_) {
    c->ssl = SSL_new(tls_);
    if (!c->ssl) {
      ::close(sock);
      return false;
    }
    SSL_set_fd(c->ssl, sock);
    SSL_set_mode(c->ssl, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_ENABLE_PARTIAL_WRITE);
  }
  c->accepted = c->idle_since = c->request_started = Clock::now();
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_) {  // Shutdown() may have run since the check above: epfd_ is gone
    if (c->ssl) SSL_free(c->ssl);
    ::close(sock);
    return false;
  }
  AdmitLocked(*c);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = sock;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, sock, &ev);
  conns_[sock] = std::move(c);
  return true;
}

void GuardedServer::CloseLocked(Conn* c) {
  auto it = conns_.find(c->fd);
  if (it == conns_.end() || it->second.get() != c) return;
  std::unique_ptr<Conn> owned = std::move(it->second);
  conns_.erase(it);
  std::erase(ready_, c);
  epoll_ctl(epfd_, EPOLL_CTL_DEL, owned->fd, nullptr);
  buffered_ -= owned->in.size();
  held_ -= owned->out.size();
  if (owned->ssl) {
    if (owned->handshaken) SSL_shutdown(owned->ssl);  // best effort, non-blocking
    SSL_free(owned->ssl);
  }
  ::close(owned->fd);
}

void GuardedServer::WatchLocked(Conn* c, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = c->fd;
  epoll_ctl(epfd_, EPOLL_CTL_MOD, c->fd, &ev);
}

// After a connection's last answer: the FIN before the close, so the client reads the answer
// rather than a reset.
void GuardedServer::CloseAfterAnswerLocked(Conn* c) {
  if (!c->ssl) ::shutdown(c->fd, SHUT_WR);
  CloseLocked(c);
}

// Waits for the connection's next request. Bytes of it that came with the last one are checked
// (and more read) now, since epoll reports only new arrivals.
void GuardedServer::AwaitNextLocked(Conn* c) {
  WatchLocked(c, EPOLLIN | EPOLLRDHUP);
  if (!c->in.empty()) ReceiveLocked(c);
}

// A fixed answer straight from the poller, then close (the request is not worth a worker).
void GuardedServer::RefuseLocked(Conn* c, int status, const char* reason) {
  std::string extra;
  if (status == 405) extra = absl::StrCat("Allow: ", absl::StrJoin(limits_.methods, ", "), "\r\n");
  std::string out = absl::StrCat("HTTP/1.1 ", status, " ", reason, "\r\n", extra,
                                 "Content-Length: 0\r\nConnection: close\r\n\r\n");
  (void)SendSome(c->fd, c->ssl, out.data(), out.size());
  CloseAfterAnswerLocked(c);
}

// The probe path, answered here with `Connection: close`; false when the request is not a probe.
bool GuardedServer::AnswerProbeLocked(Conn* c, size_t request_bytes) {
  if (!probe_) return false;
  std::string_view line(c->in.data() + c->pos, c->in.size() - c->pos);
  line = line.substr(0, line.find("\r\n"));
  bool head = false, probe = false;
  for (std::string_view m : {"GET ", "HEAD "}) {
    if (line.substr(0, m.size()) != m) continue;
    std::string_view target = line.substr(m.size());
    target = target.substr(0, target.find(' '));
    if (target.substr(0, target.find('?')) != probe_path_) continue;
    probe = true;
    head = m[0] == 'H';
  }
  if (!probe) return false;
  buffered_ -= request_bytes;
  c->in.erase(0, c->pos + request_bytes);
  c->pos = 0;
  auto [status, body] = probe_();
  std::string r =
      absl::StrCat("HTTP/1.1 ", status, status == 200 ? " OK" : " Service Unavailable",
                   "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ", body.size(),
                   "\r\nConnection: close\r\n\r\n", head ? "" : body);
  held_ += r.size();
  c->out = std::move(r);
  c->out_pos = 0;
  c->write_started = Clock::now();
  c->close_after = true;
  FlushLocked(c);
  return true;
}

// Sends held bytes as the socket takes them; once all are out the connection closes or waits
// for its next request. Called by the poller with mu_ held.
void GuardedServer::FlushLocked(Conn* c) {
  ssize_t n = SendSome(c->fd, c->ssl, c->out.data() + c->out_pos, c->out.size() - c->out_pos);
  if (n < 0) return CloseLocked(c);
  c->out_pos += static_cast<size_t>(n);
  if (c->holding()) return WatchLocked(c, EPOLLOUT);
  held_ -= c->out.size();
  c->out.clear();
  c->out_pos = 0;
  if (c->close_after) return CloseAfterAnswerLocked(c);
  c->idle_since = c->request_started = Clock::now();
  AwaitNextLocked(c);
}

// Reads what is there (non-blocking), advances a TLS handshake, and queues the connection for a
// worker once a whole request has arrived. Called by the poller with mu_ held.
void GuardedServer::ReceiveLocked(Conn* c) {
  if (c->ssl && !c->handshaken) {
    ERR_clear_error();
    int r = SSL_accept(c->ssl);
    if (r != 1) {
      int e = SSL_get_error(c->ssl, r);
      if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) return CloseLocked(c);
      return;  // more handshake bytes to come (the deadline sweep ends it otherwise)
    }
    c->handshaken = true;
    if (!Authorized(c)) return CloseLocked(c);
  }
  // A whole request at most: the head, its blank line, the body (reading stops there, so a head
  // without its blank line within the limit is seen as too large, not waited for).
  const size_t allowance = limits_.max_header_bytes + 4 + limits_.max_body_bytes;
  char buf[16384];
  for (;;) {
    if (c->in.size() - c->pos >= allowance) break;
    size_t want = std::min(sizeof buf, allowance - (c->in.size() - c->pos));
    ssize_t n;
    if (c->ssl) {
      ERR_clear_error();
      int r = SSL_read(c->ssl, buf, static_cast<int>(want));
      if (r <= 0) {
        int e = SSL_get_error(c->ssl, r);
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) break;
        return CloseLocked(c);
      }
      n = r;
    } else {
      n = ::recv(c->fd, buf, want, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
      if (n <= 0) return CloseLocked(c);
    }
    if (buffered_ + static_cast<size_t>(n) > kMaxBufferedBytes) {
      ++dropped_;  // everyone together may not hold more than this in request bytes
      return CloseLocked(c);
    }
    if (c->in.size() == c->pos && c->served > 0) c->request_started = Clock::now();
    c->in.append(buf, static_cast<size_t>(n));
    buffered_ += static_cast<size_t>(n);
  }
  size_t bytes = 0;
  switch (RequestIn(std::string_view(c->in).substr(c->pos), limits_, &bytes)) {
    case Completeness::kIncomplete:
      return;
    case Completeness::kComplete: {
      if (AnswerProbeLocked(c, bytes)) return;
      c->busy = true;
      // Level-triggered: while a worker holds it, a half-closed or pipelining client would
      // otherwise wake the poller in a loop.
      WatchLocked(c, 0);
      ready_.push_back(c);
      work_cv_.notify_one();
      return;
    }
    case Completeness::kTooLarge:
      return RefuseLocked(c, 413, "Payload Too Large");
    case Completeness::kHeadersTooLarge:
      return RefuseLocked(c, 431, "Request Header Fields Too Large");
    case Completeness::kNeedsLength:
      return RefuseLocked(c, 411, "Length Required");
    case Completeness::kMethodNotAllowed:
      return RefuseLocked(c, 405, "Method Not Allowed");
  }
}

void GuardedServer::PollLoop() {
  std::vector<epoll_event> evs(256);
  auto next_sweep = Clock::now();
  while (!stopping_) {
    int n = epoll_wait(epfd_, evs.data(), static_cast<int>(evs.size()), 100);
    std::lock_guard<std::mutex> l(mu_);
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.fd == wake_fd_) continue;
      auto it = conns_.find(evs[i].data.fd);
      if (it == conns_.end() || it->second->busy) continue;
      Conn* c = it->second.get();
      if (c->holding()) {
        FlushLocked(c);
      } else {
        ReceiveLocked(c);
      }
    }
    auto now = Clock::now();
    if (now < next_sweep) continue;
    next_sweep = now + std::chrono::milliseconds(100);
    // Deadlines of connections the poller holds: a held response must be taken within
    // write_timeout; a request (and a first handshake) must arrive within request_timeout of its
    // first byte (of the accept); an idle one waits idle_timeout.
    std::vector<Conn*> expired;
    for (auto& [fd, c] : conns_) {
      if (c->busy) continue;
      bool idle = c->in.size() == c->pos && c->served > 0;
      Clock::time_point limit =
          c->holding() ? c->write_started + limits_.write_timeout
          : idle       ? c->idle_since + limits_.idle_timeout
                 : (c->served == 0 ? c->accepted : c->request_started) + limits_.request_timeout;
      if (now >= limit) expired.push_back(c.get());
    }
    for (Conn* c : expired) CloseLocked(c);
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

// A worker: answers the complete request(s) in the buffer, then hands the connection back (with
// what the socket did not take of the response, for the poller to send).
void GuardedServer::Serve(Conn* c) {
  // `c` is ours while busy: the poller neither reads it nor expires it, no eviction picks it.
  for (;;) {
    ConnStream strm(*this, *c);
    ++c->served;
    bool last = stopping_ || c->served >= limits_.max_requests_per_connection;
    bool closed = false;
    SSL* ssl = c->ssl;
    bool ok = process_request(strm, last, closed, [ssl](httplib::Request& req) { req.ssl = ssl; });
    std::lock_guard<std::mutex> l(mu_);
    // Drop what the request consumed.
    buffered_ -= c->pos;
    c->in.erase(0, c->pos);
    c->pos = 0;
    if (!ok) return CloseLocked(c);
    c->busy = false;
    if (c->holding()) {
      c->close_after = closed || last;
      return WatchLocked(c, EPOLLOUT);
    }
    if (closed || last) return CloseAfterAnswerLocked(c);
    c->idle_since = c->request_started = Clock::now();
    size_t bytes = 0;
    if (RequestIn(c->in, limits_, &bytes) == Completeness::kComplete) {
      if (AnswerProbeLocked(c, bytes)) return;  // `c` may be closed and gone now
      c->busy = true;                           // pipelined: the next one at once
      continue;
    }
    return AwaitNextLocked(c);
  }
}

absl::StatusOr<SSL_CTX*> ServerTlsContext(const std::string& cert_pem, const std::string& key_pem,
                                          const std::string& client_ca_pem) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (!ctx) return absl::InternalError("OpenSSL: cannot create a TLS context");
  auto fail = [ctx](const std::string& why) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(why);
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

namespace {

constexpr size_t kSmallJson = 64 << 10;

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
  // Small bodies (every real extender and webhook request) parse at once: their DOMs are a few
  // MiB even for every worker together, and they must not queue behind an attacker's large ones.
  size_t n = text.size() < kSmallJson ? 0 : text.size();
  if (n) {
    std::unique_lock<std::mutex> l(b.mu);
    // One body alone may exceed the budget (it passed the size limit); otherwise wait for room.
    if (!b.cv.wait_for(l, wait, [&] { return b.used == 0 || b.used + n <= b.limit; })) {
      return absl::ResourceExhaustedError("busy: too many large requests being parsed");
    }
    b.used += n;
  }
  std::shared_ptr<void> lease(nullptr, [n](void*) {
    if (n == 0) return;
    ParseBudget& b = Budget();
    {
      std::lock_guard<std::mutex> l(b.mu);
      b.used -= n;
    }
    b.cv.notify_all();
    // A large DOM leaves tens of MiB free inside malloc's arenas; hand them back to the system
    // so that the peak, not the sum over threads, is what the process holds.
    if (n >= (256 << 10)) malloc_trim(0);
  });
  UntrustedJson out;
  out.value = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (out.value.is_discarded()) return absl::InvalidArgumentError("body is not valid JSON");
  out.lease = std::move(lease);
  return out;
}

}  // namespace gpulet::http
