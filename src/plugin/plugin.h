// The device plugin as one unit: config (with reload), health monitoring, NVIDIA resources and the
// kubelet-facing servers, over one GpuLayer. `gpulet device-plugin` and `gpulet agent` wire it to
// their flags. Thread-safe; owns the HealthMonitor, the PluginManager and their threads. The
// GpuLayer is not owned and must outlive it.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gpu/gpu.h"
#include "kubelet/podresources_client.h"
#include "kubelet/server.h"
#include "plugin/config.h"
#include "plugin/health.h"
#include "plugin/mps.h"

namespace gpulet::k8s {
class Client;
}
namespace gpulet::vgpu {
class NodeAssigner;
}

namespace gpulet::plugin {

// Blocks SIGHUP, SIGINT, SIGTERM and SIGQUIT in the calling thread and every thread it starts
// afterwards, so that DevicePlugin::Run() receives them with sigwait. Call before any thread
// (gRPC, NVML events) exists.
void BlockSignals();

class DevicePlugin {
 public:
  struct Options {
    kubelet::ManagerOptions manager;
    ConfigSources sources;        // re-read on every reload
    std::string host_root = "/";  // where /proc and /dev are looked up (sim root when simulating)
    // vGPU (config gpulet.vgpu): the API server to find the pod of an Allocate (may be null: then
    // containers are placed from the kubelet's counts), this node's name, and the kubelet's
    // PodResources (which pods hold which vcuda devices: identity and, without an API server,
    // release; null: neither).
    k8s::Client* api = nullptr;
    std::string node_name;
    std::shared_ptr<kubelet::PodResourcesLister> pod_resources;
    // false: Run() does not poll the config file's content (a NodeConfigWatcher picks the file
    // and calls ReloadFrom instead).
    bool watch_file = true;
    // sharing.mps: how often each control daemon is probed (and restarted when it does not answer).
    absl::Duration mps_probe_interval = absl::Seconds(2);
    // sharing.mps without gpulet.mps.binDir: where the driver's programs are and the environment
    // they need (the agent in its container: runtime::LinkDriverTools). Empty: $PATH.
    std::string mps_bin_dir;
    std::map<std::string, std::string> mps_env;
  };

  DevicePlugin(gpu::GpuLayer* gpu, Options options, Config config);
  ~DevicePlugin();  // Stop()s

  // Reads the inventory, starts health monitoring and serves every resource. An unusable device
  // plugin directory or an inventory the config cannot place is an error.
  absl::Status Start();
  // Loads the config again and rebuilds the resources. On any error the running config and
  // resources stay as they are and the error is returned (and logged).
  absl::Status Reload();
  // Reload() from another config file (empty: none), which later reloads keep using.
  absl::Status ReloadFrom(const std::string& file);
  // Until SIGINT / SIGTERM / SIGQUIT: SIGHUP and config-file content changes reload. Returns 0.
  int Run();
  void Stop();

  HealthMonitor* health() { return health_.get(); }
  // The MPS control daemons of the current config, by resource name.
  std::map<std::string, std::shared_ptr<MpsDaemon>> mps_daemons() const;
  // Called after every config that was applied (at start and on each reload), with that config.
  void OnConfigApplied(std::function<void(const Config&)> fn);
  kubelet::PluginManager* manager() { return manager_.get(); }
  Config config() const;
  // The vGPU assigner of the current config (null when vGPU is off).
  std::shared_ptr<vgpu::NodeAssigner> vgpu() const;
  // One vGPU housekeeping pass (the background thread runs it every gpulet.vgpu.reconcileInterval):
  // corrects identities from PodResources and releases grants of pods that are gone.
  absl::Status ReconcileVgpu();

 private:
  // The vGPU pool's inventory annotation on the Node (unchanged text: no request).
  absl::Status PublishVgpuPool(vgpu::NodeAssigner& a);
  absl::Status Apply(const Config& cfg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  gpu::GpuLayer* const gpu_;
  const Options options_;
  mutable absl::Mutex mu_;
  ConfigSources sources_ ABSL_GUARDED_BY(mu_);  // options_.sources, with the file ReloadFrom chose
  Config config_ ABSL_GUARDED_BY(mu_);
  gpu::Inventory inventory_;
  std::unique_ptr<HealthMonitor> health_;
  std::unique_ptr<kubelet::PluginManager> manager_;
  std::shared_ptr<vgpu::NodeAssigner> vgpu_ ABSL_GUARDED_BY(mu_);
  std::string vgpu_key_ ABSL_GUARDED_BY(mu_);  // the settings vgpu_ was built from
  std::map<std::string, std::shared_ptr<MpsDaemon>> mps_ ABSL_GUARDED_BY(mu_);
  std::function<void(const Config&)> on_applied_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The reconciler's wake-ups: stop, or a vGPU grant to check against the kubelet's record soon
  // (NodeOptions::granted, called from Allocate under the assigner's lock: a mutex of its own,
  // which nothing else is held under, so that a reload holding mu_ never waits on an Allocate's
  // call).
  absl::Mutex wake_mu_;
  bool reconciler_stop_ ABSL_GUARDED_BY(wake_mu_) = false;
  bool granted_ ABSL_GUARDED_BY(wake_mu_) = false;
  // After a grant: reads the kubelet's record until it names every recent grant's devices (it does
  // once Allocate has answered, well before the pod's sandbox and container exist), correcting
  // the records from it each time; at most 2 s.
  absl::Status CorrectVgpuSoon();
  std::thread reconciler_;
};

}  // namespace gpulet::plugin
