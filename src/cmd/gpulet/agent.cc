// `gpulet agent`: the node agent. One GPU layer and one inventory serve every node-side part; the
// device plugin runs here, and the other parts start in the hook below once it serves.
#include "cmd/gpulet/command.h"
#include "cmd/gpulet/metrics_flags.h"
#include "cmd/gpulet/plugin_flags.h"
#include "spdlog/spdlog.h"

namespace gpulet::cmd {
namespace {

// Feature labels follow the device plugin's own MIG strategy and time-slicing of nvidia.com/gpu.
labels::LabelOptions SharingFromConfig(labels::LabelOptions o, const plugin::Config& cfg) {
  o.mig_strategy = cfg.mig_strategy == plugin::MigStrategy::kSingle  ? "single"
                   : cfg.mig_strategy == plugin::MigStrategy::kMixed ? "mixed"
                                                                     : "none";
  for (const plugin::ReplicatedResource& r : cfg.time_slicing) {
    if (r.name == "nvidia.com/gpu" && r.replicas > 1) {
      o.replicas = r.replicas;
      o.sharing_strategy = "time-slicing";
    }
  }
  return o;
}

std::function<int()> SetupAgent(CLI::App& sub) {
  auto flags = std::make_shared<PluginFlags>();
  auto metrics_flags = std::make_shared<ExporterFlags>();
  auto label_flags = std::make_shared<LabelFlags>();
  AddPluginFlags(sub, *flags);
  AddExporterFlags(sub, *metrics_flags, /*with_pod_socket=*/false, "metrics-");
  AddLabelFlags(sub, *label_flags, "labels-", /*with_sharing_flags=*/false);
  return [flags, metrics_flags, label_flags] {
    RealFilesystem fs("/");
    std::unique_ptr<metrics::Exporter> exporter;
    std::unique_ptr<labels::LabelRefresher> labeler;
    int rc = RunDevicePlugin("agent", *flags, [&](gpu::GpuLayer& gpu, plugin::DevicePlugin& dp) {
      // Other node parts start here, sharing `gpu`.
      metrics_flags->pod_resources_socket = flags->pod_resources_socket;
      auto mo = ToExporterOptions(*metrics_flags);
      if (!mo.ok()) return mo.status();
      auto e = metrics::Exporter::Start(*std::move(mo), &gpu, nullptr);
      if (!e.ok()) return e.status();
      exporter = *std::move(e);
      auto lo = ToLabelOptions(*label_flags, fs);
      if (!lo.ok()) return lo.status();
      auto interval = ParseFlagDuration("labels-interval", label_flags->interval);
      if (!interval.ok()) return interval.status();
      labeler = std::make_unique<labels::LabelRefresher>(
          &gpu, &fs, label_flags->output, SharingFromConfig(*lo, dp.config()), *interval);
      // An unwritable feature file must not stop the device plugin; retried every interval.
      if (absl::Status st = labeler->WriteOnce(); !st.ok()) spdlog::warn("{}", st.ToString());
      labeler->Start();
      return absl::OkStatus();
    });
    return rc;
  };
}

}  // namespace

GPULET_COMMAND(agent, "Run the node agent: device plugin, metrics exporter and feature labels",
               SetupAgent);

}  // namespace gpulet::cmd
