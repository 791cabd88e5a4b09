#include "scheduler/serving_cert.h"

#include <stdlib.h>

#include <filesystem>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "common/fs.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "scheduler/extender.h"
#include "spdlog/spdlog.h"

namespace gpulet::scheduler {

absl::StatusOr<http::PemPair> ServingCertificate(const ServingCertOptions& o, k8s::Client* api,
                                                 const http::PemPair* current) {
  const auto renew_before = o.renew_before;
  if (!o.cert_file.empty() || !o.key_file.empty()) {
    if (o.cert_file.empty() || o.key_file.empty()) {
      return absl::InvalidArgumentError("--tls-cert-file and --tls-key-file go together");
    }
    http::PemPair p;
    ASSIGN_OR_RETURN(p.cert_pem, ReadFileToString(o.cert_file));
    ASSIGN_OR_RETURN(p.key_pem, ReadFileToString(o.key_file));
    return p;
  }
  if (o.secret.empty()) {
    if (current && !http::CertificateExpiresWithin(current->cert_pem, renew_before, *o.clock)) {
      return *current;
    }
    return http::SelfIssuedCertificate(o.names);
  }
  std::vector<std::string> ns_name = absl::StrSplit(o.secret, '/');
  if (ns_name.size() != 2 || !api) {
    return absl::InvalidArgumentError("--tls-secret wants NAMESPACE/NAME and an API server");
  }
  if (!IsDns1123Label(ns_name[0]) || !IsDns1123Subdomain(ns_name[1])) {
    return absl::InvalidArgumentError("--tls-secret: NAMESPACE/NAME are not Kubernetes names");
  }
  std::string path = "/api/v1/namespaces/" + ns_name[0] + "/secrets/" + ns_name[1];
  // Two attempts: replicas starting together may both find no Secret (or the same old one) and
  // write; the one that loses (AlreadyExists, or a Conflict on the stale version) reads the
  // winner's pair instead of failing.
  for (int attempt = 0;; ++attempt) {
    auto secret = api->Call("GET", path);
    http::PemPair p;
    auto data_field = [&secret](const char* key) {
      std::string out;
      if (!secret.ok()) return out;
      auto data = secret->find("data");
      if (data == secret->end() || !data->is_object()) return out;
      auto it = data->find(key);
      if (it != data->end() && it->is_string()) absl::Base64Unescape(it->get<std::string>(), &out);
      return out;
    };
    p.cert_pem = data_field("tls.crt");
    p.key_pem = data_field("tls.key");
    p.ca_pem = data_field("ca.crt");
    // Near expiry (or unreadable, or an older Secret without its CA: a CA:TRUE leaf of earlier
    // versions) the self-issued pair is replaced: the new one goes into the Secret (PUT below)
    // and, with a webhook configuration, into caBundle.
    if (!p.cert_pem.empty() && !p.key_pem.empty() && !p.ca_pem.empty() &&
        !http::CertificateExpiresWithin(p.cert_pem, renew_before, *o.clock) &&
        http::CertificateCovers(p.cert_pem, o.names)) {
      return p;
    }
    ASSIGN_OR_RETURN(p, http::SelfIssuedCertificate(o.names));
    nlohmann::json body = {{"apiVersion", "v1"},
                           {"kind", "Secret"},
                           {"type", "kubernetes.io/tls"},
                           {"metadata", {{"name", ns_name[1]}, {"namespace", ns_name[0]}}},
                           {"data",
                            {{"tls.crt", absl::Base64Escape(p.cert_pem)},
                             {"tls.key", absl::Base64Escape(p.key_pem)},
                             {"ca.crt", absl::Base64Escape(p.ca_pem)}}}};
    if (secret.ok() && secret->contains("metadata")) {
      body["metadata"]["resourceVersion"] =
          (*secret)["metadata"].value("resourceVersion", std::string());
    }
    auto created =
        api->Call(secret.ok() ? "PUT" : "POST",
                  secret.ok() ? path : "/api/v1/namespaces/" + ns_name[0] + "/secrets", &body);
    if (created.ok()) return p;
    bool lost_race = absl::IsAlreadyExists(created.status()) || absl::IsAborted(created.status());
    if (!lost_race || attempt > 0) return created.status();
  }
}

void PublishCaBundle(k8s::Client& api, const std::string& configuration,
                     const std::string& ca_pem) {
  if (configuration.empty()) return;
  nlohmann::json patch = nlohmann::json::array({{{"op", "replace"},
                                                 {"path", "/webhooks/0/clientConfig/caBundle"},
                                                 {"value", absl::Base64Escape(ca_pem)}}});
  for (const char* kind : {"validatingwebhookconfigurations", "mutatingwebhookconfigurations"}) {
    auto r = api.Call(
        "PATCH", std::string("/apis/admissionregistration.k8s.io/v1/") + kind + "/" + configuration,
        &patch, "application/json-patch+json");
    if (!r.ok() && !absl::IsNotFound(r.status())) {
      spdlog::warn("cannot publish caBundle into {} {}: {}", kind, configuration,
                   std::string(r.status().message()));
    }
  }
}

absl::StatusOr<std::unique_ptr<ServingCert>> ServingCert::Create(ServingCertOptions o,
                                                                 k8s::Client* api) {
  std::unique_ptr<ServingCert> c(new ServingCert(std::move(o), api));
  ASSIGN_OR_RETURN(c->pem_, ServingCertificate(c->o_, api));
  c->current_ = c->pem_;
  c->cert_file_ = c->o_.cert_file;
  c->key_file_ = c->o_.key_file;
  // Certificate files (cert-manager, a mounted Secret) are taken again when they change; a pair
  // of our own (self-issued, or from the Secret) is written to a private directory so that its
  // renewals are served the same way.
  if (c->o_.cert_file.empty()) c->KeepInPrivateDirectory();
  return c;
}

void ServingCert::KeepInPrivateDirectory() {
  char dir[] = "/tmp/gpulet-webhook-tls-XXXXXX";
  if (mkdtemp(dir) != nullptr) dir_ = dir;
  cert_file_ = dir_ + "/tls.crt";
  key_file_ = dir_ + "/tls.key";
  if (dir_.empty() || !WriteFileAtomic(key_file_, pem_.key_pem, 0600).ok() ||
      !WriteFileAtomic(cert_file_, pem_.cert_pem).ok()) {
    spdlog::warn("cannot keep the self-issued certificate in {}; it will not be renewed",
                 dir_.empty() ? std::string("/tmp") : dir_);
    cert_file_.clear();
    key_file_.clear();
    return;
  }
  self_issued_ = true;
}

ServingCert::~ServingCert() {
  stop_.Notify();
  if (renewal_.joinable()) renewal_.join();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

void ServingCert::PublishCa() {
  if (!api_) return;
  PublishCaBundle(*api_, o_.webhook_configuration,
                  pem_.ca_pem.empty() ? pem_.cert_pem : pem_.ca_pem);
}

absl::StatusOr<bool> ServingCert::RenewOnce() {
  if (!self_issued_) return false;
  ASSIGN_OR_RETURN(http::PemPair next, ServingCertificate(o_, api_, &current_));
  if (next.cert_pem == current_.cert_pem) return false;
  // The API server is told to trust the new and the old CA before the new pair is served.
  if (api_) PublishCaBundle(*api_, o_.webhook_configuration, next.ca_pem + current_.ca_pem);
  RETURN_IF_ERROR(WriteFileAtomic(key_file_, next.key_pem, 0600));
  RETURN_IF_ERROR(WriteFileAtomic(cert_file_, next.cert_pem));
  current_ = std::move(next);
  return true;
}

void ServingCert::StartRenewal(std::chrono::milliseconds interval) {
  if (!self_issued_ || renewal_.joinable()) return;
  renewal_ = std::thread([this, interval] {
    while (!stop_.WaitForNotificationWithTimeout(absl::FromChrono(interval))) {
      auto renewed = RenewOnce();
      if (!renewed.ok()) {
        spdlog::warn("webhook certificate renewal: {}", std::string(renewed.status().message()));
      } else if (*renewed) {
        spdlog::info("webhook certificate renewed");
      }
    }
  });
}

}  // namespace gpulet::scheduler
