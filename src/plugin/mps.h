// MPS sharing (config sharing.mps): one NVIDIA MPS control daemon per shared resource, started and
// supervised by the device plugin itself (NVIDIA runs a separate mps-control-daemon DaemonSet for
// this; the facts — directories, commands, limits — are the same):
//   <root>/<resource>/pipe   CUDA_MPS_PIPE_DIRECTORY of the daemon; mounted into containers at
//                            /mps/<resource>/pipe
//   <root>/<resource>/log    CUDA_MPS_LOG_DIRECTORY
//   <root>/shm               the daemon's and every client's /dev/shm
//   <root>/<resource>/.started, <root>/.ready   markers NVIDIA's daemon writes too
// Start: compute mode EXCLUSIVE_PROCESS on each GPU (nvidia-smi -i <uuid> -c), then
// `nvidia-cuda-mps-control -d`, then through the control's stdin
// `set_default_device_pinned_mem_limit <index> <memory/replicas in MiB>M` per GPU and
// `set_default_active_thread_percentage <100/replicas>`. Health:
// `get_default_active_thread_percentage` answers. A daemon that stops answering is started again
// and its limits set again.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kubelet/resource.h"

namespace gpulet::plugin {

inline constexpr char kMpsContainerRoot[] = "/mps";

struct MpsGpu {
  uint32_t index = 0;  // NVML index, as the control daemon's commands name devices
  std::string uuid;
  uint64_t memory_bytes = 0;
  int cc_major = 0, cc_minor = 0;
};

// One resource shared through MPS: its (possibly renamed) name, GPUs and replicas per GPU.
struct MpsShare {
  std::string resource;
  std::vector<MpsGpu> gpus;
  int replicas = 0;
  bool operator==(const MpsShare& o) const {
    if (resource != o.resource || replicas != o.replicas || gpus.size() != o.gpus.size())
      return false;
    for (size_t i = 0; i < gpus.size(); ++i)
      if (gpus[i].index != o.gpus[i].index || gpus[i].uuid != o.gpus[i].uuid ||
          gpus[i].memory_bytes != o.gpus[i].memory_bytes)
        return false;
    return true;
  }
};

// An MPS server takes at most 48 clients from compute capability 7.5 on, 16 before (NVIDIA's
// mps/device.go); more replicas than that is an error naming the GPU.
absl::Status ValidateMpsShare(const MpsShare& share);

// The per-resource directories under `root` (host side) or kMpsContainerRoot (container side).
std::string MpsPipeDir(const std::string& root, const std::string& resource);
std::string MpsLogDir(const std::string& root, const std::string& resource);
std::string MpsShmDir(const std::string& root);

// The control daemon's commands for a share, in the order they are sent.
std::vector<std::string> MpsLimitCommands(const MpsShare& share);

struct MpsOptions {
  std::string root = "/run/nvidia/mps";
  std::string bin_dir;  // where nvidia-cuda-mps-control and nvidia-smi are; "": $PATH
  // Set for those programs besides the pipe and log directories (the host driver's programs run
  // from the agent's container: LD_LIBRARY_PATH and PATH of runtime::LinkDriverTools).
  std::map<std::string, std::string> env;
  absl::Duration probe_interval = absl::Seconds(2);
  absl::Duration command_timeout = absl::Seconds(10);
  absl::Duration max_backoff = absl::Seconds(30);
  std::function<void()> on_health_change;  // called (unlocked) when healthy() changes
};

// One control daemon. Thread-safe; owns its supervising thread.
class MpsDaemon {
 public:
  MpsDaemon(MpsShare share, MpsOptions options);
  ~MpsDaemon();  // Stop()s
  MpsDaemon(const MpsDaemon&) = delete;
  MpsDaemon& operator=(const MpsDaemon&) = delete;

  // Brings the daemon up (adopting one that already answers on the pipe directory, e.g. after an
  // agent restart) with the share's limits, then supervises it. Errors name the step and the
  // command's output.
  absl::Status Start();
  // Sends `quit`, sets compute mode DEFAULT again and removes .started and the log directory.
  void Stop();

  bool healthy() const;
  int restarts() const { return restarts_.load(); }
  const MpsShare& share() const { return share_; }
  const MpsOptions& options() const { return options_; }
  // Moves when healthy() changes.
  const kubelet::ChangeNotifier* changes() const { return &changes_; }

  // Sends one command to the control daemon (stdin), returning its output.
  absl::StatusOr<std::string> Command(const std::string& command) const;

 private:
  // The control programs' environment: the options' plus this daemon's pipe and log directories.
  std::map<std::string, std::string> DaemonEnv() const;
  absl::Status Launch();  // -d, then the limits
  absl::Status SetLimits();
  absl::Status SetComputeMode(const std::string& mode) const;
  void SetHealthy(bool h);
  void Supervise();

  const MpsShare share_;
  const MpsOptions options_;
  mutable absl::Mutex mu_;
  bool healthy_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> restarts_{0};
  kubelet::ChangeNotifier changes_;
  std::thread supervisor_;
};

}  // namespace gpulet::plugin
