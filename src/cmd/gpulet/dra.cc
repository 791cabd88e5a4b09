// `gpulet dra-driver`: the DRA driver alone (the agent runs the same when gpulet.dra.gpus is set):
// the GPU layer, health, and the kubelet DRA plugin with ResourceSlices. GPUs outside
// gpulet.dra.gpus (default here: all) stay with the device plugin, as in the agent.
#include <iostream>

#include "cmd/gpulet/command.h"
#include "cmd/gpulet/dra_flags.h"

namespace gpulet::cmd {
namespace {

std::function<int()> SetupDraDriver(CLI::App& sub) {
  auto flags = std::make_shared<PluginFlags>();
  AddPluginFlags(sub, *flags);
  auto cdi = std::make_shared<CdiRefreshFlags>();
  AddCdiRefreshFlags(sub, *cdi);
  auto node = std::make_shared<std::string>();
  auto kubeconfig = std::make_shared<std::string>();
  sub.add_option("--node-name", *node, "This node's name: the ResourceSlice's node and pool")
      ->envname("NODE_NAME")
      ->required();
  sub.add_option("--kubeconfig", *kubeconfig, "kubeconfig (default: $KUBECONFIG, in-cluster)");
  Example(sub, "gpulet dra-driver --simulate dgx-h100 --node-name node1");
  return [flags, cdi, node, kubeconfig] {
    // gpulet.dra.gpus unset everywhere (flag, environment, file): every GPU.
    plugin::ConfigSources probe{flags->config_file, plugin::EnvironmentSnapshot(), flags->values};
    if (auto c = plugin::LoadConfig(probe); c.ok() && c->dra.gpus.empty())
      flags->values["gpulet.dra.gpus"] = "all";
    auto cfg = k8s::ResolveConfig(*kubeconfig);
    if (!cfg.ok()) {
      std::cerr << "gpulet dra-driver: " << cfg.status().message() << "\n";
      return 2;
    }
    k8s::Client client(*cfg);
    std::unique_ptr<dra::Driver> driver;
    std::unique_ptr<runtime::CdiRefresher> refresher;
    return RunDevicePlugin(
        "dra-driver", *flags,
        [&](gpu::Machine& machine, plugin::DevicePlugin& dp) -> absl::Status {
          auto r = StartCdiRefresher(*cdi, machine);
          if (!r.ok()) return r.status();
          refresher = *std::move(r);
          auto d = StartDraDriver(machine, dp, &client, *node, *cdi);
          if (!d.ok()) return d.status();
          driver = *std::move(d);
          return absl::OkStatus();
        },
        [&] {
          driver.reset();
          refresher.reset();
        });
  };
}

}  // namespace

static CommandRegistration dra_driver_command(
    "dra-driver",
    "Serve GPUs as a Kubernetes DRA driver (gpu.gpulet.io: ResourceSlices, kubelet DRA plugin v1)",
    SetupDraDriver);

}  // namespace gpulet::cmd
