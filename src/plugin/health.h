// Device health for the device plugin: XID classification by NVIDIA's XID catalogue resolution
// buckets, live marking from GPU-layer events, recovery after a hold-down of normal answers, the
// "NVML is gone" state (all devices Unhealthy, re-initialisation with backoff, full recovery), and
// manual isolation through a watched JSON file. Resources read Healthy(); ListAndWatch streams wake
// on changes().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "gpu/gpu.h"
#include "kubelet/resource.h"
#include "plugin/config.h"

namespace gpulet::plugin {

// The "Resolution Bucket (Immediate Action)" column of NVIDIA's XID catalogue.
enum class XidBucket { kIgnore, kRestartApp, kResetGpu, kRestartBm, kContactSupport, kUnknown };
const char* XidBucketName(XidBucket b);
XidBucket ClassifyXid(uint64_t xid);

// Whether `xid` makes a device Unhealthy under `cfg`: DP_ENABLE_HEALTHCHECKS wins, then
// DP_DISABLE_HEALTHCHECKS (all / xids / list), then the bucket: application-level buckets
// (IGNORE, RESTART_APP) leave the device Healthy, everything else (unknown XIDs too) does not.
bool IsCriticalXid(uint64_t xid, const HealthConfig& cfg);

// Devices named in the manual isolation file: {"index": [0, "1:0"], "uuid": ["GPU-..."]}.
struct Isolation {
  std::set<std::string> indices;  // "0", "1:0"
  std::set<std::string> uuids;
};
// `where` names the file in messages; errors give line and column.
absl::StatusOr<Isolation> ParseIsolation(const std::string& text, const std::string& where);

// Thread-safe. Owns a checker thread (Start/Stop) and a GPU-layer event subscription. The GpuLayer
// and Clock are not owned and must outlive the monitor.
class HealthMonitor {
 public:
  HealthMonitor(gpu::GpuLayer* gpu, const gpu::Inventory& inventory, HealthConfig cfg,
                Clock* clock = RealClock());
  ~HealthMonitor();

  // Subscribes to events and starts the checker thread (probes, re-init, isolation file).
  void Start();
  void Stop();

  // Health of GPU `index` (mig < 0) or of its MIG device at position `mig`.
  bool Healthy(uint32_t index, int mig = -1) const;
  // Why a device is unhealthy ("" when healthy), for logs and tests.
  std::string Reason(uint32_t index, int mig = -1) const;
  bool nvml_down() const;
  // The manual-isolation file's last problem (OK when it parsed or is absent).
  // Entries of the current isolation list that match no device of this node (logged as such).
  std::vector<std::string> isolation_unmatched() const;
  absl::Status isolation_status() const;
  const kubelet::ChangeNotifier* changes() const { return &changes_; }
  // Moves changes() for something else resources derive health from (an MPS daemon's).
  void NotifyChanged() { changes_.Notify(); }

  void SetConfig(HealthConfig cfg);
  // Event handler (the subscription calls it; tests may too).
  void OnEvent(const gpu::Event& e);
  // One checker cycle: re-init / probes / recovery / isolation file. The thread calls this.
  void CheckOnce();

 private:
  struct GpuState {
    std::string uuid;
    std::vector<std::string> mig_uuids;
    std::vector<std::pair<uint32_t, uint32_t>> mig_ids;  // (GI, CI) per MIG device
    std::string xid_reason;                              // whole GPU marked by an XID
    std::map<int, std::string> mig_xid;                  // MIG devices marked by an XID
    std::string probe_reason;                            // probe failed
    std::optional<Clock::TimePoint> ok_since;            // probes answering normally since
  };
  void CheckIsolationFile() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Entries of the isolation list that name no GPU or MIG device here ("index 9", "uuid GPU-x").
  std::vector<std::string> UnmatchedIsolationEntries() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  gpu::GpuLayer* const gpu_;
  Clock* const clock_;
  kubelet::ChangeNotifier changes_;
  mutable absl::Mutex mu_;
  HealthConfig cfg_ ABSL_GUARDED_BY(mu_);
  std::vector<GpuState> gpus_ ABSL_GUARDED_BY(mu_);
  bool nvml_down_ ABSL_GUARDED_BY(mu_) = false;
  std::string nvml_reason_ ABSL_GUARDED_BY(mu_);
  Clock::TimePoint next_reinit_ ABSL_GUARDED_BY(mu_){};
  Clock::Duration reinit_backoff_ ABSL_GUARDED_BY(mu_){};
  Clock::TimePoint next_probe_ ABSL_GUARDED_BY(mu_){};
  Isolation isolation_ ABSL_GUARDED_BY(mu_);
  std::string isolation_text_ ABSL_GUARDED_BY(mu_);
  bool isolation_read_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status isolation_status_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<gpu::GpuLayer::Subscription> sub_;
  std::thread thread_;
};

}  // namespace gpulet::plugin
