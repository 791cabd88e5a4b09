// NVLink traffic counters end to end through the production path: the fake libnvidia-ml.so.1
// (dlopen, nvmlDeviceGetFieldValues with NVLink throughput field IDs) -> GpuLayer -> Sampler ->
// exposition. Expected values are derived from the machine file and the injected counter values,
// never read back from the code under test.
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "fake_nvml/fault_cli.h"
#include "gmock/gmock.h"
#include "gpu/open.h"
#include "gtest/gtest.h"
#include "metrics/sampler.h"
#include "testing/common/fake_clock.h"
#include "tests/metrics/sim_node.h"

namespace gpulet::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// dgx-h100.yaml's defaults: nvlink_tx_kib / nvlink_rx_kib.
constexpr uint64_t kProfileTxKib = 73400320, kProfileRxKib = 71303168;

class NvlinkTest : public testing_metrics::SimNodeTest {};

// The GPU layer reads the NVLink data counters (sum over links) through nvmlDeviceGetFieldValues;
// a board without NVLink leaves them unset instead of reporting 0.
TEST_F(NvlinkTest, GpuLayerReadsCountersThroughNvml) {
  Open("dgx-h100");
  auto t = layer_->GetTelemetry(0);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nvlink_tx_kib, kProfileTxKib);
  EXPECT_EQ(t->nvlink_rx_kib, kProfileRxKib);
  EXPECT_TRUE(t->memory_temp_c.has_value()) << "same field-values call still reads HBM temp";
  ASSERT_EQ(Set(3, "nvlink_tx_kib=12345"), 0);
  EXPECT_EQ(layer_->GetTelemetry(3)->nvlink_tx_kib, 12345u);
  layer_.reset();
  Open("pcie-t4");
  t = layer_->GetTelemetry(0);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->nvlink_tx_kib.has_value());
  EXPECT_FALSE(t->nvlink_rx_kib.has_value());
}

// Exported as gpulet counters (bytes), DCGM's BANDWIDTH_TOTAL (KiB, tx + rx) and DCGM's
// PROF_NVLINK_*_BYTES rates (growth between two cycles over the cycle's wall time); no rate on
// the first cycle or after a counter reset, and nothing at all without NVLink.
TEST_F(NvlinkTest, ExportedAsCountersAndRates) {
  gpulet::testing::FakeClock clock;
  Open("dgx-h100");
  auto inv = layer_->GetInventory();
  ASSERT_TRUE(inv.ok());
  const std::string uuid0 = inv->devices[0].uuid;
  SamplerOptions so;
  so.hostname = "node1";
  Sampler sampler(layer_.get(), nullptr, nullptr, nullptr, &clock, so);
  sampler.SampleOnce();
  std::string t = sampler.snapshot()->text;
  std::string own = absl::StrCat("{gpu=\"0\",uuid=\"", uuid0, "\"} ");
  EXPECT_THAT(t, HasSubstr(absl::StrCat("gpulet_gpu_nvlink_transmit_bytes_total", own,
                                        kProfileTxKib * 1024, "\n")));
  EXPECT_THAT(t, HasSubstr(absl::StrCat("gpulet_gpu_nvlink_receive_bytes_total", own,
                                        kProfileRxKib * 1024, "\n")));
  EXPECT_THAT(t, HasSubstr("# TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL counter\n"));
  EXPECT_THAT(t, HasSubstr(absl::StrCat("pod=\"\"} ", kProfileTxKib + kProfileRxKib, "\n")));
  EXPECT_THAT(t, Not(HasSubstr("DCGM_FI_PROF_NVLINK_TX_BYTES{"))) << "no rate from one sample";

  // GPU 0 sends 2,048,000 KiB and receives 1,024,000 KiB in 2 s.
  ASSERT_EQ(Set(0, absl::StrCat("nvlink_tx_kib=", kProfileTxKib + 2048000)), 0);
  ASSERT_EQ(Set(0, absl::StrCat("nvlink_rx_kib=", kProfileRxKib + 1024000)), 0);
  clock.Advance(std::chrono::seconds(2));
  sampler.SampleOnce();
  t = sampler.snapshot()->text;
  std::string dcgm0 = absl::StrCat("{gpu=\"0\",UUID=\"", uuid0, "\"");
  auto line_of = [&](const std::string& family) {
    size_t at = t.find(family + dcgm0);
    if (at == std::string::npos) return std::string();
    return t.substr(at, t.find('\n', at) - at);
  };
  EXPECT_TRUE(absl::EndsWith(line_of("DCGM_FI_PROF_NVLINK_TX_BYTES"),
                             absl::StrCat("} ", 2048000ull * 1024 / 2)))
      << line_of("DCGM_FI_PROF_NVLINK_TX_BYTES");
  EXPECT_TRUE(absl::EndsWith(line_of("DCGM_FI_PROF_NVLINK_RX_BYTES"),
                             absl::StrCat("} ", 1024000ull * 1024 / 2)));
  std::string dcgm1 = absl::StrCat("{gpu=\"1\",UUID=\"", inv->devices[1].uuid, "\"");
  EXPECT_THAT(t, HasSubstr("DCGM_FI_PROF_NVLINK_TX_BYTES" + dcgm1)) << "idle GPU: rate 0";

  // Driver reload: the counter restarts lower; no negative or huge rate.
  ASSERT_EQ(Set(0, "nvlink_tx_kib=10"), 0);
  clock.Advance(std::chrono::seconds(2));
  sampler.SampleOnce();
  t = sampler.snapshot()->text;
  EXPECT_EQ(line_of("DCGM_FI_PROF_NVLINK_TX_BYTES"), "");
}

}  // namespace
}  // namespace gpulet::metrics
