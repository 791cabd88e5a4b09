// Keeps the node's CDI spec file in step with its GPUs for the agent: regenerates the spec from
// the GPU layer's inventory (which changes on NVML re-init: MIG reconfiguration, a GPU lost or
// back) every interval and soon after a GPU event, and rewrites the file atomically only when its
// text changed, so container starts never read a partial file and a quiet node causes no writes.
// Thread-safe; owns one background thread and one event subscription. The GpuLayer is not owned
// and must outlive the refresher.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu/gpu.h"
#include "runtime/cdi.h"

namespace gpulet::runtime {

class CdiRefresher {
 public:
  // JSON when `path` ends in ".json" (the runtime's fast reader), else YAML.
  CdiRefresher(gpu::GpuLayer* gpu, std::string path, CdiGenerateOptions options,
               std::chrono::milliseconds interval);
  ~CdiRefresher();

  // One refresh. True when the file was written (absent or different before). Errors name the
  // GPU layer, the driver root or the file; the previous file is then left as it was.
  absl::StatusOr<bool> RefreshOnce();
  // Background refreshes (the first one is the caller's RefreshOnce); failures are logged.
  void Start();
  void Stop();

 private:
  void Loop();

  gpu::GpuLayer* gpu_;
  std::string path_;
  CdiGenerateOptions options_;
  std::chrono::milliseconds interval_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;       // a GPU event asked for an early refresh
  std::string last_error_ ABSL_GUARDED_BY(mu_);  // logged once, not every interval
  std::unique_ptr<gpu::GpuLayer::Subscription> events_;
  std::thread thread_;
};

}  // namespace gpulet::runtime
