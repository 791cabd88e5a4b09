// The webhook's (and the HTTPS extender's) serving certificate over its whole life: taken from
// files (cert-manager, a mounted Secret), from a kubernetes.io/tls Secret (created with a
// self-issued pair when missing), or self-issued; a self-issued pair is kept in a private
// directory so that the servers reload it from files like any other, renewed near expiry, and its
// CA published into the webhook configurations' caBundle. Out of `gpulet scheduler`'s main so that
// renewal is unit-tested without spawning the binary.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "http/tls.h"
#include "k8s/client.h"

namespace gpulet::scheduler {

struct ServingCertOptions {
  // Given files (both or neither): served as they are, never renewed here.
  std::string cert_file, key_file;
  // NAMESPACE/NAME of a kubernetes.io/tls Secret that holds the pair (needs an API client).
  std::string secret;
  // DNS names / IPs of a self-issued certificate.
  std::vector<std::string> names;
  // A self-issued pair is replaced this close to its expiry (any length: the tests of the binary
  // renew on every check with a window longer than the pair's one-year life).
  std::chrono::seconds renew_before = std::chrono::hours(24 * 30);
  // Whose "now" expiry is measured against (tests move it a year ahead).
  Clock* clock = RealClock();
  // Validating/MutatingWebhookConfiguration whose caBundle gets our CA (empty: none).
  std::string webhook_configuration;
};

// The pair to serve now. With `current` (a self-issued pair being served) and no Secret, `current`
// is kept until it is within renew_before of expiry. A Secret that is missing, unreadable, lacks
// its CA or is near expiry is replaced with a new self-issued pair (PUT or POST).
// REQUIRES: api != nullptr when o.secret is set.
absl::StatusOr<http::PemPair> ServingCertificate(const ServingCertOptions& o, k8s::Client* api,
                                                 const http::PemPair* current = nullptr);

// Sets the caBundle of both webhook configurations named `configuration` to `ca_pem` (one or more
// certificates). A missing configuration is not an error; other failures are logged.
void PublishCaBundle(k8s::Client& api, const std::string& configuration, const std::string& ca_pem);

// Owns the serving pair, the private directory of a self-issued one and its renewal thread.
// Not thread-safe except as noted; the renewal thread touches only its own copy of the pair and
// the files. Destruction stops the thread and removes the private directory.
class ServingCert {
 public:
  // Fetches or issues the pair (ServingCertificate). `api` may be null without a Secret; it must
  // outlive this object.
  static absl::StatusOr<std::unique_ptr<ServingCert>> Create(ServingCertOptions o,
                                                             k8s::Client* api);
  ~ServingCert();
  ServingCert(const ServingCert&) = delete;
  ServingCert& operator=(const ServingCert&) = delete;

  const http::PemPair& pem() const { return pem_; }
  // The files the servers reload the pair from; empty when there are none (a self-issued pair
  // that could not be written: served from memory, never renewed).
  const std::string& cert_file() const { return cert_file_; }
  const std::string& key_file() const { return key_file_; }
  // True when this process issues (and so renews) the pair itself.
  bool renews() const { return self_issued_; }

  // Publishes the CA of the pair served now (the certificate itself when it has none).
  void PublishCa();
  // One renewal check: when the pair is near expiry, publishes new + old CA (so no handshake fails
  // in between), then writes the new pair to the files the servers reload. True when renewed.
  // Not concurrently with the renewal thread.
  absl::StatusOr<bool> RenewOnce();
  // Calls RenewOnce every `interval` on a thread of its own until destruction (failures logged).
  // No-op unless renews().
  void StartRenewal(std::chrono::milliseconds interval);

 private:
  ServingCert(ServingCertOptions o, k8s::Client* api) : o_(std::move(o)), api_(api) {}
  void KeepInPrivateDirectory();

  ServingCertOptions o_;
  k8s::Client* api_;
  http::PemPair pem_;      // the pair as first served (the servers reload later ones from files)
  http::PemPair current_;  // the pair served now (the renewal's; its thread only once started)
  std::string dir_, cert_file_, key_file_;
  bool self_issued_ = false;
  absl::Notification stop_;
  std::thread renewal_;
};

}  // namespace gpulet::scheduler
