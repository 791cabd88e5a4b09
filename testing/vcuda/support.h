// Shared by the interposer tests and benchmarks: paths of the built artifacts, loading the fake
// driver and the interposer into this process, and a virtual clock shared with the fake.
#pragma once

#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <cstdint>
#include <string>

#include <time.h>

#include <memory>
#include <vector>

#include "vgpu/interposer/core.h"
#include "abi/cuda_abi.h"

namespace gpulet::testing_interposer {

// This process's own temporary directory (accounting files, fake-driver state, logs), created on
// first use under $TMPDIR and removed with everything in it when the process that created it
// exits normally; forked children (which share it) leave it alone. Tests used to leave their
// /tmp/vcuda-* files behind.
inline const std::string& ProcessTempDir() {
  struct Dir {
    std::string path;
    pid_t owner = getpid();
    Dir() {
      const char* tmp = getenv("TMPDIR");
      std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/vcuda-test-XXXXXX";
      if (mkdtemp(templ.data()) != nullptr) path = templ;
      else path = tmp && *tmp ? tmp : "/tmp";  // still usable: the files carry the pid
    }
    ~Dir() {
      if (getpid() != owner || path.find("/vcuda-test-") == std::string::npos) return;
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static Dir dir;
  return dir.path;
}

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

// One process on the fake driver's timeline, paced by a Core on the virtual clock: a context, a
// stream and a kernel of `blocks` x 1 us. Launch() goes through the pacer as the shim does.
struct VirtualGpu {
  std::unique_ptr<vcuda::Core> core = std::make_unique<vcuda::Core>();
  CUstream stream = nullptr;
  CUfunction f = nullptr;
  cuda::cuLaunchKernel_t launch = nullptr;
  CUresult (*sync)(CUstream) = nullptr;
  void (*set_clock)(int64_t (*)(), void (*)(int64_t)) = nullptr;
  bool ok = false;

  VirtualGpu(uint32_t limit, uint32_t ceiling, vgpu::AccountingRegion* region) {
    set_clock = FakeSym<void (*)(int64_t (*)(), void (*)(int64_t))>("fakecuda_set_clock");
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    // Virtual time only moves forward: the fake's device timeline remembers earlier runs.
    VirtualSleepUntil(ts.tv_sec * 1000000000LL + ts.tv_nsec + 1'000'000'000);
    set_clock(&VirtualNow, &VirtualSleepUntil);
    vcuda::RealDriver real;
    if (!vcuda::ResolveRealDriver(FakeCuda(), FakeCuda(), &dlsym, &real)) return;
    vcuda::Config config;
    config.core_limit = limit;
    config.core_ceiling = ceiling;
    FakeSym<CUresult (*)(unsigned)>("cuInit")(0);
    CUcontext ctx;
    FakeSym<cuda::cuDevicePrimaryCtxRetain_t>("cuDevicePrimaryCtxRetain")(&ctx, 0);
    FakeSym<CUresult (*)(CUcontext)>("cuCtxSetCurrent")(ctx);
    core->Init(real, config, region, vcuda::ClockFns{&VirtualNow, &VirtualSleepUntil});
    FakeSym<CUresult (*)(CUstream*, unsigned)>("cuStreamCreate")(&stream, 0);
    launch = FakeSym<cuda::cuLaunchKernel_t>("cuLaunchKernel");
    sync = FakeSym<CUresult (*)(CUstream)>("cuStreamSynchronize");
    using GetFunction = CUresult (*)(CUfunction*, CUmodule, const char*);
    FakeSym<GetFunction>("cuModuleGetFunction")(&f, nullptr, "k");
    ok = true;
  }
  ~VirtualGpu() {
    FakeSym<void (*)(int64_t, int64_t)>("fakecuda_set_host_costs")(0, 0);
    FakeSym<void (*)(int64_t)>("fakecuda_set_gpu_launch_cost")(0);
    set_clock(nullptr, nullptr);
  }
  CUresult Launch(unsigned blocks) {
    if (!core->pacing()) return launch(f, blocks, 1, 1, 128, 1, 1, 0, stream, nullptr, nullptr);
    int slot = core->BeforeLaunch(stream, false);
    CUresult r = launch(f, blocks, 1, 1, 128, 1, 1, 0, stream, nullptr, nullptr);
    core->AfterLaunch(slot, stream, false, r);
    return r;
  }
  // Percent of each `window_ns` window of [start, end) the device ran this process's work.
  static std::vector<double> Shares(int64_t start, int64_t end, int64_t window_ns) {
    auto busy = FakeSym<int64_t (*)(int64_t, int64_t)>("fakecuda_busy_between");
    std::vector<double> shares;
    for (int64_t t = start; t + window_ns <= end; t += window_ns)
      shares.push_back(100.0 * static_cast<double>(busy(t, t + window_ns)) /
                       static_cast<double>(window_ns));
    return shares;
  }
};

// A greedy workload (1 ms kernels, two in flight, then a sync) paced by a Core on the fake's
// timeline; returns the GPU-time share of each `window_ns` window over `total_ns`.
inline std::vector<double> RunGreedy(uint32_t limit, uint32_t ceiling, int64_t total_ns,
                                     int64_t window_ns, vgpu::AccountingRegion* region,
                                     int64_t warmup_ns = 0, int neighbour_percent = 0) {
  VirtualGpu gpu(limit, ceiling, region);
  if (!gpu.ok || !gpu.core->pacing()) return {};
  int64_t start = VirtualNow() + warmup_ns, end = start + total_ns;
  auto foreign = FakeSym<void (*)(int, int64_t)>("fakecuda_foreign_work");
  int64_t next_foreign = VirtualNow();
  for (int n = 0; VirtualNow() < end; ++n) {
    // A neighbour container's work: neighbour_percent of every 10 ms, on the same GPU.
    for (; neighbour_percent > 0 && next_foreign <= VirtualNow(); next_foreign += 10'000'000)
      foreign(0, neighbour_percent * 100'000);
    gpu.Launch(1000);  // 1 ms
    if (n % 2 == 1) gpu.sync(gpu.stream);
    VirtualSleepUntil(VirtualNow() + 2000);  // 2 us of host work per launch
  }
  return VirtualGpu::Shares(start, end, window_ns);
}

// `launches` kernels of `blocks` us each, `host_ns` of the program's own host work between
// launches, a sync every `sync_every` launches (0: only at the end), with a driver whose launch
// costs 4 us and event record 1 us of host time, and `gpu_launch_ns` of GPU-side front-end time
// before a kernel sent to an idle stream starts. Returns host ns per launch and the GPU share.
struct LoopResult {
  double ns_per_launch = 0, gpu_share = 0;
};
inline LoopResult RunLaunchLoop(uint32_t limit, unsigned blocks, int64_t host_ns, int launches,
                                int sync_every, vgpu::AccountingRegion* region,
                                int64_t gpu_launch_ns = 0) {
  VirtualGpu gpu(limit, limit, region);
  if (!gpu.ok) return {};
  FakeSym<void (*)(int64_t, int64_t)>("fakecuda_set_host_costs")(4000, 1000);
  FakeSym<void (*)(int64_t)>("fakecuda_set_gpu_launch_cost")(gpu_launch_ns);
  int64_t start = VirtualNow();
  for (int n = 1; n <= launches; ++n) {
    gpu.Launch(blocks);
    if (sync_every > 0 && n % sync_every == 0) gpu.sync(gpu.stream);
    VirtualSleepUntil(VirtualNow() + host_ns);
  }
  gpu.sync(gpu.stream);
  int64_t end = VirtualNow();
  LoopResult r;
  r.ns_per_launch = static_cast<double>(end - start) / launches;
  r.gpu_share = VirtualGpu::Shares(start, end, end - start)[0];
  return r;
}

}  // namespace gpulet::testing_interposer
