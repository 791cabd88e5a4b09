#include "metrics/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "http/listen_address.h"

namespace gpulet::metrics {

using Clk = std::chrono::steady_clock;

namespace {

// Set by the pre-routing check on the worker thread that serves the request: close the
// connection after this response (its body, if any, was never read).
thread_local bool t_close_after = false;

bool WaitFd(int fd, short events, Clk::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clk::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r > 0) return (p.revents & events) != 0;
    if (r < 0 && errno != EINTR) return false;
  }
}

void AddressOf(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  int r = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len)
               : getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  char buf[INET6_ADDRSTRLEN] = "";
  port = 0;
  if (r == 0 && ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    port = ntohs(a->sin_port);
  } else if (r == 0 && ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    port = ntohs(a->sin6_port);
  }
  ip = buf;
}

}  // namespace

// See server.h for the limits and why. cpp-httplib's accept loop hands each new socket to
// process_and_close_socket(), which here only parks it with the poller; the poller reads request
// heads into the connection's buffer and queues complete ones to the workers, which run
// cpp-httplib's own request processing over a Stream that reads from that buffer.
class GuardedServer final : public httplib::Server {
 public:
  // The liveness probe's answer: status and body, computed on the poller thread (it must be cheap
  // and never block). Null: /health goes to the workers like any other path.
  using Probe = std::function<std::pair<int, std::string>()>;
  // Response bytes held for clients that do not read, all connections together (an uncompressed
  // /metrics of 8 GPUs x 128 containers is about 1 MiB, gzip 43 KiB; past the cap such a client is
  // cut off instead).
  static constexpr size_t kMaxHeldResponseBytes = 16 << 20;

