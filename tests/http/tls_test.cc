// CertReloader: a real HTTPS server (cpp-httplib over OpenSSL) whose certificate files are replaced
// while it serves. New handshakes get the new certificate, a request in flight and a kept-alive
// connection finish on the old one, and bad files are refused with the old pair still serving.
#include "http/tls.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "httplib.h"
#include "testing/common/fake_clock.h"

namespace gpulet::http {
namespace {

namespace fs = std::filesystem;

void Write(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  fs::rename(tmp, path);  // as the kubelet swaps a Secret volume: atomically
}

class TlsReloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (fs::temp_directory_path() / "gpulet-tls-XXXXXX").string();
    ASSERT_NE(::mkdtemp(t.data()), nullptr);
    dir_ = t;
    auto a = SelfIssuedCertificate({"localhost", "127.0.0.1"});
    auto b = SelfIssuedCertificate({"localhost", "127.0.0.1"});
    ASSERT_TRUE(a.ok() && b.ok());
    a_ = *a;
    b_ = *b;
    for (auto [name, pem] : {std::pair{"a.crt", a_.ca_pem}, {"b.crt", b_.ca_pem}})
      Write(dir_ + "/" + name, pem);
    cert_ = dir_ + "/tls.crt";
    key_ = dir_ + "/tls.key";
    Write(cert_, a_.cert_pem);
    Write(key_, a_.key_pem);
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
    fs::remove_all(dir_);
  }
  // Serves /ok and /slow (which waits for `release_`) with the reloader installed.
  void Serve(CertReloader* reloader) {
    server_ = std::make_unique<httplib::SSLServer>(cert_.c_str(), key_.c_str());
    ASSERT_TRUE(server_->is_valid());
    reloader->Install(server_->ssl_context());
    server_->Get("/ok", [](const httplib::Request&, httplib::Response& r) {
      r.set_content("ok", "text/plain");
    });
    server_->Get("/slow", [this](const httplib::Request&, httplib::Response& r) {
      entered_ = true;
      while (!release_) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      r.set_content("slow", "text/plain");
    });
    port_ = server_->bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    thread_ = std::thread([this] { server_->listen_after_bind(); });
    while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Loads pair a from tls.crt/tls.key and serves with it; the reloader outlives the server.
  CertReloader* Start(std::chrono::milliseconds interval, Clock* clock = RealClock()) {
    auto r = CertReloader::Load(cert_, key_, interval, clock);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return nullptr;
    reloader_ = *std::move(r);
    Serve(reloader_.get());
    return reloader_.get();
  }
  std::unique_ptr<httplib::SSLClient> Client(const std::string& ca) {
    auto c = std::make_unique<httplib::SSLClient>("127.0.0.1", port_);
    c->set_ca_cert_path((dir_ + "/" + ca).c_str());
    c->enable_server_certificate_verification(true);
    c->set_connection_timeout(5);
    c->set_read_timeout(10);
    return c;
  }
  std::string dir_, cert_, key_;
  PemPair a_, b_;
  std::unique_ptr<CertReloader> reloader_;
  std::unique_ptr<httplib::SSLServer> server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<bool> entered_{false}, release_{false};
};

// The whole rotation: in flight and kept-alive requests survive, new handshakes see the new pair.
TEST_F(TlsReloadTest, RotationKeepsInFlightRequestsAndServesTheNewCertificate) {
  auto reloader = Start(std::chrono::milliseconds(0));
  ASSERT_NE(reloader, nullptr);

  auto kept = Client("a.crt");
  kept->set_keep_alive(true);
  ASSERT_EQ(kept->Get("/ok")->status, 200);
  auto in_flight_client = Client("a.crt");
  std::string in_flight = "not done";
  std::thread slow([&] {
    auto r = in_flight_client->Get("/slow");
    in_flight = r ? r->body : "dropped: " + httplib::to_string(r.error());
  });
  while (!entered_) std::this_thread::sleep_for(std::chrono::milliseconds(5));

  Write(key_, b_.key_pem);
  Write(cert_, b_.cert_pem);
  auto fresh = Client("b.crt")->Get("/ok");
  ASSERT_TRUE(fresh) << httplib::to_string(fresh.error());
  EXPECT_EQ(fresh->status, 200);
  EXPECT_EQ(reloader->reloads(), 1);
  EXPECT_EQ(reloader->cert_pem(), b_.cert_pem);
  EXPECT_FALSE(Client("a.crt")->Get("/ok")) << "a new handshake must not get the old certificate";
  auto again = kept->Get("/ok");
  ASSERT_TRUE(again) << "the kept-alive connection was dropped: "
                     << httplib::to_string(again.error());
  EXPECT_EQ(again->status, 200);

  release_ = true;
  slow.join();
  EXPECT_EQ(in_flight, "slow") << "the request in flight during the rotation must finish";
}

// The files are looked at again only once check_interval has passed on the reloader's clock:
// while a test clock stands still a rotated pair is not taken, one interval later it is.
TEST_F(TlsReloadTest, ChecksFilesOnItsClocksInterval) {
  gpulet::testing::FakeClock clock;
  auto reloader = Start(std::chrono::hours(1), &clock);
  ASSERT_NE(reloader, nullptr);
  Write(key_, b_.key_pem);
  Write(cert_, b_.cert_pem);
  auto before = Client("a.crt")->Get("/ok");
  ASSERT_TRUE(before) << httplib::to_string(before.error());
  EXPECT_EQ(reloader->reloads(), 0);
  clock.Advance(std::chrono::hours(1));
  auto after = Client("b.crt")->Get("/ok");
  ASSERT_TRUE(after) << httplib::to_string(after.error());
  EXPECT_EQ(reloader->reloads(), 1);
}

// Files that do not parse or do not match are refused: the old pair keeps serving, the error names
// the file, and the next good pair is taken.
TEST_F(TlsReloadTest, BadFilesAreRefusedAndTheOldPairKeepsServing) {
  auto reloader = Start(std::chrono::milliseconds(0));
  ASSERT_NE(reloader, nullptr);

  Write(cert_, "not a certificate\n");
  auto r = Client("a.crt")->Get("/ok");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_NE(reloader->last_error().find(cert_ + ": no PEM certificate"), std::string::npos)
      << reloader->last_error();
  Write(cert_, b_.cert_pem);  // key still a's: a mismatched pair
  EXPECT_FALSE(reloader->ReloadIfChanged().ok());
  EXPECT_NE(reloader->last_error().find("does not hold the private key"), std::string::npos);
  EXPECT_EQ(Client("a.crt")->Get("/ok")->status, 200);
  EXPECT_EQ(reloader->reloads(), 0);

  Write(key_, b_.key_pem);
  EXPECT_EQ(Client("b.crt")->Get("/ok")->status, 200);
  EXPECT_EQ(reloader->reloads(), 1);
  EXPECT_EQ(reloader->last_error(), "");
}

// Loading names the missing or broken file; checks are rate-limited by the interval.
TEST_F(TlsReloadTest, LoadErrorsAndCheckInterval) {
  auto missing = CertReloader::Load(dir_ + "/none.crt", dir_ + "/none.key");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("none.crt"), std::string::npos) << missing.status();
  Write(dir_ + "/bad.key", "garbage");
  auto bad = CertReloader::Load(dir_ + "/a.crt", dir_ + "/bad.key");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.key"), std::string::npos) << bad.status();

