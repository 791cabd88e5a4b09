// DCGM's profiling families (from NVML GPM) and the nvidia-smi set: rendering from a Sample built
// here, and end to end through the fake libnvidia-ml.so.1 (dlopen -> GpuLayer -> Sampler ->
// exposition). Expected names, labels and units come from dcgm-exporter's counters list and
// nvidia_gpu_exporter's H100 fixture (reference/samples), values from the machine files.
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "fake_nvml/malloc_arenas.h"
#include "gmock/gmock.h"
#include "gpu/open.h"
#include "gtest/gtest.h"
#include "metrics/exporter.h"
#include "metrics/render.h"
#include "metrics/sampler.h"
#include "testing/common/fake_clock.h"
#include "testing/gpu/fake_gpu.h"
#include "testing/metrics/expo_util.h"
#include "testing/metrics/sample.h"
#include "tests/metrics/sim_node.h"

namespace gpulet::metrics {
namespace {

using testing::FakeGpuLayer;
using ::testing::HasSubstr;
using ::testing::Not;
using testing_metrics::SampleOf;

std::string Line(const std::string& text, const std::string& prefix) {
  size_t at = text.find(prefix);
  if (at == std::string::npos) return "";
  return text.substr(at, text.find('\n', at) - at);
}

// GPM percentages become DCGM's ratios under DCGM's names and labels; a GPU without GPM (its
// telemetry has none) gets no series, a metric NVML did not give has no family; on a MIG GPU each
// GPU instance has its own value and labels.
TEST(SmiGpm, DcgmProfilingFamilies) {
  FakeGpuLayer g(3, /*mig_on_last=*/true);
  Sample s = SampleOf(g);
  gpu::GpmMetrics m;
  m.graphics_util = 99, m.sm_util = 16, m.sm_occupancy = 9, m.tensor_util = 41;
  m.dram_bw_util = 71, m.fp64_util = 0, m.fp32_util = 3;  // fp16 not given
  s.devices[0].telemetry->gpm = m;
  gpu::GpmMetrics inst;
  inst.sm_util = 30;
  s.devices[2].telemetry->gpm_instances[1] = inst;  // GI 2 has no sample
  std::string text;
  Render(s, RenderOptions{kDcgmFamilies, true}, Format::kText, &text);
  std::string gpu0 = absl::StrCat("{gpu=\"0\",UUID=\"", s.devices[0].device.uuid, "\"");
  EXPECT_THAT(Line(text, "DCGM_FI_PROF_SM_ACTIVE" + gpu0), ::testing::EndsWith("pod=\"\"} 0.16"));
  EXPECT_THAT(Line(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE" + gpu0), ::testing::EndsWith("} 0.99"));
  EXPECT_THAT(Line(text, "DCGM_FI_PROF_SM_OCCUPANCY" + gpu0), ::testing::EndsWith("} 0.09"));
  EXPECT_THAT(Line(text, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" + gpu0), ::testing::EndsWith("} 0.41"));
  EXPECT_THAT(Line(text, "DCGM_FI_PROF_DRAM_ACTIVE" + gpu0), ::testing::EndsWith("} 0.71"));
  EXPECT_THAT(Line(text, "DCGM_FI_PROF_PIPE_FP32_ACTIVE" + gpu0), ::testing::EndsWith("} 0.03"));
  EXPECT_THAT(text, HasSubstr("# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\n"));
  EXPECT_THAT(text, Not(HasSubstr("DCGM_FI_PROF_PIPE_FP16_ACTIVE")));
  EXPECT_THAT(text, Not(HasSubstr("DCGM_FI_PROF_SM_ACTIVE{gpu=\"1\"")));
  EXPECT_THAT(text, HasSubstr("DCGM_FI_PROF_SM_ACTIVE{gpu=\"2\""));
  EXPECT_THAT(Line(text, "DCGM_FI_PROF_SM_ACTIVE{gpu=\"2\""),
              HasSubstr("GPU_I_PROFILE=\"3g.40gb\",GPU_I_ID=\"1\""));
  EXPECT_THAT(Line(text, "DCGM_FI_PROF_SM_ACTIVE{gpu=\"2\""), ::testing::EndsWith("} 0.3"));
  auto shapes = testing_metrics::ReadShapes(text);
  EXPECT_EQ(shapes["DCGM_FI_PROF_SM_ACTIVE"].samples, 2);  // GPU 0 + GI 1 of GPU 2
  EXPECT_EQ(shapes["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples, 1);

  // gpulet's names: GPU level only, promtool-clean.
  std::string own;
  Render(s, RenderOptions{kGpuletFamilies, true}, Format::kText, &own);
  const std::string own0 = absl::StrCat("{gpu=\"0\",uuid=\"", s.devices[0].device.uuid, "\"} ");
  EXPECT_THAT(own, HasSubstr("gpulet_gpu_sm_active_ratio" + own0 + "0.16\n"));
  EXPECT_THAT(own, HasSubstr("gpulet_gpu_sm_occupancy_ratio" + own0 + "0.09\n"));
  EXPECT_THAT(own, HasSubstr("gpulet_gpu_dram_active_ratio" + own0 + "0.71\n"));
  EXPECT_EQ(testing_metrics::ReadShapes(own)["gpulet_gpu_sm_active_ratio"].samples, 1);
  if (testing_metrics::HavePromtool()) {
    auto r = testing_metrics::PromtoolCheckMetrics(own);
    EXPECT_EQ(r.rc, 0) << r.output;
  }
}

// The nvidia-smi set: nvidia_gpu_exporter's names, units (hz, watts, seconds) and its uuid label;
// a value NVML did not give leaves the GPU out of the family.
TEST(SmiGpm, NvidiaSmiSetNamesAndUnits) {
  FakeGpuLayer g(2);
  Sample s = SampleOf(g);
  gpu::DeviceFacts& f = s.devices[0].device.facts;
  f.serial = "1654922003401";
  f.vbios_version = "96.00.74.00.0D";
  f.inforom_ecc = "7.16";
  f.max_sm_clock_mhz = 1980;
  f.power_min_limit_mw = 200000;
  f.pci_subsystem_id = 0x16C110DE;
  f.pcie_link_width_max = 16;
  f.supported_clock_event_reasons = 511;
  gpu::Telemetry& t = *s.devices[0].telemetry;
  t.throttle_reasons = 0x4 | 0x1;
  t.clocks_event_power_cap_ns = 2500000000;
  t.power_management_limit_mw = 650000;
  t.persistence_mode = true;
  t.ecc_dram[1][1] = 2;
  t.remap_histogram[0] = 2560;
  t.remapped_rows_pending = false;
  std::string text;
  Render(s, RenderOptions{kNvidiaSmiFamilies, true}, Format::kText, &text);
  const std::string u0 = "{uuid=\"604ac76c-d9cf-fef3-62e9-d92044ab6e00\"} ";
  for (const char* want : {"nvidia_smi_clocks_max_sm_clock_hz", "nvidia_smi_power_min_limit_watts",
                           "nvidia_smi_serial", "nvidia_smi_inforom_ecc",
                           "nvidia_smi_pci_sub_device_id", "nvidia_smi_power_limit_watts"}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("# TYPE ", want, " gauge\n"))) << want;
  }
  EXPECT_THAT(text, HasSubstr("nvidia_smi_clocks_max_sm_clock_hz" + u0 + "1980000000\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_power_min_limit_watts" + u0 + "200\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_power_limit_watts" + u0 + "650\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_serial" + u0 + "1654922003401\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_inforom_ecc" + u0 + "7.16\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_pci_sub_device_id" + u0 + "381751518\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_clocks_event_reasons_supported" + u0 + "511\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_clocks_event_reasons_sw_power_cap" + u0 + "1\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_clocks_event_reasons_gpu_idle" + u0 + "1\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_clocks_event_reasons_hw_slowdown" + u0 + "0\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_clocks_event_reasons_counters_sw_power_cap_seconds" + u0 +
                              "2.5\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_persistence_mode" + u0 + "1\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_ecc_errors_uncorrected_aggregate_dram" + u0 + "2\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_remapped_rows_histogram_max" + u0 + "2560\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_remapped_rows_pending" + u0 + "0\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_compute_cap" + u0 + "9\n"));
  EXPECT_THAT(text, HasSubstr("nvidia_smi_count" + u0 + "2\n"));
  EXPECT_THAT(text, HasSubstr("pci_sub_device_id=\"0x16C110DE\",serial=\"1654922003401\","
                              "uuid=\"604ac76c-d9cf-fef3-62e9-d92044ab6e00\","
                              "vbios_version=\"96.00.74.00.0D\"} 1\n"));
  auto shapes = testing_metrics::ReadShapes(text);
  EXPECT_EQ(shapes["nvidia_smi_serial"].samples, 1) << "GPU 1 has no serial: absent, not 0";
  EXPECT_EQ(shapes["nvidia_smi_clocks_max_sm_clock_hz"].samples, 1);
  EXPECT_EQ(shapes.count("nvidia_smi_clocks_max_graphics_clock_hz"), 0u);
  EXPECT_EQ(shapes["nvidia_smi_clocks_event_reasons_sync_boost"].samples, 2);
}

class SmiGpmFakeNvml : public testing_metrics::SimNodeTest {};

std::set<std::string> Families(const std::string& text, const std::string& prefix) {
  std::set<std::string> out;
  for (const auto& [name, shape] : testing_metrics::ReadShapes(text)) {
    if (absl::StartsWith(name, prefix)) out.insert(name);
  }
  return out;
}

// dgx-h100 through the real dlopen path: the sampler's cycles give GPM its two samples (no
// profiling series on the first cycle, injected load on the next); the nvidia-smi set covers
// every nvidia_gpu_exporter family the fake's NVML answers.
TEST_F(SmiGpmFakeNvml, HopperNodeServesProfilingAndTheSmiSet) {
  gpulet::testing::FakeClock clock;
  Open("dgx-h100");
  SamplerOptions so;
  so.hostname = "node1";
  so.render.families = kDcgmFamilies | kNvidiaSmiFamilies;
  Sampler sampler(layer_.get(), nullptr, nullptr, nullptr, &clock, so);
  sampler.SampleOnce();
  std::string t = sampler.snapshot()->text;
  EXPECT_THAT(t, Not(HasSubstr("DCGM_FI_PROF_SM_ACTIVE"))) << "one GPM sample gives no rate";
  ASSERT_EQ(Set(3, "gpm_sm_util_pct=42"), 0);
  ASSERT_EQ(Set(3, "gpu_util_pct=97"), 0);
  clock.Advance(std::chrono::seconds(10));
  sampler.SampleOnce();
  t = sampler.snapshot()->text;
  EXPECT_THAT(Line(t, "DCGM_FI_PROF_SM_ACTIVE{gpu=\"3\""), ::testing::EndsWith("} 0.42"));
  EXPECT_THAT(Line(t, "DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu=\"3\""), ::testing::EndsWith("} 0.97"));
  EXPECT_EQ(testing_metrics::ReadShapes(t)["DCGM_FI_PROF_SM_ACTIVE"].samples, 8);
  std::set<std::string> ours = Families(t, "nvidia_smi_");
  EXPECT_GE(ours.size(), 100u);
  const std::string path = std::string(GPULET_SOURCE_DIR) + "/tests/metrics/data/nvgpu_h100.prom";
  std::string ref = testing_metrics::ReadFileOrEmpty(path);
  ASSERT_FALSE(ref.empty()) << "the reference fixture is part of the tree: " << path;
  // Every fixture family we serve keeps its type; the ones we lack are those NVML (or the fake)
  // does not answer, listed here so that a regression shows up as a new name.
  const std::set<std::string> not_served = {
      "nvidia_smi_c2c_mode",
      "nvidia_smi_clocks_event_reasons_counters_hw_power_brake_slowdown_seconds",
      "nvidia_smi_clocks_event_reasons_counters_hw_thermal_slowdown_seconds",
      "nvidia_smi_clocks_event_reasons_counters_sw_thermal_slowdown_seconds",
      "nvidia_smi_command_exit_code",
      "nvidia_smi_compute_app_info",
      "nvidia_smi_compute_app_used_memory_bytes",
      "nvidia_smi_compute_apps_last_collect_success",
      "nvidia_smi_ecc_errors_uncorrected_aggregate_sram_l2",
      "nvidia_smi_ecc_errors_uncorrected_aggregate_sram_mcu",
      "nvidia_smi_ecc_errors_uncorrected_aggregate_sram_other",
      "nvidia_smi_ecc_errors_uncorrected_aggregate_sram_parity",
      "nvidia_smi_ecc_errors_uncorrected_aggregate_sram_pcie",
      "nvidia_smi_ecc_errors_uncorrected_aggregate_sram_secded",
      "nvidia_smi_ecc_errors_uncorrected_aggregate_sram_sm",
      "nvidia_smi_ecc_errors_uncorrected_aggregate_sram_threshold_exceeded",
      "nvidia_smi_ecc_errors_uncorrected_volatile_sram_parity",
      "nvidia_smi_ecc_errors_uncorrected_volatile_sram_secded",
      "nvidia_smi_edpp_multiplier_ratio",
      "nvidia_smi_fabric_clique_id",
      "nvidia_smi_fabric_state",
      "nvidia_smi_gpu_recovery_action",
      "nvidia_smi_platform_gpu_fabric_guid",
      "nvidia_smi_platform_host_id",
      "nvidia_smi_platform_module_id",
      "nvidia_smi_platform_slot_number",
      "nvidia_smi_platform_tray_index",
      "nvidia_smi_protected_memory_free_bytes",
      "nvidia_smi_protected_memory_total_bytes",
      "nvidia_smi_protected_memory_used_bytes",
      "nvidia_smi_temperature_gpu_tlimit"};
  auto ref_shapes = testing_metrics::ReadShapes(ref);
  auto our_shapes = testing_metrics::ReadShapes(t);
  for (const std::string& name : Families(ref, "nvidia_smi_")) {
    if (not_served.count(name)) {
      EXPECT_EQ(ours.count(name), 0u) << name << " is served now: take it off the list";
      continue;
    }
    ASSERT_TRUE(ours.count(name)) << name << " missing";
    EXPECT_EQ(our_shapes[name].type, ref_shapes[name].type) << name;
  }
}

// A T4 node (Turing, no GPM): no DCGM profiling family at all, however many cycles.
TEST_F(SmiGpmFakeNvml, NoGpmNoProfilingFamilies) {
  gpulet::testing::FakeClock clock;
  Open("pcie-t4");
  SamplerOptions so;
  so.render.families = kDcgmFamilies;
  Sampler sampler(layer_.get(), nullptr, nullptr, nullptr, &clock, so);
  for (int i = 0; i < 3; ++i) {
    clock.Advance(std::chrono::seconds(10));
    sampler.SampleOnce();
  }
  std::string t = sampler.snapshot()->text;
  EXPECT_THAT(t, HasSubstr("DCGM_FI_DEV_GPU_UTIL{"));
  EXPECT_THAT(t, Not(HasSubstr("DCGM_FI_PROF_GR_ENGINE_ACTIVE")));
  EXPECT_THAT(t, Not(HasSubstr("DCGM_FI_PROF_SM_ACTIVE")));
}

// After ConfigureMalloc, threads allocating at the same time share at most 2 arenas (glibc's
// default would give each of them its own, up to 8 per core). Run in a child process: arenas are
// never freed, so the test binary's earlier threads must not count.
TEST(Memory, MallocArenasStayAtTwo) {
  if (getenv("MALLOC_ARENA_MAX")) GTEST_SKIP() << "MALLOC_ARENA_MAX set by the environment";
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer replaces glibc's malloc (no arenas, mallopt is a no-op)";
#endif
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int before = sim::MallocArenas();
    if (ConfigureMalloc() != 2) _exit(10);
    constexpr int kThreads = 6;
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&] {
        void* p = malloc(4096);  // held until every thread has allocated
        ready.fetch_add(1);
        while (ready.load() < kThreads) std::this_thread::yield();
        free(p);
      });
    }
    for (std::thread& t : threads) t.join();
    const int after = sim::MallocArenas();
    _exit(after <= std::max(before, 2) ? 0 : 20 + std::min(after - before, 9));
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "exit 10: mallopt refused; 2x: x new arenas";
}

}  // namespace
}  // namespace gpulet::metrics
