// The webhook's serving certificate out of the process (scheduler/serving_cert.h): where the pair
// comes from, when a self-issued pair is renewed, and what renewal writes.
#include "scheduler/serving_cert.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/fs.h"
#include "gtest/gtest.h"
#include "testing/apiserver/fake_apiserver.h"
#include "testing/common/fake_clock.h"

namespace gpulet::scheduler {
namespace {

std::string Read(const std::string& path) { return ReadFileToString(path).value_or(""); }

ServingCertOptions SelfIssued(std::chrono::hours renew_before) {
  ServingCertOptions o;
  o.names = {"localhost", "127.0.0.1"};
  o.renew_before = renew_before;
  return o;
}

// A self-issued pair is written to a private directory (key 0600) that goes with the object.
TEST(ServingCert, SelfIssuedPairIsKeptInPrivateFilesRemovedAtTheEnd) {
  std::string dir;
  {
    auto c = ServingCert::Create(SelfIssued(std::chrono::hours(24)), nullptr);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE((*c)->renews());
    ASSERT_FALSE((*c)->cert_file().empty());
    EXPECT_EQ(Read((*c)->cert_file()), (*c)->pem().cert_pem);
    EXPECT_EQ(Read((*c)->key_file()), (*c)->pem().key_pem);
    EXPECT_FALSE((*c)->pem().ca_pem.empty());
    struct stat st {};
    ASSERT_EQ(stat((*c)->key_file().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    dir = std::filesystem::path((*c)->cert_file()).parent_path();
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// Far from expiry (one-year pair, 30-day window) nothing is renewed.
TEST(ServingCert, PairFarFromExpiryIsKept) {
  auto c = ServingCert::Create(SelfIssued(std::chrono::hours(24 * 30)), nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  std::string before = Read((*c)->cert_file());
  auto r = (*c)->RenewOnce();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(*r);
  EXPECT_EQ(Read((*c)->cert_file()), before);
}

// A window longer than the pair's life renews at every check: new, matching files each time.
TEST(ServingCert, PairNearExpiryIsReplacedInItsFiles) {
  auto c = ServingCert::Create(SelfIssued(std::chrono::hours(24 * 400)), nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  std::string first = Read((*c)->cert_file());
  auto r = (*c)->RenewOnce();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(*r);
  std::string second = Read((*c)->cert_file());
  EXPECT_NE(second, first);
  EXPECT_NE(Read((*c)->key_file()), (*c)->pem().key_pem);  // the key went with it
  EXPECT_EQ((*c)->pem().cert_pem, first);                  // pem() stays the pair first served
  r = (*c)->RenewOnce();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(*r);
  EXPECT_NE(Read((*c)->cert_file()), second);
}

// The renewal thread does what RenewOnce does, on its interval, and stops with the object.
TEST(ServingCert, RenewalThreadRenewsOnItsInterval) {
  auto c = ServingCert::Create(SelfIssued(std::chrono::hours(24 * 400)), nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  std::string first = Read((*c)->cert_file());
  (*c)->StartRenewal(std::chrono::milliseconds(10));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (Read((*c)->cert_file()) == first && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(Read((*c)->cert_file()), first);
  c->reset();  // joins the thread
}

// Given files are served as they are and never renewed here (cert-manager renews them).
TEST(ServingCert, GivenFilesAreServedNotRenewed) {
  auto issued = http::SelfIssuedCertificate({"localhost"});
  ASSERT_TRUE(issued.ok());
  std::string dir = ::testing::TempDir() + "/serving_cert_given";
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(WriteFileAtomic(dir + "/tls.crt", issued->cert_pem).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/tls.key", issued->key_pem).ok());
  ServingCertOptions o = SelfIssued(std::chrono::hours(24 * 400));
  o.cert_file = dir + "/tls.crt";
  o.key_file = dir + "/tls.key";
  auto c = ServingCert::Create(o, nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE((*c)->renews());
  EXPECT_EQ((*c)->cert_file(), o.cert_file);
  EXPECT_EQ((*c)->pem().cert_pem, issued->cert_pem);
  auto r = (*c)->RenewOnce();
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  std::filesystem::remove_all(dir);
}

// One of the two files alone is a configuration error naming both flags.
TEST(ServingCert, CertFileWithoutKeyIsRefused) {
  ServingCertOptions o = SelfIssued(std::chrono::hours(1));
  o.cert_file = "/nonexistent/tls.crt";
  auto c = ServingCert::Create(o, nullptr);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--tls-key-file"), std::string::npos) << c.status();
}

// A Secret name that is no NAMESPACE/NAME, or no API server, is refused before any call.
TEST(ServingCert, BadSecretNameIsRefused) {
  for (const char* secret : {"just-a-name", "Bad_NS/name", "a/b/c"}) {
    ServingCertOptions o = SelfIssued(std::chrono::hours(1));
    o.secret = secret;
    auto c = ServingCert::Create(o, nullptr);
    ASSERT_FALSE(c.ok()) << secret;
    EXPECT_NE(c.status().message().find("--tls-secret"), std::string::npos) << c.status();
  }
}

// An API server that cannot store the Secret (the fake serves no secrets) fails the start with
// the API's error instead of serving a pair that is nowhere stored.
TEST(ServingCert, SecretThatCannotBeStoredFailsTheStart) {
  testing::FakeApiServer api;
  ASSERT_TRUE(api.Start());
  k8s::Config cfg;
  cfg.server = api.url();
  cfg.max_attempts = 1;
  k8s::Client client(cfg);
  ServingCertOptions o = SelfIssued(std::chrono::hours(1));
  o.secret = "gpulet-system/webhook-tls";
  auto c = ServingCert::Create(o, &client);
  EXPECT_FALSE(c.ok());
}

// Renewal follows the options' clock: a one-year pair is kept until the clock reaches its
// 30-day window, then replaced, with no waiting (the expiry check used to read the system time).
TEST(ServingCert, RenewsWhenTheClockReachesTheWindow) {
  gpulet::testing::FakeClock clock(gpulet::testing::FakeClock::TimePoint{},
                                   RealClock()->UnixSeconds());
  ServingCertOptions o = SelfIssued(std::chrono::hours(24 * 30));
  o.clock = &clock;
  auto c = ServingCert::Create(o, nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  auto r = (*c)->RenewOnce();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(*r);
  clock.Advance(std::chrono::hours(24 * 330));  // 35 days left: still outside the window
  r = (*c)->RenewOnce();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(*r);
  clock.Advance(std::chrono::hours(24 * 10));  // 25 days left
  r = (*c)->RenewOnce();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(*r);
}

// The window is not rounded to hours (--tls-renew-before 90m was 1h in the library): 80 minutes
// before expiry a 90-minute window renews.
TEST(ServingCert, WindowBelowAnHourIsKeptExactly) {
  gpulet::testing::FakeClock clock(gpulet::testing::FakeClock::TimePoint{},
                                   RealClock()->UnixSeconds());
  ServingCertOptions o = SelfIssued(std::chrono::hours(1));
  o.renew_before = std::chrono::minutes(90);
  o.clock = &clock;
  auto c = ServingCert::Create(o, nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  clock.Advance(std::chrono::hours(24 * 365) - std::chrono::minutes(80));
  auto r = (*c)->RenewOnce();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(*r);
}

}  // namespace
}  // namespace gpulet::scheduler
