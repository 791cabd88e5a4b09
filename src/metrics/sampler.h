// The exporter's background sampler: every interval it reads the GPU layer, the cached pod
// attribution and the vGPU accounting, renders the exposition once per format and publishes it as
// an immutable snapshot. A scrape only takes a reference to the latest snapshot, so it never waits
// on NVML or the kubelet, and a slow or failing source only makes data older or absent.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "gpu/gpu.h"
#include "kubelet/podresources_client.h"
#include "metrics/render.h"

namespace gpulet::metrics {

// Per-container vGPU usage as the interposer accounts it (src/abi/vgpu_accounting.h). An
// interface so the exporter does not depend on the accounting's storage; `gpu_uuid` names the
// physical GPU.
struct VgpuContainerUsage {
  std::string namespace_, pod, container, gpu_uuid;
  uint64_t memory_used_bytes = 0, memory_limit_bytes = 0;
  std::optional<double> utilization_ratio;
  double core_limit_ratio = 0;
};
class VgpuUsageSource {
 public:
  virtual ~VgpuUsageSource() = default;
  virtual absl::StatusOr<std::vector<VgpuContainerUsage>> Read() = 0;
};

// What the node agent granted one vGPU container (its own record: vgpu/node's checkpoint), by
// which the exporter labels and bounds what the container's accounting file claims.
struct VgpuGrantRecord {
  std::string dir;  // its accounting directory, relative to the root ("<pod-uid>/<container>")
  std::string ns, pod, container, gpu_uuid;
  uint64_t memory_limit_bytes = 0;
  double core_limit_ratio = 0;
};
using VgpuGrantReader = std::function<absl::StatusOr<std::vector<VgpuGrantRecord>>()>;

// The interposer's accounting files: <root>/<pod-uid>/<container>/accounting (src/vgpu/
// accounting.h). The file is the tenant's to write, so only its usage figures are read, and only
// as claims: a file is reported only for a container the agent granted (`grants`, read each
// cycle), under the grant's namespace, pod, container, GPU and limits, with its memory in use
// never above the granted limit (a file naming another GPU or more memory forges nothing).
// Utilisation is the growth of the region's busy_ns between two reads, at most 1.
// Thread-compatible (the sampler calls it from one cycle at a time).
class AccountingDirUsageSource : public VgpuUsageSource {
 public:
  AccountingDirUsageSource(std::string root, VgpuGrantReader grants, Clock* clock = nullptr)
      : root_(std::move(root)), grants_(std::move(grants)), clock_(clock ? clock : RealClock()) {}
  absl::StatusOr<std::vector<VgpuContainerUsage>> Read() override;

 private:
  std::string root_;
  VgpuGrantReader grants_;
  Clock* clock_;
  std::map<std::string, std::pair<uint64_t, Clock::TimePoint>> last_busy_;  // by file path
};

// Why a GPU is unfit for work by the device plugin's rules (XID classification, hold-down, manual
// isolation: plugin::HealthMonitor), "" when it is fit, so that gpulet_gpu_healthy and what the
// kubelet is told tell one truth. An interface: the exporter does not depend on the plugin.
// Reason() is called from the sampling cycle; it must be thread-safe and not block.
class DeviceHealth {
 public:
  virtual ~DeviceHealth() = default;
  virtual std::string Reason(const gpu::Device& gpu) const = 0;
};
// Called once, with the first layer and inventory the sampler reads (the standalone exporter may
// open NVML late). The result lives until Sampler::Stop, before the layer goes.
using DeviceHealthFactory =
    std::function<std::unique_ptr<DeviceHealth>(gpu::GpuLayer*, const gpu::Inventory&)>;

// One immutable rendering of one sample. Bodies stop before the per-scrape tail (see server.h).
// Only the variants (format x encoding) scraped in the last kFormatKeep are kept, all uncompressed
// ones before the first scrape: a Prometheus asking for gzipped OpenMetrics leaves 30 KiB here
// instead of 1.5 MiB of bodies nobody reads. An empty body was not rendered this cycle; the server
// then renders it from `sample` (no NVML or kubelet call) and the next cycles keep it.
struct Snapshot {
  std::string text;         // Prometheus text 0.0.4
  std::string openmetrics;  // OpenMetrics 1.0.0, without "# EOF"
  std::string gpu_manager;  // GPU Manager's /metric families (text), always rendered (small)
  // The bodies gzip-compressed once per cycle for scrapers sending Accept-Encoding: gzip
  // (Prometheus does): a gzip scrape writes a fraction of the bytes and only closes the stream.
  OpenGzip text_gz, openmetrics_gz;
  std::shared_ptr<const Sample> sample;  // what the bodies were rendered from
  SelfStats self;
  Clock::TimePoint taken{};
  uint64_t pods_generation = 0;  // the PodResourcesCache answer the containers came from
};

struct SamplerOptions {
  std::chrono::milliseconds interval{10000};
  RenderOptions render;
  std::string hostname;  // DCGM Hostname / GPU Manager node label
  // Read each cycle when set (the agent's reboot readiness controller); must be thread-safe.
  std::function<int64_t()> bare_pods_reported;
  DeviceHealthFactory device_health;  // unset: a GPU is healthy when it answers
  // ScrapeSnapshot asks the kubelet at most once per this gap, whatever the number of scrapers.
  std::chrono::milliseconds scrape_list_gap{1000};
};

// Thread-safe. Owns its thread; the sources it is given must outlive it.
class Sampler {
 public:
  // Opens the GPU layer when none is given or it could not be opened yet (NVML missing at start):
  // retried every cycle, so the exporter recovers without a restart.
  using GpuOpener = std::function<absl::StatusOr<std::unique_ptr<gpu::GpuLayer>>()>;

