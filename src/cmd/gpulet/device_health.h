// The device plugin's health monitor as the exporter's DeviceHealth (metrics/sampler.h), so that
// gpulet_gpu_healthy and what the kubelet is told come from one decision: the agent hands the
// exporter its plugin's monitor; `gpulet exporter` alone runs a monitor of its own.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gpu/gpu.h"
#include "metrics/sampler.h"
#include "plugin/config.h"
#include "plugin/health.h"

namespace gpulet::cmd {

// Answers for the GPUs of the inventory the monitor was made with, found by UUID (the sampler's
// inventory of a later cycle may have lost one).
class MonitorHealth : public metrics::DeviceHealth {
 public:
  MonitorHealth(const plugin::HealthMonitor* monitor, const gpu::Inventory& inventory,
                std::unique_ptr<plugin::HealthMonitor> owned = nullptr)
      : monitor_(monitor), owned_(std::move(owned)) {
    for (size_t i = 0; i < inventory.devices.size(); ++i)
      position_[inventory.devices[i].uuid] = static_cast<uint32_t>(i);
  }
  ~MonitorHealth() override {
    if (owned_) owned_->Stop();
  }
  std::string Reason(const gpu::Device& gpu) const override {
    auto it = position_.find(gpu.uuid);
    return it == position_.end() ? "" : monitor_->Reason(it->second);
  }

 private:
  const plugin::HealthMonitor* monitor_;
  std::unique_ptr<plugin::HealthMonitor> owned_;
  std::map<std::string, uint32_t> position_;
};

// The agent: its device plugin's monitor, which outlives the exporter (the agent stops the
// exporter first). The layer is the plugin's, so its inventory has the plugin's order.
inline metrics::DeviceHealthFactory PluginHealth(const plugin::HealthMonitor* monitor) {
  return [monitor](gpu::GpuLayer*, const gpu::Inventory& inventory) {
    return std::make_unique<MonitorHealth>(monitor, inventory);
  };
}

// `gpulet exporter` alone: a monitor over the exporter's own layer, with the health settings the
// device plugin reads from the environment (DP_DISABLE_HEALTHCHECKS, DP_ENABLE_HEALTHCHECKS,
// GPULET_HEALTH_HOLD_DOWN, UNHEALTHY_DEVICES_FILE, ...). An environment the plugin would refuse is
// refused here too, naming the variable.
inline absl::StatusOr<metrics::DeviceHealthFactory> StandaloneHealth() {
  plugin::ConfigSources sources;
  sources.env = plugin::EnvironmentSnapshot();
  absl::StatusOr<plugin::Config> config = plugin::LoadConfig(sources);
  if (!config.ok()) return config.status();
  return [health = config->health](gpu::GpuLayer* layer, const gpu::Inventory& inventory) {
    auto monitor = std::make_unique<plugin::HealthMonitor>(layer, inventory, health);
    monitor->Start();
    const plugin::HealthMonitor* m = monitor.get();
    return std::make_unique<MonitorHealth>(m, inventory, std::move(monitor));
  };
}

}  // namespace gpulet::cmd
