// `gpulet install` / `gpulet uninstall`: the node DaemonSet's init step (node/install.h), and its
// uninstall-on-delete container (`gpulet uninstall --on-owner-delete`, node/owner_deletion.h).
#include "node/install.h"

#include <signal.h>

#include <iostream>
#include <memory>

#include "cmd/common/exit.h"
#include "cmd/gpulet/command.h"
#include "cmd/gpulet/gpu_flags.h"
#include "cmd/gpulet/logs.h"
#include "common/signals.h"
#include "k8s/client.h"
#include "node/owner_deletion.h"

namespace gpulet::cmd {
namespace {

// Each action is printed and flushed as it happens: the engine restart can end this container's
// output when the engine runs it (gpulet uninstall in a `kubectl debug node` pod).
void Show(const std::string& action) { std::cout << action << std::endl; }

int Report(const char* what, const absl::StatusOr<node::InstallResult>& r) {
  return r.ok() ? 0 : Fail(std::string("gpulet ") + what, r.status());
}

void AddRestart(CLI::App& sub, std::string& restart) {
  sub.add_option("--restart", restart,
                 "How to restart the engine when its configuration changed: auto (systemctl "
                 "restart, chrooted into --host-root), none, or a shell command")
      ->capture_default_str();
}

std::function<int()> SetupInstall(CLI::App& sub) {
  auto o = std::make_shared<node::InstallOptions>();
  sub.add_option("--host-root", o->host_root, "Where the host's root filesystem is mounted")
      ->capture_default_str()
      ->check(CLI::ExistingDirectory);  // before NVML is looked for under it
  sub.add_option("--runtime", o->runtime, "containerd, docker, crio or auto (detect)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "containerd", "docker", "crio"}));
  sub.add_option("--artifacts", o->artifacts_dir,
                 "Directory with bin/ and lib/ to install from (default: beside this binary)");
  sub.add_option("--prefix", o->prefix, "Host directory for the installed bin/ and lib/")
      ->capture_default_str();
  sub.add_option("--cdi-dir", o->cdi_dir, "Host directory for the CDI spec")->capture_default_str();
  sub.add_flag("--set-as-default", o->set_as_default, "Make gpulet's runtime the engine's default");
  AddRestart(sub, o->restart_command);
  AddGpuFlags(sub, o->gpu);
  Example(sub, "gpulet install --host-root /host --runtime containerd --set-as-default");
  return [o] {
    ReadHostUnder(o->gpu, o->host_root);
    return Report("install", node::Install(*o, Show));
  };
}

struct UninstallFlags {
  std::string host_root = "/";
  std::string restart = "auto";
  bool on_owner_delete = false;
  std::string pod_name, pod_namespace, kubeconfig;
};

// --on-owner-delete: wait for SIGTERM, then uninstall only when this pod's DaemonSet is being
// deleted (node/owner_deletion.h). The pod's name and namespace come from the downward API.
int UninstallOnOwnerDelete(const UninstallFlags& f) {
  const char* who = "gpulet uninstall --on-owner-delete";
  if (f.pod_name.empty() || f.pod_namespace.empty())
    return Fail(who,
                "--pod-name and --pod-namespace are required (the downward API's "
                "metadata.name and metadata.namespace)",
                kUsageError);
  const sigset_t stop = BlockStopSignals();
  UseDaemonLogs();
  auto cfg = k8s::ResolveConfig(f.kubeconfig);
  if (!cfg.ok()) return Fail(who, cfg.status());
  // At termination one GET decides: a few quick tries, not the default minutes of retries.
  cfg->max_attempts = 3;
  cfg->timeout = std::chrono::seconds(5);
  k8s::Client client(*cfg);
  node::OwnerDeletion owner(&client, f.pod_namespace, f.pod_name);
  owner.Start();
  std::cout << "waiting; the engine configuration is restored only when this pod's DaemonSet is "
               "deleted"
            << std::endl;
  int sig = 0;
  sigwait(&stop, &sig);
  node::OwnerDeletion::Verdict v = owner.Decide();
  // The watch is stopped after the work: ending it can wait for the connection to close, and the
  // kubelet's grace period is better spent on the uninstall.
  if (!v.deleting) {
    std::cout << "kept the engine configuration: " << v.reason << std::endl;
    owner.Stop();
    return 0;
  }
  std::cout << v.reason << ": uninstalling" << std::endl;
  int rc = Report("uninstall", node::Uninstall(f.host_root, f.restart, Show));
  owner.Stop();
  return rc;
}

std::function<int()> SetupUninstall(CLI::App& sub) {
  auto f = std::make_shared<UninstallFlags>();
  sub.add_option("--host-root", f->host_root, "Where the host's root filesystem is mounted")
      ->capture_default_str();
  AddRestart(sub, f->restart);
  sub.add_flag("--on-owner-delete", f->on_owner_delete,
               "Wait for SIGTERM, then uninstall only if this pod's DaemonSet is being deleted "
               "(the node agent's uninstall-on-delete container)");
  sub.add_option("--pod-name", f->pod_name, "This pod's name (with --on-owner-delete)");
  sub.add_option("--pod-namespace", f->pod_namespace,
                 "This pod's namespace (with --on-owner-delete)");
  sub.add_option("--kubeconfig", f->kubeconfig,
                 "kubeconfig (with --on-owner-delete; default: $KUBECONFIG, in-cluster)");
  Example(sub, "gpulet uninstall --host-root /host");
  return [f] {
    if (f->on_owner_delete) return UninstallOnOwnerDelete(*f);
    return Report("uninstall", node::Uninstall(f->host_root, f->restart, Show));
  };
}

}  // namespace

GPULET_COMMAND(install,
               "Install the runtime shim, hook, interposer and CDI spec on the host and configure "
               "the container engine (idempotent)",
               SetupInstall);
GPULET_COMMAND(uninstall,
               "Restore the engine configuration and remove what `gpulet install` placed",
               SetupUninstall);

}  // namespace gpulet::cmd
