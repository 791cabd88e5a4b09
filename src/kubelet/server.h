// The kubelet side of the device plugin: a gRPC DevicePlugin server per Resource on its own unix
// socket in the device-plugin directory, registration with the kubelet (retried with backoff), and
// a watcher that re-serves and re-registers when the kubelet restarts (kubelet.sock recreated) or
// our socket disappears. Knows nothing of GPUs: everything resource-specific is behind Resource.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "kubelet/resource.h"

namespace gpulet::kubelet {

// "nvidia.com/gpu" -> "nvidia-gpu.sock" (NVIDIA's naming), "tencent.com/vcuda-core" ->
// "tencent-vcuda-core.sock".
std::string SocketNameFor(const std::string& resource_name);

struct ManagerOptions {
  std::string plugin_dir = "/var/lib/kubelet/device-plugins";
  // Base name of the kubelet's Registration socket inside plugin_dir. Empty: serve, never register.
  std::string kubelet_socket = "kubelet.sock";
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(10);
  absl::Duration register_timeout = absl::Seconds(2);
  // Upper bound on how long a missed inotify event could delay noticing a change.
  absl::Duration poll_interval = absl::Milliseconds(200);
  // Whose time the registration backoff waits on (the watcher itself wakes every poll_interval
  // of real time to look). Never null.
  Clock* clock = RealClock();
};

struct ServerStatus {
  std::string resource;
  std::string socket;  // full path
  bool registered = false;
  int registrations = 0;   // successful Register calls
  int serves = 0;          // times the socket was (re)created
  std::string last_error;  // last failed registration, empty when none
};

class PluginServer;

// Owns one PluginServer per resource and a background thread that keeps them served and
// registered. Thread-safe. The plugin never exits on kubelet trouble: failures are logged, kept
// in Status() and retried.
class PluginManager {
 public:
  explicit PluginManager(ManagerOptions options);
  ~PluginManager();  // Stop()s
  PluginManager(const PluginManager&) = delete;
  PluginManager& operator=(const PluginManager&) = delete;

  // Replaces the served set: servers of the previous set stop (their sockets are removed), the new
  // ones serve at once and register in the background. Error (nothing changed) when the directory
  // is unusable or a socket cannot be bound; duplicate resource names are an error too.
  absl::Status SetResources(std::vector<std::shared_ptr<Resource>> resources);

  // Stops every server and the watcher thread; sockets are removed. Idempotent.
  void Stop();

  std::vector<ServerStatus> Status() const;
  const ManagerOptions& options() const { return options_; }

 private:
  struct Entry;
  void Run();
  void Tick();

  const ManagerOptions options_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int inotify_fd_ = -1;
  std::thread thread_;
  // Waiting for kubelet.sock (Tick() runs on one thread only): said once when the wait starts and
  // then at doubling intervals (capped at a minute), so a node without a kubelet is not silent.
  absl::Time kubelet_wait_since_ = absl::InfiniteFuture();
  absl::Time next_wait_log_ = absl::InfinitePast();
  absl::Duration wait_log_step_ = absl::Seconds(1);
};

}  // namespace gpulet::kubelet
