// `gpulet scheduler`: the vGPU scheduler extender (kube-scheduler extender v1: loopback HTTP, or
// HTTPS with client certificates) and the admission webhook (HTTPS, AdmissionReview v1) in one
// process, each on a http::GuardedServer. Only flag parsing and wiring here.
#include <malloc.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <unistd.h>

#include <memory>
#include <thread>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cmd/common/exit.h"
#include "cmd/gpulet/command.h"
#include "cmd/gpulet/logs.h"
#include "common/duration.h"
#include "common/fs.h"
#include "common/net.h"
#include "common/signals.h"
#include "common/status.h"
#include "http/guarded_server.h"
#include "http/listen_address.h"
#include "http/tls.h"
#include "httplib.h"
#include "k8s/client.h"
#include "k8s/lease.h"
#include "placement/vgpu_policy.h"
#include "scheduler/extender.h"
#include "scheduler/serving_cert.h"
#include "scheduler/webhook.h"
#include "spdlog/spdlog.h"

namespace gpulet::cmd {
namespace {

struct SchedulerFlags {
  std::string kubeconfig;
  // Loopback by default: beside kube-scheduler. Any other address needs client certificates
  // (--extender-client-ca-file) or the explicit --extender-insecure.
  std::string extender_listen = "127.0.0.1:12345";
  std::string extender_prefix = "/scheduler";
  std::string extender_client_ca_file;
  std::string extender_client_names = "system:kube-scheduler";
  bool extender_insecure = false;
  bool extender_echo_node_objects = false;
  bool extender_debug_endpoints = false;
  std::string extender_scheduler_names = "default-scheduler";
  std::string health_listen;
  int64_t max_request_bytes = 1 << 20;
  int64_t workers = 8;
  std::string webhook_listen = ":8443";
  std::string tls_cert_file, tls_key_file, tls_secret, webhook_configuration;
  std::string tls_names =
      "localhost,127.0.0.1,gpulet-scheduler.gpulet-system.svc,"
      "gpulet-scheduler-extender.gpulet-system.svc";
  // Durations as written (common/duration.h); bare numbers keep their old units, deprecated.
  std::string tls_renew_before = "720h";  // a self-issued pair is replaced this close to expiry
  std::string tls_renew_check = "1h";
  std::string policy = "binpack";
  std::string workload_refresh = "1s";
  // Parsed from the three above at start.
  absl::Duration renew_before, renew_check, workload_refresh_every;
  std::string scheduler_name;
  int64_t max_memory_units = 0;
  vgpu::ResourceNames names;
  // Leader election among replicas (k8s/lease.h), with kube-scheduler's flag names.
  bool leader_elect = false;
  std::string lease_name = "gpulet-scheduler";
  std::string lease_namespace;  // default: $POD_NAMESPACE, else gpulet-system
  std::string identity;         // default: $POD_NAME, else hostname_pid
  std::string lease_duration = "15s", renew_deadline = "10s", retry_period = "2s";
  absl::Duration lease_duration_d, renew_deadline_d, retry_period_d;
};

// The label the leader puts on its own pod: the extender's Service selects it, so kube-scheduler
// reaches the leader only (deploy/components/vgpu/scheduler.yaml).
constexpr char kLeaderLabel[] = "gpulet.io/extender-leader";

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

constexpr char kWho[] = "gpulet scheduler";

// The serving side of every listener: one GuardedServer per address; `tls` (owned) or plain.
struct Listener {
  std::unique_ptr<http::GuardedServer> server;
  std::thread thread;
  void Stop() {
    if (!server) return;
    server->stop();
    if (thread.joinable()) thread.join();
    server->Shutdown();
  }
};

// The duration flags, each in the one syntax; bare numbers as before (hours, milliseconds,
// milliseconds), with a deprecation warning.
absl::Status ParseDurationFlags(SchedulerFlags& f) {
  struct Flag {
    const char* name;
    const std::string& text;
    DurationRules rules;
    absl::Duration* out;
  };
  for (const Flag& d : {
           Flag{"--tls-renew-before",
                f.tls_renew_before,
                {.bare_unit = absl::Hours(1), .min = absl::Hours(1), .max = absl::Hours(24 * 3650)},
                &f.renew_before},
           Flag{"--tls-renew-check",
                f.tls_renew_check,
                {.bare_unit = absl::Milliseconds(1),
                .min = absl::Milliseconds(10),
                .max = absl::Hours(24)},
                &f.renew_check},
           Flag{"--workload-refresh",
                f.workload_refresh,
                {.allow_zero = true, .bare_unit = absl::Milliseconds(1), .max = absl::Hours(1)},
                &f.workload_refresh_every},
           Flag{"--leader-elect-lease-duration",
                f.lease_duration,
                {.min = absl::Seconds(1), .max = absl::Hours(1)},
                &f.lease_duration_d},
           Flag{"--leader-elect-renew-deadline",
                f.renew_deadline,
                {.min = absl::Milliseconds(100), .max = absl::Hours(1)},
                &f.renew_deadline_d},
           Flag{"--leader-elect-retry-period",
                f.retry_period,
                {.min = absl::Milliseconds(10), .max = absl::Hours(1)},
                &f.retry_period_d},
       }) {
    ASSIGN_OR_RETURN(ParsedDuration p, ParseDuration(d.name, d.text, d.rules));
    if (!p.deprecation.empty()) spdlog::warn("{}", p.deprecation);
    *d.out = p.value;
  }
  return absl::OkStatus();
}

int RunScheduler(SchedulerFlags f) {
  const sigset_t stop = BlockStopSignals();  // before any thread, so sigwait receives them
  UseDaemonLogs();

  if (absl::Status st = ParseDurationFlags(f); !st.ok()) return Fail(kWho, st, kUsageError);
  if (!vgpu::MakeVgpuPolicy(f.policy).ok()) {
    return Fail(kWho,
                "--policy \"" + f.policy + "\" is not a policy (known: " +
                    absl::StrJoin(vgpu::VgpuPolicyNames(), ", ") + ")",
                kUsageError);
  }
  std::string ext_host, hook_host, health_host;
  int ext_port = 0, hook_port = 0, health_port = 0;
  for (auto [flag, value, host, port] :
       {std::tuple{"--extender-listen", &f.extender_listen, &ext_host, &ext_port},
        {"--webhook-listen", &f.webhook_listen, &hook_host, &hook_port},
        {"--health-listen", &f.health_listen, &health_host, &health_port}}) {
    if (value->empty() && std::string_view(flag) != "--extender-listen") continue;  // off
    auto hp = http::ParseListenAddress(*value);
    if (!hp.ok()) return Fail(kWho, std::string(flag) + ": " + Message(hp.status()), kUsageError);
    std::tie(*host, *port) = *hp;
  }
  // The extender binds pods: reachable from the network only with kube-scheduler's certificate.
  if (!http::IsLoopbackHost(ext_host) && f.extender_client_ca_file.empty() &&
      !f.extender_insecure) {
    return Fail(kWho,
                "--extender-listen " + f.extender_listen +
                    " is not a loopback address: give --extender-client-ca-file (HTTPS with "
                    "kube-scheduler's client certificate) or, knowingly, --extender-insecure",
                kUsageError);
  }
  std::string client_ca;
  if (!f.extender_client_ca_file.empty()) {
    auto ca = ReadFileToString(f.extender_client_ca_file);
    if (!ca.ok()) {
      return Fail(kWho, "--extender-client-ca-file: " + std::string(ca.status().message()),
                  kUsageError);
    }
    client_ca = *ca;
  }
  k8s::LeaseOptions lease;
  if (f.leader_elect) {
    lease.name = f.lease_name;
    lease.ns =
        f.lease_namespace.empty() ? EnvOr("POD_NAMESPACE", "gpulet-system") : f.lease_namespace;
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    lease.identity = f.identity.empty()
                         ? EnvOr("POD_NAME", absl::StrCat(host, "_", static_cast<int>(getpid())))
                         : f.identity;
    lease.lease_duration = absl::ToChronoMilliseconds(f.lease_duration_d);
    lease.renew_deadline = absl::ToChronoMilliseconds(f.renew_deadline_d);
    lease.retry_period = absl::ToChronoMilliseconds(f.retry_period_d);
    if (absl::Status st = k8s::ValidateLeaseOptions(lease); !st.ok()) {
      return Fail(kWho, "--leader-elect-*: " + std::string(st.message()), kUsageError);
    }
  }
  // Our own inputs before the first call to the API server: the serving pair's files and the
  // listen addresses (a busy port used to show after the initial sync, with no reason given).
  if (!f.tls_cert_file.empty() || !f.tls_key_file.empty()) {
    if (f.tls_cert_file.empty() || f.tls_key_file.empty())
      return Fail(kWho, "--tls-cert-file and --tls-key-file go together", kUsageError);
    auto cert_pem = ReadFileToString(f.tls_cert_file);
    if (!cert_pem.ok())
      return Fail(kWho, "--tls-cert-file " + Message(cert_pem.status()), kUsageError);
    auto key_pem = ReadFileToString(f.tls_key_file);
    if (!key_pem.ok())
      return Fail(kWho, "--tls-key-file " + Message(key_pem.status()), kUsageError);
    auto ctx = http::ServerTlsContext(*cert_pem, *key_pem);
    if (!ctx.ok())
      return Fail(kWho,
                  "--tls-cert-file " + f.tls_cert_file + " with --tls-key-file " + f.tls_key_file +
                      ": " + Message(ctx.status()),
                  kUsageError);
    SSL_CTX_free(*ctx);
  }
  // A port free at the check can be taken before the server binds it; httplib then says only
  // that it failed, so the probe is asked again for which of in use, no permission or no address.
  auto listen_failed = [](const std::string& flag, const std::string& host, int port) {
    absl::Status why = ProbeTcpListen(host, port);
    return Fail(kWho,
                flag + ": " +
                    (why.ok() ? absl::StrCat("cannot listen on ", host, ":", port) : Message(why)));
  };
  for (const auto& [flag, host, port] :
       {std::tuple<const char*, std::string, int>{"--extender-listen", ext_host, ext_port},
        {"--webhook-listen", hook_host, f.webhook_listen.empty() ? 0 : hook_port},
        {"--health-listen", health_host, f.health_listen.empty() ? 0 : health_port}}) {
    if (port == 0) continue;
    if (absl::Status st = ProbeTcpListen(host, port); !st.ok())
      return Fail(kWho, std::string(flag) + ": " + Message(st));
  }
  auto config = k8s::ResolveConfig(f.kubeconfig);
  if (!config.ok()) return Fail(kWho, config.status(), kUsageError);
  k8s::Client api(*config);
  scheduler::ExtenderOptions eo;
  eo.names = f.names;
  eo.default_policy = f.policy;
  eo.workload_refresh = absl::ToChronoMilliseconds(f.workload_refresh_every);
  eo.scheduler_names = absl::StrSplit(f.extender_scheduler_names, ',', absl::SkipEmpty());
  if (!f.scheduler_name.empty()) eo.scheduler_names.push_back(f.scheduler_name);
  eo.echo_node_objects = f.extender_echo_node_objects;
  eo.debug_endpoints = f.extender_debug_endpoints;
  scheduler::Extender extender(&api, eo);
  if (auto s = extender.Sync(); !s.ok()) {
    return Fail(kWho, "initial sync with the API server failed: " + std::string(s.message()));
  }
  extender.StartWatching();
  // Replicas: the leader alone answers the extender's verbs (and so alone reserves and binds);
  // the others keep their state current from the watches, ready to take over. A new leader
  // lists again first, so that it sees every bind of the previous one before it places a pod.
  std::unique_ptr<k8s::LeaderElector> elector;
  if (f.leader_elect) {
    const std::string pod = EnvOr("POD_NAME", ""), pod_ns = EnvOr("POD_NAMESPACE", "");
    auto label = [&api, pod, pod_ns](bool leader) {
      if (pod.empty() || pod_ns.empty()) return;  // not in a pod: nothing routes by label
      k8s::json patch = {
          {"metadata", {{"labels", {{kLeaderLabel, leader ? k8s::json("true") : k8s::json()}}}}}};
      if (auto r = api.PatchPod(pod_ns, pod, k8s::PatchType::kMerge, patch); !r.ok()) {
        spdlog::warn("label {} on pod {}/{}: {}", kLeaderLabel, pod_ns, pod,
                     std::string(r.status().message()));
      }
    };
    const std::string follower =
        absl::StrCat("gpulet scheduler ", lease.identity, " is not the leader (Lease ", lease.ns,
                     "/", lease.name, "); the extender's Service routes to the leader");
    extender.SetServing(false, follower);
    elector = std::make_unique<k8s::LeaderElector>(
        &api, lease,
        [&extender, label] {
          if (auto s = extender.Sync(); !s.ok()) {
            spdlog::warn("re-list as leader: {}", std::string(s.message()));
          }
          extender.SetServing(true);
          label(true);
        },
        [&extender, label, follower] {
          extender.SetServing(false, follower);
          label(false);
        });
    elector->Start();
  }

  http::ServerLimits limits;
  limits.max_body_bytes = static_cast<size_t>(f.max_request_bytes);
  limits.workers = static_cast<int>(f.workers);
  // One largest body at a time in parsed form: its DOM costs up to ~40x the text (2 MiB of
  // "{}," is ~80 MiB), and the Deployment's limit is 256 MiB.
  http::SetUntrustedJsonBudget(limits.max_body_bytes);
  // glibc gives every thread that allocates its own arena and keeps freed memory there: a large
  // DOM freed on each of 50 worker threads adds up to GiBs of RSS (measured: 1.2 GiB after 24
  // concurrent 2 MiB bodies). Two arenas make freed memory reusable by every thread.
  mallopt(M_ARENA_MAX, 2);

  // The serving certificate (webhook, and the extender when it serves HTTPS): files, a Secret, or
  // self-issued and renewed (scheduler/serving_cert.h). Declared before the reloaders and the
  // servers, so that its files outlive them.
  std::unique_ptr<scheduler::ServingCert> cert;
  if (!f.webhook_listen.empty() || !client_ca.empty()) {
    scheduler::ServingCertOptions co;
    co.cert_file = f.tls_cert_file;
    co.key_file = f.tls_key_file;
    co.secret = f.tls_secret;
    co.names = absl::StrSplit(f.tls_names, ',', absl::SkipEmpty());
    co.renew_before = absl::ToChronoSeconds(f.renew_before);
    co.webhook_configuration = f.webhook_configuration;
    auto c = scheduler::ServingCert::Create(std::move(co), &api);
    if (!c.ok()) {
      extender.StopWatching();
      return Fail(kWho, "serving certificate: " + std::string(c.status().message()));
    }
    cert = *std::move(c);
  }
  // Installed as the servers' certificate callback: declared before them, so they outlive them.
  std::vector<std::unique_ptr<http::CertReloader>> reloaders;
  // A TLS listener with the serving pair (reloaded from its files when they change).
  auto make_tls = [&](const std::string& ca) -> absl::StatusOr<SSL_CTX*> {
    ASSIGN_OR_RETURN(SSL_CTX * ctx,
                     http::ServerTlsContext(cert->pem().cert_pem, cert->pem().key_pem, ca));
    if (!cert->cert_file().empty()) {
      auto r = http::CertReloader::Load(cert->cert_file(), cert->key_file());
      if (r.ok()) {
        (*r)->Install(ctx);
        reloaders.push_back(*std::move(r));
      } else {
        spdlog::warn("serving certificate will not be reloaded: {}",
                     std::string(r.status().message()));
      }
    }
    return ctx;
  };

  Listener ext, hook, health;
  auto stop_all = [&] {
    if (elector) elector->Stop();  // hands the Lease over at once
    extender.StopWatching();
    ext.Stop();
    hook.Stop();
    health.Stop();
  };
  {
    http::ServerLimits el = limits;
    SSL_CTX* ctx = nullptr;
    if (!client_ca.empty()) {
      auto c = make_tls(client_ca);
      if (!c.ok()) {
        stop_all();
        return Fail(kWho, "extender TLS: " + std::string(c.status().message()), kUsageError);
      }
      ctx = *c;
      el.client_names = absl::StrSplit(f.extender_client_names, ',', absl::SkipEmpty());
    }
    ext.server = std::make_unique<http::GuardedServer>(el, ctx);
    extender.Register(*ext.server, f.extender_prefix);
    ext.server->Get("/healthz", [](const httplib::Request&, httplib::Response& r) {
      r.set_content("ok", "text/plain");
    });
    if (!ext.server->bind_to_port(ext_host, ext_port)) {
      stop_all();
      return listen_failed("--extender-listen " + f.extender_listen, ext_host, ext_port);
    }
    ext.thread = std::thread([&ext] { ext.server->listen_after_bind(); });
  }
  if (!f.health_listen.empty()) {
    health.server = std::make_unique<http::GuardedServer>(limits);
    health.server->Get("/healthz", [](const httplib::Request&, httplib::Response& r) {
      r.set_content("ok", "text/plain");
    });
    if (!health.server->bind_to_port(health_host, health_port)) {
      stop_all();
      return listen_failed("--health-listen " + f.health_listen, health_host, health_port);
    }
    health.thread = std::thread([&health] { health.server->listen_after_bind(); });
  }

  scheduler::AdmissionWebhook webhook({f.names, f.max_memory_units, f.scheduler_name}, &api);
  if (!f.webhook_listen.empty()) {
    auto ctx = make_tls("");
    if (!ctx.ok()) {
      stop_all();
      return Fail(kWho, "webhook TLS: " + std::string(ctx.status().message()));
    }
    hook.server = std::make_unique<http::GuardedServer>(limits, *ctx);
    webhook.Register(*hook.server);
    if (!hook.server->bind_to_port(hook_host, hook_port)) {
      stop_all();
      return listen_failed("--webhook-listen " + f.webhook_listen, hook_host, hook_port);
    }
    hook.thread = std::thread([&hook] { hook.server->listen_after_bind(); });
    cert->PublishCa();
  }
  // Renewed pairs reach the servers through the reloaders' files: without one, no renewal.
  if (cert && !reloaders.empty()) cert->StartRenewal(absl::ToChronoMilliseconds(f.renew_check));
  spdlog::info("gpulet scheduler: extender on {}{} ({}), webhook on {}", f.extender_listen,
               f.extender_prefix, client_ca.empty() ? "HTTP" : "HTTPS, client certificates",
               f.webhook_listen.empty() ? "(off)" : f.webhook_listen);
  int sig = 0;
  sigwait(&stop, &sig);
  spdlog::info("gpulet scheduler: signal {}, stopping", sig);
  stop_all();
  return 0;  // `cert` goes last: it stops the renewal and removes the self-issued pair's files
}

std::function<int()> SetupScheduler(CLI::App& sub) {
  auto f = std::make_shared<SchedulerFlags>();
  sub.add_option("--kubeconfig", f->kubeconfig,
                 "kubeconfig file; default: $KUBECONFIG, in-cluster service account, "
                 "~/.kube/config")
      ->type_name("FILE");
  sub.add_option("--extender-listen", f->extender_listen,
                 "HOST:PORT of the scheduler extender (kube-scheduler's urlPrefix). A non-loopback "
                 "address needs --extender-client-ca-file (or --extender-insecure)")
      ->capture_default_str();
  sub.add_option("--extender-client-ca-file", f->extender_client_ca_file,
                 "Serve the extender over HTTPS (the webhook's serving certificate) and require "
                 "client certificates signed by this CA bundle (PEM), e.g. the cluster CA")
      ->type_name("FILE");
  sub.add_option("--extender-client-names", f->extender_client_names,
                 "Comma-separated subject CNs (or DNS SANs) a client certificate must carry")
      ->capture_default_str();
  sub.add_flag("--extender-insecure", f->extender_insecure,
               "Allow a plain-HTTP extender on a non-loopback address (anyone who reaches it can "
               "bind vGPU pods; see docs/security.md)");
  sub.add_flag("--extender-echo-node-objects", f->extender_echo_node_objects,
               "Answer kube-scheduler configured with nodeCacheCapable: false (echo the Node "
               "objects it sent) instead of asking for nodeCacheCapable: true");
  sub.add_flag("--extender-debug-endpoints", f->extender_debug_endpoints,
               "Serve GET <prefix>/state and /workload (the cluster's GPU layout) on the extender");
  sub.add_option("--extender-scheduler-names", f->extender_scheduler_names,
                 "Comma-separated spec.schedulerName values whose pods bind accepts "
                 "(--scheduler-name is added)")
      ->capture_default_str();
  sub.add_option("--health-listen", f->health_listen,
                 "HOST:PORT of a plain-HTTP GET /healthz for kubelet probes (empty: off)");
  sub.add_option("--max-request-bytes", f->max_request_bytes,
                 "Largest request body the extender and the webhook accept (413 above)")
      ->check(CLI::Range(int64_t{64 << 10}, int64_t{64 << 20}))
      ->capture_default_str();
  sub.add_option("--workers", f->workers, "Request threads per listener")
      ->check(CLI::Range(int64_t{1}, int64_t{256}))
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
  sub.add_option("--tls-renew-before", f->tls_renew_before,
                 "How long before expiry a self-issued certificate (one-year validity) is "
                 "replaced, in the running process and in --tls-secret (1h..87600h; a bare "
                 "number is hours, deprecated)")
      ->capture_default_str()
      ->type_name("DURATION");
  sub.add_option("--tls-renew-check", f->tls_renew_check,
                 "How often the self-issued certificate's expiry is checked (10ms..24h; a bare "
                 "number is milliseconds, deprecated)")
      ->capture_default_str()
      ->type_name("DURATION");
  sub.add_option("--policy", f->policy,
                 "Default placement policy: binpack, spread, or a placement registry name "
                 "(best-fit, gpu-packing, dot-product, fgd, gpulet, random); a pod may choose "
                 "with the annotation gpulet.io/vgpu-policy")
      ->capture_default_str();
  sub.add_option("--workload-refresh", f->workload_refresh,
                 "How often the workload (the mix of pending and bound vGPU pods) that the fgd "
                 "and gpulet policies score against is rebuilt while pods change; 0: before "
                 "every decision after a change (..1h; a bare number is milliseconds, "
                 "deprecated)")
      ->capture_default_str()
      ->type_name("DURATION");
  sub.add_option("--scheduler-name", f->scheduler_name,
                 "Mutating webhook: set spec.schedulerName of vGPU pods to this profile");
  sub.add_option("--max-memory-units", f->max_memory_units,
                 "Largest GPU in 256 MiB units for the webhook's memory check; 0: learn from "
                 "the nodes")
      ->capture_default_str();
  sub.add_flag("--leader-elect", f->leader_elect,
               "Elect a leader among replicas on a coordination.k8s.io Lease: only the leader "
               "answers the extender's verbs and labels its pod " +
                   std::string(kLeaderLabel) + "=true (run 2+ replicas only with this)");
  sub.add_option("--leader-elect-lease-name", f->lease_name, "Name of the Lease")
      ->capture_default_str();
  sub.add_option("--leader-elect-namespace", f->lease_namespace,
                 "Namespace of the Lease (default: $POD_NAMESPACE, else gpulet-system)");
  sub.add_option("--leader-elect-identity", f->identity,
                 "This replica's name in the Lease (default: $POD_NAME, else HOSTNAME_PID)");
  sub.add_option("--leader-elect-lease-duration", f->lease_duration,
                 "How long followers wait after the leader's last renewal before taking over")
      ->capture_default_str()
      ->type_name("DURATION");
  sub.add_option("--leader-elect-renew-deadline", f->renew_deadline,
                 "How long the leader keeps leading without a successful renewal")
      ->capture_default_str()
      ->type_name("DURATION");
  sub.add_option("--leader-elect-retry-period", f->retry_period,
                 "How often candidates try to acquire or renew the Lease")
      ->capture_default_str()
      ->type_name("DURATION");
  sub.add_option("--core-resource", f->names.core, "Resource name of vGPU cores")
      ->capture_default_str();
  sub.add_option("--memory-resource", f->names.memory,
                 "Resource name of vGPU memory (256 MiB units)")
      ->capture_default_str();
  Example(sub, "gpulet scheduler --extender-listen 127.0.0.1:12345 --policy binpack");
  return [f] { return RunScheduler(*f); };
}

}  // namespace

GPULET_COMMAND(scheduler, "vGPU scheduler extender (filter/prioritize/bind) and admission webhook",
               SetupScheduler);

}  // namespace gpulet::cmd
