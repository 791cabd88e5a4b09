// The DRA driver's start-up, shared by `gpulet agent` and `gpulet dra-driver`: options from the
// plugin config's gpulet.dra section and the CDI flags, health from the device plugin's monitor.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cmd/gpulet/cdi_flags.h"
#include "cmd/gpulet/plugin_flags.h"
#include "dra/driver.h"
#include "k8s/client.h"

namespace gpulet::cmd {

// The DRA driver for the GPUs of gpulet.dra.gpus (null when that is empty); the device plugin
// already leaves them out. It follows the plugin's health monitor.
inline absl::StatusOr<std::unique_ptr<dra::Driver>> StartDraDriver(gpu::Machine& machine,
                                                                   plugin::DevicePlugin& dp,
                                                                   k8s::Client* client,
                                                                   const std::string& node_name,
                                                                   const CdiRefreshFlags& cdi) {
  plugin::Config cfg = dp.config();
  if (cfg.dra.gpus.empty()) return nullptr;
  if (!client)
    return absl::InvalidArgumentError(
        "gpulet.dra.gpus is set but --node-name is not: the DRA driver publishes ResourceSlices "
        "and reads ResourceClaims through the API server");
  dra::DriverOptions o;
  o.node_name = node_name;
  o.devices.selection = cfg.dra.gpus;
  o.devices.consumable_capacity = cfg.dra.consumable_capacity;
  o.devices.host_root = machine.node_root();
  o.kubelet_dir = cfg.dra.kubelet_dir;
  o.cdi_dir = cfg.dra.cdi_dir;
  o.state_dir = cfg.dra.state_dir;
  o.cdi.driver_root = cdi.driver_root;
  o.cdi.host_root = cdi.host_root;
  o.cdi.hook_path = cdi.hook_path;
  o.cdi.proc_root = machine.kernel_root();
  o.library_host_path = cfg.vgpu.library;
  o.accounting_tmpfs = cfg.vgpu.accounting_tmpfs;
  plugin::HealthMonitor* health = dp.health();
  auto d = std::make_unique<dra::Driver>(
      &machine.gpus(), client, [health](uint32_t g, int mig) { return health->Healthy(g, mig); },
      health->changes(), o);
  if (absl::Status s = d->Start(); !s.ok()) return s;
  return d;
}

}  // namespace gpulet::cmd
