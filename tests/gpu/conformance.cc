#include "conformance.h"

#include <dlfcn.h>

#include <chrono>
#include <regex>
#include <set>
#include <thread>
#include <vector>

namespace gpulet::gpu::testing {

void GpuLayerConformance::SetUp() {
  GpuOptions o;
  o.simulate = GetParam();
  if (o.simulate.empty()) {
    void* h = dlopen(o.nvml_library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) GTEST_SKIP() << "no real NVML here (" << dlerror() << ")";
    dlclose(h);
  }
  auto layer = OpenGpuLayer(o);
  if (o.simulate.empty() && !layer.ok()) {
    GTEST_SKIP() << "real NVML present but not usable: " << layer.status();
  }
  ASSERT_TRUE(layer.ok()) << layer.status();
  layer_ = *std::move(layer);
  auto inv = layer_->GetInventory();
  ASSERT_TRUE(inv.ok()) << inv.status();
  inv_ = *inv;
}

// Devices are numbered 0..n-1 in order, with well-formed, distinct identities.
TEST_P(GpuLayerConformance, InventoryIdentities) {
  EXPECT_FALSE(inv_.driver_version.empty());
  EXPECT_GT(inv_.cuda_driver_version, 0);
  const std::regex uuid("GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}");
  const std::regex mig_uuid("MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}");
  const std::regex bus("[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\\.[0-7]");
  std::set<std::string> uuids, buses;
  std::set<uint32_t> minors;
  for (size_t i = 0; i < inv_.devices.size(); ++i) {
    const Device& d = inv_.devices[i];
    EXPECT_EQ(d.index, i);
    EXPECT_TRUE(std::regex_match(d.uuid, uuid)) << d.uuid;
    EXPECT_TRUE(std::regex_match(d.pci_bus_id, bus)) << d.pci_bus_id;
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.memory_bytes, 1ull << 30);
    EXPECT_GE(d.cc_major, 3);
    EXPECT_EQ(d.pci_device_id & 0xffff, 0x10deu) << "vendor id is NVIDIA's";
    EXPECT_TRUE(uuids.insert(d.uuid).second);
    EXPECT_TRUE(buses.insert(d.pci_bus_id).second);
    EXPECT_TRUE(minors.insert(d.minor).second);
    EXPECT_GE(d.numa_node, -1);
    if (!d.mig_enabled) {
      EXPECT_TRUE(d.mig_devices.empty());
    }
    uint64_t mig_memory = 0;
    for (const MigDevice& m : d.mig_devices) {
      EXPECT_TRUE(std::regex_match(m.uuid, mig_uuid)) << m.uuid;
      EXPECT_TRUE(uuids.insert(m.uuid).second);
      EXPECT_GE(m.gi_slices, 1u);
      EXPECT_LE(m.ci_slices, m.gi_slices);
      EXPECT_GT(m.memory_bytes, 0u);
      EXPECT_EQ(m.profile.find(std::to_string(m.gi_slices) + "g."),
                m.ci_slices == m.gi_slices ? 0 : m.profile.find('.') + 1)
          << m.profile;
      mig_memory += m.memory_bytes;
    }
    EXPECT_LE(mig_memory, d.memory_bytes);
  }
}

// The topology matrix is square and symmetric: NVLinks and PCIe relations are properties of a pair.
TEST_P(GpuLayerConformance, TopologyIsSymmetric) {
  const size_t n = inv_.devices.size();
  ASSERT_EQ(inv_.topology.size(), n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(inv_.topology[i].size(), n);
    for (size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      EXPECT_EQ(inv_.topology[i][j].nvlinks, inv_.topology[j][i].nvlinks) << i << "," << j;
      EXPECT_EQ(inv_.topology[i][j].pcie, inv_.topology[j][i].pcie) << i << "," << j;
      EXPECT_LE(inv_.topology[i][j].nvlinks, 18);
      // GPUs on different NUMA nodes cannot share a PCIe switch or host bridge.
      if (inv_.devices[i].numa_node >= 0 && inv_.devices[j].numa_node >= 0 &&
          inv_.devices[i].numa_node != inv_.devices[j].numa_node) {
        EXPECT_EQ(inv_.topology[i][j].pcie, PcieRelation::kCrossNuma) << i << "," << j;
      }
    }
  }
}

// Every GPU answers a telemetry sample whose fields are within physical bounds.
TEST_P(GpuLayerConformance, TelemetryIsPlausible) {
  for (const Device& d : inv_.devices) {
    auto t = layer_->GetTelemetry(d.index);
    ASSERT_TRUE(t.ok()) << t.status();
    if (t->gpu_temp_c) {
      EXPECT_LT(*t->gpu_temp_c, 130u);
    }
    if (t->gpu_util_pct) {
      EXPECT_LE(*t->gpu_util_pct, 100u);
    }
    if (t->memory_util_pct) {
      EXPECT_LE(*t->memory_util_pct, 100u);
    }
    if (t->fb_total_bytes) {
      EXPECT_EQ(*t->fb_total_bytes, d.memory_bytes);
      ASSERT_TRUE(t->fb_used_bytes && t->fb_free_bytes);
      EXPECT_EQ(*t->fb_used_bytes + *t->fb_free_bytes + t->fb_reserved_bytes.value_or(0),
                *t->fb_total_bytes);
    }
    if (t->power_usage_mw && t->power_limit_mw) {
      EXPECT_LE(*t->power_usage_mw, *t->power_limit_mw);
    }
    if (t->pstate) {
      EXPECT_LE(*t->pstate, 15u);
    }
    for (const ProcessInfo& p : t->processes) EXPECT_GT(p.pid, 0u);
  }
}

