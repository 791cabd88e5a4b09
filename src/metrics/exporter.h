// The whole exporter as one object, for `gpulet exporter` and `gpulet agent`: PodResources cache,
// vGPU accounting reader, sampler and HTTP server, started and stopped together.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/gpu.h"
#include "metrics/sampler.h"
#include "metrics/server.h"

namespace gpulet::metrics {

struct ExporterOptions {
  ServerOptions server;
  SamplerOptions sampler;
  std::string pod_resources_socket;  // empty: no pod attribution
  std::chrono::milliseconds pod_resources_interval{10000};
  std::vector<std::string> extra_resources;  // resource names kept besides nvidia.com/*
  std::string vgpu_accounting_dir;           // empty: no vGPU usage
  VgpuGrantReader vgpu_grants;               // the agent's grants (needed with the directory)
  // The kubelet's device-manager checkpoint (<device-plugin-dir>/kubelet_internal_checkpoint).
  // The kubelet rewrites it after every allocation and release, once PodResources already shows
  // the change; each rewrite makes the exporter re-read PodResources and publish at once. Empty:
  // off (attribution then follows the timer and RefreshPods()).
  std::string kubelet_checkpoint;
};

class CheckpointWatcher;

// "gpulet,dcgm" -> FamilySet bits. InvalidArgument naming an unknown set.
absl::StatusOr<unsigned> ParseFamilies(const std::string& list);

// The node name used as DCGM's Hostname / GPU Manager's node: $NODE_NAME, else gethostname().
std::string DefaultHostname();

// Process-wide malloc settings for the long-running commands (agent, exporter), unless the
// environment sets them (MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_): a fixed 64 KiB mmap threshold
// (the per-cycle MiB-sized bodies go back to the kernel when freed) and at most 2 arenas. glibc
// gives each thread that allocates its own arena, up to 8 per core: on a 100-core GPU node the
// threads (HTTP workers, the sampler, gRPC's pool, NVML's own) would each keep the memory they
// freed. Allocation here is not contended (one sampling cycle at a time, scrapes copy a
// snapshot), so 2 arenas cost nothing. Call first thing in main, before any thread starts: threads
// that already allocated keep their arenas. Returns the arena limit set (0: left to glibc).
int ConfigureMalloc();

class Exporter {
 public:
  // `gpu` (not owned, may be null) is a layer shared with the agent; with null, `opener` opens
  // one and retries until it succeeds. Starts sampling and serving; an error names the cause
  // (e.g. the address in use).
  static absl::StatusOr<std::unique_ptr<Exporter>> Start(ExporterOptions options,
                                                         gpu::GpuLayer* gpu,
                                                         Sampler::GpuOpener opener);
  ~Exporter();
  void Stop();

  // Ask the kubelet again and publish a new snapshot now (after a device-plugin allocation);
  // returns at once.
  void RefreshPods();

  int port() const { return server_->port(); }
  int gpu_manager_port() const { return server_->gpu_manager_port(); }
  Sampler& sampler() { return *sampler_; }

 private:
  Exporter() = default;
  std::unique_ptr<kubelet::PodResourcesCache> pods_;
  std::unique_ptr<VgpuUsageSource> vgpu_;
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<MetricsServer> server_;
  std::unique_ptr<CheckpointWatcher> checkpoint_watcher_;
};

}  // namespace gpulet::metrics
