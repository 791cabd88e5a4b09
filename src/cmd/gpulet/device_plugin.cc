// `gpulet device-plugin`: the kubelet device plugin alone (NVIDIA k8s-device-plugin replacement).
#include "cmd/gpulet/command.h"
#include "cmd/gpulet/plugin_flags.h"

namespace gpulet::cmd {
namespace {

std::function<int()> SetupDevicePlugin(CLI::App& sub) {
  auto flags = std::make_shared<PluginFlags>();
  AddPluginFlags(sub, *flags);
  Example(sub,
          "gpulet device-plugin --simulate dgx-h100 --device-plugin-dir /tmp/dp --config-file "
          "config.yaml");
  return [flags] { return RunDevicePlugin("device-plugin", *flags); };
}

}  // namespace

// The name has a dash, so register without the GPULET_COMMAND macro (it pastes the name).
static CommandRegistration device_plugin_command(
    "device-plugin", "Serve GPUs to the kubelet (device plugin API v1beta1)", SetupDevicePlugin);

}  // namespace gpulet::cmd