// Unknown indices are NotFound, never a crash; known ones probe healthy.
TEST_P(GpuLayerConformance, ProbeAndBadIndex) {
  const uint32_t n = static_cast<uint32_t>(inv_.devices.size());
  for (uint32_t i = 0; i < n; ++i) EXPECT_TRUE(layer_->ProbeDevice(i).ok()) << i;
  EXPECT_EQ(layer_->ProbeDevice(n).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(layer_->GetTelemetry(n).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(layer_->GetTelemetry(UINT32_MAX).status().code(), absl::StatusCode::kNotFound);
}

// Reinit reads the same node again, and the layer keeps working afterwards.
TEST_P(GpuLayerConformance, ReinitKeepsTheInventory) {
  auto sub = layer_->Subscribe([](const Event&) {});
  ASSERT_TRUE(layer_->Reinit().ok());
  auto again = layer_->GetInventory();
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->devices.size(), inv_.devices.size());
  for (size_t i = 0; i < inv_.devices.size(); ++i) {
    EXPECT_EQ(again->devices[i].uuid, inv_.devices[i].uuid);
    EXPECT_EQ(again->devices[i].mig_devices.size(), inv_.devices[i].mig_devices.size());
  }
  if (!inv_.devices.empty()) {
    EXPECT_TRUE(layer_->GetTelemetry(0).ok());
  }
}

// The nvidia-smi facts and extras agree with each other, and GPM gives percentages on GPUs that
// support it (per GPU instance under MIG) and nothing elsewhere. Two reads 200 ms apart: NVML
// wants GPM samples at least 100 ms apart.
TEST_P(GpuLayerConformance, ProfilingAndNvidiaSmiSetArePlausible) {
  const TelemetryRequest all{true, true};
  for (const Device& d : inv_.devices) {
    SCOPED_TRACE(d.index);
    const DeviceFacts& f = d.facts;
    if (f.power_min_limit_mw && f.power_max_limit_mw) {
      EXPECT_LE(*f.power_min_limit_mw, *f.power_max_limit_mw);
      if (f.power_default_limit_mw) {
        EXPECT_LE(*f.power_default_limit_mw, *f.power_max_limit_mw);
        EXPECT_GE(*f.power_default_limit_mw, *f.power_min_limit_mw);
      }
    }
    auto first = layer_->ReadTelemetry(d.index, all);
    ASSERT_TRUE(first.ok()) << first.status();
    if (f.pcie_link_gen_max && first->pcie_link_gen_current) {
      EXPECT_LE(*first->pcie_link_gen_current, *f.pcie_link_gen_max);
    }
    if (f.pcie_link_width_max && first->pcie_link_width_current) {
      EXPECT_LE(*first->pcie_link_width_current, *f.pcie_link_width_max);
    }
    if (f.max_sm_clock_mhz && first->sm_clock_mhz) {
      EXPECT_LE(*first->sm_clock_mhz, *f.max_sm_clock_mhz);
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (const Device& d : inv_.devices) {
    SCOPED_TRACE(d.index);
    auto t = layer_->ReadTelemetry(d.index, all);
    ASSERT_TRUE(t.ok()) << t.status();
    if (!d.gpm_supported) {
      EXPECT_FALSE(t->gpm.has_value());
      EXPECT_TRUE(t->gpm_instances.empty());
      continue;
    }
    std::vector<GpmMetrics> got;
    if (d.mig_enabled) {
      EXPECT_FALSE(t->gpm.has_value());
      for (const auto& [gi, m] : t->gpm_instances) got.push_back(m);
      EXPECT_FALSE(got.empty()) << "MIG GPU with GPM: no instance measured";
    } else {
      ASSERT_TRUE(t->gpm.has_value()) << "GPM supported but no metrics from two samples";
      got.push_back(*t->gpm);
    }
    for (const GpmMetrics& m : got) {
      for (const auto& v : {m.graphics_util, m.sm_util, m.sm_occupancy, m.tensor_util,
                            m.dram_bw_util, m.fp64_util, m.fp32_util, m.fp16_util}) {
        if (!v) continue;
        EXPECT_GE(*v, 0.0);
        EXPECT_LE(*v, 200.0) << "percent (MIG instances may read somewhat above 100)";
      }
    }
  }
}

}  // namespace gpulet::gpu::testing
