// The MIG index name "<gpu>:<mig>" (gpu/gpu.h): one spelling for the device plugin, CDI and the
// PodResources lookup.
#include <gtest/gtest.h>

#include "gpu/gpu.h"

namespace gpulet::gpu {
namespace {

// What MigIndexName builds ParseIndexName reads back; a plain index has no MIG part.
TEST(IndexName, BuildAndParse) {
  EXPECT_EQ(MigIndexName(3, 1), "3:1");
  auto n = ParseIndexName(MigIndexName(7, 12));
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->gpu, 7u);
  EXPECT_EQ(n->mig, 12u);
  n = ParseIndexName("5");
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->gpu, 5u);
  EXPECT_FALSE(n->mig.has_value());
}

// Anything but decimal indexes is no index name.
TEST(IndexName, RejectsNonIndexes) {
  for (const char* s : {"", "GPU-1234", "a:1", "1:b", "-1", "1:-2", "99999999999"}) {
    EXPECT_FALSE(ParseIndexName(s).has_value()) << s;
  }
}

}  // namespace
}  // namespace gpulet::gpu
