// The vGPU admission webhook: AdmissionReview v1 (admission.k8s.io/v1) for pod CREATE. The
// validating endpoint applies the vGPU rules (vgpu/rules/rules.h) and denies with the rule's
// message; the mutating endpoint (optional) points vGPU pods at a scheduler profile
// (spec.schedulerName) so clusters can route them to the kube-scheduler that calls the extender.
// "Memory must fit one GPU" needs the largest GPU of the cluster: a fixed option, or learned from
// the nodes through the API server (cached for 30 s).
// Thread-safe.
#pragma once

#include <chrono>
#include <string>

#include "abi/vgpu_contract.h"  // the contract variables a pod may not set
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "k8s/client.h"
#include "vgpu/rules/rules.h"

namespace httplib {
class Server;
}

namespace gpulet::scheduler {

using nlohmann::json;

// The vGPU opt-out a pod may ask for (see docs/vgpu.md), and the namespace label with which an
// administrator allows it for pods that share a GPU.
inline constexpr char kAnnotationVgpuDisable[] = "gpulet.io/vgpu-disable";
inline constexpr char kLabelAllowVgpuDisable[] = "gpulet.io/vgpu-disable-allowed";

struct WebhookOptions {
  vgpu::ResourceNames names;
  int64_t max_memory_units = 0;  // largest GPU, in 256 MiB units; 0 = learn from nodes
  std::string scheduler_name;    // mutate: set spec.schedulerName of vGPU pods (empty: no)
  Clock* clock = RealClock();    // whose time the learned bound's 30 s cache expires in
};

class AdmissionWebhook {
 public:
  // `api` may be null (then only options.max_memory_units bounds memory).
  AdmissionWebhook(WebhookOptions options, k8s::Client* api);

  // One AdmissionReview in, one AdmissionReview (with .response) out. Malformed reviews give
  // InvalidArgument (answered as HTTP 400).
  absl::StatusOr<json> Validate(const json& review);
  absl::StatusOr<json> Mutate(const json& review);

  // POST /validate and /mutate, GET /healthz.
  void Register(httplib::Server& server);

  // Largest GPU memory among the cluster's nodes, in units (annotation or capacity); 0 if none.
  int64_t MaxMemoryUnits();

 private:
  // True when namespace `ns` carries kLabelAllowVgpuDisable=true (read from the API server).
  bool NamespaceAllowsDisable(const std::string& ns);

  WebhookOptions options_;
  k8s::Client* api_;
  absl::Mutex mu_;
  int64_t cached_units_ ABSL_GUARDED_BY(mu_) = 0;
  Clock::TimePoint cached_at_ ABSL_GUARDED_BY(mu_){};
};

// Largest per-GPU memory, in units, that a node object offers (gpulet.io/vgpu-gpus annotation,
// else allocatable memory units / (cores / 100)); 0 when the node has no vGPU resources.
int64_t NodeMaxGpuUnits(const json& node, const vgpu::ResourceNames& names);

}  // namespace gpulet::scheduler
