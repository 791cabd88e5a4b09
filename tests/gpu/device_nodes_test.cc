// The driver's device nodes as gpu/device_nodes.h names them: the mig-minors file as the driver
// writes it (other capability lines among the MIG ones, malformed lines skipped) and a MIG
// device's two capability keys.
#include "gpu/device_nodes.h"

#include "gtest/gtest.h"

namespace gpulet::gpu {
namespace {

TEST(DeviceNodes, MigMinorsAsTheDriverListsThem) {
  auto m = ParseMigMinors(
      "config 1\nmonitor 2\ngpu0/gi1/access 21\ngpu0/gi1/ci0/access 30\n"
      "gpu1/gi2/access notanumber\nbroken\n\n  gpu1/gi2/ci1/access   45  \n");
  EXPECT_EQ(m.size(), 5u);
  EXPECT_EQ(m.at("config"), 1);
  EXPECT_EQ(m.at("gpu0/gi1/access"), 21);
  EXPECT_EQ(m.at("gpu0/gi1/ci0/access"), 30);
  EXPECT_EQ(m.at("gpu1/gi2/ci1/access"), 45);
  EXPECT_EQ(m.count("gpu1/gi2/access"), 0u) << "a minor that is no number";
  EXPECT_TRUE(ParseMigMinors("").empty());
}

TEST(DeviceNodes, NamesOfAGpuAndItsMigCapabilities) {
  EXPECT_EQ(GpuNode(3), "/dev/nvidia3");
  auto keys = MigCapabilityKeys(1, 2, 0);
  EXPECT_EQ(keys[0], "gpu1/gi2/access");
  EXPECT_EQ(keys[1], "gpu1/gi2/ci0/access");
  EXPECT_EQ(CapabilityNode(21), "/dev/nvidia-caps/nvidia-cap21");
  EXPECT_EQ(std::string(kControlNodes[0]), "/dev/nvidiactl");
}

}  // namespace
}  // namespace gpulet::gpu