  // `gpu` may be null (then `opener` is used); `pods` and `vgpu` may be null (feature off).
  Sampler(gpu::GpuLayer* gpu, GpuOpener opener, kubelet::PodResourcesCache* pods,
          VgpuUsageSource* vgpu, Clock* clock, SamplerOptions options);
  ~Sampler();

  // Samples once synchronously (so the first scrape has data), then every interval in the
  // background.
  void Start();
  void Stop();

  // One cycle on the caller's thread: read, render, publish.
  void SampleOnce();

  // Pod attribution changed (an allocation, a pod gone): the background thread asks the kubelet
  // again and publishes a new snapshot at once instead of at the next tick. Returns at once;
  // pokes arriving while one is handled coalesce into one more cycle.
  void Poke();
  uint64_t pokes_handled() const;  // for tests

  // A scrape asked for `format`, gzip-compressed or not: the next cycles render that variant
  // (until no such scrape came for kFormatKeep). Lock-free; called from the HTTP workers.
  void NoteRequest(Format format, bool gzip);
  static constexpr std::chrono::minutes kFormatKeep{5};

  // The latest snapshot; never null after construction (an empty one before the first cycle).
  std::shared_ptr<const Snapshot> snapshot() const;
  // The latest snapshot for a scrape, its pod attribution as of now: asks the kubelet once (at
  // most once per scrape_list_gap) and, where the answer changed, renders the last cycle's
  // sample again with it (no NVML call), so a new pod's series carry its labels at the first
  // scrape after its devices are allocated, as dcgm-exporter's do. A kubelet whose last call
  // failed is left to the timer, so a hung kubelet never holds a scrape; a cycle in progress
  // reads the new answer itself.
  std::shared_ptr<const Snapshot> ScrapeSnapshot();

  const SamplerOptions& options() const { return options_; }
  // The clock Snapshot::taken is on.
  Clock* clock() const { return clock_; }

 private:
  struct XidState {
    std::map<uint32_t, uint64_t> counts;
    uint32_t last = 0;
  };
  struct NvlinkPrev {
    uint64_t tx_kib = 0, rx_kib = 0;
    Clock::TimePoint at{};
  };
  gpu::GpuLayer* Layer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(cycle_mu_);  // the usable layer or null
  void NvlinkRates(DeviceSample& ds, Clock::TimePoint now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(cycle_mu_);
  void OnEvent(const gpu::Event& e);
  Sample Collect() ABSL_EXCLUSIVE_LOCKS_REQUIRED(cycle_mu_);
  // Fills s.containers from the pod cache's last answer; returns that answer's generation.
  uint64_t Attribute(Sample& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(cycle_mu_);
  // Renders `s` and makes it the latest snapshot.
  void Publish(Sample s, uint64_t pods_generation, Clock::TimePoint taken)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(cycle_mu_);

  gpu::GpuLayer* external_gpu_;
  GpuOpener opener_;
  kubelet::PodResourcesCache* pods_;
  VgpuUsageSource* vgpu_;
  Clock* clock_;
  SamplerOptions options_;

  absl::Mutex cycle_mu_;  // one cycle at a time; guards the fields below
  std::unique_ptr<gpu::GpuLayer> owned_gpu_ ABSL_GUARDED_BY(cycle_mu_);
  std::unique_ptr<gpu::GpuLayer::Subscription> subscription_ ABSL_GUARDED_BY(cycle_mu_);
  bool need_reinit_ ABSL_GUARDED_BY(cycle_mu_) = false;
  SelfStats stats_ ABSL_GUARDED_BY(cycle_mu_);
  std::map<std::string, NvlinkPrev> nvlink_prev_ ABSL_GUARDED_BY(cycle_mu_);  // by GPU UUID
  // After owned_gpu_, so it goes first: it may hold a subscription on that layer.
  std::unique_ptr<DeviceHealth> health_ ABSL_GUARDED_BY(cycle_mu_);
  std::atomic<int64_t> scrape_list_ms_{0};  // steady ms of ScrapeSnapshot's last List; 0 never

  // Steady-clock milliseconds of the last request per variant, index 2 * OpenMetrics + gzip;
  // 0 = never.
  std::atomic<int64_t> requested_ms_[4] = {0, 0, 0, 0};
  size_t body_size_hint_[2] ABSL_GUARDED_BY(cycle_mu_) = {0, 0};  // last rendered size per format

  absl::Mutex xid_mu_;  // events arrive on the GPU layer's thread
  std::map<std::string, XidState> xids_ ABSL_GUARDED_BY(xid_mu_);  // by GPU UUID

  mutable absl::Mutex snap_mu_;
  std::shared_ptr<const Snapshot> snapshot_ ABSL_GUARDED_BY(snap_mu_);

  mutable absl::Mutex stop_mu_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;
  bool poked_ ABSL_GUARDED_BY(stop_mu_) = false;
  uint64_t pokes_handled_ ABSL_GUARDED_BY(stop_mu_) = 0;
  std::thread thread_;
};

}  // namespace gpulet::metrics
