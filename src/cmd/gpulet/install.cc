// `gpulet install` / `gpulet uninstall`: the node DaemonSet's init step (node/install.h).
#include "node/install.h"

#include <iostream>
#include <memory>

#include "cmd/common/exit.h"
#include "cmd/gpulet/command.h"
#include "cmd/gpulet/gpu_flags.h"

namespace gpulet::cmd {
namespace {

int Report(const char* what, const absl::StatusOr<node::InstallResult>& r) {
  if (!r.ok()) return Fail(std::string("gpulet ") + what, r.status());
  for (const auto& a : r->actions) std::cout << a << "\n";
  return 0;
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
      ->capture_default_str();
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
  return [o] {
    if (o->gpu.simulate.empty() && o->host_root != "/") o->gpu.host_root = o->host_root;
    return Report("install", node::Install(*o));
  };
}

std::function<int()> SetupUninstall(CLI::App& sub) {
  auto host_root = std::make_shared<std::string>("/");
  auto restart = std::make_shared<std::string>("auto");
  sub.add_option("--host-root", *host_root, "Where the host's root filesystem is mounted")
      ->capture_default_str();
  AddRestart(sub, *restart);
  return
      [host_root, restart] { return Report("uninstall", node::Uninstall(*host_root, *restart)); };
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
