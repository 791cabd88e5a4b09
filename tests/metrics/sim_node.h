// A test fixture for a simulated node: a private sim root, the GPU layer opened on a built-in
// profile through the production dlopen path (fake libnvidia-ml.so.1), and `gpulet sim fault
// set` against that node.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fake_nvml/fault_cli.h"
#include "gpu/open.h"
#include "gtest/gtest.h"

namespace gpulet::testing_metrics {

class SimNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpulet-sim-node-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    layer_.reset();
    std::filesystem::remove_all(root_);
  }
  void Open(const std::string& profile) {
    gpu::GpuOptions o;
    o.simulate = profile;
    o.sim_root = root_;
    auto l = gpu::OpenGpuLayer(o);
    ASSERT_TRUE(l.ok()) << l.status();
    layer_ = *std::move(l);
  }
  // `gpulet sim fault set --gpu N --value KEY=V` against this node.
  int Set(int gpu, const std::string& kv) {
    std::vector<std::string> args = {"fault",   "set", "--gpu",      absl::StrCat(gpu),
                                     "--value", kv,    "--sim-root", root_};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return sim::RunFaultCommand(static_cast<int>(argv.size()), argv.data());
  }
  std::string root_;
  std::unique_ptr<gpu::GpuLayer> layer_;
};

}  // namespace gpulet::testing_metrics
