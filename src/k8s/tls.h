// Self-issued TLS certificates for gpulet's HTTPS endpoints (the admission webhook) when no
// certificate files are given: an EC P-256 key and a self-signed X.509 certificate whose subject
// alternative names are the given DNS names / IP addresses. The PEM certificate doubles as the CA
// bundle (caBundle of a webhook configuration). Thread-safe (no shared state).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpulet::k8s {

struct PemPair {
  std::string cert_pem;
  std::string key_pem;
};

// `names`: DNS names or IP literals ("localhost", "127.0.0.1", "gpulet.kube-system.svc").
absl::StatusOr<PemPair> SelfSignedCertificate(const std::vector<std::string>& names,
                                              int valid_days = 365);

}  // namespace gpulet::k8s
