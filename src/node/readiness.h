// Reboot self-healing for a GPU node (what the GPU Operator lacks). After every boot -- detected by
// the node's boot ID (status.nodeInfo.bootID, as the kubelet reports it) differing from the boot ID
// gpulet last validated -- the node carries a NoSchedule taint so new GPU pods stay off it until
// the whole stack validates (driver, runtime, device plugin). Then, in this order: the node is
// labelled gpulet.io/gpu-stack=ready and annotated with the validated boot ID, the taint is
// removed, and pods the kubelet rejected meanwhile (UnexpectedAdmissionError for GPU resources) are
// dealt with once: controller-owned ones are deleted so their controllers recreate them, bare ones
// are reported (a Warning event and a counter) and left alone.
//
// Thread-safety: ReconcileOnce() must not run concurrently with itself; Start() runs it on a thread
// owned by the controller; counters may be read from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "k8s/client.h"
#include "node/validation.h"

namespace gpulet::node {

struct ReadinessOptions {
  std::string node_name;
  std::string taint_key = "gpulet.io/gpu-stack-not-ready";
  std::string ready_label = "gpulet.io/gpu-stack";  // value "ready" once validated
  std::string boot_annotation = "gpulet.io/validated-boot-id";
  // Resources whose admission failures are ours to heal.
  std::vector<std::string> resource_prefixes = {"nvidia.com/", "tencent.com/vcuda-"};
  std::chrono::milliseconds interval{2000};
  // How long after a boot is first seen validated rejected pods keep being looked for on each pass.
  // The kubelet posts its verdict (phase Failed) seconds after it starts, which on the real kubelet
  // can be after the agent's first pass (tests/cluster/vgpu_support.py); once per boot missed
  // them. Afterwards no more passes: no delete/recreate storm, no list every interval forever.
  std::chrono::milliseconds remediate_window{120000};
  // Within that window, how often the node's pods are listed for rejected ones.
  std::chrono::milliseconds remediate_every{10000};
  // Once the boot is validated and the window is over, how often a pass runs. Under Start() the
  // Node comes from a watch (no request a pass) and a change to it wakes a pass at once; without
  // the watch each pass is one GET, which a thousand nodes multiply.
  std::chrono::milliseconds steady_interval{30000};
  // The checks that depend on the agent's settings (which runtime acts on the device plugin's
  // delivery). A boot is validated once, but the settings can change within it: a new agent
  // process (rollout, helm upgrade) or a reloaded config. So on a validated boot this runs on the
  // first pass of each process and after each SettingsChanged(); failing, the node goes back to
  // not validated (taint, no ready label) until the whole stack validates again. Unset: never.
  std::function<absl::Status()> settings_check;
};

enum class NodeStackState { kNotReady, kReady };

class ReadinessController {
 public:
  using Validator = std::function<ValidationReport()>;
  // `client` is not owned and must outlive the controller.
  ReadinessController(k8s::Client* client, Validator validate, ReadinessOptions options,
                      Clock* clock = RealClock());
  ~ReadinessController();

  // One pass: taint if this boot is not validated, validate, then label / untaint / remediate.
  absl::StatusOr<NodeStackState> ReconcileOnce();

  // Reconciles on a background thread (NextWait() between passes), on the watched Node.
  void Start();
  // Watches this node (one watch, field-selected by name): a pass then reads the Node from the
  // watch instead of GETting it, and a change to it (a label or taint edited by hand, a new boot
  // ID) wakes the loop. Start() calls it; tests call it to drive ReconcileOnce() by hand. True once
  // the first list arrived within `timeout`.
  bool WatchNode(std::chrono::milliseconds timeout);
  void Stop();
  // The agent's settings changed: the next pass reruns `settings_check` (at once when Start()ed).
  // Any thread.
  void SettingsChanged();

  int64_t deleted_pods() const { return deleted_pods_.load(); }
  int64_t reported_bare_pods() const { return reported_bare_pods_.load(); }
  const ValidationReport& last_report() const { return last_report_; }  // ReconcileOnce thread

 private:
  bool HasTaint(const k8s::json& node) const;  // our taint is on `node`
  // The watch's copy of the Node when it shows this controller's last write, else one GET.
  absl::StatusOr<k8s::json> ReadNode();
  // After a write of the Node: its copy is stale until the watch delivers that resourceVersion.
  void Wrote(const absl::StatusOr<k8s::json>& node);
  void Watched(k8s::json node);  // the watch's callbacks
  absl::Status SetTaint(bool present);
  absl::Status MarkValidated(const std::string& boot_id);
  absl::Status ClearReadyLabel();
  void StartRemediation(const std::string& boot_id);
  absl::Status RemediateRejectedPods();
  absl::Status RemediateIfDue();  // within the window, at most every remediate_every
  // Until the next pass: `interval` until validated, then `remediate_every` within the window
  // (a pass has nothing else to do), then `steady_interval`.
  std::chrono::milliseconds NextWait() const;
  bool RequestsOurResources(const k8s::json& pod) const;

  k8s::Client* client_;
  Validator validate_;
  ReadinessOptions options_;
  Clock* clock_;
  ValidationReport last_report_;
  std::string last_failure_logged_;
  std::string remediated_boot_;  // boot ID whose rejected pods are being (or were) handled
  Clock::TimePoint remediate_until_{};
  Clock::TimePoint next_remediation_{};
  std::atomic<bool> ready_{false};       // the last pass found the boot validated
  std::set<std::string> reported_bare_;  // namespace/name of bare pods reported for this boot
  std::atomic<int64_t> deleted_pods_{0};
  std::atomic<int64_t> reported_bare_pods_{0};
  std::atomic<bool> recheck_settings_{true};  // a new process checks its settings once

  std::unique_ptr<k8s::Reflector> node_watch_;
  absl::Mutex node_mu_;
  k8s::json watched_ ABSL_GUARDED_BY(node_mu_);             // the Node as last watched; null: none
  uint64_t awaited_version_ ABSL_GUARDED_BY(node_mu_) = 0;  // of our last write; 0: none
  uint64_t watched_version_ ABSL_GUARDED_BY(node_mu_) = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool wake_ = false;  // SettingsChanged() cuts the wait short
  std::thread thread_;
};

}  // namespace gpulet::node