  GuardedServer(const ServerOptions& o, Probe probe) : opt_(o), probe_(std::move(probe)) {
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    // The accept loop's own pool only parks sockets.
    new_task_queue = [] { return new httplib::ThreadPool(1); };
    set_keep_alive_timeout(std::max<time_t>(
        1, std::chrono::duration_cast<std::chrono::seconds>(opt_.idle_timeout).count()));
    set_payload_max_length(0);
    // Announced in the Keep-Alive header and enforced in Work(). A kept-alive connection costs no
    // worker while idle (it waits in the poller), so reconnecting every few requests buys nothing.
    set_keep_alive_max_count(kMaxRequestsPerConnection);
    set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
      bool body =
          req.has_header("Transfer-Encoding") ||
          (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
      if (req.method != "GET" && req.method != "HEAD") {
        res.status = 405;
        res.set_header("Allow", "GET, HEAD");
      } else if (body) {
        res.status = 413;
      } else {
        return HandlerResponse::Unhandled;
      }
      res.set_header("Connection", "close");
      res.set_content(res.status == 405 ? "only GET and HEAD are served\n"
                                        : "request bodies are not accepted\n",
                      "text/plain; charset=utf-8");
      t_close_after = true;
      return HandlerResponse::Handled;
    });
    for (int i = 0; i < std::max(1, opt_.threads); ++i) workers_.emplace_back([this] { Work(); });
    poller_ = std::thread([this] { Poll(); });
  }
  ~GuardedServer() override { Shutdown(); }

  // cpp-httplib listens with a backlog of 5: a burst of connections (a flood, or many scrapers at
  // once) would have the kernel drop SYNs, and a probe would wait for a retransmit (1 s, 3 s, ..).
  void WidenBacklog() { ::listen(svr_sock_, SOMAXCONN); }

  // After stop(): closes every connection and joins the threads. Idempotent.
  void Shutdown() {
    if (shut_down_) return;
    shut_down_ = true;
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
    }
    Wake();
    cv_.notify_all();
    if (poller_.joinable()) poller_.join();
    for (auto& w : workers_)
      if (w.joinable()) w.join();
    std::lock_guard<std::mutex> l(mu_);
    for (auto& c : incoming_) Close(*c);
    for (auto& c : jobs_) Close(*c);
    incoming_.clear();
    jobs_.clear();
    if (wake_fd_ >= 0) close(wake_fd_);
    wake_fd_ = -1;
  }

 private:
  struct Conn {
    int fd = -1;
    std::string peer;  // the client's IP address (max_connections_per_peer)
    std::string buf;   // bytes received and not yet consumed, from `off`
    size_t off = 0;
    Clk::time_point since;       // parked at (idle timeout)
    Clk::time_point first_byte;  // of the pending request head (head deadline)
    size_t requests = 0;         // served on this connection
    // Response bytes the socket did not take at once, sent by the poller from `out_off` as the
    // client reads; counted in held_. Nothing more is read from the connection meanwhile.
    std::string out;
    size_t out_off = 0;
    Clk::time_point write_since;  // `out` started (write deadline)
    bool close_after = false;     // close once `out` is sent
  };
  static constexpr size_t kMaxRequestsPerConnection = 1000;

  // The worker's view of a connection: reads come from the head the poller buffered (a body is
  // never read: it is refused before routing), writes send what the socket takes and hold the rest
  // for the poller.
  class ConnStream final : public httplib::Stream {
   public:
    ConnStream(Conn& c, const ServerOptions& o, std::atomic<size_t>& held)
        : c_(c), o_(o), held_(held), read_deadline_(Clk::now() + o.head_deadline) {}
    bool is_readable() const override {
      return c_.off < c_.buf.size() || WaitFd(c_.fd, POLLIN, read_deadline_);
    }
    // Always: what the socket does not take is held for the poller (write()).
    bool is_writable() const override { return c_.fd >= 0; }
    ssize_t read(char* ptr, size_t size) override {
      if (c_.off >= c_.buf.size()) {
        // Past the buffered head: bounded by the same size and deadline as a head.
        if (socket_bytes_ >= o_.max_request_head_bytes) return -1;
        if (!WaitFd(c_.fd, POLLIN, read_deadline_)) return -1;
        char tmp[4096];
        ssize_t n =
            recv(c_.fd, tmp, std::min(sizeof tmp, o_.max_request_head_bytes - socket_bytes_), 0);
        if (n <= 0) return n < 0 ? -1 : 0;
        socket_bytes_ += static_cast<size_t>(n);
        c_.buf.assign(tmp, static_cast<size_t>(n));
        c_.off = 0;
      }
      size_t k = std::min(size, c_.buf.size() - c_.off);
      memcpy(ptr, c_.buf.data() + c_.off, k);
      c_.off += k;
      return static_cast<ssize_t>(k);
    }
    // Sends what the socket takes now; the rest (and everything after it, to keep the order) is
    // held in the connection for the poller, so a client that does not read never holds this
    // worker. Fails when the held bytes of all connections would pass their cap.
    ssize_t write(const char* ptr, size_t size) override {
      size_t done = 0;
      while (c_.out.empty() && done < size) {
        ssize_t n = send(c_.fd, ptr + done, size - done, MSG_NOSIGNAL);
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
      size_t rest = size - done;
      if (rest > 0) {
        if (held_.fetch_add(rest) + rest > kMaxHeldResponseBytes) {
          held_.fetch_sub(rest);
          return -1;
        }
        if (c_.out.empty()) c_.write_since = Clk::now();
        c_.out.append(ptr + done, rest);
      }
      return static_cast<ssize_t>(size);
    }
    void get_remote_ip_and_port(std::string& ip, int& port) const override {
      AddressOf(c_.fd, true, ip, port);
    }
    void get_local_ip_and_port(std::string& ip, int& port) const override {
      AddressOf(c_.fd, false, ip, port);
    }
    socket_t socket() const override { return c_.fd; }

   private:
    Conn& c_;
    const ServerOptions& o_;
    std::atomic<size_t>& held_;
    Clk::time_point read_deadline_;
    size_t socket_bytes_ = 0;
  };

  bool process_and_close_socket(socket_t sock) override {
    int flags = fcntl(sock, F_GETFL);
    fcntl(sock, F_SETFL, flags | O_NONBLOCK);
    int yes = 1;
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
    auto c = std::make_unique<Conn>();
    c->fd = sock;
    int port = 0;
    AddressOf(sock, true, c->peer, port);
    Park(std::move(c));
    return true;
  }

  void Park(std::unique_ptr<Conn> c) {
    c->since = Clk::now();
    c->first_byte = c->since;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!stopping_) {
        incoming_.push_back(std::move(c));
        c = nullptr;
      }
    }
    if (c) Close(*c);
    Wake();
  }

  static bool HeadComplete(const Conn& c) {
    return c.buf.find("\r\n\r\n", c.off) != std::string::npos;
  }

  void Close(Conn& c) {
    if (c.fd >= 0) {
      shutdown(c.fd, SHUT_RDWR);
      close(c.fd);
    }
    c.fd = -1;
    held_ -= c.out.size();
    c.out.clear();
  }

  // Sends held response bytes; false on a dead connection. When all are sent, `out` is empty.
  bool Flush(Conn& c) {
    while (c.out_off < c.out.size()) {
      ssize_t n = send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_off += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
      }
    }
    held_ -= c.out.size();
    c.out.clear();
    c.out_off = 0;
    return true;
  }

  // Whether the complete head at `off` is GET or HEAD of /health (with or without a query).
  bool IsProbe(const Conn& c, bool* head) const {
    if (!probe_) return false;
    std::string_view line(c.buf.data() + c.off, c.buf.size() - c.off);
    line = line.substr(0, line.find("\r\n"));
    for (std::string_view m : {"GET /health", "HEAD /health"}) {
      if (line.substr(0, m.size()) != m || line.size() == m.size()) continue;
      char next = line[m.size()];
      if (next != ' ' && next != '?') continue;
      *head = m[0] == 'H';
      return true;
    }
    return false;
  }

  // A complete request head: the liveness probe is answered here, on the poller, with
  // `Connection: close`; everything else goes to the workers. Leaves `c` null when it is gone.
  void Route(std::unique_ptr<Conn>& c) {
    bool head = false;
    if (!IsProbe(*c, &head)) {
      Dispatch(std::move(c));
      return;
    }
    c->off = c->buf.find("\r\n\r\n", c->off) + 4;
    auto [status, body] = probe_();
    std::string r =
        absl::StrCat("HTTP/1.1 ", status, status == 200 ? " OK" : " Service Unavailable",
                     "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ", body.size(),
                     "\r\nConnection: close\r\n\r\n");
    if (!head) r += body;
    held_ += r.size();
    c->out = std::move(r);
    c->out_off = 0;
    c->write_since = Clk::now();
    c->close_after = true;
    if (!Flush(*c) || c->out.empty()) {
      Close(*c);
      c = nullptr;
    }
  }

  void Wake() {
    uint64_t one = 1;
    if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof one);
  }

  // Reads what arrived; false when the connection is finished (closed by the peer, an error, or a
  // head over the limit, answered 431).
  bool ReadHead(Conn& c) {
    for (;;) {
      size_t pending = c.buf.size() - c.off;
      if (pending >= opt_.max_request_head_bytes) {
        static constexpr char k431[] =
            "HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n"
            "Content-Length: 0\r\n\r\n";
        (void)!send(c.fd, k431, sizeof k431 - 1, MSG_NOSIGNAL);
        return false;
      }
      char tmp[4096];
      ssize_t n = recv(c.fd, tmp, std::min(sizeof tmp, opt_.max_request_head_bytes - pending), 0);
      if (n == 0) return false;
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      if (pending == 0) {
        c.buf.erase(0, c.off);
        c.off = 0;
        c.first_byte = Clk::now();
      }
      c.buf.append(tmp, static_cast<size_t>(n));
      if (HeadComplete(c)) return true;
    }
  }

  void Poll() {
    std::vector<std::unique_ptr<Conn>> parked;
    std::vector<pollfd> fds;
    std::unordered_map<std::string, int> per_peer;
    for (;;) {
      {
        std::lock_guard<std::mutex> l(mu_);
        if (stopping_) break;
        for (auto& c : incoming_) parked.push_back(std::move(c));
        incoming_.clear();
      }
      Clk::time_point now = Clk::now();
      // Pipelined requests already buffered go straight on (once the previous response is out).
      for (auto& c : parked)
        if (c->out.empty() && HeadComplete(*c)) Route(c);
      std::erase(parked, nullptr);
      // Deadlines: held bytes must be read in time, a started head must complete in time, an idle
      // connection closes.
      for (auto& c : parked) {
        bool started = c->off < c->buf.size();
        Clk::time_point due = !c->out.empty() ? c->write_since + opt_.write_deadline
                              : started       ? c->first_byte + opt_.head_deadline
                                              : c->since + opt_.idle_timeout;
        if (now >= due) {
          Close(*c);
          c = nullptr;
        }
      }
      std::erase(parked, nullptr);
      // Too many waiting, from one address or in all: the oldest go first (a flood of idle
      // connections must not starve the kubelet's probe, which always arrives on a new connection,
      // possibly from the attacker's address: a host-network pod shares the node's).
      // No address can be over its cap while fewer are parked than the cap: the common case costs
      // neither the sort nor the count (this loop runs on every wake, every flush of a response).
      const size_t per_peer_cap = std::max(1, opt_.max_connections_per_peer);
      const size_t total_cap = std::max(1, opt_.max_connections);
      if (parked.size() > std::min(per_peer_cap, total_cap)) {
        std::sort(parked.begin(), parked.end(),
                  [](const auto& a, const auto& b) { return a->since > b->since; });
      }
      if (parked.size() > per_peer_cap) {
        per_peer.clear();
        for (auto& c : parked) {
          if (static_cast<size_t>(++per_peer[c->peer]) > per_peer_cap) {
            Close(*c);
            c = nullptr;
          }
        }
        std::erase(parked, nullptr);
      }
      if (parked.size() > total_cap) {
        for (size_t i = total_cap; i < parked.size(); ++i) Close(*parked[i]);
        parked.resize(total_cap);
      }
      fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
      for (auto& c : parked) {
        fds.push_back({c->fd, static_cast<short>(c->out.empty() ? POLLIN : POLLOUT), 0});
      }
      int r = poll(fds.data(), fds.size(), 100);
      if (r <= 0) continue;
      if (fds[0].revents) {
        uint64_t v;
        (void)!::read(wake_fd_, &v, sizeof v);
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        auto& c = parked[i - 1];
        if (!c->out.empty()) {
          if (!Flush(*c) || (c->out.empty() && c->close_after)) {
            Close(*c);
            c = nullptr;
          } else if (c->out.empty() && HeadComplete(*c)) {
            Route(c);
          }
        } else if (!ReadHead(*c)) {
          Close(*c);
          c = nullptr;
        } else if (HeadComplete(*c)) {
          Route(c);
        }
      }
      std::erase(parked, nullptr);
    }
    for (auto& c : parked) Close(*c);
  }

  void Dispatch(std::unique_ptr<Conn> c) {
    {
      std::lock_guard<std::mutex> l(mu_);
      jobs_.push_back(std::move(c));
    }
    cv_.notify_one();
  }

  void Work() {
    for (;;) {
      std::unique_ptr<Conn> c;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stopping_ || !jobs_.empty(); });
        if (stopping_) return;
        c = std::move(jobs_.front());
        jobs_.pop_front();
      }
      t_close_after = false;
      bool closed = false, ok = false;
      {
        ConnStream strm(*c, opt_, held_);
        bool last = ++c->requests >= kMaxRequestsPerConnection;
        ok = process_request(strm, last, closed, nullptr);
        closed = closed || last;
      }
      if (!ok || ((closed || t_close_after) && c->out.empty())) {
        Close(*c);
        continue;
      }
      // The rest of the response goes out from the poller; then the connection closes, or reads on.
      c->close_after = closed || t_close_after;
      c->buf.erase(0, c->off);
      c->off = 0;
      Park(std::move(c));
    }
  }

  const ServerOptions opt_;
  const Probe probe_;
  std::atomic<size_t> held_{0};  // bytes in every connection's `out`
  int wake_fd_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool shut_down_ = false;  // Shutdown() ran (called from the owner's thread only)
  std::vector<std::unique_ptr<Conn>> incoming_;
  std::deque<std::unique_ptr<Conn>> jobs_;
  std::vector<std::thread> workers_;
  std::thread poller_;
};

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

