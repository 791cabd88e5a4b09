#include "placement/vgpu_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gpulet::vgpu {
namespace {

// The spread policy: among GPUs that fit, the one with the most free compute; nodes score by
// their free compute after placing (most free first).
class SpreadPolicy final : public placement::Policy {
 public:
  std::string_view name() const override { return "spread"; }
  std::optional<placement::NodeScore> Score(const placement::Node& node,
                                            const placement::PodRequest& pod) const override {
    if (!placement::Fits(node, pod)) return std::nullopt;
    std::vector<int32_t> free(node.gpus.size());
    std::vector<int64_t> mem(node.gpus.size());
    for (size_t g = 0; g < node.gpus.size(); ++g) {
      free[g] = node.gpus[g].healthy ? node.gpus[g].free_milli : 0;
      mem[g] = node.gpus[g].memory_free_bytes;
    }
    placement::NodeScore out;
    // Whole GPUs first (they need idle GPUs), then shares onto the emptiest GPU that fits.
    out.assignment.containers.resize(pod.containers.size());
    for (size_t c = 0; c < pod.containers.size(); ++c) {
      const auto& req = pod.containers[c];
      auto& a = out.assignment.containers[c];
      for (size_t g = 0; g < node.gpus.size() && a.gpus.size() < size_t(req.whole_gpus); ++g) {
        if (free[g] == placement::kMilliPerGpu) {
          a.gpus.push_back(static_cast<int32_t>(g));
          free[g] = 0;
          mem[g] = 0;
        }
      }
      if (req.whole_gpus > 0) {
        if (a.gpus.size() != size_t(req.whole_gpus)) return std::nullopt;
        a.milli = placement::kMilliPerGpu;
        a.memory_bytes = node.gpus[a.gpus[0]].memory_total_bytes;
      }
    }
    for (size_t c = 0; c < pod.containers.size(); ++c) {
      const auto& req = pod.containers[c];
      if (req.whole_gpus > 0 || req.milli == 0) continue;
      int best = -1;
      for (size_t g = 0; g < node.gpus.size(); ++g) {
        const auto& gpu = node.gpus[g];
        if (!gpu.healthy || !gpu.fractional_allowed || free[g] < req.milli) continue;
        if (gpu.memory_total_bytes > 0 && mem[g] < req.memory_bytes) continue;
        if (best < 0 || free[g] > free[best]) best = static_cast<int>(g);
      }
      if (best < 0) return std::nullopt;
      free[best] -= req.milli;
      mem[best] -= req.memory_bytes;
      out.assignment.containers[c] = {{best}, req.milli, req.memory_bytes};
    }
    int64_t total_free = 0;
    for (int32_t f : free) total_free += f;
    out.score = static_cast<double>(total_free) /
                std::max<size_t>(1, node.gpus.size() * placement::kMilliPerGpu);
    return out;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<placement::Policy>> MakeVgpuPolicy(const std::string& name) {
  if (name == "binpack") return placement::MakePolicy("best-fit");
  if (name == "spread") return std::unique_ptr<placement::Policy>(std::make_unique<SpreadPolicy>());
  auto p = placement::MakePolicy(name);
  if (!p.ok())  // name the vGPU aliases too
    return absl::InvalidArgumentError(absl::StrCat("unknown vGPU policy \"", name, "\" (known: ",
                                                   absl::StrJoin(VgpuPolicyNames(), ", "), ")"));
  return p;
}

std::vector<std::string> VgpuPolicyNames() {
  std::vector<std::string> names = {"binpack", "spread"};
  for (const auto& n : placement::PolicyNames()) names.push_back(n);
  return names;
}

}  // namespace gpulet::vgpu
