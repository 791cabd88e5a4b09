// `gpulet agent`: the node agent. One GPU layer and one inventory serve every node-side part; the
// device plugin runs here, and the other parts start in the hook below once it serves.
#include "absl/strings/str_cat.h"
#include "cmd/common/exit.h"
#include "cmd/gpulet/cdi_flags.h"
#include "cmd/gpulet/command.h"
#include "cmd/gpulet/device_health.h"
#include "cmd/gpulet/dra_flags.h"
#include "cmd/gpulet/metrics_options.h"
#include "cmd/gpulet/plugin_flags.h"
#include "cmd/gpulet/stack_settings.h"
#include "http/listen_address.h"
#include "k8s/client.h"
#include "metrics/server.h"
#include "node/readiness.h"
#include "node/validate.h"
#include "spdlog/spdlog.h"

namespace gpulet::cmd {
namespace {

// Feature labels follow the device plugin's own MIG strategy and sharing (plugin::LabelsOf).
labels::LabelOptions SharingFromConfig(labels::LabelOptions o, const plugin::Config& cfg) {
  plugin::SharingLabels l = plugin::LabelsOf(cfg);
  o.mig_strategy = l.mig_strategy;
  o.replicas = l.replicas;
  o.sharing_strategy = l.sharing_strategy;
  return o;
}

struct NodeFlags {
  std::string name, kubeconfig, host_root = "/";
};

std::function<int()> SetupAgent(CLI::App& sub) {
  auto flags = std::make_shared<PluginFlags>();
  auto metrics_flags = std::make_shared<ExporterFlags>();
  auto label_flags = std::make_shared<LabelFlags>();
  AddPluginFlags(sub, *flags);
  AddExporterFlags(sub, *metrics_flags, /*with_pod_socket=*/false, "metrics-");
  AddLabelFlags(sub, *label_flags, "labels-", /*with_sharing_flags=*/false);
  auto cdi_flags = std::make_shared<CdiRefreshFlags>();
  AddCdiRefreshFlags(sub, *cdi_flags);
  auto node = std::make_shared<NodeFlags>();
  sub.add_option("--node-name", node->name,
                 "This node's name: enables reboot readiness (taint until the GPU stack validates, "
                 "then label gpulet.io/gpu-stack=ready and recreate rejected pods) and vGPU pod "
                 "lookup through the API server")
      ->envname("NODE_NAME");
  sub.add_option("--kubeconfig", node->kubeconfig, "kubeconfig (default: $KUBECONFIG, in-cluster)");
  sub.add_option("--host-root", node->host_root,
                 "Where the host's root is mounted, for validating the engine configuration")
      ->capture_default_str();
  Example(sub,
          "gpulet agent --simulate dgx-h100 --device-plugin-dir /tmp/dp --metrics-address :9400 "
          "--labels-output /tmp/features");
  return [flags, metrics_flags, label_flags, node, cdi_flags] {
    RootedFilesystem fs("/");
    // Every input is checked before anything serves (the device plugin registered, then a bad
    // --metrics-interval stopped it), naming the flag as the user typed it.
    metrics_flags->pod_resources_socket = flags->pod_resources_socket;
    metrics_flags->kubelet_checkpoint = flags->plugin_dir + "/kubelet_internal_checkpoint";
    auto checked_metrics = ToExporterOptions(*metrics_flags);
    if (!checked_metrics.ok()) return Fail("gpulet agent", checked_metrics.status(), kUsageError);
    auto checked_labels = ToLabelOptions(*label_flags, fs);
    if (!checked_labels.ok()) return Fail("gpulet agent", checked_labels.status(), kUsageError);
    auto label_interval = ParseFlagDuration("labels-interval", label_flags->interval);
    if (!label_interval.ok()) return Fail("gpulet agent", label_interval.status(), kUsageError);
    UseHostNvml(flags->gpu, node->host_root);
    UseHostDriverPrograms(*flags, node->host_root);
    std::unique_ptr<metrics::Exporter> exporter;
    std::unique_ptr<labels::LabelRefresher> labeler;
    std::unique_ptr<k8s::Client> client;
    std::unique_ptr<node::ReadinessController> readiness;
    std::unique_ptr<runtime::CdiRefresher> cdi;
    std::unique_ptr<dra::Driver> dra_driver;
    plugin::DevicePlugin* plugin = nullptr;  // for the teardown: no config callbacks after it
    if (!node->name.empty()) {
      // Before the device plugin starts: its vGPU Allocate looks pods up through this client.
      auto cfg = k8s::ResolveConfig(node->kubeconfig);
      if (!cfg.ok()) return Fail("gpulet agent", cfg.status(), kUsageError);
      client = std::make_unique<k8s::Client>(*cfg);
      flags->api = client.get();
      flags->node_name = node->name;
    }
    int rc = RunDevicePlugin(
        "agent", *flags,
        [&](gpu::Machine& machine, plugin::DevicePlugin& dp) {
          plugin = &dp;
          // Other node parts start here, on the same machine.
          gpu::GpuLayer& gpu = machine.gpus();
          if (client) {  // created before the exporter, which reports its bare-pod count
            node::ValidateOptions vo;
            vo.layer = &gpu;
            vo.host_root = node->host_root;
            vo.pod_resources_socket = flags->pod_resources_socket;
            vo.node_name = node->name;
            vo.client = client.get();
            // What depends on the settings is read when validating: they can be reloaded.
            auto now = [vo, &dp] { return WithPluginSettings(vo, dp.config()); };
            node::ReadinessOptions ro;
            ro.node_name = node->name;
            ro.settings_check = [now] { return node::ValidateGpuDelivery(now()); };
            readiness = std::make_unique<node::ReadinessController>(
                client.get(), [now] { return node::ValidateStack(now()); }, ro, machine.clock());
          }
          auto mo = checked_metrics;
          if (node::ReadinessController* r = readiness.get())
            mo->sampler.bare_pods_reported = [r] { return r->reported_bare_pods(); };
          mo->sampler.device_health = PluginHealth(dp.health());
          auto e = metrics::Exporter::Start(*std::move(mo), &gpu, nullptr);
          if (!e.ok()) return e.status();
          exporter = *std::move(e);
          const labels::LabelOptions* lo = &*checked_labels;
          labeler = std::make_unique<labels::LabelRefresher>(
              &gpu, &fs, label_flags->output, SharingFromConfig(*lo, dp.config()), *label_interval);
          // A reloaded config (file, ConfigMap, node label) relabels at once and is checked against
          // this node's engine.
          dp.OnConfigApplied(
              [l = labeler.get(), base = *lo, r = readiness.get()](const plugin::Config& c) {
                l->SetOptions(SharingFromConfig(base, c));
                if (absl::Status st = l->WriteOnce(); !st.ok())
                  spdlog::warn("{}", std::string(st.message()));
                if (r) r->SettingsChanged();
              });
          // An unwritable feature file must not stop the device plugin; retried every interval.
          if (absl::Status st = labeler->WriteOnce(); !st.ok())
            spdlog::warn("{}", std::string(st.message()));
          labeler->Start();
          // Where to look, said once at start (the port is the bound one when :0 was asked for).
          auto hp = http::ParseListenAddress(metrics_flags->address);
          spdlog::info(
              "metrics: http://{}:{}/metrics (and /health){}; labels: {} every {}",
              hp.ok() ? hp->first : std::string("?"), exporter->port(),
              exporter->gpu_manager_port() > 0
                  ? absl::StrCat("; GPU Manager /metric on port ", exporter->gpu_manager_port())
                  : "",
              label_flags->output, label_flags->interval);
          if (readiness) readiness->Start();
          // CDI specs name host paths; the host's driver files are read under --host-root.
          cdi_flags->host_root = node->host_root;
          auto c = StartCdiRefresher(*cdi_flags, machine);  // the CDI spec follows the GPU set
          if (!c.ok()) return c.status();
          cdi = *std::move(c);
          auto d = StartDraDriver(machine, dp, client.get(), node->name, *cdi_flags);
          if (!d.ok()) return d.status();
          dra_driver = *std::move(d);
          return absl::OkStatus();
        },
        [&] {
          // A reload (the per-node config watcher still runs) must not reach what goes below.
          if (plugin) plugin->OnConfigApplied({});
          dra_driver.reset();
          cdi.reset();
          labeler.reset();
          exporter.reset();  // before the readiness controller its sampler reads
          readiness.reset();
        });
    return rc;
  };
}

}  // namespace

GPULET_COMMAND(agent, "Run the node agent: device plugin, metrics exporter and feature labels",
               SetupAgent);

}  // namespace gpulet::cmd
