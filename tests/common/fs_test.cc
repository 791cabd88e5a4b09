// JoinRoot, the one lexical join of a root and a path, and RootedFilesystem reading through it.
#include "common/fs.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace gpulet {
namespace {

TEST(JoinRoot, RootsAndPaths) {
  EXPECT_EQ(JoinRoot("/", "/dev/nvidia0"), "/dev/nvidia0");
  EXPECT_EQ(JoinRoot("", "/dev/nvidia0"), "/dev/nvidia0");
  EXPECT_EQ(JoinRoot("/sim", "/dev/nvidia0"), "/sim/dev/nvidia0");
  EXPECT_EQ(JoinRoot("/sim/", "/dev/nvidia0"), "/sim/dev/nvidia0");
  EXPECT_EQ(JoinRoot("/sim//", "/dev/nvidia0"), "/sim/dev/nvidia0");
  EXPECT_EQ(JoinRoot("/sim", "dev/nvidia0"), "/sim/dev/nvidia0") << "a relative path is rooted";
  EXPECT_EQ(JoinRoot("/run/nvidia/driver", "/"), "/run/nvidia/driver/");
  EXPECT_EQ(JoinRoot("/host", ""), "/host/");
}

TEST(RootedFilesystem, ReadsUnderItsRoot) {
  std::string root = ::testing::TempDir() + "/rooted-fs-test";
  std::filesystem::create_directories(root + "/proc");
  std::ofstream(root + "/proc/version") << "fake kernel\n";
  RootedFilesystem fs(root + "/");
  EXPECT_EQ(fs.Resolve("/proc/version"), root + "/proc/version");
  auto text = fs.ReadFile("/proc/version");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "fake kernel\n");
  EXPECT_FALSE(fs.Exists("/proc/missing"));
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace gpulet