  auto reloader = Start(std::chrono::hours(1));
  ASSERT_NE(reloader, nullptr);
  Write(key_, b_.key_pem);
  Write(cert_, b_.cert_pem);
  EXPECT_EQ(Client("a.crt")->Get("/ok")->status, 200) << "not checked again within the interval";
  EXPECT_EQ(reloader->reloads(), 0);
}

// Renewal decision for self-issued certificates: near expiry or unreadable means renew.
TEST(CertificateExpiry, NearExpiryOrUnreadableMeansRenew) {
  auto short_lived = SelfIssuedCertificate({"localhost"}, 10);
  auto long_lived = SelfIssuedCertificate({"localhost"}, 365);
  ASSERT_TRUE(short_lived.ok() && long_lived.ok());
  const auto month = std::chrono::hours(24 * 30);
  EXPECT_TRUE(CertificateExpiresWithin(short_lived->cert_pem, month));
  EXPECT_FALSE(CertificateExpiresWithin(short_lived->cert_pem, std::chrono::hours(24 * 9)));
  EXPECT_FALSE(CertificateExpiresWithin(long_lived->cert_pem, month));
  EXPECT_TRUE(CertificateExpiresWithin("not a certificate", month));
  EXPECT_TRUE(CertificateExpiresWithin("", month));
  // Measured from the given clock's now: eleven months on, the one-year pair is within a month.
  gpulet::testing::FakeClock later(Clock::TimePoint{},
                                   RealClock()->UnixSeconds() + int64_t{24 * 3600} * 340);
  EXPECT_TRUE(CertificateExpiresWithin(long_lived->cert_pem, month, later));
}

}  // namespace
// A stored certificate is kept only while it names every name the server answers to.
TEST(Tls, CertificateCoversItsNamesOnly) {
  auto p = SelfIssuedCertificate({"localhost", "127.0.0.1", "gpulet-scheduler.gpulet-system.svc"});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(CertificateCovers(p->cert_pem, {"gpulet-scheduler.gpulet-system.svc", "127.0.0.1"}));
  EXPECT_TRUE(CertificateCovers(p->cert_pem, {}));
  EXPECT_FALSE(CertificateCovers(p->cert_pem, {"gpulet-scheduler-extender.gpulet-system.svc"}));
  EXPECT_FALSE(CertificateCovers(p->cert_pem, {"10.0.0.1"}));
  EXPECT_FALSE(CertificateCovers("not a certificate", {"localhost"}));
}

}  // namespace gpulet::http
