// Node feature labels compatible with NVIDIA's gpu-feature-discovery (nvidia.com/gpu.product,
// .memory, .count, cuda.driver-version.*, MIG labels, ...), computed from the GPU layer's
// inventory and written as a Node Feature Discovery "local" feature file (key=value lines),
// atomically, so NFD never reads half a file.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/fs.h"
#include "gpu/gpu.h"

namespace gpulet::labels {

inline constexpr char kDefaultFeatureFile[] =
    "/etc/kubernetes/node-feature-discovery/features.d/gpulet";

struct LabelOptions {
  std::string mig_strategy = "none";      // none | single | mixed (as the device plugin)
  int replicas = 1;                       // time-slicing / MPS replicas per GPU
  std::string sharing_strategy = "none";  // none | time-slicing | mps
  bool timestamp = true;                  // nvidia.com/gfd.timestamp
  std::string machine_type;               // nvidia.com/gpu.machine; empty = omitted
};

// InvalidArgument naming the bad option (e.g. "--mig-strategy 'dual': expected none, single or
// mixed").
absl::Status ValidateOptions(const LabelOptions& options);

using Labels = std::map<std::string, std::string>;

// Labels for this node. Pure function: `unix_now` is the gfd.timestamp value.
Labels GenerateLabels(const gpu::Inventory& inventory, const LabelOptions& options,
                      int64_t unix_now);

// "key=value\n" per label, sorted by key: NFD's feature-file format.
std::string FormatFeatureFile(const Labels& labels);

// Creates the parent directory if needed and replaces `path` atomically; "-" writes to stdout.
absl::Status WriteFeatureFile(const RootedFilesystem& fs, const std::string& path,
                              const Labels& labels);

// GFD's sanitising of a model name: characters outside [A-Za-z0-9-_. ] dropped, spaces -> '-';
// then what Kubernetes requires of a label value: at most kMaxLabelValue characters, beginning and
// ending with an alphanumeric (possibly empty).
inline constexpr size_t kMaxLabelValue = 63;
std::string SanitizeLabelValue(const std::string& s);

// Rewrites the feature file from the GPU layer's inventory every `interval` (GFD's
// --sleep-interval). Thread-safe; owns its thread; `gpu` and `fs` must outlive it.
class LabelRefresher {
 public:
  LabelRefresher(gpu::GpuLayer* gpu, const RootedFilesystem* fs, std::string path,
                 LabelOptions options, std::chrono::milliseconds interval, Clock* clock = nullptr);
  ~LabelRefresher();
  // One refresh: inventory -> labels -> atomic write. Errors name the file or the GPU layer.
  absl::Status WriteOnce();
  void Start();  // refreshes in the background (the first write is the caller's WriteOnce)
  // New options for the next write (the device plugin's config was reloaded).
  void SetOptions(LabelOptions options);
  void Stop();

 private:
  gpu::GpuLayer* gpu_;
  const RootedFilesystem* fs_;
  std::string path_;
  LabelOptions options_ ABSL_GUARDED_BY(mu_);
  std::chrono::milliseconds interval_;
  Clock* clock_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gpulet::labels
