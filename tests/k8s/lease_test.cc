// Leader election (k8s/lease.h) against the fake API server over real HTTP, with a fake clock:
// one holder at a time, takeover only after the lease duration as observed locally, release on
// Stop, optimistic concurrency between racing candidates, and the option checks.
#include "k8s/lease.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>

#include "k8s/client.h"
#include "testing/apiserver/fake_apiserver.h"
#include "testing/common/fake_clock.h"

namespace gpulet::k8s {
namespace {

using ::testing::HasSubstr;

class LeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.Start());
    Config c;
    c.server = server_.url();
    c.max_attempts = 1;
    client_ = std::make_unique<Client>(c);
  }
  LeaseOptions Options(const std::string& who) {
    LeaseOptions o;
    o.ns = "gpulet-system";
    o.name = "gpulet-scheduler";
    o.identity = who;
    return o;  // 15 s lease, 10 s renew deadline, 2 s retry
  }
  json Lease() {
    json l;
    EXPECT_TRUE(server_.GetObject("leases", "gpulet-system", "gpulet-scheduler", &l));
    return l;
  }
  testing::FakeApiServer server_;
  std::unique_ptr<Client> client_;
  testing::FakeClock clock_;
};

TEST_F(LeaseTest, OneHolderTakeoverOnlyAfterTheLeaseDuration) {
  LeaderElector a(client_.get(), Options("a"), nullptr, nullptr, &clock_);
  LeaderElector b(client_.get(), Options("b"), nullptr, nullptr, &clock_);
  EXPECT_TRUE(a.TryAcquireOrRenew());  // creates the Lease
  EXPECT_EQ(Lease()["spec"]["holderIdentity"], "a");
  EXPECT_EQ(Lease()["spec"]["leaseDurationSeconds"], 15);
  EXPECT_FALSE(b.TryAcquireOrRenew());  // b observes a's lease now
  clock_.Advance(std::chrono::seconds(10));
  EXPECT_TRUE(a.TryAcquireOrRenew());  // a renews: b sees the renewTime change
  clock_.Advance(std::chrono::seconds(10));
  EXPECT_FALSE(b.TryAcquireOrRenew());  // 20 s since b first looked, but only 10 since a renewed
  clock_.Advance(std::chrono::seconds(16));  // a is gone: no renewal for longer than the lease
  EXPECT_TRUE(b.TryAcquireOrRenew());
  json l = Lease();
  EXPECT_EQ(l["spec"]["holderIdentity"], "b");
  EXPECT_EQ(l["spec"]["leaseTransitions"], 1);
  EXPECT_FALSE(a.TryAcquireOrRenew());  // a comes back: b holds it now
}

TEST_F(LeaseTest, ReleaseHandsOverAtOnce) {
  LeaderElector a(client_.get(), Options("a"), nullptr, nullptr, &clock_);
  LeaderElector b(client_.get(), Options("b"), nullptr, nullptr, &clock_);
  ASSERT_TRUE(a.TryAcquireOrRenew());
  EXPECT_FALSE(b.TryAcquireOrRenew());
  a.Release();
  EXPECT_EQ(Lease()["spec"]["holderIdentity"], "");
  EXPECT_TRUE(b.TryAcquireOrRenew());  // no waiting for the lease duration
  a.Release();                         // not a's any more: left alone
  EXPECT_EQ(Lease()["spec"]["holderIdentity"], "b");
}

// Two candidates that both read the expired Lease: the PUT carries the resourceVersion read, so
// only the first write wins.
TEST_F(LeaseTest, RacingCandidatesCannotBothWin) {
  LeaderElector a(client_.get(), Options("a"), nullptr, nullptr, &clock_);
  ASSERT_TRUE(a.TryAcquireOrRenew());
  json stale = Lease();
  LeaderElector b(client_.get(), Options("b"), nullptr, nullptr, &clock_);
  a.Release();
  ASSERT_TRUE(b.TryAcquireOrRenew());
  // c writes with the version read before b's takeover: refused.
  stale["spec"]["holderIdentity"] = "c";
  auto put = client_->Call(
      "PUT", "/apis/coordination.k8s.io/v1/namespaces/gpulet-system/leases/gpulet-scheduler",
      &stale);
  EXPECT_TRUE(absl::IsAborted(put.status())) << put.status();
  EXPECT_EQ(Lease()["spec"]["holderIdentity"], "b");
}

