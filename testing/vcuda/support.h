// Shared by the interposer tests and benchmarks: paths of the built artifacts, loading the fake
// driver and the interposer into this process, and a virtual clock shared with the fake.
#pragma once

#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "abi/cuda_abi.h"
#include "vgpu/interposer/core.h"

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
      if (mkdtemp(templ.data()) != nullptr)
        path = templ;
      else
        path = tmp && *tmp ? tmp : "/tmp";  // still usable: the files carry the pid
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

// Several tenants on one virtual clock, one thread each: the clock moves only when every tenant
// thread sleeps, to the earliest wake-up, so no thread's sleep skips over another's work (a
// discrete-event simulation whose events are the threads' sleeps).
struct VirtualScheduler {
  std::mutex mu;
  std::condition_variable cv;
  int running = 0;  // tenant threads not asleep
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<int64_t>> wakes;
  void AdvanceLocked() {
    if (running > 0 || wakes.empty()) return;
    int64_t t = wakes.top();
    if (t > g_virtual_now.load()) g_virtual_now.store(t);
    while (!wakes.empty() && wakes.top() <= t) wakes.pop(), ++running;
    cv.notify_all();
  }
  void Sleep(int64_t t) {
    std::unique_lock<std::mutex> lock(mu);
    if (t <= g_virtual_now.load()) return;
    wakes.push(t);
    --running;
    AdvanceLocked();
    cv.wait(lock, [&] { return g_virtual_now.load() >= t; });
  }
  void Leave() {  // a tenant thread is done
    std::lock_guard<std::mutex> lock(mu);
    --running;
    AdvanceLocked();
  }
};
inline std::atomic<VirtualScheduler*> g_scheduler{nullptr};

inline void VirtualSleepUntil(int64_t t) {
  if (VirtualScheduler* s = g_scheduler.load()) return s->Sleep(t);
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
    set_clock = FakeSym<void (*)(int64_t(*)(), void (*)(int64_t))>("fakecuda_set_clock");
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
  // A neighbour above what the GPU leaves it has a backlog: not the next run's business.
  FakeSym<void (*)(int)>("fakecuda_drop_foreign_work")(0);
  return VirtualGpu::Shares(start, end, window_ns);
}

// Several containers sharing one GPU: each tenant is a context of its own (NVML pid 0x10000 + i),
// paced by its own Core and accounting region at limit/ceiling (limit 100: unpaced), running the
// greedy workload of RunGreedy (`blocks` us kernels, two in flight, then a sync; 2 us of host
// work per launch) in a thread of its own on the shared virtual clock. Returns each tenant's
// percent of the device in [start + warmup_ns, + total_ns).
struct TenantSpec {
  uint32_t limit, ceiling;
  unsigned blocks = 1000;
};
inline std::vector<double> RunTenants(const std::vector<TenantSpec>& specs, int64_t total_ns,
                                      int64_t warmup_ns) {
  auto set_clock = FakeSym<void (*)(int64_t(*)(), void (*)(int64_t))>("fakecuda_set_clock");
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  VirtualSleepUntil(ts.tv_sec * 1000000000LL + ts.tv_nsec + 1'000'000'000);
  set_clock(&VirtualNow, &VirtualSleepUntil);
  vcuda::RealDriver real;
  if (!vcuda::ResolveRealDriver(FakeCuda(), FakeCuda(), &dlsym, &real)) return {};
  FakeSym<CUresult (*)(unsigned)>("cuInit")(0);
  FakeSym<void (*)(int)>("fakecuda_drop_foreign_work")(0);  // only the tenants share the GPU
  using GetFunction = CUresult (*)(CUfunction*, CUmodule, const char*);
  struct Tenant {
    std::unique_ptr<vcuda::Core> core = std::make_unique<vcuda::Core>();
    std::unique_ptr<vgpu::AccountingRegion> region = std::make_unique<vgpu::AccountingRegion>();
    CUcontext ctx = nullptr;
    CUstream stream = nullptr;
    CUfunction f = nullptr;
  };
  std::vector<Tenant> tenants(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    Tenant& t = tenants[i];
    FakeSym<CUresult (*)(CUcontext*, unsigned, CUdevice)>("cuCtxCreate_v2")(&t.ctx, 0, 0);
    FakeSym<void (*)(CUcontext, unsigned)>("fakecuda_set_context_pid")(
        t.ctx, 0x10000 + static_cast<unsigned>(i));
    vcuda::Config config;
    config.core_limit = specs[i].limit;
    config.core_ceiling = specs[i].ceiling;
    t.core->Init(real, config, t.region.get(), vcuda::ClockFns{&VirtualNow, &VirtualSleepUntil});
    t.core->set_nvml_pid(0x10000 + static_cast<int>(i));
    FakeSym<CUresult (*)(CUstream*, unsigned)>("cuStreamCreate")(&t.stream, 0);
    FakeSym<GetFunction>("cuModuleGetFunction")(&t.f, nullptr, "k");
  }
  auto launch = FakeSym<cuda::cuLaunchKernel_t>("cuLaunchKernel");
  auto sync = FakeSym<CUresult (*)(CUstream)>("cuStreamSynchronize");
  auto set_current = FakeSym<CUresult (*)(CUcontext)>("cuCtxSetCurrent");
  int64_t start = VirtualNow() + warmup_ns, end = start + total_ns;
  VirtualScheduler sched;
  sched.running = static_cast<int>(specs.size());
  g_scheduler.store(&sched);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < specs.size(); ++i) {
    threads.emplace_back([&, i] {
      Tenant& t = tenants[i];
      set_current(t.ctx);
      for (int n = 0; VirtualNow() < end; ++n) {
        int slot = t.core->pacing() ? t.core->BeforeLaunch(t.stream, false) : -1;
        CUresult r = launch(t.f, specs[i].blocks, 1, 1, 128, 1, 1, 0, t.stream, nullptr, nullptr);
        if (t.core->pacing()) t.core->AfterLaunch(slot, t.stream, false, r);
        if (n % 2 == 1) sync(t.stream);
        VirtualSleepUntil(VirtualNow() + 2000);
      }
      sync(t.stream);
      sched.Leave();
    });
  }
  for (std::thread& th : threads) th.join();
  g_scheduler.store(nullptr);
  auto busy = FakeSym<int64_t (*)(CUcontext, int64_t, int64_t)>("fakecuda_context_busy_between");
  std::vector<double> shares;
  for (Tenant& t : tenants)
    shares.push_back(100.0 * static_cast<double>(busy(t.ctx, start, end)) /
                     static_cast<double>(total_ns));
  // The tenants' contexts hold device memory in this process's NVML entry: gone with them.
  for (Tenant& t : tenants) FakeSym<CUresult (*)(CUcontext)>("cuCtxDestroy_v2")(t.ctx);
  set_clock(nullptr, nullptr);
  return shares;
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
