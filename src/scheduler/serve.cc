#include "scheduler/serve.h"

#include <malloc.h>
#include <openssl/ssl.h>

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/net.h"
#include "common/status.h"
#include "http/listen_address.h"
#include "http/tls.h"
#include "spdlog/spdlog.h"

namespace gpulet::scheduler {

struct Server::Listener {
  std::unique_ptr<http::GuardedServer> server;
  std::thread thread;
  void Stop() {
    if (!server) return;
    server->stop();
    if (thread.joinable()) thread.join();
    server->Shutdown();
  }
};

absl::Status CheckServeOptions(const ServeOptions& o) {
  for (const auto& [flag, value] :
       {std::pair<const char*, std::string>{"--extender-listen", o.extender_listen},
        {"--webhook-listen", o.webhook_listen},
        {"--health-listen", o.health_listen}}) {
    if (value.empty() && std::string_view(flag) != "--extender-listen") continue;  // off
    auto hp = http::ParseListenAddress(value);
    if (!hp.ok())
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", hp.status().message()));
    // The extender binds pods: reachable from the network only with kube-scheduler's certificate.
    if (std::string_view(flag) == "--extender-listen" && !http::IsLoopbackHost(hp->first) &&
        o.extender_client_ca.empty() && !o.extender_insecure) {
      return absl::InvalidArgumentError(
          absl::StrCat("--extender-listen ", value,
                       " is not a loopback address: give --extender-client-ca-file (HTTPS with "
                       "kube-scheduler's client certificate) or, knowingly, --extender-insecure"));
    }
    // A busy port used to show only after the initial sync, with no reason given.
    if (hp->second != 0) {
      if (absl::Status st = ProbeTcpListen(hp->first, hp->second); !st.ok())
        return absl::FailedPreconditionError(absl::StrCat(flag, ": ", st.message()));
    }
  }
  const ServingCertOptions& c = o.cert;
  if (!c.cert_file.empty() || !c.key_file.empty()) {
    if (c.cert_file.empty() || c.key_file.empty())
      return absl::InvalidArgumentError("--tls-cert-file and --tls-key-file go together");
    auto cert_pem = ReadFileToString(c.cert_file);
    if (!cert_pem.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-cert-file ", cert_pem.status().message()));
    auto key_pem = ReadFileToString(c.key_file);
    if (!key_pem.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-key-file ", key_pem.status().message()));
    auto ctx = http::ServerTlsContext(*cert_pem, *key_pem);
    if (!ctx.ok())
      return absl::InvalidArgumentError(absl::StrCat("--tls-cert-file ", c.cert_file,
                                                     " with --tls-key-file ", c.key_file, ": ",
                                                     ctx.status().message()));
    SSL_CTX_free(*ctx);
  }
  if (o.lease) {
    if (absl::Status st = k8s::ValidateLeaseOptions(*o.lease); !st.ok())
      return absl::InvalidArgumentError(absl::StrCat("--leader-elect-*: ", st.message()));
  }
  return absl::OkStatus();
}

Server::Server(ServeOptions o, k8s::Client* api)
    : o_(std::move(o)),
      api_(api),
      ext_(std::make_unique<Listener>()),
      hook_(std::make_unique<Listener>()),
      health_(std::make_unique<Listener>()) {}

Server::~Server() { Stop(); }

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServeOptions o, k8s::Client* api) {
  RETURN_IF_ERROR(CheckServeOptions(o));
  std::unique_ptr<Server> s(new Server(std::move(o), api));
  if (absl::Status st = s->Run(); !st.ok()) {
    s->Stop();
    return st;
  }
  return s;
}

void Server::Stop() {
  if (elector_) elector_->Stop();  // hands the Lease over at once
  if (extender_) extender_->StopWatching();
  ext_->Stop();
  hook_->Stop();
  health_->Stop();
}

absl::StatusOr<SSL_CTX*> Server::TlsContext(const std::string& client_ca) {
  ASSIGN_OR_RETURN(SSL_CTX * ctx,
                   http::ServerTlsContext(cert_->pem().cert_pem, cert_->pem().key_pem, client_ca));
  if (!cert_->cert_file().empty()) {  // renewed or rotated pairs arrive through the files
    auto r = http::CertReloader::Load(cert_->cert_file(), cert_->key_file());
    if (r.ok()) {
      (*r)->Install(ctx);
      reloaders_.push_back(*std::move(r));
    } else {
      spdlog::warn("serving certificate will not be reloaded: {}",
                   std::string(r.status().message()));
    }
  }
  return ctx;
}

absl::Status Server::Listen(Listener& l, const std::string& flag, const std::string& address) {
  auto [host, port] = *http::ParseListenAddress(address);  // checked by CheckServeOptions
  if (!l.server->bind_to_port(host, port)) {
    // A port free at the check can be taken before the server binds it.
    absl::Status why = TcpListenFailed(host, port);
    return absl::Status(why.code(), absl::StrCat(flag, " ", address, ": ", why.message()));
  }
  l.thread = std::thread([&l] { l.server->listen_after_bind(); });
  return absl::OkStatus();
}

absl::Status Server::Run() {
  extender_ = std::make_unique<Extender>(api_, o_.extender);
  if (absl::Status s = extender_->Sync(); !s.ok())
    return absl::UnavailableError(
        absl::StrCat("initial sync with the API server failed: ", s.message()));
  extender_->StartWatching();
  // Replicas: the leader alone answers the extender's verbs (and so alone reserves and binds);
  // the others keep their state current from the watches, ready to take over. A new leader
  // lists again first, so that it sees every bind of the previous one before it places a pod.
  if (o_.lease) {
    auto label = [this](bool leader) {
      if (o_.pod_name.empty() || o_.pod_namespace.empty()) return;  // not in a pod
      k8s::json patch = {
          {"metadata", {{"labels", {{kLeaderLabel, leader ? k8s::json("true") : k8s::json()}}}}}};
      if (auto r = api_->PatchPod(o_.pod_namespace, o_.pod_name, k8s::PatchType::kMerge, patch);
          !r.ok()) {
        spdlog::warn("label {} on pod {}/{}: {}", kLeaderLabel, o_.pod_namespace, o_.pod_name,
                     std::string(r.status().message()));
      }
    };
    const std::string follower = absl::StrCat(
        "gpulet scheduler ", o_.lease->identity, " is not the leader (Lease ", o_.lease->ns, "/",
        o_.lease->name, "); the extender's Service routes to the leader");
    extender_->SetServing(false, follower);
    elector_ = std::make_unique<k8s::LeaderElector>(
        api_, *o_.lease,
        [this, label] {
          if (auto s = extender_->Sync(); !s.ok())
            spdlog::warn("re-list as leader: {}", std::string(s.message()));
          extender_->SetServing(true);
          label(true);
        },
        [this, label, follower] {
          extender_->SetServing(false, follower);
          label(false);
        });
    elector_->Start();
  }

  // One largest body at a time in parsed form: its DOM costs up to ~40x the text (2 MiB of
  // "{}," is ~80 MiB), and the Deployment's limit is 256 MiB.
  http::SetUntrustedJsonBudget(o_.limits.max_body_bytes);
  // glibc gives every thread that allocates its own arena and keeps freed memory there: a large
  // DOM freed on each of 50 worker threads adds up to GiBs of RSS (measured: 1.2 GiB after 24
  // concurrent 2 MiB bodies). Two arenas make freed memory reusable by every thread.
  mallopt(M_ARENA_MAX, 2);

  // The serving certificate (webhook, and the extender when it serves HTTPS): files, a Secret, or
  // self-issued and renewed (serving_cert.h).
  if (!o_.webhook_listen.empty() || !o_.extender_client_ca.empty()) {
    auto c = ServingCert::Create(o_.cert, api_);
    if (!c.ok())
      return absl::Status(c.status().code(),
                          absl::StrCat("serving certificate: ", c.status().message()));
    cert_ = *std::move(c);
  }

  http::ServerLimits el = o_.limits;
  SSL_CTX* ctx = nullptr;
  if (!o_.extender_client_ca.empty()) {
    auto c = TlsContext(o_.extender_client_ca);
    if (!c.ok())
      return absl::InvalidArgumentError(absl::StrCat("extender TLS: ", c.status().message()));
    ctx = *c;
    el.client_names = o_.extender_client_names;
  }
  // Answered by the servers' pollers: workers busy with binds cannot fail the kubelet's probes.
  auto healthz = [] { return std::pair<int, std::string>(200, "ok"); };
  ext_->server = std::make_unique<http::GuardedServer>(el, ctx);
  extender_->Register(*ext_->server, o_.extender_prefix);
  ext_->server->SetProbe("/healthz", healthz);
  RETURN_IF_ERROR(Listen(*ext_, "--extender-listen", o_.extender_listen));
  if (!o_.health_listen.empty()) {
    health_->server = std::make_unique<http::GuardedServer>(o_.limits);
    health_->server->SetProbe("/healthz", healthz);
    RETURN_IF_ERROR(Listen(*health_, "--health-listen", o_.health_listen));
  }
  webhook_ = std::make_unique<AdmissionWebhook>(o_.webhook, api_);
  if (!o_.webhook_listen.empty()) {
    auto c = TlsContext("");
    if (!c.ok())
      return absl::Status(c.status().code(), absl::StrCat("webhook TLS: ", c.status().message()));
    hook_->server = std::make_unique<http::GuardedServer>(o_.limits, *c);
    webhook_->Register(*hook_->server);
    RETURN_IF_ERROR(Listen(*hook_, "--webhook-listen", o_.webhook_listen));
    cert_->PublishCa();
  }
  // Renewed pairs reach the servers through the reloaders' files: without one, no renewal.
  if (cert_ && !reloaders_.empty()) cert_->StartRenewal(o_.renew_check);
  return absl::OkStatus();
}

}  // namespace gpulet::scheduler