// A Lease edited into the wrong types (by hand) neither crashes a candidate nor blocks it: the
// fields read as absent, so it is taken over as a Lease without a holder.
TEST_F(LeaseTest, WrongTypesReadAsAbsent) {
  LeaderElector a(client_.get(), Options("a"), nullptr, nullptr, &clock_);
  ASSERT_TRUE(a.TryAcquireOrRenew());
  json l = Lease();
  l["spec"]["holderIdentity"] = 7;
  l["spec"]["renewTime"] = json::array();
  l["spec"]["leaseTransitions"] = "many";
  ASSERT_TRUE(server_.UpdateObject("leases", l));
  LeaderElector b(client_.get(), Options("b"), nullptr, nullptr, &clock_);
  EXPECT_TRUE(b.TryAcquireOrRenew());
  EXPECT_EQ(Lease()["spec"]["holderIdentity"], "b");
  EXPECT_EQ(Lease()["spec"]["leaseTransitions"], 1);
  a.Release();  // not a's: left alone
  EXPECT_EQ(Lease()["spec"]["holderIdentity"], "b");
}

// The loop on real time with short periods: callbacks in order, Stop releases, and the second
// candidate then leads.
TEST_F(LeaseTest, LoopLeadsAndHandsOverOnStop) {
  auto fast = [&](const std::string& who) {
    LeaseOptions o = Options(who);
    o.lease_duration = std::chrono::milliseconds(3000);
    o.renew_deadline = std::chrono::milliseconds(2000);
    o.retry_period = std::chrono::milliseconds(50);
    return o;
  };
  std::atomic<int> a_started{0}, a_stopped{0}, b_started{0};
  auto a = std::make_unique<LeaderElector>(
      client_.get(), fast("a"), [&] { ++a_started; }, [&] { ++a_stopped; });
  a->Start();
  for (int i = 0; i < 200 && !a->is_leader(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(a->is_leader());
  LeaderElector b(
      client_.get(), fast("b"), [&] { ++b_started; }, nullptr);
  b.Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(b.is_leader());
  auto t0 = std::chrono::steady_clock::now();
  a->Stop();
  EXPECT_EQ(a_started, 1);
  EXPECT_EQ(a_stopped, 1);
  for (int i = 0; i < 200 && !b.is_leader(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(b.is_leader());
  // Well under the 3 s lease duration: the release handed it over.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500));
  EXPECT_EQ(b_started, 1);
}

// The API server unreachable: a leader gives up after the renew deadline, not before.
TEST_F(LeaseTest, LeaderAbdicatesWhenItCannotRenew) {
  LeaseOptions o = Options("a");
  o.lease_duration = std::chrono::milliseconds(1500);
  o.renew_deadline = std::chrono::milliseconds(600);
  o.retry_period = std::chrono::milliseconds(50);
  std::atomic<int> stopped{0};
  LeaderElector a(client_.get(), o, nullptr, [&] { ++stopped; });
  a.Start();
  for (int i = 0; i < 200 && !a.is_leader(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(a.is_leader());
  server_.InjectFailures(1000000, 503);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(a.is_leader());  // within the renew deadline
  for (int i = 0; i < 200 && a.is_leader(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(a.is_leader());
  EXPECT_EQ(stopped, 1);
  server_.InjectFailures(0, 503);
  a.Stop();
}

TEST(LeaseOptionsTest, Checked) {
  LeaseOptions o;
  EXPECT_THAT(ValidateLeaseOptions(o).message(), HasSubstr("no Lease name"));
  o.name = "x";
  EXPECT_THAT(ValidateLeaseOptions(o).message(), HasSubstr("no identity"));
  o.identity = "me";
  EXPECT_TRUE(ValidateLeaseOptions(o).ok());
  o.renew_deadline = o.lease_duration;
  EXPECT_THAT(ValidateLeaseOptions(o).message(), HasSubstr("longer than the renew deadline"));
  o.renew_deadline = o.retry_period;
  EXPECT_THAT(ValidateLeaseOptions(o).message(), HasSubstr("longer than the retry period"));
  o.retry_period = std::chrono::milliseconds(0);
  EXPECT_THAT(ValidateLeaseOptions(o).message(), HasSubstr("must be positive"));
}

}  // namespace
}  // namespace gpulet::k8s
