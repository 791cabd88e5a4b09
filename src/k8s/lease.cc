#include "k8s/lease.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace gpulet::k8s {
namespace {

// metav1.MicroTime as the API server writes it: RFC 3339 with microseconds, UTC.
std::string MicroTimeNow() {
  return absl::FormatTime("%Y-%m-%d%ET%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone());
}

// A string field of the Lease's spec, "" when absent or of another type.
std::string Text(const json& spec, const char* key) {
  auto it = spec.find(key);
  return it != spec.end() && it->is_string() ? it->get<std::string>() : std::string();
}

int64_t Seconds(std::chrono::milliseconds d) {
  return std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::seconds>(d).count());
}

}  // namespace

absl::Status ValidateLeaseOptions(const LeaseOptions& o) {
  if (o.name.empty()) return absl::InvalidArgumentError("leader election: no Lease name");
  if (o.identity.empty()) return absl::InvalidArgumentError("leader election: no identity");
  if (o.retry_period.count() <= 0) {
    return absl::InvalidArgumentError("leader election: the retry period must be positive");
  }
  if (o.renew_deadline <= o.retry_period) {
    return absl::InvalidArgumentError(
        "leader election: the renew deadline must be longer than the retry period");
  }
  if (o.lease_duration <= o.renew_deadline) {
    return absl::InvalidArgumentError(
        "leader election: the lease duration must be longer than the renew deadline");
  }
  return absl::OkStatus();
}

LeaderElector::LeaderElector(Client* api, LeaseOptions options, std::function<void()> on_start,
                             std::function<void()> on_stop, Clock* clock)
    : api_(api),
      options_(std::move(options)),
      on_start_(std::move(on_start)),
      on_stop_(std::move(on_stop)),
      clock_(clock),
      path_(absl::StrCat("/apis/coordination.k8s.io/v1/namespaces/", options_.ns, "/leases/",
                         options_.name)) {}

LeaderElector::~LeaderElector() { Stop(); }

bool LeaderElector::TryAcquireOrRenew() {
  const std::string now = MicroTimeNow();
  auto got = api_->Call("GET", path_);
  const bool exists = got.ok();
  if (!exists && !absl::IsNotFound(got.status())) {
    spdlog::warn("lease {}/{}: {}", options_.ns, options_.name,
                 std::string(got.status().message()));
    return false;
  }
  json lease = exists ? std::move(*got)
                      : json{{"apiVersion", "coordination.k8s.io/v1"},
                             {"kind", "Lease"},
                             {"metadata", {{"name", options_.name}, {"namespace", options_.ns}}}};
  if (!lease.is_object()) return false;
  json& spec = lease["spec"];
  if (!spec.is_object()) spec = json::object();
  std::string holder = Text(spec, "holderIdentity");
  std::string renew = Text(spec, "renewTime");
  if (holder != observed_holder_ || renew != observed_renew_) {
    observed_holder_ = holder;
    observed_renew_ = renew;
    observed_at_ = clock_->Now();
  }
  int64_t duration_s = Seconds(options_.lease_duration);
  if (auto d = spec.find("leaseDurationSeconds"); d != spec.end() && d->is_number_integer()) {
    duration_s = std::clamp<int64_t>(d->get<int64_t>(), 1, 3600);
  }
  if (!holder.empty() && holder != options_.identity &&
      clock_->Now() < observed_at_ + std::chrono::seconds(duration_s)) {
    return false;  // somebody else's, and alive as far as this process has seen
  }
  if (holder != options_.identity) {
    spec["acquireTime"] = now;
    auto t = spec.find("leaseTransitions");
    int64_t before = t != spec.end() && t->is_number_integer() ? t->get<int64_t>() : 0;
    spec["leaseTransitions"] = exists ? before + 1 : 0;
  }
  spec["holderIdentity"] = options_.identity;
  spec["leaseDurationSeconds"] = Seconds(options_.lease_duration);
  spec["renewTime"] = now;
  // The PUT carries the resourceVersion just read: a candidate that wrote in between wins (as
  // the first of two creates does).
  auto wrote = exists ? api_->Call("PUT", path_, &lease)
                      : api_->Call("POST",
                                   absl::StrCat("/apis/coordination.k8s.io/v1/namespaces/",
                                                options_.ns, "/leases"),
                                   &lease);
  if (!wrote.ok()) {
    spdlog::debug("lease {}: {}: {}", options_.name, exists ? "update" : "create",
                  std::string(wrote.status().message()));
    return false;
  }
  observed_holder_ = options_.identity;
  observed_renew_ = now;
  observed_at_ = last_renew_ = clock_->Now();
  return true;
}

void LeaderElector::Release() {
  auto got = api_->Call("GET", path_);
  if (!got.ok()) return;
  json lease = std::move(*got);
  if (!lease.is_object() || !lease["spec"].is_object() ||
      Text(lease["spec"], "holderIdentity") != options_.identity) {
    return;
  }
  lease["spec"]["holderIdentity"] = "";
  lease["spec"]["leaseDurationSeconds"] = 1;
  lease["spec"]["renewTime"] = MicroTimeNow();
  if (auto put = api_->Call("PUT", path_, &lease); !put.ok()) {
    spdlog::warn("lease {}/{}: release: {}", options_.ns, options_.name,
                 std::string(put.status().message()));
  } else {
    spdlog::info("lease {}/{}: released", options_.ns, options_.name);
  }
}

void LeaderElector::Lead() {
  spdlog::info("lease {}/{}: {} is the leader", options_.ns, options_.name, options_.identity);
  if (on_start_) on_start_();
  leader_ = true;
}

void LeaderElector::Abdicate() {
  leader_ = false;
  spdlog::warn("lease {}/{}: {} is no longer the leader", options_.ns, options_.name,
               options_.identity);
  if (on_stop_) on_stop_();
}

void LeaderElector::Run() {
  while (!stop_) {
    if (TryAcquireOrRenew()) {
      if (!leader_) Lead();
    } else if (leader_ && ((!observed_holder_.empty() && observed_holder_ != options_.identity) ||
                           clock_->Now() - last_renew_ >= options_.renew_deadline)) {
      Abdicate();  // taken over, or not renewed in time: stop acting before anyone else starts
    }
    absl::MutexLock l(&wake_mu_);
    wake_mu_.AwaitWithTimeout(absl::Condition(&wake_), absl::FromChrono(options_.retry_period));
  }
}

void LeaderElector::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { Run(); });
}

void LeaderElector::Stop() {
  stop_ = true;
  {
    absl::MutexLock l(&wake_mu_);
    wake_ = true;
  }
  if (thread_.joinable()) thread_.join();
  if (leader_) {
    Abdicate();
    Release();
  }
}

}  // namespace gpulet::k8s
