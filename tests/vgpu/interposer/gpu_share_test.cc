// On a real NVIDIA GPU (label `gpu`): compute shares as floors (issue 20.2). Greedy containers,
// each a vcuda_probe process with libgpulet-vcuda.so preloaded and an accounting file of its own,
// run fixed-work kernels side by side at shares that add up to at most 100 % of the GPU; each must
// get its share within 5 points. Method: the probe's `work` kernels do a fixed number of volatile
// shared-memory loads in one thread, so a kernel's duration is the SM time it gets (it is not
// power-limited: the clock stays the same alone and shared); `workcal` sizes them to 1 ms alone;
// a share is the probe's kernel rate beside the others divided by its rate alone, unlimited.
// Skipped, with the reason, where no real GPU is present (no libcuda.so.1, the fake driver, or
// cuInit / no device).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "testing/vcuda/support.h"

namespace gpulet {
namespace {

using namespace testing_interposer;

std::string Probe() { return std::string(GPULET_BINARY_DIR) + "/tests/vcuda_probe"; }

// Why this host cannot run the test, or "" if it has a real GPU.
std::string NoGpuReason() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return std::string("no libcuda.so.1 (") + dlerror() + ")";
  if (dlsym(h, "fakecuda_set_clock") != nullptr) return "libcuda.so.1 is the fake driver";
  auto init = reinterpret_cast<CUresult (*)(unsigned)>(dlsym(h, "cuInit"));
  auto count = reinterpret_cast<CUresult (*)(int*)>(dlsym(h, "cuDeviceGetCount"));
  int n = 0;
  if (init == nullptr || count == nullptr) return "libcuda.so.1 lacks cuInit";
  if (CUresult r = init(0); r != CUDA_SUCCESS) return "cuInit failed: " + std::to_string(r);
  if (count(&n) != CUDA_SUCCESS || n == 0) return "no CUDA device";
  return "";
}

// Starts a shell command; its stdout is read by Finish.
FILE* Start(const std::string& cmd) { return popen(cmd.c_str(), "r"); }
double Field(FILE* f, const char* key) {
  double v = -1;
  char line[256];
  while (fgets(line, sizeof line, f) != nullptr) {
    std::string l = line;
    if (l.rfind(std::string(key) + " ", 0) == 0) v = std::stod(l.substr(strlen(key) + 1));
  }
  pclose(f);
  return v;
}

std::string Env(uint32_t share, const std::string& acct) {
  return "env LD_PRELOAD=" + ShimPath() + " GPULET_VGPU_CORE_LIMIT=" + std::to_string(share) +
         " GPULET_VGPU_MEMORY_LIMIT=" + std::to_string(8ull << 30) +
         " GPULET_VGPU_ACCOUNTING=" + acct + " ";
}

TEST(GpuShares, EachShareHoldsBesideBusyNeighbours) {
  if (std::string why = NoGpuReason(); !why.empty()) GTEST_SKIP() << "skipped: " << why;
  ASSERT_EQ(access(Probe().c_str(), X_OK), 0) << Probe() << " not built";
  ASSERT_EQ(access(ShimPath().c_str(), R_OK), 0) << ShimPath() << " not built";
  double iters = Field(Start(Probe() + " workcal 1000"), "iters");
  ASSERT_GT(iters, 0) << "workcal failed";
  std::string it = std::to_string(static_cast<long long>(iters));
  constexpr int kSeconds = 8;
  double alone = Field(Start(Probe() + " work 4 " + it), "rate");
  ASSERT_GT(alone, 0) << "work failed";
  RecordProperty("rate_alone", std::to_string(alone));
  const std::vector<std::vector<uint32_t>> mixes = {{10, 90}, {30, 50}, {30, 30, 40}};
  for (const auto& mix : mixes) {
    std::vector<FILE*> running;
    std::string name;
    for (size_t i = 0; i < mix.size(); ++i) {
      std::string acct = ProcessTempDir() + "/gpu-share-" + std::to_string(i) + "-" +
                         std::to_string(mix[0]) + "-" + std::to_string(mix.size());
      unlink(acct.c_str());
      running.push_back(
          Start(Env(mix[i], acct) + Probe() + " work " + std::to_string(kSeconds) + " " + it));
      name += (name.empty() ? "" : "/") + std::to_string(mix[i]);
    }
    for (size_t i = 0; i < mix.size(); ++i) {
      double share = 100.0 * Field(running[i], "rate") / alone;
      printf("mix %s: share %u got %.1f %%\n", name.c_str(), mix[i], share);
      RecordProperty("mix_" + name + "_" + std::to_string(i), std::to_string(share));
      EXPECT_GE(share, mix[i] - 5.0) << "mix " << name << ", share " << mix[i];
      EXPECT_LE(share, mix[i] + 5.0) << "mix " << name << ", share " << mix[i];
    }
  }
}

}  // namespace
}  // namespace gpulet
