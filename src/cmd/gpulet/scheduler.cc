// `gpulet scheduler`: the vGPU scheduler extender (kube-scheduler extender v1: loopback HTTP, or
// HTTPS with client certificates) and the admission webhook (HTTPS, AdmissionReview v1) in one
// process (scheduler::Server, src/scheduler/serve.h). Only flags to options here.
#include <signal.h>
#include <unistd.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cmd/common/exit.h"
#include "cmd/gpulet/command.h"
#include "cmd/gpulet/logs.h"
#include "common/duration.h"
#include "common/fs.h"
#include "common/signals.h"
#include "common/status.h"
#include "k8s/client.h"
#include "placement/vgpu_policy.h"
#include "scheduler/serve.h"
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

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

constexpr char kWho[] = "gpulet scheduler";

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

// Flags to options; everything else is scheduler::Server's.
absl::StatusOr<scheduler::ServeOptions> ToServeOptions(SchedulerFlags& f) {
  RETURN_IF_ERROR(ParseDurationFlags(f));
  if (!vgpu::MakeVgpuPolicy(f.policy).ok()) {
    return absl::InvalidArgumentError("--policy \"" + f.policy + "\" is not a policy (known: " +
                                      absl::StrJoin(vgpu::VgpuPolicyNames(), ", ") + ")");
  }
  scheduler::ServeOptions o;
  o.extender_listen = f.extender_listen;
  o.extender_prefix = f.extender_prefix;
  o.extender_insecure = f.extender_insecure;
  o.extender_client_names = absl::StrSplit(f.extender_client_names, ',', absl::SkipEmpty());
  if (!f.extender_client_ca_file.empty()) {
    auto ca = ReadFileToString(f.extender_client_ca_file);
    if (!ca.ok())
      return absl::InvalidArgumentError("--extender-client-ca-file: " + Message(ca.status()));
    o.extender_client_ca = *ca;
  }
  o.webhook_listen = f.webhook_listen;
  o.health_listen = f.health_listen;
  o.limits.max_body_bytes = static_cast<size_t>(f.max_request_bytes);
  o.limits.workers = static_cast<int>(f.workers);
  o.cert.cert_file = f.tls_cert_file;
  o.cert.key_file = f.tls_key_file;
  o.cert.secret = f.tls_secret;
  o.cert.names = absl::StrSplit(f.tls_names, ',', absl::SkipEmpty());
  o.cert.renew_before = absl::ToChronoSeconds(f.renew_before);
  o.cert.webhook_configuration = f.webhook_configuration;
  o.renew_check = absl::ToChronoMilliseconds(f.renew_check);
  o.extender.names = f.names;
  o.extender.default_policy = f.policy;
  o.extender.workload_refresh = absl::ToChronoMilliseconds(f.workload_refresh_every);
  o.extender.scheduler_names = absl::StrSplit(f.extender_scheduler_names, ',', absl::SkipEmpty());
  if (!f.scheduler_name.empty()) o.extender.scheduler_names.push_back(f.scheduler_name);
  o.extender.echo_node_objects = f.extender_echo_node_objects;
  o.extender.debug_endpoints = f.extender_debug_endpoints;
  o.webhook = {f.names, f.max_memory_units, f.scheduler_name};
  if (f.leader_elect) {
    k8s::LeaseOptions& lease = o.lease.emplace();
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
    o.pod_name = EnvOr("POD_NAME", "");
    o.pod_namespace = EnvOr("POD_NAMESPACE", "");
  }
  return o;
}

int RunScheduler(SchedulerFlags f) {
  const sigset_t stop = BlockStopSignals();  // before any thread, so sigwait receives them
  UseDaemonLogs();
  auto options = ToServeOptions(f);
  if (!options.ok()) return Fail(kWho, options.status());
  // Our own inputs before the first call to the API server.
  if (absl::Status st = scheduler::CheckServeOptions(*options); !st.ok()) return Fail(kWho, st);
  auto config = k8s::ResolveConfig(f.kubeconfig);
  if (!config.ok()) return Fail(kWho, config.status(), kUsageError);
  k8s::Client api(*config);
  auto server = scheduler::Server::Start(*std::move(options), &api);
  if (!server.ok()) return Fail(kWho, server.status());
  spdlog::info("gpulet scheduler: extender on {}{} ({}), webhook on {}", f.extender_listen,
               f.extender_prefix,
               f.extender_client_ca_file.empty() ? "HTTP" : "HTTPS, client certificates",
               f.webhook_listen.empty() ? "(off)" : f.webhook_listen);
  int sig = 0;
  sigwait(&stop, &sig);
  spdlog::info("gpulet scheduler: signal {}, stopping", sig);
  (*server)->Stop();
  return 0;  // the server's certificate goes last: it removes the self-issued pair's files
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
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub.add_flag("--leader-elect", f->leader_elect,
               "Elect a leader among replicas on a coordination.k8s.io Lease: only the leader "
               "answers the extender's verbs and labels its pod " +
                   std::string(scheduler::kLeaderLabel) + "=true (run 2+ replicas only with this)");
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