std::unique_ptr<GuardedServer> NewServer(ServerOptions o, int threads,
                                         GuardedServer::Probe probe = nullptr) {
  o.threads = threads;
  auto s = std::make_unique<GuardedServer>(o, std::move(probe));
  // httplib's default also sets SO_REUSEPORT, which lets a second exporter bind the same port and
  // silently take half the scrapes; keep only SO_REUSEADDR so a busy port is an error.
  s->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  return s;
}

absl::StatusOr<int> Bind(GuardedServer& s, const std::string& address) {
  auto hp = http::ParseListenAddress(address);
  if (!hp.ok()) return hp.status();
  auto [host, port] = *hp;
  if (port == 0) {
    int p = s.bind_to_any_port(host);
    if (p <= 0) return TcpListenFailed(host, port);
    s.WidenBacklog();
    return p;
  }
  if (!s.bind_to_port(host, port)) return TcpListenFailed(host, port);
  s.WidenBacklog();
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

// /health, answered on the poller thread (GuardedServer::Probe): a snapshot pointer and a few
// fields, no lock held, no I/O.
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
  http_ = NewServer(options_, options_.threads, [this] { return Health(); });
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
  if (http_) http_->stop();
  if (gpu_manager_http_) gpu_manager_http_->stop();
  if (thread_.joinable()) thread_.join();
  if (gpu_manager_thread_.joinable()) gpu_manager_thread_.join();
  if (http_) http_->Shutdown();
  if (gpu_manager_http_) gpu_manager_http_->Shutdown();
}

}  // namespace gpulet::metrics
