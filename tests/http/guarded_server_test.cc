// GuardedServer against hostile clients over real loopback sockets: slow clients, idle
// connections, endless headers, oversized bodies, old TLS versions, missing or wrong client
// certificates, passphrase-protected keys; and the JSON depth/budget gate.
#include "http/guarded_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pty.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "http/tls.h"
#include "testing/net/loopback.h"

namespace gpulet::http {
namespace {
using testing_net::Connect;

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// True when the peer closed `fd` within `within`.
bool ClosedWithin(int fd, std::chrono::milliseconds within) {
  auto deadline = Clock::now() + within;
  char buf[4096];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) > 0) {
      ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) return true;
    }
  }
  return false;
}

class GuardedServerTest : public ::testing::Test {
 protected:
  void Start(ServerLimits limits, SSL_CTX* tls = nullptr) {
    server_ = std::make_unique<GuardedServer>(limits, tls);
    server_->Get("/healthz", [](const httplib::Request&, httplib::Response& r) {
      r.set_content("ok", "text/plain");
    });
    server_->Post("/echo", [](const httplib::Request& req, httplib::Response& r) {
      r.set_content(std::to_string(req.body.size()), "text/plain");
    });
    port_ = server_->bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    thread_ = std::thread([this] { server_->listen_after_bind(); });
    while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void TearDown() override {
    if (!server_) return;
    server_->stop();
    thread_.join();
    server_->Shutdown();
  }
  // GET /healthz over a new plain connection; the time it took, or -1 ms on failure.
  std::chrono::milliseconds Healthz() {
    auto t0 = Clock::now();
    httplib::Client cli("127.0.0.1", port_);
    cli.set_connection_timeout(std::chrono::seconds(3));
    cli.set_read_timeout(std::chrono::seconds(3));
    auto r = cli.Get("/healthz");
    if (!r || r->status != 200 || r->body != "ok") return std::chrono::milliseconds(-1);
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  }

  std::unique_ptr<GuardedServer> server_;
  std::thread thread_;
  int port_ = 0;
};

// Clients that send a request a byte at a time (one per 200 ms, each read well within any per-read
// timeout) occupy more connections than there are workers; /healthz still answers at once, and
// each slow request is cut at request_timeout.
TEST_F(GuardedServerTest, SlowClientsDoNotBlockHealthz) {
  ServerLimits l;
  l.workers = 4;
  l.request_timeout = std::chrono::milliseconds(1500);
  Start(l);
  std::vector<int> fds;
  for (int i = 0; i < 32; ++i) fds.push_back(Connect(port_));
  const std::string req = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n";
  std::atomic<bool> done{false};
  std::thread dribble([&] {
    for (size_t i = 0; i < req.size() && !done; ++i) {
      for (int fd : fds) send(fd, &req[i], 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (int i = 0; i < 5; ++i) {
    auto t = Healthz();
    EXPECT_GE(t.count(), 0);
    EXPECT_LT(t.count(), 500);
  }
  // Cut at the deadline: every slow connection is closed by ~1.5 s after its first byte.
  for (int fd : fds) EXPECT_TRUE(ClosedWithin(fd, std::chrono::milliseconds(3000)));
  done = true;
  dribble.join();
  for (int fd : fds) close(fd);
}

// Thousands of idle connections cost no worker; at max_connections the longest idle is closed to
// admit the new one, so a fresh client always gets in.
TEST_F(GuardedServerTest, IdleConnectionsDoNotBlockHealthz) {
  ServerLimits l;
  l.workers = 2;
  l.max_connections = 500;
  Start(l);
  std::vector<int> fds;
  for (int i = 0; i < 2000; ++i) {
    int fd = Connect(port_);
    if (fd >= 0) fds.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (int i = 0; i < 5; ++i) {
    auto t = Healthz();
    EXPECT_GE(t.count(), 0);
    EXPECT_LT(t.count(), 500);
  }
  EXPECT_LE(server_->open_connections(), 500u);
  EXPECT_GT(server_->dropped_connections(), 1000u);
  for (int fd : fds) close(fd);
}

// Endless header lines: the connection is closed once max_header_bytes are spent.
TEST_F(GuardedServerTest, EndlessHeadersAreCut) {
  ServerLimits l;
  l.max_header_bytes = 16 << 10;
  l.max_body_bytes = 16 << 10;
  Start(l);
  int fd = Connect(port_);
  std::string head = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
  send(fd, head.data(), head.size(), MSG_NOSIGNAL);
  size_t sent = 0;
  std::string line = "X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
  std::string block;
  for (int i = 0; i < 100; ++i) block += line;
  for (int i = 0; i < 1000; ++i) {  // ~6 MB unless the server hangs up
    ssize_t n = send(fd, block.data(), block.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN) break;
    if (n > 0) sent += static_cast<size_t>(n);
    if (n < 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(ClosedWithin(fd, std::chrono::milliseconds(2000)));
  EXPECT_LT(sent, size_t{4} << 20);
  close(fd);
  EXPECT_GE(Healthz().count(), 0);
}

// A body above the limit is answered 413; at the limit it is served.
TEST_F(GuardedServerTest, BodyLimit) {
  ServerLimits l;
  l.max_body_bytes = 64 << 10;
  Start(l);
  httplib::Client cli("127.0.0.1", port_);
  auto big = cli.Post("/echo", std::string((64 << 10) + 1, 'x'), "text/plain");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  auto ok = cli.Post("/echo", std::string(64 << 10, 'x'), "text/plain");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->body, std::to_string(64 << 10));
}

// Keep-alive works (several requests on one connection) and pipelined requests are all answered.
TEST_F(GuardedServerTest, KeepAliveAndPipelining) {
  Start({});
  httplib::Client cli("127.0.0.1", port_);
  cli.set_keep_alive(true);
  for (int i = 0; i < 20; ++i) {
    auto r = cli.Get("/healthz");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "ok");
  }
  int fd = Connect(port_);
  std::string two =
      "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n"
      "Connection: close\r\n\r\n";
  send(fd, two.data(), two.size(), MSG_NOSIGNAL);
  std::string got;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 2000) <= 0) break;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  size_t first = got.find("HTTP/1.1 200");
  ASSERT_NE(first, std::string::npos) << got;
  EXPECT_NE(got.find("HTTP/1.1 200", first + 1), std::string::npos) << got;
}

struct Pki {
  PemPair server, client, other;
  Pki() {
    server = *SelfIssuedCertificate({"localhost", "127.0.0.1"});
    client = *SelfIssuedCertificate({"system:kube-scheduler"}, 365, "clientAuth");
    other = *SelfIssuedCertificate({"system:node:evil"}, 365, "clientAuth");
  }
};

// A TLS client with the given protocol ceiling and optional client certificate; true when a GET
// /healthz over it answers.
bool TlsGet(int port, int max_version, const PemPair* cert) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_security_level(ctx, 0);  // let the client offer TLS 1.1 at all
  SSL_CTX_set_min_proto_version(ctx, TLS1_VERSION);
  SSL_CTX_set_max_proto_version(ctx, max_version);
  if (cert) {
    BIO* cb = BIO_new_mem_buf(cert->cert_pem.data(), -1);
    BIO* kb = BIO_new_mem_buf(cert->key_pem.data(), -1);
    X509* x = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
    EVP_PKEY* k = PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr);
    SSL_CTX_use_certificate(ctx, x);
    SSL_CTX_use_PrivateKey(ctx, k);
    // The issuing CA goes along as the chain.
    BIO* ab = BIO_new_mem_buf(cert->ca_pem.data(), -1);
    SSL_CTX_add_extra_chain_cert(ctx, PEM_read_bio_X509(ab, nullptr, nullptr, nullptr));
    X509_free(x);
    EVP_PKEY_free(k);
    BIO_free(cb);
    BIO_free(kb);
    BIO_free(ab);
  }
  int fd = Connect(port);
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  bool ok = false;
  if (SSL_connect(ssl) == 1) {
    std::string req = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    if (SSL_write(ssl, req.data(), static_cast<int>(req.size())) > 0) {
      char buf[1024];
      int n = SSL_read(ssl, buf, sizeof buf - 1);
      ok = n > 0 && std::string(buf, static_cast<size_t>(n)).find("200 OK") != std::string::npos;
    }
  }
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  close(fd);
  return ok;
}

TEST_F(GuardedServerTest, TlsTwelveAtLeast) {
  Pki pki;
  auto ctx = ServerTlsContext(pki.server.cert_pem, pki.server.key_pem);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  Start({}, *ctx);
  EXPECT_FALSE(TlsGet(port_, TLS1_1_VERSION, nullptr));
  EXPECT_TRUE(TlsGet(port_, TLS1_2_VERSION, nullptr));
  EXPECT_TRUE(TlsGet(port_, TLS1_3_VERSION, nullptr));
}

// With a client CA: no certificate, a certificate of another CA, or one of the right CA with the
// wrong name are all refused at the handshake; kube-scheduler's certificate gets in.
TEST_F(GuardedServerTest, ClientCertificatesRequiredAndNamed) {
  Pki pki;
  auto ctx = ServerTlsContext(pki.server.cert_pem, pki.server.key_pem,
                              pki.client.ca_pem + pki.other.ca_pem);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  ServerLimits l;
  l.client_names = {"system:kube-scheduler"};
  Start(l, *ctx);
  Pki stranger;
  EXPECT_FALSE(TlsGet(port_, TLS1_3_VERSION, nullptr));
  EXPECT_FALSE(TlsGet(port_, TLS1_3_VERSION, &stranger.client));  // right name, unknown CA
  EXPECT_FALSE(TlsGet(port_, TLS1_3_VERSION, &pki.other));        // trusted CA, wrong name
  EXPECT_TRUE(TlsGet(port_, TLS1_3_VERSION, &pki.client));
  EXPECT_TRUE(TlsGet(port_, TLS1_2_VERSION, &pki.client));
}

// GET `path` over TLS; the whole response (until the server closes), or "" when the handshake
// fails. `rcvbuf` > 0: a receive buffer that small, and nothing read (the response is left
// unread; the open SSL and socket are handed back in `*kept` for the caller to close).
std::string TlsFetch(int port, const std::string& path, int rcvbuf = 0,
                     std::pair<SSL*, int>* kept = nullptr) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string got;
  SSL* ssl = SSL_new(ctx);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    SSL_set_fd(ssl, fd);
    if (SSL_connect(ssl) == 1) {
      std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
      SSL_write(ssl, req.data(), static_cast<int>(req.size()));
      if (kept) {
        *kept = {ssl, fd};
        SSL_CTX_free(ctx);  // the SSL holds its own reference
        return "sent";
      }
      char buf[16384];
      for (int n; (n = SSL_read(ssl, buf, sizeof buf)) > 0;)
        got.append(buf, static_cast<size_t>(n));
    }
  }
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  close(fd);
  return got;
}

