// Leader election on a coordination.k8s.io/v1 Lease, the protocol kube-scheduler and
// kube-controller-manager use (client-go's leaderelection), so that replicas of one component
// agree on a single writer:
//   - a candidate takes the Lease when it does not exist, names no holder, or its holder has not
//     renewed it for leaseDurationSeconds as *this process* observed it (the time the Lease last
//     changed here, not its renewTime: no trust in other machines' clocks);
//   - every write is a PUT carrying the resourceVersion read just before (optimistic
//     concurrency): two candidates racing for an expired Lease cannot both win;
//   - the holder renews every `retry_period` and gives leadership up when it has not renewed for
//     `renew_deadline` (shorter than the lease duration, so it has stopped acting before anyone
//     else may take over);
//   - Stop() while leading releases the Lease (no holder, duration 1 s), so a rolling update
//     hands over within one retry period instead of a whole lease duration.
//
// Thread-safety: is_leader() from any thread; the callbacks run on the elector's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "k8s/client.h"

namespace gpulet::k8s {

struct LeaseOptions {
  std::string ns = "gpulet-system";
  std::string name;
  std::string identity;  // unique per candidate (the pod's name)
  std::chrono::milliseconds lease_duration{15000};
  std::chrono::milliseconds renew_deadline{10000};
  std::chrono::milliseconds retry_period{2000};
};

// Checks the three durations against each other (client-go's rules): lease > renew deadline
// > retry period > 0, and a non-empty name and identity.
absl::Status ValidateLeaseOptions(const LeaseOptions& o);

class LeaderElector {
 public:
  // `on_start` runs when this candidate becomes the leader (before is_leader() turns true);
  // `on_stop` when it stops being one (after is_leader() turned false).
  LeaderElector(Client* api, LeaseOptions options, std::function<void()> on_start,
                std::function<void()> on_stop, Clock* clock = RealClock());
  ~LeaderElector();

  void Start();
  // Ends the loop; releases the Lease when leading (on_stop runs first).
  void Stop();
  bool is_leader() const { return leader_.load(); }

  // One round, what the loop runs every retry period (tests drive it directly): acquire or
  // renew; true when this candidate holds the Lease afterwards. A field of the wrong type (an
  // admin's edit) reads as absent.
  bool TryAcquireOrRenew();
  // Gives the Lease up if held (what Stop does).
  void Release();

 private:
  void Run();
  void Lead();
  void Abdicate();

  Client* api_;
  LeaseOptions options_;
  std::function<void()> on_start_, on_stop_;
  Clock* clock_;
  std::string path_;
  // What this process last saw of the Lease, and when it saw it change.
  std::string observed_holder_, observed_renew_;
  Clock::TimePoint observed_at_{};
  Clock::TimePoint last_renew_{};  // this candidate's last successful acquire/renew
  std::atomic<bool> leader_{false};
  std::atomic<bool> stop_{false};
  absl::Mutex wake_mu_;
  bool wake_ ABSL_GUARDED_BY(wake_mu_) = false;
  std::thread thread_;
};

}  // namespace gpulet::k8s
