// The flags of `gpulet scheduler` (scheduler.cc turns them into scheduler::ServeOptions).
#pragma once

#include <cstdint>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/time/time.h"
#include "scheduler/serve.h"
#include "vgpu/rules/rules.h"

namespace gpulet::cmd {

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
  bool extender_all_pods = false;
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

inline void AddSchedulerFlags(CLI::App& sub, SchedulerFlags& f) {
  sub.add_option("--kubeconfig", f.kubeconfig,
                 "kubeconfig file; default: $KUBECONFIG, in-cluster service account, "
                 "~/.kube/config")
      ->type_name("FILE");
  sub.add_option("--extender-listen", f.extender_listen,
                 "HOST:PORT of the scheduler extender (kube-scheduler's urlPrefix). A non-loopback "
                 "address needs --extender-client-ca-file (or --extender-insecure)")
      ->capture_default_str();
  sub.add_option("--extender-client-ca-file", f.extender_client_ca_file,
                 "Serve the extender over HTTPS (the webhook's serving certificate) and require "
                 "client certificates signed by this CA bundle (PEM), e.g. the cluster CA")
      ->type_name("FILE");
  sub.add_option("--extender-client-names", f.extender_client_names,
                 "Comma-separated subject CNs (or DNS SANs) a client certificate must carry")
      ->capture_default_str();
  sub.add_flag("--extender-insecure", f.extender_insecure,
               "Allow a plain-HTTP extender on a non-loopback address (anyone who reaches it can "
               "bind vGPU pods; see docs/security.md)");
  sub.add_flag("--extender-echo-node-objects", f.extender_echo_node_objects,
               "Answer kube-scheduler configured with nodeCacheCapable: false (echo the Node "
               "objects it sent) instead of asking for nodeCacheCapable: true");
  sub.add_flag("--extender-all-pods", f.extender_all_pods,
               "Place pods that ask for no vGPU too, with the same policy (kube-scheduler's "
               "extender entry then has no managedResources, so it sends every pod): CPU-only "
               "pods go where they strand the fewest GPUs, as gpulet-sched simulate assumes");
  sub.add_flag("--extender-debug-endpoints", f.extender_debug_endpoints,
               "Serve GET <prefix>/state and /workload (the cluster's GPU layout) on the extender");
  sub.add_option("--extender-scheduler-names", f.extender_scheduler_names,
                 "Comma-separated spec.schedulerName values whose pods bind accepts "
                 "(--scheduler-name is added)")
      ->capture_default_str();
  sub.add_option("--health-listen", f.health_listen,
                 "HOST:PORT of a plain-HTTP GET /healthz for kubelet probes (empty: off)");
  sub.add_option("--max-request-bytes", f.max_request_bytes,
                 "Largest request body the extender and the webhook accept (413 above)")
      ->check(CLI::Range(int64_t{64 << 10}, int64_t{64 << 20}))
      ->capture_default_str();
  sub.add_option("--workers", f.workers, "Request threads per listener")
      ->check(CLI::Range(int64_t{1}, int64_t{256}))
      ->capture_default_str();
  sub.add_option("--extender-prefix", f.extender_prefix,
                 "URL prefix of the extender verbs: <prefix>/filter, /prioritize, /bind")
      ->capture_default_str();
  sub.add_option("--webhook-listen", f.webhook_listen,
                 "HOST:PORT of the admission webhook (HTTPS: /validate, /mutate); empty: off")
      ->capture_default_str();
  sub.add_option("--tls-cert-file", f.tls_cert_file,
                 "Webhook serving certificate (PEM); read again when it changes");
  sub.add_option("--tls-key-file", f.tls_key_file, "Webhook serving key (PEM)");
  sub.add_option("--tls-secret", f.tls_secret,
                 "NAMESPACE/NAME of a kubernetes.io/tls Secret holding the webhook certificate; "
                 "created with a self-issued one when missing");
  sub.add_option("--tls-names", f.tls_names,
                 "Comma-separated DNS names / IPs of a self-issued certificate")
      ->capture_default_str();
  sub.add_option("--webhook-configuration", f.webhook_configuration,
                 "Name of the Validating/MutatingWebhookConfiguration whose caBundle is set to "
                 "our self-issued certificate (at start and on every renewal)");
  sub.add_option("--tls-renew-before", f.tls_renew_before,
                 "How long before expiry a self-issued certificate (one-year validity) is "
                 "replaced, in the running process and in --tls-secret (1h..87600h; a bare "
                 "number is hours, deprecated)")
      ->capture_default_str()
      ->type_name("DURATION");
  sub.add_option("--tls-renew-check", f.tls_renew_check,
                 "How often the self-issued certificate's expiry is checked (10ms..24h; a bare "
                 "number is milliseconds, deprecated)")
      ->capture_default_str()
      ->type_name("DURATION");
  sub.add_option("--policy", f.policy,
                 "Default placement policy: binpack, spread, or a placement registry name "
                 "(best-fit, gpu-packing, dot-product, fgd, gpulet, random); a pod may choose "
                 "with the annotation gpulet.io/vgpu-policy")
      ->capture_default_str();
  sub.add_option("--workload-refresh", f.workload_refresh,
                 "How often the workload (the mix of pending and bound vGPU pods) that the fgd "
                 "and gpulet policies score against is rebuilt while pods change; 0: before "
                 "every decision after a change (..1h; a bare number is milliseconds, "
                 "deprecated)")
      ->capture_default_str()
      ->type_name("DURATION");
  sub.add_option("--scheduler-name", f.scheduler_name,
                 "Mutating webhook: set spec.schedulerName of vGPU pods to this profile");
  sub.add_option("--max-memory-units", f.max_memory_units,
                 "Largest GPU in 256 MiB units for the webhook's memory check; 0: learn from "
                 "the nodes")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub.add_flag("--leader-elect", f.leader_elect,
               "Elect a leader among replicas on a coordination.k8s.io Lease: only the leader "
               "answers the extender's verbs and labels its pod " +
                   std::string(scheduler::kLeaderLabel) + "=true (run 2+ replicas only with this)");
  sub.add_option("--leader-elect-lease-name", f.lease_name, "Name of the Lease")
      ->capture_default_str();
  sub.add_option("--leader-elect-namespace", f.lease_namespace,
                 "Namespace of the Lease (default: $POD_NAMESPACE, else gpulet-system)");
  sub.add_option("--leader-elect-identity", f.identity,
                 "This replica's name in the Lease (default: $POD_NAME, else HOSTNAME_PID)");
  sub.add_option("--leader-elect-lease-duration", f.lease_duration,
                 "How long followers wait after the leader's last renewal before taking over")
      ->capture_default_str()
      ->type_name("DURATION");
  sub.add_option("--leader-elect-renew-deadline", f.renew_deadline,
                 "How long the leader keeps leading without a successful renewal")
      ->capture_default_str()
      ->type_name("DURATION");
  sub.add_option("--leader-elect-retry-period", f.retry_period,
                 "How often candidates try to acquire or renew the Lease")
      ->capture_default_str()
      ->type_name("DURATION");
  sub.add_option("--core-resource", f.names.core, "Resource name of vGPU cores")
      ->capture_default_str();
  sub.add_option("--memory-resource", f.names.memory,
                 "Resource name of vGPU memory (256 MiB units)")
      ->capture_default_str();
}

}  // namespace gpulet::cmd
