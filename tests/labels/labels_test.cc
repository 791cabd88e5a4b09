// Unit tests of the GFD-compatible feature labels. Expected values follow gpu-feature-discovery's
// documented label set (reference/monitoring-toolkit.md section 5) for the machines we simulate.
#include "labels/labels.h"

#include <filesystem>
#include <regex>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/gpu/fake_gpu.h"
#include "testing/metrics/expo_util.h"

namespace gpulet::labels {
namespace {

using testing::FakeGpuLayer;

// A DGX H100: product sanitised, memory in MiB, driver and CUDA versions split, hopper family.
TEST(Labels, DgxH100) {
  FakeGpuLayer g(8);
  Labels l = GenerateLabels(*g.GetInventory(), LabelOptions{}, 1700000000);
  EXPECT_EQ(l["nvidia.com/gpu.present"], "true");
  EXPECT_EQ(l["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3");
  EXPECT_EQ(l["nvidia.com/gpu.memory"], "81559");
  EXPECT_EQ(l["nvidia.com/gpu.count"], "8");
  EXPECT_EQ(l["nvidia.com/gpu.family"], "hopper");
  EXPECT_EQ(l["nvidia.com/gpu.compute.major"], "9");
  EXPECT_EQ(l["nvidia.com/gpu.compute.minor"], "0");
  EXPECT_EQ(l["nvidia.com/cuda.driver-version.full"], "550.54.15");
  EXPECT_EQ(l["nvidia.com/cuda.driver-version.major"], "550");
  EXPECT_EQ(l["nvidia.com/cuda.driver-version.minor"], "54");
  EXPECT_EQ(l["nvidia.com/cuda.driver-version.revision"], "15");
  EXPECT_EQ(l["nvidia.com/cuda.driver.rev"], "15");
  EXPECT_EQ(l["nvidia.com/cuda.runtime-version.full"], "12.4");
  EXPECT_EQ(l["nvidia.com/cuda.runtime.major"], "12");
  EXPECT_EQ(l["nvidia.com/mig.capable"], "true");
  EXPECT_EQ(l.count("nvidia.com/mig.strategy"), 0u);
  EXPECT_EQ(l["nvidia.com/gpu.replicas"], "1");
  EXPECT_EQ(l["nvidia.com/gpu.sharing-strategy"], "none");
  EXPECT_EQ(l["nvidia.com/mps.capable"], "false");  // GFD's, without MPS sharing (tests/compat)
  EXPECT_EQ(l["nvidia.com/gfd.timestamp"], "1700000000");
}

// Time-slicing replicas mark the product -SHARED (GFD's resource_test example).
TEST(Labels, SharedProduct) {
  FakeGpuLayer g(2);
  LabelOptions o;
  o.replicas = 4;
  o.sharing_strategy = "time-slicing";
  o.timestamp = false;
  Labels l = GenerateLabels(*g.GetInventory(), o, 0);
  EXPECT_EQ(l["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3-SHARED");
  EXPECT_EQ(l["nvidia.com/gpu.replicas"], "4");
  EXPECT_EQ(l["nvidia.com/gpu.sharing-strategy"], "time-slicing");
  EXPECT_EQ(l["nvidia.com/mps.capable"], "false");
  EXPECT_EQ(l.count("nvidia.com/gfd.timestamp"), 0u);
  o.sharing_strategy = "mps";  // MPS sharing: capable when no GPU has MIG on (as GFD)
  EXPECT_EQ(GenerateLabels(*g.GetInventory(), o, 0)["nvidia.com/mps.capable"], "true");
}

// MIG mixed: full GPUs keep gpu.*, each profile gets nvidia.com/mig-<profile>.* ('+' -> '.'),
// engines, replicas and sharing strategy included; gpu.count counts the MIG-enabled GPU too
// (as GFD: physical GPUs of the product; issue 16, compat.labels).
TEST(Labels, MigMixed) {
  FakeGpuLayer g(2, /*mig_on_last=*/true);
  LabelOptions o;
  o.mig_strategy = "mixed";
  o.sharing_strategy = "time-slicing";
  o.replicas = 4;
  gpu::Inventory inv = *g.GetInventory();
  for (auto& m : inv.devices[1].mig_devices)
    if (m.profile == "3g.40gb") m.copy_engines = 3, m.decoders = 2, m.jpeg_engines = 1;
  Labels l = GenerateLabels(inv, o, 0);
  EXPECT_EQ(l["nvidia.com/mig.strategy"], "mixed");
  EXPECT_EQ(l["nvidia.com/gpu.count"], "2");
  EXPECT_EQ(l["nvidia.com/gpu.replicas"], "4");
  EXPECT_EQ(l["nvidia.com/mig-3g.40gb.replicas"], "1");
  EXPECT_EQ(l["nvidia.com/mig-3g.40gb.sharing-strategy"], "none");
  EXPECT_EQ(l["nvidia.com/mig-3g.40gb.engines.copy"], "3");
  EXPECT_EQ(l["nvidia.com/mig-3g.40gb.engines.decoder"], "2");
  EXPECT_EQ(l["nvidia.com/mig-3g.40gb.engines.encoder"], "0");
  EXPECT_EQ(l["nvidia.com/mig-3g.40gb.engines.jpeg"], "1");
  EXPECT_EQ(l["nvidia.com/mig-3g.40gb.engines.ofa"], "0");
  EXPECT_EQ(l["nvidia.com/mig-3g.40gb.count"], "1");
  EXPECT_EQ(l["nvidia.com/mig-3g.40gb.memory"], "40192");
  EXPECT_EQ(l["nvidia.com/mig-3g.40gb.multiprocessors"], "60");
  EXPECT_EQ(l["nvidia.com/mig-3g.40gb.slices.gi"], "3");
  EXPECT_EQ(l["nvidia.com/mig-1g.10gb.me.count"], "1");
  for (const auto& [k, v] : l) EXPECT_EQ(k.find('+'), std::string::npos) << k;
}

// MIG single needs every GPU in MIG mode with one profile; otherwise the product is -MIG-INVALID.
TEST(Labels, MigSingle) {
  FakeGpuLayer g(2, /*mig_on_last=*/true);
  LabelOptions o;
  o.mig_strategy = "single";
  Labels bad = GenerateLabels(*g.GetInventory(), o, 0);
  EXPECT_EQ(bad["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3-MIG-INVALID");
  EXPECT_EQ(bad["nvidia.com/gpu.count"], "0");

  gpu::Inventory inv = *g.GetInventory();
  inv.devices.erase(inv.devices.begin());                         // only the MIG GPU left
  inv.devices[0].mig_devices[1] = inv.devices[0].mig_devices[0];  // one profile
  Labels good = GenerateLabels(inv, o, 0);
  EXPECT_EQ(good["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb");
  EXPECT_EQ(good["nvidia.com/gpu.count"], "2");
  EXPECT_EQ(good["nvidia.com/gpu.memory"], "40192");
  EXPECT_EQ(good["nvidia.com/gpu.slices.gi"], "3");
  EXPECT_EQ(good["nvidia.com/gpu.engines.copy"], "0");
}

// Families by compute capability as GFD's getArchFamily.
TEST(Labels, FamilyByComputeCapability) {
  FakeGpuLayer g(1);
  gpu::Inventory inv = *g.GetInventory();
  std::pair<std::pair<int, int>, const char*> cases[] = {
      {{7, 0}, "volta"},      {{7, 5}, "turing"},       {{8, 0}, "ampere"},
      {{8, 6}, "ampere"},     {{8, 9}, "ada-lovelace"}, {{10, 0}, "blackwell"},
      {{12, 0}, "blackwell"}, {{4, 0}, "undefined"}};
  for (auto [cc, family] : cases) {
    inv.devices[0].cc_major = cc.first;
    inv.devices[0].cc_minor = cc.second;
    EXPECT_EQ(GenerateLabels(inv, {}, 0)["nvidia.com/gpu.family"], family);
  }
}

// Bad options are one clear error naming the flag.
TEST(Labels, RejectsBadOptions) {
  LabelOptions o;
  o.mig_strategy = "dual";
  EXPECT_THAT(std::string(ValidateOptions(o).message()), ::testing::HasSubstr("--mig-strategy"));
  o = {};
  o.replicas = 3;
  EXPECT_THAT(std::string(ValidateOptions(o).message()),
              ::testing::HasSubstr("--sharing-strategy"));
  o = {};
  o.sharing_strategy = "magic";
  EXPECT_FALSE(ValidateOptions(o).ok());
  EXPECT_TRUE(ValidateOptions({}).ok());
}

// Every value is one Kubernetes accepts: at most 63 characters, alphanumeric at both ends, only
// [A-Za-z0-9-_.] inside (a 179-character machine type from a binary file was written as is, and
// the API server refuses the whole node's labels for one such value).
TEST(Labels, ValuesAreValidKubernetesLabelValues) {
  std::string binary;
  for (int i = 0; i < 256; ++i) binary.push_back(static_cast<char>(i));
  binary += binary;
  for (const std::string& in : {binary, std::string(200, 'a'),
                                std::string("--.NVIDIA H100 80GB HBM3._-"), std::string("")}) {
    std::string v = SanitizeLabelValue(in);
    EXPECT_LE(v.size(), 63u) << v;
    EXPECT_TRUE(std::regex_match(v, std::regex("(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")))
        << v;
  }
  EXPECT_EQ(SanitizeLabelValue("--.NVIDIA H100 80GB HBM3._-"), "NVIDIA-H100-80GB-HBM3");
  EXPECT_EQ(SanitizeLabelValue(std::string(200, 'a')), std::string(63, 'a'));
  EXPECT_EQ(SanitizeLabelValue("NVIDIA A100-SXM4-40GB"), "NVIDIA-A100-SXM4-40GB");  // GFD's
}

// "-" is standard output, not a file named "-".
TEST(Labels, DashWritesToStandardOutput) {
  RootedFilesystem fs("/");
  ::testing::internal::CaptureStdout();
  absl::Status st = WriteFeatureFile(fs, "-", {{"nvidia.com/gpu.count", "8"}});
  std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(out, "nvidia.com/gpu.count=8\n");
  EXPECT_FALSE(std::filesystem::exists("-"));
}

// The feature file is key=value lines, created with its directory, replaced atomically (no
// temporary file left beside it).
TEST(Labels, WritesFeatureFileAtomically) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "gpulet-labels-XXXXXX").string();
  std::string dir = mkdtemp(tmpl.data());
  RootedFilesystem fs("/");
  std::string path = dir + "/features.d/gpulet";
  ASSERT_TRUE(WriteFeatureFile(fs, path,
                               {{"nvidia.com/gpu.count", "8"}, {"nvidia.com/gpu.present", "true"}})
                  .ok());
  EXPECT_EQ(testing_metrics::ReadFileOrEmpty(path),
            "nvidia.com/gpu.count=8\nnvidia.com/gpu.present=true\n");
  ASSERT_TRUE(WriteFeatureFile(fs, path, {{"nvidia.com/gpu.count", "7"}}).ok());
  EXPECT_EQ(testing_metrics::ReadFileOrEmpty(path), "nvidia.com/gpu.count=7\n");
  int entries = 0;
  for (auto& e : std::filesystem::directory_iterator(dir + "/features.d")) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gpulet::labels
