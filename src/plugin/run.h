// The device plugin's whole life in a process (`gpulet device-plugin`, `gpulet agent`): the machine
// (gpu::Machine: its GPU layer, waited for when failOnInitError is false), the plugin, the parts
// the caller starts beside it on the same machine, and the stop on a signal.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "gpu/open.h"
#include "plugin/config.h"
#include "plugin/plugin.h"

namespace gpulet::plugin {

struct RunOptions {
  gpu::GpuOptions gpu;
  std::string plugin_dir = "/var/lib/kubelet/device-plugins";
  std::string kubelet_socket = "kubelet.sock";
  std::string pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  ConfigSources sources;  // kept for reloads
  // vGPU Allocate finds its pod through the API (gpulet agent with a node name); may be null.
  k8s::Client* api = nullptr;
  std::string node_name;
  // False when someone else follows the config (per-node configs: NodeConfigWatcher).
  bool watch_file = true;
  // Called once the plugin serves, before `with_plugin`; `on_stop` before the plugin goes away,
  // on every return after `on_serving` ran (the per-node config watcher's start and stop).
  std::function<void(DevicePlugin&)> on_serving;
  std::function<void()> on_stop;
  // DevicePlugin::Options::mps_bin_dir and mps_env.
  std::string mps_bin_dir;
  std::map<std::string, std::string> mps_env;
};

// Runs until SIGINT/SIGTERM/SIGQUIT: OK then. `with_plugin`, when set, runs once the plugin serves
// (the agent starts its other parts there) and may fail the start; `before_teardown` stops them
// again before the plugin and the GPU layer are destroyed, also after `with_plugin` failed (it
// must then stop what was started). While the driver cannot be opened and
// config.fail_on_init_error is false, "<who>: <why>" goes to stderr every 5 s.
// REQUIRES: BlockSignals() was called before any thread was started.
absl::Status RunDevicePlugin(
    std::string_view who, RunOptions o, Config config,
    const std::function<absl::Status(gpu::Machine&, DevicePlugin&)>& with_plugin = {},
    const std::function<void()>& before_teardown = {});

}  // namespace gpulet::plugin
