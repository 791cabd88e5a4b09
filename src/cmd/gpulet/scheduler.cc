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
#include "cmd/gpulet/scheduler_flags.h"
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
  o.extender.all_pods = f.extender_all_pods;
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
  AddSchedulerFlags(sub, *f);
  Example(sub, "gpulet scheduler --extender-listen 127.0.0.1:12345 --policy binpack");
  return [f] { return RunScheduler(*f); };
}

}  // namespace

GPULET_COMMAND(scheduler, "vGPU scheduler extender (filter/prioritize/bind) and admission webhook",
               SetupScheduler);

}  // namespace gpulet::cmd
