// The GPU layer's GPM profiling metrics and the nvidia-smi set on simulated nodes: GPM where the
// machine has it (Hopper profiles), nothing where it has not (Volta, Turing, Ampere), per GPU
// instance on a MIG-enabled Hopper; the static facts read at start and the per-sample extras.
// Expected values come from the machine files and injected telemetry, not from the code under
// test. The GPM structures are also checked against NVIDIA's published layout.
#include <filesystem>
#include <fstream>

#include "abi/nvml_api.h"
#include "fake_nvml/control.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/metrics/sim_node.h"

namespace gpulet::gpu::testing {
namespace {

class ProfilingTest : public testing_metrics::SimNodeTest {
 protected:
  void Start(const std::string& profile) { Open(profile); }
  void Inject(const std::string& line) {
    auto f = sim::ParseFault(line);
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_TRUE(sim::InjectFault(root_, *f).ok());
  }
  Telemetry Read(uint32_t gpu, TelemetryRequest what) {
    auto t = layer_->ReadTelemetry(gpu, what);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : Telemetry{};
  }
};

constexpr TelemetryRequest kProfiling{false, true};
constexpr TelemetryRequest kExtended{true, false};

// NVIDIA's nvml.h: nvmlGpmMetric_t is {uint, nvmlReturn_t, double, 3 pointers} and
// nvmlGpmMetricsGet_t {version, numMetrics, sample1, sample2, metrics[NVML_GPM_METRIC_MAX = 98]}.
TEST(GpmAbi, StructLayoutIsNvidias) {
  EXPECT_EQ(offsetof(nvmlGpmMetric_t, metricId), 0u);
  EXPECT_EQ(offsetof(nvmlGpmMetric_t, nvmlReturn), 4u);
  EXPECT_EQ(offsetof(nvmlGpmMetric_t, value), 8u);
  EXPECT_EQ(offsetof(nvmlGpmMetric_t, metricInfo), 16u);
  EXPECT_EQ(sizeof(nvmlGpmMetric_t), 40u);
  EXPECT_EQ(offsetof(nvmlGpmMetricsGet_t, numMetrics), 4u);
  EXPECT_EQ(offsetof(nvmlGpmMetricsGet_t, sample2), 16u);
  EXPECT_EQ(offsetof(nvmlGpmMetricsGet_t, metrics), 24u);
  EXPECT_EQ(sizeof(nvmlGpmMetricsGet_t), 24u + 98u * 40u);
  EXPECT_EQ(sizeof(nvmlGpmSupport_t), 8u);
  EXPECT_EQ(NVML_GPM_METRIC_SM_OCCUPANCY, 3u);
  EXPECT_EQ(NVML_GPM_METRIC_ANY_TENSOR_UTIL, 5u);
  EXPECT_EQ(NVML_GPM_METRIC_DRAM_BW_UTIL, 10u);
  EXPECT_EQ(NVML_GPM_METRIC_FP16_UTIL, 13u);
}

// H100: GPM is supported; the first read only takes a sample, the second gives the metrics
// (percent) of the machine's load: injected values, graphics following gpu_util_pct.
TEST_F(ProfilingTest, HopperGivesGpmFromTheSecondRead) {
  Start("dgx-h100");
  EXPECT_TRUE((*layer_->GetInventory()).devices[2].gpm_supported);
  Inject(
      "set gpu=2 gpu_util_pct=99 gpm_sm_util_pct=16 gpm_sm_occupancy_pct=9 "
      "gpm_tensor_util_pct=41 gpm_dram_bw_util_pct=71 gpm_fp32_util_pct=3");
  EXPECT_FALSE(Read(2, kProfiling).gpm.has_value()) << "one sample cannot give a rate";
  Telemetry t = Read(2, kProfiling);
  ASSERT_TRUE(t.gpm.has_value());
  EXPECT_EQ(t.gpm->graphics_util, 99.0);
  EXPECT_EQ(t.gpm->sm_util, 16.0);
  EXPECT_EQ(t.gpm->sm_occupancy, 9.0);
  EXPECT_EQ(t.gpm->tensor_util, 41.0);
  EXPECT_EQ(t.gpm->dram_bw_util, 71.0);
  EXPECT_EQ(t.gpm->fp32_util, 3.0);
  EXPECT_EQ(t.gpm->fp64_util, 0.0);
  Inject("set gpu=2 gpm_sm_util_pct=80");
  EXPECT_EQ(Read(2, kProfiling).gpm->sm_util, 80.0) << "each read uses the newest sample";
  EXPECT_TRUE(t.gpm_instances.empty());
  // Without the request nothing is sampled.
  EXPECT_FALSE(Read(2, {}).gpm.has_value());
}

// Volta, Turing and Ampere have no GPM: never a value, whatever the load (not zeros).
TEST_F(ProfilingTest, OlderGpusGiveNoGpm) {
  for (const char* profile : {"dgx1-v100", "pcie-t4", "a100-mig"}) {
    SCOPED_TRACE(profile);
    layer_.reset();
    Start(profile);
    EXPECT_FALSE((*layer_->GetInventory()).devices[0].gpm_supported);
    for (int i = 0; i < 3; ++i) {
      Telemetry t = Read(0, kProfiling);
      EXPECT_FALSE(t.gpm.has_value());
      EXPECT_TRUE(t.gpm_instances.empty());
    }
  }
}

// A MIG-enabled Hopper: one GPM sample per GPU instance (nvmlGpmMigSampleGet), none for the GPU.
TEST_F(ProfilingTest, MigHopperGivesGpmPerGpuInstance) {
  std::string path = root_ + "/h100-mig.yaml";
  std::ofstream(path) << R"(name: h100-mig
mig_profiles:
  3g.40gb: {slices: 3, memory_mib: 40192, sm_count: 60}
  1g.10gb: {slices: 1, memory_mib: 9984, sm_count: 16}
gpus:
  - name: NVIDIA H100 80GB HBM3
    architecture: hopper
    uuid: GPU-5a367384-d845-e8ec-9c9d-2d5e8a50b041
    pci_bus_id: "00000000:1B:00.0"
    memory_mib: 81559
    mig_capable: true
    telemetry: {gpu_util_pct: 50, gpm_sm_util_pct: 30}
    mig:
      - {profile: 3g.40gb, uuid: MIG-0b3c1d6e-0000-0000-0000-000000000001, gi: 1}
      - {profile: 1g.10gb, uuid: MIG-0b3c1d6e-0000-0000-0000-000000000002, gi: 5}
)";
  Start(path);
  Read(0, kProfiling);
  Telemetry t = Read(0, kProfiling);
  EXPECT_FALSE(t.gpm.has_value());
  ASSERT_EQ(t.gpm_instances.size(), 2u);
  EXPECT_EQ(t.gpm_instances.at(1).sm_util, 30.0);
  EXPECT_EQ(t.gpm_instances.at(5).graphics_util, 50.0);
}

// A lost GPU fails the whole read before any GPM call, so its last sample stays the first of the
// next pair: once the GPU answers again the very next read has metrics (over the whole gap).
TEST_F(ProfilingTest, LostGpuKeepsItsLastGpmSample) {
  Start("dgx-h100");
  Read(1, kProfiling);
  Inject("lost gpu=1");
  EXPECT_FALSE(layer_->ReadTelemetry(1, kProfiling).ok());
  Inject("reset gpu=1");
  EXPECT_TRUE(Read(1, kProfiling).gpm.has_value()) << "pairs with the sample before the loss";
}

// The nvidia-smi set: static facts in the inventory (from the machine file), per-sample extras
// only when asked, unsupported answers left unset.
TEST_F(ProfilingTest, NvidiaSmiFactsAndExtras) {
  Start("dgx-h100");
  const Device d = (*layer_->GetInventory()).devices[0];
  EXPECT_EQ(d.facts.serial, "1654922003401");
  EXPECT_EQ(d.facts.vbios_version, "96.00.74.00.0D");
  EXPECT_EQ(d.facts.inforom_ecc, "7.16");
  EXPECT_EQ(d.facts.max_sm_clock_mhz, 1980u);
  EXPECT_EQ(d.facts.max_memory_clock_mhz, 2619u);
  EXPECT_EQ(d.facts.pcie_link_gen_max, 5u);
  EXPECT_EQ(d.facts.pcie_link_width_max, 16u);
  EXPECT_EQ(d.facts.power_min_limit_mw, 200000u);
  EXPECT_EQ(d.facts.power_default_limit_mw, 700000u);
  EXPECT_EQ(d.facts.pci_bus, 0x1Bu);
  EXPECT_EQ(d.facts.pci_subsystem_id, 0x16C110DEu);
  EXPECT_EQ(d.facts.pci_base_class, 3u);
  EXPECT_EQ(d.facts.pci_sub_class, 2u);
  EXPECT_EQ(d.facts.gsp_firmware_enabled, true);
  EXPECT_FALSE(Read(0, {}).persistence_mode.has_value()) << "extras only when asked";
  Inject(
      "set gpu=0 remapped_rows_correctable=3 ecc_dbe_aggregate=2 power_usage_mw=500000 "
      "throttle_reasons=4 clocks_event_power_cap_ns=2500000000");
  Telemetry t = Read(0, kExtended);
  EXPECT_EQ(t.persistence_mode, true);
  EXPECT_EQ(t.compute_mode, 0u);
  EXPECT_EQ(t.ecc_mode_current, true);
  EXPECT_EQ(t.mig_mode_pending, false);
  EXPECT_EQ(t.pcie_link_gen_current, 5u);
  EXPECT_EQ(t.power_management_limit_mw, 700000u);
  EXPECT_EQ(t.power_average_mw, 500000u);
  EXPECT_EQ(t.clocks_event_power_cap_ns, 2500000000u);
  EXPECT_EQ(t.remapped_rows_correctable, 3u);
  EXPECT_EQ(t.remapped_rows_pending, false);
  EXPECT_EQ(t.remap_histogram[0], 2557u);
  EXPECT_EQ(t.ecc_dram[1][1], 2u);
  EXPECT_EQ(t.ecc_sram[1][1], 0u);
  EXPECT_EQ(t.jpeg_util_pct, 0u);
  EXPECT_EQ(t.encoder_sessions, 0u);
}

// A T4 without remapping or JPEG engines in its machine file: those stay unset, not 0.
TEST_F(ProfilingTest, UnsupportedExtrasStayUnset) {
  Start("pcie-t4");
  Telemetry t = Read(0, kExtended);
  EXPECT_FALSE(t.remapped_rows_correctable.has_value());
  EXPECT_FALSE(t.remap_histogram[0].has_value());
  EXPECT_FALSE(t.jpeg_util_pct.has_value());
  EXPECT_FALSE(t.clocks_event_power_cap_ns.has_value());
  EXPECT_EQ(t.pcie_link_gen_current, 3u);
  const Device d = (*layer_->GetInventory()).devices[0];
  EXPECT_TRUE(d.facts.serial.empty());
  EXPECT_FALSE(d.facts.gsp_firmware_enabled.has_value());
}

}  // namespace
}  // namespace gpulet::gpu::testing
