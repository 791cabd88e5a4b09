// Test doubles for the device-plugin unit tests: a C++ GpuLayer whose inventory, probe answers and
// re-init results the test sets, and which delivers events on the caller's thread; a clock moved by
// hand; inventories shaped like the built-in profiles.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "gpu/gpu.h"
#include "testing/common/fake_clock.h"

namespace gpulet::testing {

class FakeGpuLayer : public gpu::GpuLayer {
 public:
  explicit FakeGpuLayer(gpu::Inventory inv) : inv_(std::move(inv)) {}
  absl::StatusOr<gpu::Inventory> GetInventory() override { return inv_; }
  absl::StatusOr<gpu::Telemetry> GetTelemetry(uint32_t) override { return gpu::Telemetry{}; }
  absl::Status ProbeDevice(uint32_t i) override {
    std::lock_guard<std::mutex> l(mu_);
    ++probes;
    if (nvml_down) return absl::UnavailableError("NVML: Unknown Error");
    auto it = probe.find(i);
    return it == probe.end() ? absl::OkStatus() : it->second;
  }
  absl::Status Reinit() override {
    std::lock_guard<std::mutex> l(mu_);
    ++reinits;
    return nvml_down ? absl::UnavailableError("nvmlInit: Unknown Error") : absl::OkStatus();
  }
  struct Sub : Subscription {
    FakeGpuLayer* l;
    int id;
    ~Sub() override {
      std::lock_guard<std::mutex> g(l->mu_);
      l->subs_.erase(id);
    }
  };
  std::unique_ptr<Subscription> Subscribe(EventCallback cb) override {
    std::lock_guard<std::mutex> l(mu_);
    auto s = std::make_unique<Sub>();
    s->l = this;
    s->id = next_++;
    subs_[s->id] = std::move(cb);
    return s;
  }
  void Emit(uint32_t gpu, uint64_t xid, uint32_t gi = gpu::Event::kAllInstances,
            uint32_t ci = gpu::Event::kAllInstances) {
    gpu::Event e;
    e.device_index = gpu;
    e.data = xid;
    e.gpu_instance_id = gi;
    e.compute_instance_id = ci;
    std::map<int, EventCallback> subs;
    {
      std::lock_guard<std::mutex> l(mu_);
      subs = subs_;
    }
    for (auto& [id, cb] : subs) cb(e);
  }
  void SetProbe(uint32_t i, absl::Status s) {
    std::lock_guard<std::mutex> l(mu_);
    if (s.ok())
      probe.erase(i);
    else
      probe[i] = s;
  }
  void SetNvmlDown(bool down) {
    std::lock_guard<std::mutex> l(mu_);
    nvml_down = down;
  }

  int probes = 0, reinits = 0;

 private:
  std::mutex mu_;
  gpu::Inventory inv_;
  std::map<uint32_t, absl::Status> probe;
  bool nvml_down = false;
  std::map<int, EventCallback> subs_;
  int next_ = 0;
};

inline std::string Uuid(const char* prefix, int n) {
  return absl::StrFormat("%s-%08x-1111-2222-3333-%012x", prefix, 0xabc00000 + n, n);
}

// `n` GPUs named `name`, half on NUMA node 0 and half on 1, with `nvlink[i][j]` links.
inline gpu::Inventory MakeInventory(int n, const std::vector<std::vector<int>>& nvlink,
                                    const std::string& name = "NVIDIA H100 80GB HBM3") {
  gpu::Inventory inv;
  for (int i = 0; i < n; ++i) {
    gpu::Device d;
    d.index = i;
    d.minor = i;
    d.uuid = Uuid("GPU", i);
    d.name = name;
    d.numa_node = i < n / 2 ? 0 : 1;
    inv.devices.push_back(d);
  }
  inv.topology.assign(n, std::vector<gpu::Link>(n));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      inv.topology[i][j].nvlinks = nvlink.empty() ? 0 : nvlink[i][j];
      bool same = inv.devices[i].numa_node == inv.devices[j].numa_node;
      inv.topology[i][j].pcie = same ? gpu::PcieRelation::kSameNuma : gpu::PcieRelation::kCrossNuma;
    }
  return inv;
}

// The DGX-1 V100 hybrid cube-mesh (reference/hardware.md).
inline std::vector<std::vector<int>> Dgx1Links() {
  return {{0, 2, 1, 1, 2, 0, 0, 0}, {2, 0, 1, 2, 0, 1, 0, 0}, {1, 1, 0, 2, 0, 0, 2, 0},
          {1, 2, 2, 0, 0, 0, 0, 1}, {2, 0, 0, 0, 0, 2, 1, 1}, {0, 1, 0, 0, 2, 0, 1, 2},
          {0, 0, 2, 0, 1, 1, 0, 2}, {0, 0, 0, 1, 1, 2, 2, 0}};
}

// Adds MIG devices to GPU `g`: one per profile, GI ids from 1, CI 0.
inline void AddMig(gpu::Inventory& inv, int g, const std::vector<std::string>& profiles) {
  auto& d = inv.devices[g];
  d.mig_capable = d.mig_enabled = true;
  for (size_t k = 0; k < profiles.size(); ++k) {
    gpu::MigDevice m;
    m.index = k;
    m.uuid = Uuid("MIG", g * 100 + k);
    m.gpu_instance_id = k + 1;
    m.compute_instance_id = 0;
    m.profile = profiles[k];
    m.gi_slices = m.ci_slices = profiles[k][0] - '0';
    d.mig_devices.push_back(m);
  }
}

}  // namespace gpulet::testing
