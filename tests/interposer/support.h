// Shared by the interposer tests and benchmarks: paths of the built artifacts, loading the fake
// driver and the interposer into this process, and a virtual clock shared with the fake.
#pragma once

#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>

#include <time.h>

#include <memory>
#include <vector>

#include "vgpu/interposer/core.h"
#include "vgpu/interposer/cuda_abi.h"

namespace gpulet::testing_interposer {

inline std::string FakeCudaDir() { return std::string(GPULET_BINARY_DIR) + "/lib/fake_cuda"; }
inline std::string FakeCudaPath() { return FakeCudaDir() + "/libcuda.so.1"; }
inline std::string ShimPath() { return std::string(GPULET_BINARY_DIR) + "/lib/libgpulet-vcuda.so"; }

// The fake driver, loaded once per process (RTLD_GLOBAL so the shim's dlopen("libcuda.so.1")
// with GPULET_VGPU_REAL_LIBCUDA finds the same instance).
inline void* FakeCuda() {
  static void* h = dlopen(FakeCudaPath().c_str(), RTLD_NOW | RTLD_GLOBAL);
  return h;
}
template <class T>
T FakeSym(const char* name) {
  return reinterpret_cast<T>(dlsym(FakeCuda(), name));
}

// A virtual clock: sleeping advances it instantly, so simulated seconds cost microseconds.
inline std::atomic<int64_t> g_virtual_now{1'000'000'000};
inline int64_t VirtualNow() { return g_virtual_now.load(); }
inline void VirtualSleepUntil(int64_t t) {
  int64_t now = g_virtual_now.load();
  while (now < t && !g_virtual_now.compare_exchange_weak(now, t)) {
  }
}

// A greedy workload (1 ms kernels, two in flight, then a sync) paced by a Core on the fake's
// timeline; returns the GPU-time share of each `window_ns` window over `total_ns`.
inline std::vector<double> RunGreedy(uint32_t limit, uint32_t ceiling, int64_t total_ns,
                                     int64_t window_ns, vgpu::AccountingRegion* region,
                                     int64_t warmup_ns = 0, int neighbour_percent = 0) {
  auto set_clock = FakeSym<void (*)(int64_t (*)(), void (*)(int64_t))>("fakecuda_set_clock");
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  // Virtual time only moves forward: the fake's device timeline remembers earlier runs.
  VirtualSleepUntil(ts.tv_sec * 1000000000LL + ts.tv_nsec + 1'000'000'000);
  set_clock(&VirtualNow, &VirtualSleepUntil);
  vcuda::RealDriver real;
  if (!vcuda::ResolveRealDriver(FakeCuda(), FakeCuda(), &dlsym, &real)) return {};
  vcuda::Config config;
  config.core_limit = limit;
  config.core_ceiling = ceiling;
  auto core = std::make_unique<vcuda::Core>();
  FakeSym<CUresult (*)(unsigned)>("cuInit")(0);
  CUcontext ctx;
  FakeSym<cuda::cuDevicePrimaryCtxRetain_t>("cuDevicePrimaryCtxRetain")(&ctx, 0);
  FakeSym<CUresult (*)(CUcontext)>("cuCtxSetCurrent")(ctx);
  core->Init(real, config, region, vcuda::ClockFns{&VirtualNow, &VirtualSleepUntil});
  if (!core->pacing()) return {};
  CUstream stream;
  FakeSym<CUresult (*)(CUstream*, unsigned)>("cuStreamCreate")(&stream, 0);
  auto launch = FakeSym<cuda::cuLaunchKernel_t>("cuLaunchKernel");
  auto sync = FakeSym<CUresult (*)(CUstream)>("cuStreamSynchronize");
  CUfunction f;
  FakeSym<CUresult (*)(CUfunction*, CUmodule, const char*)>("cuModuleGetFunction")(&f, nullptr, "k");
  int64_t start = VirtualNow() + warmup_ns, end = start + total_ns;
  auto foreign = FakeSym<void (*)(int, int64_t)>("fakecuda_foreign_work");
  int64_t next_foreign = VirtualNow();
  for (int n = 0; VirtualNow() < end; ++n) {
    // A neighbour container's work: neighbour_percent of every 10 ms, on the same GPU.
    for (; neighbour_percent > 0 && next_foreign <= VirtualNow(); next_foreign += 10'000'000)
      foreign(0, neighbour_percent * 100'000);
    int slot = core->BeforeLaunch(stream, false);
    CUresult r = launch(f, 1000, 1, 1, 128, 1, 1, 0, stream, nullptr, nullptr);  // 1 ms
    core->AfterLaunch(slot, stream, false, r);
    if (n % 2 == 1) sync(stream);
    VirtualSleepUntil(VirtualNow() + 2000);  // 2 us of host work per launch
  }
  auto busy = FakeSym<int64_t (*)(int64_t, int64_t)>("fakecuda_busy_between");
  std::vector<double> shares;
  for (int64_t t = start; t + window_ns <= end; t += window_ns)
    shares.push_back(100.0 * static_cast<double>(busy(t, t + window_ns)) / static_cast<double>(window_ns));
  set_clock(nullptr, nullptr);
  return shares;
}

}  // namespace gpulet::testing_interposer
