// The GPU-layer conformance suite: properties every NVML must give through gpu::GpuLayer, real or
// simulated. Instantiated over the built-in profiles (sim_test.cc, label unit) and over the
// machine's real NVML (real_nvml_test.cc, label gpu; skipped without one).
#pragma once

#include <memory>
#include <string>

#include "gpu/open.h"
#include "gtest/gtest.h"

namespace gpulet::gpu::testing {

// The parameter: a built-in profile name, or "" for the real NVML.
class GpuLayerConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override;
  std::unique_ptr<GpuLayer> layer_;
  Inventory inv_;
};

}  // namespace gpulet::gpu::testing
