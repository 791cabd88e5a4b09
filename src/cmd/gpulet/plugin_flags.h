// Flags shared by `gpulet device-plugin` and `gpulet agent`: the kubelet paths, the config file,
// every NVIDIA setting under its NVIDIA flag name (plugin/config.h Settings()); the run itself is
// plugin::RunDevicePlugin (plugin/run.h).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "cmd/common/exit.h"
#include "cmd/gpulet/gpu_flags.h"
#include "cmd/gpulet/logs.h"
#include "cmd/gpulet/nvidia_only_flags.h"
#include "gpu/open.h"
#include "k8s/client.h"
#include "placement/vgpu_policy.h"
#include "plugin/node_config.h"
#include "plugin/plugin.h"
#include "plugin/run.h"
#include "runtime/driver.h"
#include "spdlog/spdlog.h"
#include "vgpu/rules/rules.h"

namespace gpulet::k8s {
class Client;
}

namespace gpulet::cmd {

// What the plugin runs with (plugin::RunOptions, set from flags), and the flags' own sources.
struct PluginFlags : plugin::RunOptions {
  std::string config_file;
  // Per-node configs (NVIDIA's config-manager): a directory of named configs, the default name,
  // and the Node label that picks one.
  std::string config_dir, config_default, config_node_label = plugin::kDefaultConfigNodeLabel;
  std::map<std::string, std::string> values;  // plugin::Setting::key -> value of a flag given
  // NVIDIA device-plugin flags gpulet has no use for, accepted so a DaemonSet written for NVIDIA's
  // plugin starts (flag name -> value of those given; see NvidiaOnlyFlagNotes()).
  std::map<std::string, std::string> nvidia_only;
};

inline void AddPluginFlags(CLI::App& sub, PluginFlags& f) {
  AddGpuFlags(sub, f.gpu);
  sub.add_option("--device-plugin-dir", f.plugin_dir,
                 "Kubelet device-plugin directory (kubelet.sock and our sockets)")
      ->capture_default_str()
      ->type_name("DIR");
  sub.add_option("--kubelet-socket", f.kubelet_socket,
                 "Kubelet Registration socket, a name inside --device-plugin-dir; empty: serve "
                 "without registering")
      ->capture_default_str()
      ->envname("KUBELET_SOCKET")
      ->type_name("NAME");
  sub.add_option("--pod-resources-socket", f.pod_resources_socket,
                 "Kubelet PodResources socket (per-pod attribution)")
      ->capture_default_str()
      ->type_name("PATH");
  sub.add_option("--config-file", f.config_file,
                 "Device plugin config (NVIDIA `version: v1` format plus a `gpulet:` section); "
                 "reloaded on SIGHUP and when its content changes")
      ->envname("CONFIG_FILE")
      ->type_name("FILE");
  sub.add_option("--config-dir", f.config_dir,
                 "Directory of named configs, one file each (a mounted ConfigMap); the Node label "
                 "--config-node-label picks one, else --config-default. Label and file changes "
                 "are applied live; instead of --config-file")
      ->envname("CONFIG_FILE_SRCDIR")
      ->type_name("DIR");
  sub.add_option("--config-default", f.config_default,
                 "Config name used when the Node has no label (default: the only file, if one)")
      ->envname("DEFAULT_CONFIG")
      ->type_name("NAME");
  sub.add_option("--config-node-label", f.config_node_label,
                 "Node label whose value names the config in --config-dir (node from $NODE_NAME)")
      ->capture_default_str()
      ->envname("NODE_LABEL")
      ->type_name("LABEL");
  for (const auto& n : NvidiaOnlyFlags()) {
    std::string flag = n.flag;
    sub.add_option_function<std::string>(
           std::string("--") + n.flag,
           [&f, flag](const std::string& v) { f.nvidia_only[flag] = v; },
           std::string("NVIDIA device-plugin flag, accepted for compatibility: ") + n.why)
        ->envname(n.env)
        ->type_name("VALUE");
  }
  for (const auto& s : plugin::Settings()) {
    std::string key = s.key;
    std::string help = std::string(s.help) + " [env " + s.envs.front() + "; file " + s.key + "]";
    CLI::Option* o = sub.add_option_function<std::string>(
        std::string("--") + s.flag, [&f, key](const std::string& v) { f.values[key] = v; }, help);
    o->type_name("VALUE");
    // Shown, not applied: the setting's own default stands unless a flag, env or file sets it.
    if (const char* d = plugin::DefaultOf(s)) o->default_str(*d ? d : "unset");
  }
}

// sharing.mps from a container that has no driver (the agent reading the host under `host_root`;
// runc injects nothing): the host driver's nvidia-cuda-mps-control and nvidia-smi, linked into
// `dir` with the libraries they load (runtime::LinkDriverTools). Skipped as UseHostNvml is;
// gpulet.mps.binDir, when set, still wins.
inline void UseHostDriverPrograms(PluginFlags& f, const std::string& host_root,
                                  const std::string& dir = "/tmp/gpulet-driver-programs") {
  if (!ReadsHostDriver(f.gpu, host_root)) return;
  absl::StatusOr<runtime::DriverTools> t = runtime::LinkDriverTools(host_root, dir);
  if (!t.ok()) {
    spdlog::info("{}; sharing.mps looks for them on $PATH", std::string(t.status().message()));
    return;
  }
  spdlog::info("driver programs for sharing.mps: the host's, from {}", t->root);
  f.mps_bin_dir = t->bin_dir;
  const char* path = std::getenv("PATH");
  f.mps_env = {{"LD_LIBRARY_PATH", t->lib_dir},
               {"PATH", t->bin_dir + ":" + (path ? path : "/usr/bin:/bin")}};
}

// `gpulet <cmd>`'s device-plugin life (plugin::RunDevicePlugin) from its flags: the exit code.
inline int RunDevicePlugin(
    const char* cmd, PluginFlags& f,
    const std::function<absl::Status(gpu::Machine&, plugin::DevicePlugin&)>& with_plugin = {},
    const std::function<void()>& before_teardown = {}) {
  const std::string who = std::string("gpulet ") + cmd;
  plugin::BlockSignals();  // before any thread exists, so Run() receives them
  UseDaemonLogs();
  plugin::RunOptions o = f;
  o.sources = {f.config_file, plugin::EnvironmentSnapshot(), f.values};
  // Per-node configs: the Node's label picks the file (the watcher is created before any thread;
  // it starts once the plugin serves).
  std::unique_ptr<k8s::Client> own_client;
  std::unique_ptr<plugin::NodeConfigWatcher> node_config;
  plugin::DevicePlugin* dp_ptr = nullptr;
  if (!f.config_dir.empty()) {
    if (!f.config_file.empty()) {
      return Fail(who, "--config-file and --config-dir exclude each other", kUsageError);
    }
    if (!std::filesystem::is_directory(f.config_dir)) {
      return Fail(who, "--config-dir " + f.config_dir + ": not a directory", kUsageError);
    }
    plugin::NodeConfigOptions no;
    no.dir = f.config_dir;
    no.default_name = f.config_default;
    no.node_label = f.config_node_label;
    no.node_name = f.node_name;
    if (no.node_name.empty())
      if (const char* n = std::getenv("NODE_NAME")) no.node_name = n;
    no.api = f.api;
    no.component = std::string("gpulet-") + cmd;
    if (!no.api && !no.node_name.empty()) {
      auto kc = k8s::ResolveConfig("");
      if (kc.ok()) {
        own_client = std::make_unique<k8s::Client>(*kc);
        no.api = own_client.get();
      } else {
        std::cerr << who << ": warning: no API server (" << kc.status().message()
                  << "): the node label is not followed\n";
      }
    }
    node_config = std::make_unique<plugin::NodeConfigWatcher>(
        no, [&dp_ptr](const std::string& path) { return dp_ptr->ReloadFrom(path); });
    auto initial = node_config->Initial();
    if (!initial.ok()) return Fail(who, initial.status(), kUsageError);
    o.sources.file = *initial;
    o.watch_file = false;
    o.on_serving = [&](plugin::DevicePlugin& dp) {
      dp_ptr = &dp;
      node_config->Start(o.sources.file);
    };
    // Stops following the Node and the directory before the plugin goes away.
    o.on_stop = [&] { node_config->Stop(); };
  }
  auto config = plugin::LoadConfig(o.sources);
  if (!config.ok()) return Fail(who, config.status(), kUsageError);
  // The vGPU policy is looked up by name only at a pod's Allocate: a name no policy has started a
  // node that then refused every vGPU pod it had no extender placement for.
  if (auto p = vgpu::MakeVgpuPolicy(config->vgpu.policy); !p.ok())
    return Fail(who,
                "gpulet.vgpu.policy (--vgpu-policy, $GPULET_VGPU_POLICY or the config file): " +
                    std::string(p.status().message()),
                kUsageError);
  auto notes = NvidiaOnlyFlagNotes(f.nvidia_only);
  if (!notes.ok()) return Fail(who, notes.status(), kUsageError);
  for (const std::string& n : *notes) std::cerr << who << ": warning: " << n << "\n";
  absl::Status s =
      plugin::RunDevicePlugin(who, o, *std::move(config), with_plugin, before_teardown);
  return s.ok() ? 0 : Fail(who, s);
}

}  // namespace gpulet::cmd
