#include "kubelet/podresources_client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "k8s/podresources/v1/api.grpc.pb.h"

namespace gpulet::kubelet {

absl::StatusOr<std::vector<PodDevice>> GrpcPodResourcesLister::List() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);  // thousands of pods fit; the kubelet's own cap is 16M
  auto channel = grpc::CreateCustomChannel("unix://" + options_.socket,
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = v1::PodResourcesLister::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + options_.timeout);
  v1::ListPodResourcesRequest req;
  v1::ListPodResourcesResponse resp;
  grpc::Status st = stub->List(&ctx, req, &resp);
  if (!st.ok()) {
    return absl::UnavailableError(absl::StrCat("kubelet PodResources List on ", options_.socket,
                                               ": ", st.error_message(), " (grpc code ",
                                               static_cast<int>(st.error_code()), ")"));
  }
  std::vector<PodDevice> out;
  for (const v1::PodResources& pod : resp.pod_resources()) {
    for (const v1::ContainerResources& c : pod.containers()) {
      for (const v1::ContainerDevices& d : c.devices()) {
        bool keep = absl::StartsWith(d.resource_name(), "nvidia.com/");
        for (const std::string& r : options_.extra_resources) keep |= d.resource_name() == r;
        if (!keep) continue;
        for (const std::string& id : d.device_ids()) {
          out.push_back({pod.namespace_(), pod.name(), c.name(), d.resource_name(), id});
        }
      }
    }
  }
  return out;
}

std::optional<DeviceRef> ResolveDeviceId(const gpu::Inventory& inv, std::string_view sid) {
  // Debian's absl::string_view is its own type, not std::string_view.
  absl::string_view id(sid.data(), sid.size());
  // Replica suffix "::n" (time-slicing, MPS): the same physical device.
  if (size_t p = id.find("::"); p != absl::string_view::npos) id = id.substr(0, p);
  if (id.empty()) return std::nullopt;
  if (absl::StartsWith(id, "GPU-")) {
    for (size_t i = 0; i < inv.devices.size(); ++i) {
      if (absl::EqualsIgnoreCase(inv.devices[i].uuid, id)) return DeviceRef{i, -1};
    }
    return std::nullopt;
  }
  if (absl::StartsWith(id, "MIG-")) {
    for (size_t i = 0; i < inv.devices.size(); ++i) {
      const auto& migs = inv.devices[i].mig_devices;
      for (size_t m = 0; m < migs.size(); ++m) {
        if (absl::EqualsIgnoreCase(migs[m].uuid, id)) return DeviceRef{i, static_cast<int>(m)};
      }
    }
    return std::nullopt;
  }
  // Index forms: "3" or "3:1".
  auto name = gpu::ParseIndexName(std::string_view(id.data(), id.size()));
  if (!name) return std::nullopt;
  for (size_t i = 0; i < inv.devices.size(); ++i) {
    if (inv.devices[i].index != name->gpu) continue;
    if (!name->mig) return DeviceRef{i, -1};
    const auto& migs = inv.devices[i].mig_devices;
    for (size_t m = 0; m < migs.size(); ++m) {
      if (migs[m].index == *name->mig) return DeviceRef{i, static_cast<int>(m)};
    }
  }
  return std::nullopt;
}

PodResourcesCache::PodResourcesCache(std::unique_ptr<PodResourcesLister> lister,
                                     std::chrono::milliseconds interval)
    : lister_(std::move(lister)), interval_(interval) {}

PodResourcesCache::~PodResourcesCache() { Stop(); }

void PodResourcesCache::Start() {
  {
    absl::MutexLock l(&mu_);
    if (thread_.joinable()) return;
    stop_ = false;
  }
  thread_ = std::thread([this] { Loop(); });
}

void PodResourcesCache::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void PodResourcesCache::RequestRefresh() {
  absl::MutexLock l(&mu_);
  refresh_requested_ = true;
}

void PodResourcesCache::RefreshNow() {
  absl::MutexLock call(&call_mu_);
  absl::StatusOr<std::vector<PodDevice>> r = lister_->List();
  absl::MutexLock l(&mu_);
  ++state_.refreshes;
  if (r.ok()) {
    if (*r != state_.devices) {
      state_.devices = *std::move(r);
      ++state_.generation;
    }
    state_.up = true;
  } else {
    // Keep the last known attribution: pods rarely move, and dropping pod labels for one failed
    // call would break every dashboard series. kubelet_up says the data may be stale.
    state_.up = false;
    ++state_.errors;
  }
}

PodResourcesCache::State PodResourcesCache::state() const {
  absl::MutexLock l(&mu_);
  return state_;
}

void PodResourcesCache::Loop() {
  while (true) {
    RefreshNow();
    absl::MutexLock l(&mu_);
    auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || refresh_requested_; };
    mu_.AwaitWithTimeout(absl::Condition(&wake), absl::FromChrono(interval_));
    if (stop_) return;
    refresh_requested_ = false;
  }
}

}  // namespace gpulet::kubelet
