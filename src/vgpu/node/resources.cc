// tencent.com/vcuda-core and tencent.com/vcuda-memory as kubelet::Resource objects (see node.h).
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "vgpu/node/node.h"

namespace gpulet::vgpu {
namespace {

class VcudaResource final : public kubelet::Resource {
 public:
  VcudaResource(std::shared_ptr<NodeAssigner> a, bool is_core,
                std::function<bool(const std::string&)> healthy,
                const kubelet::ChangeNotifier* changes)
      : assigner_(std::move(a)),
        is_core_(is_core),
        name_(is_core ? assigner_->options().names.core : assigner_->options().names.memory),
        healthy_(std::move(healthy)),
        changes_(changes ? changes : &own_changes_) {}

  const std::string& name() const override { return name_; }

  std::vector<kubelet::DeviceState> Devices() const override {
    std::vector<kubelet::DeviceState> out;
    for (const PoolGpu& g : assigner_->pool()) {
      bool ok = g.healthy && (!healthy_ || healthy_(g.uuid));
      int64_t n = is_core_ ? kCoresPerGpu : g.memory_units;
      for (int64_t i = 0; i < n; ++i) {
        out.push_back({absl::StrCat(g.uuid, is_core_ ? "::vc" : "::vm", i), ok, -1});
      }
    }
    return out;
  }

  const kubelet::ChangeNotifier* changes() const override { return changes_; }

  absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocate(
      const std::vector<std::string>& ids) override {
    for (const auto& id : ids) {
      if (id.find(is_core_ ? "::vc" : "::vm") == std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown ", name_, " device ID \"", id, "\""));
      }
    }
    return assigner_->Allocate(is_core_, ids);
  }

  // Keeps a container's units on one GPU: the one the pending container will get when it is
  // known, else the GPU with the most available units (so the count fits on one GPU).
  absl::StatusOr<std::vector<std::string>> Preferred(const std::vector<std::string>& available,
                                                     const std::vector<std::string>& must_include,
                                                     int size) override {
    std::string target = is_core_ ? assigner_->PredictGpu(size, 0) : assigner_->PredictGpu(0, size);
    std::map<std::string, std::vector<std::string>> by_gpu;
    for (const auto& id : available) {
      size_t sep = id.rfind("::");
      by_gpu[sep == std::string::npos ? "" : id.substr(0, sep)].push_back(id);
    }
    std::vector<std::string> out = must_include;
    auto take = [&](const std::vector<std::string>& ids) {
      for (const auto& id : ids) {
        if (static_cast<int>(out.size()) >= size) return;
        if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
      }
    };
    if (!target.empty() && by_gpu.count(target)) take(by_gpu[target]);
    std::vector<std::pair<size_t, std::string>> order;
    for (const auto& [gpu, ids] : by_gpu) order.emplace_back(ids.size(), gpu);
    std::sort(order.rbegin(), order.rend());
    for (const auto& [n, gpu] : order) take(by_gpu[gpu]);
    return out;
  }

 private:
  std::shared_ptr<NodeAssigner> assigner_;
  bool is_core_;
  std::string name_;
  std::function<bool(const std::string&)> healthy_;
  kubelet::ChangeNotifier own_changes_;
  const kubelet::ChangeNotifier* changes_;
};

}  // namespace

std::vector<std::shared_ptr<kubelet::Resource>> MakeVcudaResources(
    std::shared_ptr<NodeAssigner> assigner, std::function<bool(const std::string&)> healthy,
    const kubelet::ChangeNotifier* changes) {
  return {std::make_shared<VcudaResource>(assigner, true, healthy, changes),
          std::make_shared<VcudaResource>(assigner, false, healthy, changes)};
}

}  // namespace gpulet::vgpu
