// Self-issued TLS certificates for gpulet's HTTPS endpoints (the admission webhook) when no
// certificate files are given: a one-off CA (CA:TRUE, pathlen 0, its key discarded) and a leaf
// (CA:FALSE, serverAuth) it signs, EC P-256, whose subject alternative names are the given DNS
// names / IP addresses. The CA is what clients trust (caBundle of a webhook configuration).
// Private keys are read without ever prompting for a passphrase. Thread-safe (no shared state).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX
struct ssl_st;      // OpenSSL's SSL

namespace gpulet::http {

struct PemPair {
  std::string cert_pem;
  std::string key_pem;
  std::string ca_pem;  // the issuing CA (self-issued pairs; empty when unknown)
};

// `names`: DNS names or IP literals ("localhost", "127.0.0.1", "gpulet.kube-system.svc").
// `usage`: the leaf's extendedKeyUsage ("serverAuth"; "clientAuth" for a client certificate).
absl::StatusOr<PemPair> SelfIssuedCertificate(const std::vector<std::string>& names,
                                              int valid_days = 365,
                                              const std::string& usage = "serverAuth");

// OpenSSL pem_password_cb that refuses: pass it to every PEM_read_*PrivateKey so that an
// encrypted key fails instead of OpenSSL asking for its passphrase on the terminal.
int NoPassphrase(char* buf, int size, int rwflag, void* userdata);

// True when the PEM certificate's notAfter is less than `within` from the clock's now, or it does
// not parse (either way: issue a new one). The clock is a parameter so that renewal can be tested
// a year ahead without waiting.
bool CertificateExpiresWithin(const std::string& cert_pem, std::chrono::seconds within,
                              const Clock& clock = *RealClock());

// True when the PEM certificate is valid for every one of `names` (DNS names by its SANs, IP
// literals by its IP SANs); false when one is missing or it does not parse. A stored self-issued
// certificate that lacks a name the server now answers to is issued again.
bool CertificateCovers(const std::string& cert_pem, const std::vector<std::string>& names);

// A serving certificate read from PEM files and read again when they change (cert-manager renewing
// its Secret, the kubelet swapping the mounted files). Install() hooks it into a server's SSL_CTX
// as the certificate callback: every new TLS handshake takes the current pair, connections already
// established keep the one they negotiated, so a rotation drops no request. Files are checked at
// most once per `check_interval`, on a handshake; new files that do not parse or whose key does not
// match the certificate are refused (the old pair keeps serving; last_error() says why) and tried
// again at the next check. Thread-safe; must outlive the SSL_CTX it is installed into.
class CertReloader {
 public:
  // Fails (naming the file) when the files cannot be read, do not parse or do not match.
  static absl::StatusOr<std::unique_ptr<CertReloader>> Load(
      std::string cert_file, std::string key_file,
      std::chrono::milliseconds check_interval = std::chrono::seconds(1),
      Clock* clock = RealClock());
  ~CertReloader();

  void Install(ssl_ctx_st* ctx);
  // Re-reads the files now; true when a new pair was taken.
  absl::StatusOr<bool> ReloadIfChanged();

  std::string cert_pem() const;
  int reloads() const;
  std::string last_error() const;

 private:
  struct Pair;
  static absl::StatusOr<std::shared_ptr<const Pair>> Parse(const std::string& cert_file,
                                                           const std::string& key_file);
  CertReloader(std::string cert_file, std::string key_file, std::chrono::milliseconds interval,
               Clock* clock);
  static int OnHandshake(ssl_st* ssl, void* self);

  const std::string cert_file_, key_file_;
  const std::chrono::milliseconds interval_;
  Clock* const clock_;  // when the files were last checked, against check_interval
  mutable absl::Mutex mu_;
  std::shared_ptr<const Pair> current_ ABSL_GUARDED_BY(mu_);
  Clock::TimePoint checked_ ABSL_GUARDED_BY(mu_){};
  int reloads_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpulet::http
