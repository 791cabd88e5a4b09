// `gpulet scheduler` as one object: the extender, the admission webhook and the health listener,
// each on an http::GuardedServer, the serving certificate with its reloading and renewal, and
// leader election among replicas. The command only turns flags into ServeOptions.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "http/guarded_server.h"
#include "k8s/client.h"
#include "k8s/lease.h"
#include "scheduler/extender.h"
#include "scheduler/serving_cert.h"
#include "scheduler/webhook.h"

namespace gpulet::scheduler {

struct ServeOptions {
  std::string extender_listen = "127.0.0.1:12345";  // [host]:port
  std::string extender_prefix = "/scheduler";
  // PEM CA bundle: serve the extender over HTTPS and require client certificates it signed, whose
  // subject is one of extender_client_names. Empty: plain HTTP (loopback unless insecure).
  std::string extender_client_ca;
  std::vector<std::string> extender_client_names;
  bool extender_insecure = false;  // plain HTTP on a non-loopback address, knowingly
  std::string webhook_listen;      // empty: no webhook
  std::string health_listen;       // empty: no separate health listener
  http::ServerLimits limits;
  ServingCertOptions cert;  // the webhook's pair (and the HTTPS extender's)
  std::chrono::milliseconds renew_check{3600 * 1000};
  ExtenderOptions extender;
  WebhookOptions webhook;
  std::optional<k8s::LeaseOptions> lease;  // set: leader election among replicas
  // This replica's pod, labelled while it leads (the extender's Service selects the label).
  std::string pod_name, pod_namespace;
};

// The label the leader puts on its own pod: the extender's Service selects it, so kube-scheduler
// reaches the leader only (deploy/components/vgpu/scheduler.yaml).
inline constexpr char kLeaderLabel[] = "gpulet.io/extender-leader";

// What can be checked before the first call to the API server: the listen addresses (and that
// their ports can be bound now), the loopback rule of a plain-HTTP extender, the serving pair's
// files, the lease settings. InvalidArgument names the flag's value; FailedPrecondition says why a
// port cannot be bound (in use, no permission, no such address).
absl::Status CheckServeOptions(const ServeOptions& o);

class Server {
 public:
  // Syncs the extender with the API server, then serves. Every error names what failed.
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServeOptions o, k8s::Client* api);
  ~Server();
  // Hands the Lease over, stops the watches and every listener. Idempotent.
  void Stop();

 private:
  struct Listener;
  Server(ServeOptions o, k8s::Client* api);
  absl::Status Run();
  // A GuardedServer on `address` (as the flag `flag` gave it), started.
  absl::Status Listen(Listener& l, const std::string& flag, const std::string& address);
  absl::StatusOr<SSL_CTX*> TlsContext(const std::string& client_ca);

  ServeOptions o_;
  k8s::Client* api_;
  // Declaration order is destruction order reversed: the certificate (its files) outlives the
  // reloaders, which outlive the servers whose TLS contexts call them.
  std::unique_ptr<ServingCert> cert_;
  std::vector<std::unique_ptr<http::CertReloader>> reloaders_;
  std::unique_ptr<Extender> extender_;
  std::unique_ptr<AdmissionWebhook> webhook_;
  std::unique_ptr<k8s::LeaderElector> elector_;
  std::unique_ptr<Listener> ext_, hook_, health_;
};

}  // namespace gpulet::scheduler
