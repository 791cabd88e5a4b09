// Node install and uninstall of the runtime pieces, as the node DaemonSet's init step runs them
// (`gpulet install --host-root /host`). Install copies the shim, the hook and the interposer
// library onto the host, writes the CDI spec, registers the shim with the detected container engine
// and restarts the engine only when its configuration changed. Everything it placed or changed is
// recorded in <host>/var/lib/gpulet/install.json, with a copy of each engine file as it was before
// the first install, so uninstall restores the engine configuration and removes exactly what was
// placed. Both are idempotent: a second run changes nothing.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/open.h"

namespace gpulet::node {

struct InstallOptions {
  std::string host_root = "/";
  std::string runtime = "auto";              // containerd | docker | crio | auto (detect)
  std::string artifacts_dir;                 // holds bin/ and lib/; empty: beside this executable
  std::string prefix = "/usr/local/gpulet";  // host path of the installed bin/ and lib/
  std::string cdi_dir = "/var/run/cdi";
  // "auto": `systemctl restart <engine>` (inside `chroot <host_root>` when it is not "/");
  // "none": do not restart; anything else: a shell command run as is.
  std::string restart_command = "auto";
  bool set_as_default = false;
  gpu::GpuOptions gpu;  // for the CDI spec
};

struct InstallResult {
  std::string engine;
  std::vector<std::string> actions;  // human-readable, in order
  bool engine_config_changed = false;
};

// Host path `p` as this process sees it with the host's root at `host_root` ("/" leaves it alone):
// symlinks on the way, the last component included, are followed within `host_root`.
std::string UnderRoot(const std::string& host_root, const std::string& p);

// The engine whose configuration exists under `host_root`: containerd, then crio, then docker.
absl::StatusOr<std::string> DetectEngine(const std::string& host_root);

// Called with each action as it happens. Restarting the engine can cut off the output of the
// container this runs in (the engine runs it), so callers show actions through this, not after
// the call returns; a failed call has shown what it did before the failure.
using OnAction = std::function<void(const std::string&)>;

absl::StatusOr<InstallResult> Install(const InstallOptions& options,
                                      const OnAction& on_action = {});

// Restores the engine configuration saved by Install and removes the installed files and the
// record. Without a record (never installed) it changes nothing and says so.
absl::StatusOr<InstallResult> Uninstall(const std::string& host_root,
                                        const std::string& restart_command = "auto",
                                        const OnAction& on_action = {});

}  // namespace gpulet::node
