// The unit tests' GpuLayer: in-process, with the inventory, telemetry, failures and events the test
// sets; events are delivered on the caller's thread. Inventories shaped like real nodes beside it.
// (End-to-end tests use the fake NVML library, testing/fake_nvml, through the production dlopen
// path instead.)
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gpu/gpu.h"

namespace gpulet::testing {

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

// `n` H100s as NVML describes them (driver, PCI, memory, compute capability; no topology), the
// last with two MIG devices (3g.40gb and 1g.10gb+me) if `mig_on_last`.
inline gpu::Inventory H100Inventory(int n, bool mig_on_last = false) {
  gpu::Inventory inv;
  inv.driver_version = "550.54.15";
  inv.cuda_driver_version = 12040;
  for (int i = 0; i < n; ++i) {
    gpu::Device d;
    d.index = i;
    d.minor = i;
    d.uuid = absl::StrFormat("GPU-%08x-d9cf-fef3-62e9-d92044ab6e%02x", 0x604ac76c + i, i);
    d.name = "NVIDIA H100 80GB HBM3";
    d.brand = "NVIDIA";
    d.architecture = "Hopper";
    d.pci_bus_id = absl::StrFormat("00000000:%02X:00.0", 0x18 + i);
    d.memory_bytes = 81559ull << 20;
    d.cc_major = 9;
    d.numa_node = i < n / 2 ? 0 : 1;
    d.mig_capable = true;
    if (mig_on_last && i == n - 1) {
      d.mig_enabled = true;
      for (uint32_t m = 0; m < 2; ++m) {
        gpu::MigDevice md;
        md.index = m;
        md.uuid = absl::StrFormat("MIG-0b3c1d6e-0000-0000-0000-0000000000%02x", m);
        md.gpu_instance_id = m == 0 ? 1 : 2;
        md.profile = m == 0 ? "3g.40gb" : "1g.10gb+me";
        md.gi_slices = m == 0 ? 3 : 1;
        md.memory_bytes = (m == 0 ? 40192ull : 9984ull) << 20;
        md.sm_count = m == 0 ? 60 : 16;
        d.mig_devices.push_back(md);
      }
    }
    inv.devices.push_back(d);
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

class FakeGpuLayer : public gpu::GpuLayer {
 public:
  explicit FakeGpuLayer(gpu::Inventory inv) : inv_(std::move(inv)) {}
  explicit FakeGpuLayer(int n, bool mig_on_last = false)
      : FakeGpuLayer(H100Inventory(n, mig_on_last)) {}

  absl::StatusOr<gpu::Inventory> GetInventory() override {
    std::lock_guard<std::mutex> l(mu_);
    if (nvml_down_) return absl::UnavailableError("fake NVML: driver not loaded");
    return inv_;
  }
  // The same busy H100 figures for every GPU (a few vary with the index, to tell GPUs apart).
  absl::StatusOr<gpu::Telemetry> GetTelemetry(uint32_t index) override {
    std::lock_guard<std::mutex> l(mu_);
    if (nvml_down_) return absl::UnavailableError("fake NVML: driver not loaded");
    if (index >= inv_.devices.size()) return absl::NotFoundError("no such GPU");
    if (auto it = device_errors_.find(index); it != device_errors_.end()) return it->second;
    gpu::Telemetry t;
    t.gpu_temp_c = 40 + index;
    t.memory_temp_c = 45;
    t.sm_clock_mhz = 1980;
    t.memory_clock_mhz = 2619;
    t.graphics_clock_mhz = 1980;
    t.video_clock_mhz = 1545;
    t.power_usage_mw = 120500 + index;
    t.power_limit_mw = 700000;
    t.total_energy_mj = 55491669881ull + index;
    t.gpu_util_pct = 37 + index;
    t.memory_util_pct = 5;
    t.encoder_util_pct = 0;
    t.decoder_util_pct = 0;
    t.fb_total_bytes = inv_.devices[index].memory_bytes;
    t.fb_used_bytes = 1024ull << 20;
    t.fb_free_bytes = *t.fb_total_bytes - *t.fb_used_bytes;
    t.fb_reserved_bytes = 512ull << 20;
    t.ecc_sbe_volatile = 0;
    t.ecc_dbe_volatile = 0;
    t.ecc_sbe_aggregate = 1;
    t.ecc_dbe_aggregate = 0;
    t.throttle_reasons = 0;
    t.pcie_replay_count = 0;
    t.pcie_tx_kbps = 1000;
    t.pcie_rx_kbps = 2000;
    t.pstate = 0;
    t.nvlink_tx_kib = 3000000 + index;
    t.nvlink_rx_kib = 2000000;
    return t;
  }
  absl::Status ProbeDevice(uint32_t index) override {
    std::lock_guard<std::mutex> l(mu_);
    if (nvml_down_) return absl::UnavailableError("NVML: Unknown Error");
    auto it = device_errors_.find(index);
    return it == device_errors_.end() ? absl::OkStatus() : it->second;
  }
  absl::Status Reinit() override {
    ++reinits_;
    std::lock_guard<std::mutex> l(mu_);
    return nvml_down_ ? absl::UnavailableError("nvmlInit: Unknown Error") : absl::OkStatus();
  }
  std::unique_ptr<Subscription> Subscribe(EventCallback cb) override {
    std::lock_guard<std::mutex> l(mu_);
    auto s = std::make_unique<Sub>();
    s->layer = this;
    s->id = next_sub_++;
    subs_[s->id] = std::move(cb);
    return s;
  }

  // Test controls.
  // An XID on GPU `index` (a MIG device's when `gi`, `ci` are given), to every subscriber.
  void Emit(uint32_t index, uint64_t xid, uint32_t gi = gpu::Event::kAllInstances,
            uint32_t ci = gpu::Event::kAllInstances) {
    gpu::Event e;
    e.device_index = index;
    e.data = xid;
    e.gpu_instance_id = gi;
    e.compute_instance_id = ci;
    std::map<int, EventCallback> subs;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (const gpu::Device& d : inv_.devices)
        if (d.index == index) e.uuid = d.uuid;
      subs = subs_;
    }
    for (auto& [id, cb] : subs) cb(e);
  }
  // Every call fails, as with the driver unloaded, until SetNvmlDown(false).
  void SetNvmlDown(bool down) {
    std::lock_guard<std::mutex> l(mu_);
    nvml_down_ = down;
  }
  // ProbeDevice and GetTelemetry of GPU `index` answer `s` (a lost GPU); OkStatus() clears it.
  void SetDeviceError(uint32_t index, absl::Status s) {
    std::lock_guard<std::mutex> l(mu_);
    if (s.ok())
      device_errors_.erase(index);
    else
      device_errors_[index] = std::move(s);
  }
  // A new GPU set, as an NVML re-init after a MIG change or a GPU lost would see.
  void SetInventory(gpu::Inventory inv) {
    std::lock_guard<std::mutex> l(mu_);
    inv_ = std::move(inv);
  }
  gpu::Inventory inventory() {
    std::lock_guard<std::mutex> l(mu_);
    return inv_;
  }
  int reinits() const { return reinits_; }

 private:
  struct Sub : Subscription {
    FakeGpuLayer* layer;
    int id;
    ~Sub() override {
      std::lock_guard<std::mutex> l(layer->mu_);
      layer->subs_.erase(id);
    }
  };

  std::mutex mu_;
  gpu::Inventory inv_;
  bool nvml_down_ = false;
  std::map<uint32_t, absl::Status> device_errors_;
  std::map<int, EventCallback> subs_;
  int next_sub_ = 0;
  std::atomic<int> reinits_{0};
};

}  // namespace gpulet::testing