// Clients that ask for a large response over TLS and never read it hold no worker: with one
// worker, three such clients and then a normal client are all served at once (the responses the
// sockets do not take wait in the poller), the normal client gets the whole body, and the stuck
// ones are cut at write_timeout.
TEST_F(GuardedServerTest, ClientsThatNeverReadHoldNoWorker) {
  Pki pki;
  auto ctx = ServerTlsContext(pki.server.cert_pem, pki.server.key_pem);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  ServerLimits l;
  l.workers = 1;
  l.write_timeout = std::chrono::milliseconds(800);
  Start(l, *ctx);
  const std::string big(2 << 20, 'x');
  server_->Get("/big", [&](const httplib::Request&, httplib::Response& r) {
    r.set_content(big, "text/plain");
  });
  std::vector<std::pair<SSL*, int>> stuck(3);
  for (auto& s : stuck) ASSERT_EQ(TlsFetch(port_, "/big", 4096, &s), "sent");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto t0 = Clock::now();
  std::string whole = TlsFetch(port_, "/big");
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  EXPECT_LT(took.count(), 1000) << "the one worker waited on a client that does not read";
  ASSERT_GT(whole.size(), big.size());
  EXPECT_EQ(whole.substr(whole.size() - big.size()), big) << "the body arrived whole";
  EXPECT_TRUE(TlsGet(port_, TLS1_3_VERSION, nullptr));
  // Past write_timeout (and a sweep) the three are closed.
  auto until = Clock::now() + std::chrono::seconds(3);
  while (server_->open_connections() > 0 && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(server_->open_connections(), 0u);
  for (auto& [ssl, fd] : stuck) {
    SSL_free(ssl);
    close(fd);
  }
}

// The probe path is answered by the poller while the only worker is busy; HEAD gets no body, a
// query is the same probe, another path is not; a method outside `methods` is 405 with Allow.
TEST_F(GuardedServerTest, ProbeOnThePollerAndMethods) {
  ServerLimits l;
  l.workers = 1;
  l.methods = {"GET", "HEAD"};
  Start(l);
  server_->SetProbe("/livez", [] { return std::pair<int, std::string>(200, "alive\n"); });
  server_->Get("/slow", [](const httplib::Request&, httplib::Response& r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    r.set_content("late", "text/plain");
  });
  std::thread slow([&] {
    httplib::Client cli("127.0.0.1", port_);
    cli.set_read_timeout(std::chrono::seconds(5));
    EXPECT_TRUE(cli.Get("/slow"));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto raw = [&](const std::string& req) {
    int fd = Connect(port_);
    send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    std::string got;
    char buf[4096];
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 1000) <= 0) break;
      ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    close(fd);
    return got;
  };
  auto t0 = Clock::now();
  std::string get = raw("GET /livez HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count(), 500);
  EXPECT_THAT(get, ::testing::StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(get, HasSubstr("Connection: close"));
  EXPECT_THAT(get, ::testing::EndsWith("\r\n\r\nalive\n"));
  std::string head = raw("HEAD /livez?verbose=1 HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(head, ::testing::StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(head, ::testing::EndsWith("Content-Length: 6\r\nConnection: close\r\n\r\n"));
  std::string post = raw("POST /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_THAT(post,
              ::testing::StartsWith("HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\n"));
  slow.join();
  // Not the probe: routed to the workers (here: no such route).
  EXPECT_THAT(raw("GET /livezz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
              ::testing::StartsWith("HTTP/1.1 404"));
}

// The self-issued pair is a CA and a leaf: the leaf cannot sign (CA:FALSE), the CA verifies it.
TEST(SelfIssued, LeafIsNotACa) {
  auto p = SelfIssuedCertificate({"localhost"});
  ASSERT_TRUE(p.ok());
  BIO* b = BIO_new_mem_buf(p->cert_pem.data(), -1);
  X509* leaf = PEM_read_bio_X509(b, nullptr, nullptr, nullptr);
  BIO_free(b);
  b = BIO_new_mem_buf(p->ca_pem.data(), -1);
  X509* ca = PEM_read_bio_X509(b, nullptr, nullptr, nullptr);
  BIO_free(b);
  ASSERT_TRUE(leaf && ca);
  EXPECT_EQ(X509_check_ca(leaf), 0);
  EXPECT_NE(X509_check_ca(ca), 0);
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  X509_STORE_CTX* sctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(sctx, store, leaf, nullptr);
  EXPECT_EQ(X509_verify_cert(sctx), 1);
  X509_STORE_CTX_free(sctx);
  X509_STORE_free(store);
  X509_free(leaf);
  X509_free(ca);
}

// An encrypted serving key is an error naming the problem, and loading it never asks for a
// passphrase: run with a controlling terminal (a pty), the child must finish without writing a
// prompt to it (OpenSSL's default callback reads the passphrase from /dev/tty and would block).
TEST(Passphrase, EncryptedKeyFailsWithoutPrompting) {
  auto p = SelfIssuedCertificate({"localhost"});
  ASSERT_TRUE(p.ok());
  BIO* kb = BIO_new_mem_buf(p->key_pem.data(), -1);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr);
  BIO_free(kb);
  BIO* out = BIO_new(BIO_s_mem());
  PEM_write_bio_PKCS8PrivateKey(out, key, EVP_aes_256_cbc(), "secret", 6, nullptr, nullptr);
  EVP_PKEY_free(key);
  char* data = nullptr;
  long n = BIO_get_mem_data(out, &data);
  std::string encrypted(data, static_cast<size_t>(n));
  BIO_free(out);
  ASSERT_THAT(encrypted, HasSubstr("ENCRYPTED"));

  char dir[] = "/tmp/gpulet-passphrase-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string cert_file = std::string(dir) + "/tls.crt", key_file = std::string(dir) + "/tls.key";
  FILE* f = fopen(cert_file.c_str(), "w");
  fputs(p->cert_pem.c_str(), f);
  fclose(f);
  f = fopen(key_file.c_str(), "w");
  fputs(encrypted.c_str(), f);
  fclose(f);

  int master = -1;
  pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto ctx = ServerTlsContext(p->cert_pem, encrypted);
    auto reloader = CertReloader::Load(cert_file, key_file);
    bool good = !ctx.ok() && !reloader.ok() &&
                std::string(ctx.status().message()).find("passphrase") != std::string::npos &&
                std::string(reloader.status().message()).find("passphrase") != std::string::npos;
    _exit(good ? 0 : 1);
  }
  std::string tty;
  auto deadline = Clock::now() + std::chrono::seconds(5);
  int status = -1;
  while (Clock::now() < deadline) {
    pollfd pf{master, POLLIN, 0};
    if (poll(&pf, 1, 50) > 0) {
      char buf[256];
      ssize_t r = read(master, buf, sizeof buf);
      if (r > 0) tty.append(buf, static_cast<size_t>(r));
    }
    if (waitpid(pid, &status, WNOHANG) == pid) break;
  }
  if (waitpid(pid, &status, WNOHANG) == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    ADD_FAILURE() << "loading an encrypted key blocked (prompt on the tty: \"" << tty << "\")";
  } else {
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_THAT(tty, ::testing::Not(HasSubstr("pass phrase")));
  close(master);
  std::filesystem::remove_all(dir);
}

TEST(UntrustedJson, DepthAndSyntax) {
  EXPECT_EQ(JsonDepth(R"({"a":[1,{"b":"[[[["}]})", 100), 3);
  EXPECT_EQ(JsonDepth(R"(["\"[[[["])", 100), 1);
  auto deep = ParseUntrustedJson(std::string(100000, '[') + std::string(100000, ']'));
  ASSERT_FALSE(deep.ok());
  EXPECT_THAT(std::string(deep.status().message()), HasSubstr("deeper than 64"));
  EXPECT_TRUE(ParseUntrustedJson(std::string(64, '[') + std::string(64, ']')).ok());
  EXPECT_FALSE(ParseUntrustedJson("{").ok());
  auto ok = ParseUntrustedJson(R"({"Pod":{}})");
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->value.contains("Pod"));
}

// The parse budget: while one large body is held in parsed form, another that would exceed the
// budget waits, then is refused; once released it goes through.
TEST(UntrustedJson, BudgetBoundsConcurrentParses) {
  SetUntrustedJsonBudget(1 << 20);
  std::string big = "[" + std::string((600 << 10), ' ') + "]";
  auto first = ParseUntrustedJson(big);
  ASSERT_TRUE(first.ok());
  auto second = ParseUntrustedJson(big, 64, std::chrono::milliseconds(100));
  EXPECT_TRUE(absl::IsResourceExhausted(second.status())) << second.status();
  first->lease.reset();
  EXPECT_TRUE(ParseUntrustedJson(big, 64, std::chrono::milliseconds(100)).ok());
  SetUntrustedJsonBudget(8 << 20);
}

}  // namespace
}  // namespace gpulet::http
