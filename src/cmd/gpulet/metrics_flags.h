// Flags of the exporter and the feature labels, shared by `gpulet exporter`, `gpulet labels` and
// `gpulet agent` so they are spelled and defaulted the same everywhere. Header-only wiring.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/duration.h"
#include "common/signals.h"
#include "http/listen_address.h"
#include "labels/labels.h"
#include "metrics/exporter.h"
#include "vgpu/node/node.h"
#include "vgpu/rules/rules.h"

namespace gpulet::cmd {

struct ExporterFlags {
  std::string prefix;  // of every flag name below ("metrics-" in the agent), for messages
  std::string address = ":9400";
  std::string interval = "10s";
  std::string families = "gpulet,dcgm";
  std::string gpu_manager_address;
  std::string hostname;
  bool no_hostname = false;
  std::string pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  std::string pod_resources_interval = "10s";
  std::vector<std::string> resource_names;
  std::string vgpu_accounting_dir = "/var/lib/gpulet/vgpu";
  std::string kubelet_checkpoint = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint";
};

struct LabelFlags {
  std::string prefix;  // of the flag names ("labels-" in the agent), for messages
  std::string output = labels::kDefaultFeatureFile;
  std::string interval = "60s";
  std::string mig_strategy = "none";
  int replicas = 1;
  std::string sharing_strategy = "none";
  bool no_timestamp = false;
  std::string machine_type_file = "/sys/class/dmi/id/product_name";
};

// `with_pod_socket`: false when the command already has --pod-resources-socket (the agent's
// device-plugin flags); then that value and the checkpoint path (from --device-plugin-dir) are
// copied in by the caller.
inline void AddExporterFlags(CLI::App& sub, ExporterFlags& f, bool with_pod_socket,
                             const std::string& prefix = "") {
  f.prefix = prefix;
  sub.add_option("--" + prefix + "address", f.address,
                 "Listen address of GET /metrics and /health ([host]:port)")
      ->capture_default_str()
      ->type_name("ADDR");
  sub.add_option("--" + prefix + "interval", f.interval,
                 "Sampling interval: NVML, vGPU accounting and rendering run this often in the "
                 "background; a scrape never waits for them")
      ->capture_default_str()
      ->type_name("DURATION");
  sub.add_option("--" + prefix + "families", f.families,
                 "Metric family sets to export, comma-separated: gpulet (own names), dcgm "
                 "(dcgm-exporter names), nvidia-smi (nvidia_gpu_exporter names), gpu-manager "
                 "(GPU Manager's container_* names)")
      ->capture_default_str()
      ->type_name("LIST");
  sub.add_option("--" + prefix + "gpu-manager-address", f.gpu_manager_address,
                 "Also serve GPU Manager's GET /metric on this address (e.g. :5678); empty: off")
      ->type_name("ADDR");
  sub.add_option("--" + prefix + "hostname", f.hostname,
                 "Node name in DCGM's Hostname and GPU Manager's node labels; default $NODE_NAME, "
                 "else the host name")
      ->type_name("NAME");
  sub.add_flag("--" + prefix + "no-hostname", f.no_hostname,
               "Omit DCGM's Hostname label (dcgm-exporter's --no-hostname)");
  if (with_pod_socket) {
    sub.add_option("--pod-resources-socket", f.pod_resources_socket,
                   "Kubelet PodResources socket for per-pod attribution; empty: off")
        ->capture_default_str()
        ->type_name("PATH");
    sub.add_option("--kubelet-checkpoint", f.kubelet_checkpoint,
                   "The kubelet's device-manager checkpoint: each rewrite (an allocation or "
                   "release) refreshes pod attribution at once; empty: timer only")
        ->capture_default_str()
        ->type_name("PATH");
  }
  sub.add_option("--" + prefix + "pod-resources-interval", f.pod_resources_interval,
                 "How often the kubelet is asked which pod holds which GPU; it is also asked "
                 "after allocations and before a scrape (at most once a second), so a new pod is "
                 "attributed at the first scrape")
      ->capture_default_str()
      ->type_name("DURATION");
  sub.add_option("--" + prefix + "resource-name", f.resource_names,
                 "Extra resource name attributed to pods besides nvidia.com/* (repeatable)")
      ->type_name("NAME");
  sub.add_option("--" + prefix + "vgpu-accounting-dir", f.vgpu_accounting_dir,
                 "Root of the vGPU accounting files (<pod-uid>/<container>/accounting); empty: "
                 "off")
      ->capture_default_str()
      ->type_name("DIR");
}

// `with_sharing_flags`: false in the agent, where MIG strategy and replicas come from the device
// plugin's config instead.
inline void AddLabelFlags(CLI::App& sub, LabelFlags& f, const std::string& prefix = "",
                          bool with_sharing_flags = true) {
  f.prefix = prefix;
  sub.add_option("--" + prefix + "output", f.output, "NFD feature file to write (atomically)")
      ->capture_default_str()
      ->type_name("FILE");
  sub.add_option("--" + prefix + "interval", f.interval,
                 "Rewrite the labels this often (GFD's --sleep-interval)")
      ->capture_default_str()
      ->type_name("DURATION");
  if (with_sharing_flags) {
    // MIG_STRATEGY as `gpulet device-plugin` (and NVIDIA's GFD) read it, so one DaemonSet env
    // gives both the same strategy.
    // The value is checked where the labels options are built (exit 2, naming the value).
    sub.add_option("--mig-strategy", f.mig_strategy, "MIG strategy: none, single or mixed")
        ->envname("MIG_STRATEGY")
        ->capture_default_str();
    sub.add_option("--replicas", f.replicas,
                   "GPU sharing replicas (gpu.replicas; > 1 marks the product -SHARED)")
        ->check(CLI::Range(1, 1 << 16))
        ->capture_default_str();
    sub.add_option("--sharing-strategy", f.sharing_strategy,
                   "none, time-slicing or mps (gpu.sharing-strategy)")
        ->capture_default_str();
  }
  sub.add_flag("--" + prefix + "no-timestamp", f.no_timestamp, "Omit nvidia.com/gfd.timestamp");
  sub.add_option("--" + prefix + "machine-type-file", f.machine_type_file,
                 "File holding the machine type (nvidia.com/gpu.machine); missing: omitted")
      ->capture_default_str()
      ->type_name("FILE");
}

inline absl::StatusOr<std::chrono::milliseconds> ParseFlagDuration(const std::string& flag,
                                                                   const std::string& v) {
  absl::StatusOr<ParsedDuration> d = ParseDuration("--" + flag, v);
  if (!d.ok()) return d.status();
  return absl::ToChronoMilliseconds(d->value);
}

}  // namespace gpulet::cmd
