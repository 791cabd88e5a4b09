// The exporter's and the labels' flags (metrics_flags.h) to their modules' options, shared by
// `gpulet exporter`, `gpulet labels` and `gpulet agent`. Header-only wiring.
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
#include "cmd/gpulet/metrics_flags.h"
#include "common/duration.h"
#include "common/signals.h"
#include "http/listen_address.h"
#include "labels/labels.h"
#include "metrics/exporter.h"
#include "vgpu/node/node.h"
#include "vgpu/rules/rules.h"

namespace gpulet::cmd {

// The fractional grants of the agent's checkpoint in `dir`, as the exporter checks usage by them.
inline absl::StatusOr<std::vector<metrics::VgpuGrantRecord>> VgpuGrantRecords(
    const std::string& dir) {
  absl::StatusOr<std::vector<vgpu::Grant>> grants = vgpu::ReadGrantCheckpoint(dir);
  if (!grants.ok()) return grants.status();
  std::vector<metrics::VgpuGrantRecord> out;
  for (const vgpu::Grant& g : *grants) {
    if (g.accounting_dir.empty() || g.gpus.size() != 1) continue;  // whole GPUs: no accounting
    // <dir>/<pod-uid>/<container as first named>: the exporter reads it under its own root.
    absl::string_view rel = g.accounting_dir;
    if (!absl::ConsumePrefix(&rel, dir + "/")) continue;
    out.push_back({std::string(rel), g.ns, g.pod, g.container, g.gpus[0],
                   static_cast<uint64_t>(vgpu::MemoryUnitsToBytes(g.memory_units)),
                   static_cast<double>(g.cores) / vgpu::kCoresPerGpu});
  }
  return out;
}

// A module's message about "--families" (it knows no prefix), said about the flag as the user
// typed it: "--metrics-families" in the agent.
inline absl::Status AsTyped(const absl::Status& s, const std::string& flag,
                            const std::string& prefix) {
  if (s.ok() || prefix.empty()) return s;
  std::string m(s.message());
  if (absl::StartsWith(m, "--" + flag)) return absl::Status(s.code(), "--" + prefix + m.substr(2));
  return absl::Status(s.code(), absl::StrCat("--", prefix, flag, ": ", m));
}

inline absl::StatusOr<metrics::ExporterOptions> ToExporterOptions(const ExporterFlags& f) {
  metrics::ExporterOptions o;
  auto fam = metrics::ParseFamilies(f.families);
  if (!fam.ok()) return AsTyped(fam.status(), "families", f.prefix);
  auto interval = ParseFlagDuration(f.prefix + "interval", f.interval);
  if (!interval.ok()) return interval.status();
  auto pod_interval =
      ParseFlagDuration(f.prefix + "pod-resources-interval", f.pod_resources_interval);
  if (!pod_interval.ok()) return pod_interval.status();
  if (auto a = http::ParseListenAddress(f.address); !a.ok())
    return AsTyped(a.status(), "address", f.prefix);
  if (!f.gpu_manager_address.empty()) {
    if (auto a = http::ParseListenAddress(f.gpu_manager_address); !a.ok())
      return AsTyped(a.status(), "gpu-manager-address", f.prefix);
  }
  o.server.address = f.address;
  o.server.gpu_manager_address = f.gpu_manager_address;
  o.sampler.interval = *interval;
  o.sampler.render.families = *fam;
  o.sampler.render.dcgm_hostname = !f.no_hostname;
  o.sampler.hostname = f.hostname.empty() ? metrics::DefaultHostname() : f.hostname;
  o.pod_resources_socket = f.pod_resources_socket;
  o.pod_resources_interval = *pod_interval;
  o.extra_resources = f.resource_names;
  o.vgpu_accounting_dir = f.vgpu_accounting_dir;
  // The agent checkpoints its grants in the same directory (vgpu/node's state_dir).
  o.vgpu_grants = [dir = f.vgpu_accounting_dir] { return VgpuGrantRecords(dir); };
  o.kubelet_checkpoint = f.kubelet_checkpoint;
  return o;
}

inline absl::StatusOr<labels::LabelOptions> ToLabelOptions(const LabelFlags& f,
                                                           const RootedFilesystem& fs) {
  labels::LabelOptions o;
  o.mig_strategy = f.mig_strategy;
  o.replicas = f.replicas;
  o.sharing_strategy = f.sharing_strategy;
  o.timestamp = !f.no_timestamp;
  if (!f.machine_type_file.empty()) {
    if (auto m = fs.ReadFile(f.machine_type_file); m.ok()) {
      o.machine_type = std::string(absl::StripAsciiWhitespace(*m));
    }
  }
  if (absl::Status st = labels::ValidateOptions(o); !st.ok()) return st;
  return o;
}

}  // namespace gpulet::cmd
