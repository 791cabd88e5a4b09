// An in-process GpuLayer for the metrics unit tests and benchmark: N H100-like GPUs with
// scriptable telemetry, failures and XID events. (End-to-end tests use the fake NVML library
// through the production dlopen path instead.)
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "gpu/gpu.h"
#include "metrics/render.h"

namespace gpulet::testing_metrics {

class FakeGpuLayer : public gpu::GpuLayer {
 public:
  explicit FakeGpuLayer(int n, bool mig_on_last = false) {
    inv_.driver_version = "550.54.15";
    inv_.cuda_driver_version = 12040;
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
      inv_.devices.push_back(d);
    }
  }

  absl::StatusOr<gpu::Inventory> GetInventory() override {
    std::lock_guard<std::mutex> l(mu_);
    if (fail_) return absl::UnavailableError("fake NVML: driver not loaded");
    return inv_;
  }
  absl::StatusOr<gpu::Telemetry> GetTelemetry(uint32_t index) override {
    std::lock_guard<std::mutex> l(mu_);
    if (fail_) return absl::UnavailableError("fake NVML: driver not loaded");
    if (index >= inv_.devices.size()) return absl::NotFoundError("no such GPU");
    if (index == lost_) return absl::UnavailableError("GPU is lost");
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
    t.gpu_util_pct = util_ + index;
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
    ++telemetry_calls_;
    return t;
  }
  absl::Status ProbeDevice(uint32_t index) override { return absl::OkStatus(); }
  absl::Status Reinit() override {
    ++reinits_;
    std::lock_guard<std::mutex> l(mu_);
    return fail_ ? absl::UnavailableError("fake NVML: init failed") : absl::OkStatus();
  }
  class Sub : public Subscription {};
  std::unique_ptr<Subscription> Subscribe(EventCallback cb) override {
    std::lock_guard<std::mutex> l(mu_);
    cb_ = std::move(cb);
    return std::make_unique<Sub>();
  }

  // Test controls.
  void SetFailing(bool f) {
    std::lock_guard<std::mutex> l(mu_);
    fail_ = f;
  }
  void SetLost(uint32_t index) {
    std::lock_guard<std::mutex> l(mu_);
    lost_ = index;
  }
  void SetUtil(uint32_t u) {
    std::lock_guard<std::mutex> l(mu_);
    util_ = u;
  }
  void EmitXid(uint32_t index, uint64_t code) {
    gpu::Event e;
    e.device_index = index;
    e.uuid = inv_.devices[index].uuid;
    e.data = code;
    EventCallback cb;
    {
      std::lock_guard<std::mutex> l(mu_);
      cb = cb_;
    }
    if (cb) cb(e);
  }
  gpu::Inventory& inventory() { return inv_; }
  int reinits() const { return reinits_; }

 private:
  std::mutex mu_;
  gpu::Inventory inv_;
  bool fail_ = false;
  uint32_t lost_ = ~0u;
  uint32_t util_ = 37;
  EventCallback cb_;
  std::atomic<int> reinits_{0};
  std::atomic<int> telemetry_calls_{0};
};

// A metrics Sample of every GPU of `g`, all healthy, on host "node1".
inline metrics::Sample SampleOf(FakeGpuLayer& g) {
  metrics::Sample s;
  s.hostname = "node1";
  auto inv = g.GetInventory();
  s.driver_version = inv->driver_version;
  s.cuda_driver_version = inv->cuda_driver_version;
  for (const gpu::Device& d : inv->devices) {
    metrics::DeviceSample ds;
    ds.device = d;
    ds.telemetry = *g.GetTelemetry(d.index);
    ds.healthy = true;
    s.devices.push_back(ds);
  }
  s.self.nvml_up = true;
  return s;
}

}  // namespace gpulet::testing_metrics
