// `gpulet validate`: checks driver, runtime and device plugin in order (node/validate.h).
#include "node/validate.h"

#include <iostream>
#include <memory>

#include "cmd/common/exit.h"
#include "cmd/gpulet/command.h"
#include "cmd/gpulet/gpu_flags.h"
#include "cmd/gpulet/stack_settings.h"
#include "k8s/client.h"

namespace gpulet::cmd {
namespace {

struct ValidateFlags {
  node::ValidateOptions o;
  std::string kubeconfig;
  std::string config_file;
  bool label = false;
};

int Run(ValidateFlags& f) {
  if (!f.config_file.empty()) {
    plugin::ConfigSources sources;
    sources.file = f.config_file;
    auto config = plugin::LoadConfig(sources);
    if (!config.ok()) return Fail("gpulet validate", config.status(), kUsageError);
    f.o = WithPluginSettings(f.o, *config);
  }
  std::unique_ptr<k8s::Client> client;
  if (!f.o.node_name.empty()) {
    auto cfg = k8s::ResolveConfig(f.kubeconfig);
    if (!cfg.ok()) return Fail("gpulet validate", cfg.status());
    client = std::make_unique<k8s::Client>(*cfg);
    f.o.client = client.get();
  }
  ReadHostUnder(f.o.gpu, f.o.host_root);
  node::ValidationReport r = node::ValidateStack(f.o);
  for (const auto& s : r.steps)
    std::cout << (s.ok ? "ok   " : "FAIL ") << s.name << ": " << s.detail << "\n";
  if (f.label && client) {
    k8s::json patch = {
        {"metadata",
         {{"labels",
           {{"gpulet.io/gpu-stack", r.ok() ? k8s::json("ready") : k8s::json(nullptr)}}}}}};
    if (auto p = client->PatchNode(f.o.node_name, k8s::PatchType::kMerge, patch); !p.ok()) {
      return Fail("gpulet validate",
                  "cannot label node " + f.o.node_name + ": " + std::string(p.status().message()));
    }
    std::cout << (r.ok() ? "labelled " : "unlabelled ") << f.o.node_name
              << " gpulet.io/gpu-stack=ready\n";
  }
  return r.ok() ? 0 : 1;
}

std::function<int()> SetupValidate(CLI::App& sub) {
  auto f = std::make_shared<ValidateFlags>();
  sub.add_option("--host-root", f->o.host_root, "Where the host's root filesystem is mounted")
      ->capture_default_str()
      ->check(CLI::ExistingDirectory);
  sub.add_option("--runtime", f->o.runtime, "Engine to check: containerd, docker, crio or auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "containerd", "docker", "crio"}));
  sub.add_option("--prefix", f->o.prefix, "Host directory of the installed runtime pieces")
      ->capture_default_str();
  sub.add_option("--cdi-dir", f->o.cdi_dir, "Host directory of the CDI spec")
      ->capture_default_str();
  sub.add_option("--pod-resources-socket", f->o.pod_resources_socket,
                 "The kubelet's PodResources socket")
      ->capture_default_str();
  sub.add_option("--node-name", f->o.node_name,
                 "Also check this node's capacity through the API server (and, with "
                 "--config-file, its engine's version)")
      ->envname("NODE_NAME");
  sub.add_option(
         "--config-file", f->config_file,
         "The device plugin's config: also check that this node's engine acts on how it "
         "hands GPUs to containers (deviceListStrategy, passDeviceSpecs), as the agent does")
      ->type_name("FILE");
  sub.add_option("--kubeconfig", f->kubeconfig, "kubeconfig (default: $KUBECONFIG, in-cluster)");
  sub.add_flag("--probe,!--no-probe", f->o.container_probe,
               "Start the probe container of the runtime step (--no-probe skips it)")
      ->capture_default_str();
  sub.add_option("--probe-busybox", f->o.probe_busybox,
                 "Static busybox the probe container's rootfs is made of")
      ->capture_default_str();
  sub.add_option("--probe-runc", f->o.probe_runc,
                 "runc for the probe container (default: the host's, else PATH)");
  sub.add_flag(
      "--label", f->label,
      "Set gpulet.io/gpu-stack=ready on the node when every step passes (remove it otherwise)");
  AddGpuFlags(sub, f->o.gpu);
  Example(sub, "gpulet validate --host-root /host --runtime containerd --no-probe");
  return [f] { return Run(*f); };
}

}  // namespace

GPULET_COMMAND(validate,
               "Check driver, runtime and device plugin in order; exit 1 on the first failure",
               SetupValidate);

}  // namespace gpulet::cmd
