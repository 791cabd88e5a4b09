// `gpulet scheduler` renews its self-issued webhook certificate while it runs: the real binary
// against the fake API server, the certificate read from real TLS handshakes.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "http/tls.h"
#include "testing/apiserver/fake_apiserver.h"
#include "testing/net/loopback.h"
#include "testing/process/spawn.h"

namespace gpulet {
namespace {
using testing_net::FreePort;

using std::chrono::milliseconds;

// The PEM certificate the server presents in a fresh handshake; empty when none completes.
std::string ServedCertificate(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string pem;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    if (SSL_connect(ssl) == 1) {
      X509* cert = SSL_get1_peer_certificate(ssl);
      BIO* bio = BIO_new(BIO_s_mem());
      if (cert && PEM_write_bio_X509(bio, cert) == 1) {
        char* data = nullptr;
        long n = BIO_get_mem_data(bio, &data);
        pem.assign(data, static_cast<size_t>(n));
      }
      BIO_free(bio);
      X509_free(cert);
      SSL_shutdown(ssl);
    }
    SSL_free(ssl);
    SSL_CTX_free(ctx);
  }
  close(fd);
  return pem;
}

struct SchedulerCert : ::testing::Test {
  void SetUp() override {
    ASSERT_TRUE(api_.Start());
    char tmpl[] = "/tmp/gpulet-sched-cert-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ + "/kubeconfig") << api_.Kubeconfig();
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }
  // Starts the scheduler (webhook on a free port) and returns the first certificate it serves.
  std::string Start(const std::vector<std::string>& extra) {
    port_ = FreePort();
    std::vector<std::string> argv = {std::string(GPULET_BINARY_DIR) + "/bin/gpulet",
                                     "scheduler",
                                     "--kubeconfig",
                                     dir_ + "/kubeconfig",
                                     "--extender-listen",
                                     "127.0.0.1:0",
                                     "--webhook-listen",
                                     "127.0.0.1:" + std::to_string(port_),
                                     "--tls-renew-check",
                                     "100ms"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    pid_ = testing_process::SpawnLogged(argv, dir_ + "/scheduler.log");
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    std::string pem;
    while (pem.empty() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(50));
      pem = ServedCertificate(port_);
    }
    return pem;
  }
  std::string Log() {
    std::ifstream in(dir_ + "/scheduler.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  int Stop() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  testing::FakeApiServer api_;
  std::string dir_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// With a renewal window longer than the certificate's one-year life, every check renews it: new
// handshakes get the new certificate, which is itself far from expiry.
TEST_F(SchedulerCert, SelfIssuedCertificateIsRenewedWhileServing) {
  std::string first = Start({"--tls-renew-before", "9000h"});
  ASSERT_FALSE(first.empty()) << Log();
  std::string later = first;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (later == first && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(100));
    later = ServedCertificate(port_);
  }
  EXPECT_NE(later, first) << Log();
  EXPECT_FALSE(later.empty());
  EXPECT_FALSE(http::CertificateExpiresWithin(later, std::chrono::hours(24 * 300)));
  EXPECT_NE(Log().find("webhook certificate renewed"), std::string::npos) << Log();
  EXPECT_EQ(Stop(), 0) << Log();
}

// With the default window (30 days) a fresh certificate is kept: the same one is served across
// many checks.
TEST_F(SchedulerCert, FreshCertificateIsKept) {
  std::string first = Start({});
  ASSERT_FALSE(first.empty()) << Log();
  std::this_thread::sleep_for(milliseconds(600));
  EXPECT_EQ(ServedCertificate(port_), first);
  EXPECT_EQ(Log().find("renewed"), std::string::npos) << Log();
  EXPECT_EQ(Stop(), 0) << Log();
}

}  // namespace
}  // namespace gpulet
