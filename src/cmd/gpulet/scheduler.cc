// `gpulet scheduler`: the vGPU scheduler extender (HTTP, kube-scheduler extender v1) and the
// admission webhook (HTTPS, AdmissionReview v1) in one process. Only flag parsing and wiring here.
#include <openssl/pem.h>
#include <signal.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/synchronization/notification.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cmd/gpulet/command.h"
#include "common/fs.h"
#include "common/status.h"
#include "httplib.h"
#include "k8s/client.h"
#include "k8s/tls.h"
#include "scheduler/extender.h"
#include "scheduler/webhook.h"
#include "vgpu/policy.h"
#include "spdlog/spdlog.h"

namespace gpulet::cmd {
namespace {

struct SchedulerFlags {
  std::string kubeconfig;
  std::string extender_listen = ":12345";
  std::string extender_prefix = "/scheduler";
  std::string webhook_listen = ":8443";
  std::string tls_cert_file, tls_key_file, tls_secret, webhook_configuration;
  std::string tls_names = "localhost,127.0.0.1,gpulet-scheduler.gpulet-system.svc";
  int64_t tls_renew_before_h = 24 * 30;  // a self-issued pair is replaced this close to expiry
  int64_t tls_renew_check_ms = 3600 * 1000;
  std::string policy = "binpack";
  int64_t workload_refresh_ms = 1000;
  std::string scheduler_name;
  int64_t max_memory_units = 0;
  vgpu::ResourceNames names;
};

bool SplitHostPort(const std::string& listen, std::string* host, int* port) {
  size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return false;
  *host = listen.substr(0, colon);
  if (host->empty()) *host = "0.0.0.0";
  return absl::SimpleAtoi(listen.substr(colon + 1), port) && *port >= 0 && *port < 65536;
}

// The serving certificate: files, a Secret (created with a self-issued pair when missing), or a
// self-issued pair of our own. A self-issued `current` pair (from the Secret, or the one being
// served) is kept until it is within --tls-renew-before of expiry, then replaced (and stored).
absl::StatusOr<k8s::PemPair> ServingCertificate(const SchedulerFlags& f, k8s::Client* api,
                                                const k8s::PemPair* current = nullptr) {
  const auto renew_before = std::chrono::hours(f.tls_renew_before_h);
  if (!f.tls_cert_file.empty() || !f.tls_key_file.empty()) {
    if (f.tls_cert_file.empty() || f.tls_key_file.empty()) {
      return absl::InvalidArgumentError("--tls-cert-file and --tls-key-file go together");
    }
    k8s::PemPair p;
    ASSIGN_OR_RETURN(p.cert_pem, ReadFileToString(f.tls_cert_file));
    ASSIGN_OR_RETURN(p.key_pem, ReadFileToString(f.tls_key_file));
    return p;
  }
  std::vector<std::string> names = absl::StrSplit(f.tls_names, ',', absl::SkipEmpty());
  if (f.tls_secret.empty()) {
    if (current && !k8s::CertificateExpiresWithin(current->cert_pem, renew_before)) return *current;
    return k8s::SelfSignedCertificate(names);
  }
  std::vector<std::string> ns_name = absl::StrSplit(f.tls_secret, '/');
  if (ns_name.size() != 2 || !api) {
    return absl::InvalidArgumentError("--tls-secret wants NAMESPACE/NAME and an API server");
  }
  std::string path = "/api/v1/namespaces/" + ns_name[0] + "/secrets/" + ns_name[1];
  auto secret = api->Call("GET", path);
  k8s::PemPair p;
  if (secret.ok() && (*secret)["data"].contains("tls.crt") && (*secret)["data"].contains("tls.key")) {
    absl::Base64Unescape((*secret)["data"]["tls.crt"].get<std::string>(), &p.cert_pem);
    absl::Base64Unescape((*secret)["data"]["tls.key"].get<std::string>(), &p.key_pem);
    // Near expiry (or unreadable) the self-issued pair is replaced: the new one goes into the
    // Secret (PUT below) and, with --webhook-configuration, into caBundle.
    if (!k8s::CertificateExpiresWithin(p.cert_pem, renew_before)) return p;
  }
  ASSIGN_OR_RETURN(p, k8s::SelfSignedCertificate(names));
  nlohmann::json body = {{"apiVersion", "v1"},
                         {"kind", "Secret"},
                         {"type", "kubernetes.io/tls"},
                         {"metadata", {{"name", ns_name[1]}, {"namespace", ns_name[0]}}},
                         {"data",
                          {{"tls.crt", absl::Base64Escape(p.cert_pem)},
                           {"tls.key", absl::Base64Escape(p.key_pem)}}}};
  auto created = api->Call(secret.ok() ? "PUT" : "POST",
                           secret.ok() ? path : "/api/v1/namespaces/" + ns_name[0] + "/secrets",
                           &body);
  if (!created.ok()) return created.status();
  return p;
}

// Publishes `ca_pem` (one or more certificates) as the webhook configuration's caBundle so the API
// server trusts our self-issued certificate.
void PublishCaBundle(k8s::Client& api, const std::string& configuration, const std::string& ca_pem) {
  if (configuration.empty()) return;
  nlohmann::json patch = nlohmann::json::array({{{"op", "replace"},
                                                 {"path", "/webhooks/0/clientConfig/caBundle"},
                                                 {"value", absl::Base64Escape(ca_pem)}}});
  for (const char* kind : {"validatingwebhookconfigurations", "mutatingwebhookconfigurations"}) {
    auto r = api.Call("PATCH",
                      std::string("/apis/admissionregistration.k8s.io/v1/") + kind + "/" +
                          configuration,
                      &patch, "application/json-patch+json");
    if (!r.ok() && !absl::IsNotFound(r.status())) {
      spdlog::warn("cannot publish caBundle into {} {}: {}", kind, configuration,
                   r.status().ToString());
    }
  }
}

int RunScheduler(const SchedulerFlags& f) {
  sigset_t stop;
  sigemptyset(&stop);
  for (int sig : {SIGINT, SIGTERM, SIGQUIT}) sigaddset(&stop, sig);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // before any thread, so sigwait receives them

  if (!vgpu::MakeVgpuPolicy(f.policy).ok()) {
    std::cerr << "gpulet scheduler: --policy \"" << f.policy << "\" is not a policy (known: "
              << absl::StrJoin(vgpu::VgpuPolicyNames(), ", ") << ")\n";
    return 2;
  }
  auto config = k8s::ResolveConfig(f.kubeconfig);
  if (!config.ok()) {
    std::cerr << "gpulet scheduler: " << config.status().message() << "\n";
    return 2;
  }
  k8s::Client api(*config);
  scheduler::Extender extender(
      &api, {f.names, f.policy, std::chrono::milliseconds(f.workload_refresh_ms)});
  if (auto s = extender.Sync(); !s.ok()) {
    std::cerr << "gpulet scheduler: initial sync with the API server failed: " << s.message()
              << "\n";
    return 1;
  }
  extender.StartWatching();

  std::string host;
  int port = 0;
  httplib::Server ext_server;
  if (!SplitHostPort(f.extender_listen, &host, &port)) {
    std::cerr << "gpulet scheduler: --extender-listen \"" << f.extender_listen
              << "\" is not HOST:PORT\n";
    return 2;
  }
  extender.Register(ext_server, f.extender_prefix);
  ext_server.Get("/healthz", [](const httplib::Request&, httplib::Response& r) {
    r.set_content("ok", "text/plain");
  });
  if (!ext_server.bind_to_port(host, port)) {
    std::cerr << "gpulet scheduler: cannot listen on " << f.extender_listen << "\n";
    return 1;
  }
  std::thread ext_thread([&] { ext_server.listen_after_bind(); });

  std::unique_ptr<k8s::CertReloader> cert_reloader;  // outlives hook_server, which calls it
  bool self_issued = false;
  std::string tls_dir;  // self-issued pair's files; removed at exit
  absl::Notification renew_stop;
  std::thread renew_thread;
  std::unique_ptr<httplib::SSLServer> hook_server;
  std::thread hook_thread;
  scheduler::AdmissionWebhook webhook({f.names, f.max_memory_units, f.scheduler_name}, &api);
  if (!f.webhook_listen.empty()) {
    auto pem = ServingCertificate(f, &api);
    if (!pem.ok()) {
      std::cerr << "gpulet scheduler: webhook certificate: " << pem.status().message() << "\n";
      ext_server.stop();
      ext_thread.join();
      return 1;
    }
    BIO* cb = BIO_new_mem_buf(pem->cert_pem.data(), static_cast<int>(pem->cert_pem.size()));
    BIO* kb = BIO_new_mem_buf(pem->key_pem.data(), static_cast<int>(pem->key_pem.size()));
    X509* cert = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
    EVP_PKEY* key = PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr);
    BIO_free(cb);
    BIO_free(kb);
    if (cert && key) hook_server = std::make_unique<httplib::SSLServer>(cert, key);
    if (cert) X509_free(cert);
    if (key) EVP_PKEY_free(key);
    // Certificate files (cert-manager, a mounted Secret) are taken again when they change; a
    // self-issued pair is written to a private directory so that its renewals are served the
    // same way.
    self_issued = f.tls_cert_file.empty();
    std::string cert_file = f.tls_cert_file, key_file = f.tls_key_file;
    if (self_issued) {
      char dir[] = "/tmp/gpulet-webhook-tls-XXXXXX";
      if (mkdtemp(dir) != nullptr) tls_dir = dir;
      cert_file = tls_dir + "/tls.crt";
      key_file = tls_dir + "/tls.key";
      if (tls_dir.empty() || !WriteFileAtomic(key_file, pem->key_pem, 0600).ok() ||
          !WriteFileAtomic(cert_file, pem->cert_pem).ok()) {
        spdlog::warn("cannot keep the self-issued certificate in {}; it will not be renewed",
                     tls_dir.empty() ? std::string("/tmp") : tls_dir);
        self_issued = false;
      }
    }
    if (hook_server && hook_server->is_valid() && (self_issued || !f.tls_cert_file.empty())) {
      auto r = k8s::CertReloader::Load(cert_file, key_file);
      if (r.ok()) (cert_reloader = *std::move(r))->Install(hook_server->ssl_context());
      else spdlog::warn("webhook certificate will not be reloaded: {}", r.status().ToString());
    }
    if (!hook_server || !hook_server->is_valid() ||
        !SplitHostPort(f.webhook_listen, &host, &port) || !hook_server->bind_to_port(host, port)) {
      std::cerr << "gpulet scheduler: cannot serve HTTPS on --webhook-listen \""
                << f.webhook_listen << "\" (bad address or certificate)\n";
      ext_server.stop();
      ext_thread.join();
      return 1;
    }
    webhook.Register(*hook_server);
    hook_thread = std::thread([&] { hook_server->listen_after_bind(); });
    PublishCaBundle(api, f.webhook_configuration, pem->cert_pem);
    if (self_issued && cert_reloader) {
      // Renewal: the API server is told to trust the new and the old certificate before the new
      // one is served, so no handshake in between fails.
      renew_thread = std::thread([&f, &api, &renew_stop, current = *pem, cert_file, key_file]() mutable {
        while (!renew_stop.WaitForNotificationWithTimeout(absl::Milliseconds(f.tls_renew_check_ms))) {
          auto next = ServingCertificate(f, &api, &current);
          if (!next.ok()) {
            spdlog::warn("webhook certificate renewal: {}", next.status().ToString());
            continue;
          }
          if (next->cert_pem == current.cert_pem) continue;
          PublishCaBundle(api, f.webhook_configuration, next->cert_pem + current.cert_pem);
          absl::Status st = WriteFileAtomic(key_file, next->key_pem, 0600);
          if (st.ok()) st = WriteFileAtomic(cert_file, next->cert_pem);
          if (!st.ok()) {
            spdlog::warn("webhook certificate renewal: {}", st.ToString());
            continue;
          }
          current = *std::move(next);
          spdlog::info("webhook certificate renewed");
        }
      });
    }
  }
  spdlog::info("gpulet scheduler: extender on {}{}, webhook on {}", f.extender_listen,
               f.extender_prefix, f.webhook_listen.empty() ? "(off)" : f.webhook_listen);
  int sig = 0;
  sigwait(&stop, &sig);
  spdlog::info("gpulet scheduler: signal {}, stopping", sig);
  extender.StopWatching();
  ext_server.stop();
  ext_thread.join();
  renew_stop.Notify();
  if (renew_thread.joinable()) renew_thread.join();
  if (hook_server) {
    hook_server->stop();
    hook_thread.join();
  }
  if (!tls_dir.empty()) std::filesystem::remove_all(tls_dir);
  return 0;
}

std::function<int()> SetupScheduler(CLI::App& sub) {
  auto f = std::make_shared<SchedulerFlags>();
  sub.add_option("--kubeconfig", f->kubeconfig,
                 "kubeconfig file; default: $KUBECONFIG, in-cluster service account, "
                 "~/.kube/config")
      ->type_name("FILE");
  sub.add_option("--extender-listen", f->extender_listen,
                 "HOST:PORT of the scheduler extender (plain HTTP; kube-scheduler's urlPrefix)")
      ->capture_default_str();
  sub.add_option("--extender-prefix", f->extender_prefix,
                 "URL prefix of the extender verbs: <prefix>/filter, /prioritize, /bind")
      ->capture_default_str();
  sub.add_option("--webhook-listen", f->webhook_listen,
                 "HOST:PORT of the admission webhook (HTTPS: /validate, /mutate); empty: off")
      ->capture_default_str();
  sub.add_option("--tls-cert-file", f->tls_cert_file,
                 "Webhook serving certificate (PEM); read again when it changes");
  sub.add_option("--tls-key-file", f->tls_key_file, "Webhook serving key (PEM)");
  sub.add_option("--tls-secret", f->tls_secret,
                 "NAMESPACE/NAME of a kubernetes.io/tls Secret holding the webhook certificate; "
                 "created with a self-issued one when missing");
  sub.add_option("--tls-names", f->tls_names,
                 "Comma-separated DNS names / IPs of a self-issued certificate")
      ->capture_default_str();
  sub.add_option("--webhook-configuration", f->webhook_configuration,
                 "Name of the Validating/MutatingWebhookConfiguration whose caBundle is set to "
                 "our self-issued certificate (at start and on every renewal)");
  sub.add_option("--tls-renew-before", f->tls_renew_before_h,
                 "Hours before expiry at which a self-issued certificate (one-year validity) is "
                 "replaced, in the running process and in --tls-secret")
      ->check(CLI::Range(int64_t{1}, int64_t{24 * 3650}))
      ->capture_default_str();
  sub.add_option("--tls-renew-check", f->tls_renew_check_ms,
                 "Milliseconds between checks of the self-issued certificate's expiry")
      ->check(CLI::Range(int64_t{10}, int64_t{24 * 3600 * 1000}))
      ->capture_default_str();
  sub.add_option("--policy", f->policy,
                 "Default placement policy: binpack, spread, or a placement registry name "
                 "(best-fit, gpu-packing, dot-product, fgd, gpulet, random); a pod may choose "
                 "with the annotation gpulet.io/vgpu-policy")
      ->capture_default_str();
  sub.add_option("--workload-refresh", f->workload_refresh_ms,
                 "Milliseconds between rebuilds of the workload (the mix of pending and bound "
                 "vGPU pods) that the fgd and gpulet policies score against, while pods change")
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}))
      ->capture_default_str();
  sub.add_option("--scheduler-name", f->scheduler_name,
                 "Mutating webhook: set spec.schedulerName of vGPU pods to this profile");
  sub.add_option("--max-memory-units", f->max_memory_units,
                 "Largest GPU in 256 MiB units for the webhook's memory check; 0: learn from "
                 "the nodes")
      ->capture_default_str();
  sub.add_option("--core-resource", f->names.core, "Resource name of vGPU cores")
      ->capture_default_str();
  sub.add_option("--memory-resource", f->names.memory,
                 "Resource name of vGPU memory (256 MiB units)")
      ->capture_default_str();
  return [f] { return RunScheduler(*f); };
}

}  // namespace

GPULET_COMMAND(scheduler,
               "vGPU scheduler extender (filter/prioritize/bind) and admission webhook",
               SetupScheduler);

}  // namespace gpulet::cmd
