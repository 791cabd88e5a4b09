#include "plugin/run.h"

#include <signal.h>

#include <iostream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/signals.h"
#include "kubelet/podresources_client.h"
#include "vgpu/rules/rules.h"

namespace gpulet::plugin {

absl::Status RunDevicePlugin(
    std::string_view who, RunOptions o, Config config,
    const std::function<absl::Status(gpu::Machine&, DevicePlugin&)>& with_plugin,
    const std::function<void()>& before_teardown) {
  auto machine = gpu::Machine::Open(o.gpu);
  const sigset_t stop = StopSignals();
  while (!machine.ok()) {
    if (config.fail_on_init_error) return machine.status();
    std::cerr << who << ": " << machine.status().message() << "\n";
    // failOnInitError=false: wait for the driver instead of crash-looping.
    struct timespec ts = {5, 0};
    if (sigtimedwait(&stop, nullptr, &ts) > 0) return absl::OkStatus();
    machine = gpu::Machine::Open(o.gpu);
  }
  DevicePlugin::Options options;
  options.manager.plugin_dir = o.plugin_dir;
  options.manager.kubelet_socket = o.kubelet_socket;
  options.sources = std::move(o.sources);
  options.watch_file = o.watch_file;
  options.host_root = (*machine)->node_root();
  options.api = o.api;
  options.node_name = o.node_name;
  options.mps_bin_dir = o.mps_bin_dir;
  options.mps_env = o.mps_env;
  kubelet::PodResourcesOptions pr;
  pr.socket = o.pod_resources_socket;
  pr.extra_resources = {vgpu::ResourceNames().core, vgpu::ResourceNames().memory};
  options.pod_resources = std::make_shared<kubelet::GrpcPodResourcesLister>(pr);
  DevicePlugin dp(&(*machine)->gpus(), std::move(options), std::move(config));
  if (absl::Status s = dp.Start(); !s.ok()) return s;
  if (o.on_serving) o.on_serving(dp);
  struct OnStop {
    const std::function<void()>& f;
    ~OnStop() {
      if (f) f();
    }
  } on_stop{o.on_stop};
  // Parts started by `with_plugin` share the machine and the plugin: they stop before those go
  // away, also when a later part failed to start.
  if (with_plugin) {
    if (absl::Status s = with_plugin(**machine, dp); !s.ok()) {
      if (before_teardown) before_teardown();
      return s;
    }
  }
  int rc = dp.Run();
  if (before_teardown) before_teardown();
  if (rc != 0) return absl::InternalError(absl::StrCat("device plugin stopped with status ", rc));
  return absl::OkStatus();
}

}  // namespace gpulet::plugin
