// Interposer benchmarks (Google Benchmark). Method: the fake driver and libgpulet-vcuda.so are
// loaded into this process; each benchmark calls the same driver entry point once directly (the
// fake's) and once through the interposer's hook, so the difference of the two is the added cost
// per intercepted call. Allocation = one cuMemAlloc_v2 + cuMemFree_v2 pair of 4 KiB under a 1 TiB
// limit (reserve, record, release are all on the path); launch = cuLaunchKernel with no core
// limit (the unthrottled path). BM_Pacing runs the compute pacer on virtual time for each share
// and reports the achieved GPU-time share of 10 s windows as counters (share_min/share_max).
// Instruction counts (stable across machines): bench/vgpu/interposer/callgrind.sh.
#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "abi/vgpu_accounting.h"
#include "testing/vcuda/support.h"

namespace {

using namespace gpulet;
using namespace gpulet::testing_interposer;

struct Env {
  void* shim = nullptr;
  CUfunction fn = nullptr;
  CUstream stream = nullptr;
  Env() {
    std::string acct = ProcessTempDir() + "/vcuda-bench-" + std::to_string(getpid());
    unlink(acct.c_str());
    setenv("GPULET_VGPU_REAL_LIBCUDA", FakeCudaPath().c_str(), 1);
    setenv("GPULET_VGPU_ACCOUNTING", acct.c_str(), 1);
    setenv("GPULET_VGPU_MEMORY_LIMIT", std::to_string(1ull << 40).c_str(), 1);
    FakeCuda();
    shim = dlopen(ShimPath().c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!shim) {
      fprintf(stderr, "cannot load %s: %s\n", ShimPath().c_str(), dlerror());
      exit(1);
    }
    FakeSym<CUresult (*)(unsigned)>("cuInit")(0);
    CUcontext ctx;
    // Through the hook, as a program's runtime does: the interposer then measures the process
    // with NVML and the allocation path carries its reconciliation countdown.
    Hook<cuda::cuDevicePrimaryCtxRetain_t>("cuDevicePrimaryCtxRetain")(&ctx, 0);
    FakeSym<CUresult (*)(CUcontext)>("cuCtxSetCurrent")(ctx);
    FakeSym<CUresult (*)(CUfunction*, CUmodule, const char*)>("cuModuleGetFunction")(&fn, nullptr,
                                                                                     "k");
    FakeSym<CUresult (*)(CUstream*, unsigned)>("cuStreamCreate")(&stream, 0);
    unlink(acct.c_str());
  }
  template <class T>
  T Hook(const char* name) {
    return reinterpret_cast<T>(dlsym(shim, name));
  }
};
Env& E() {
  static Env* e = new Env();
  return *e;
}

void BM_AllocFree(benchmark::State& state, bool interposed) {
  E();  // context current on this thread
  auto alloc = interposed ? E().Hook<cuda::cuMemAlloc_t>("cuMemAlloc_v2")
                          : FakeSym<cuda::cuMemAlloc_t>("cuMemAlloc_v2");
  auto free_fn = interposed ? E().Hook<cuda::cuMemFree_t>("cuMemFree_v2")
                            : FakeSym<cuda::cuMemFree_t>("cuMemFree_v2");
  for (auto _ : state) {
    CUdeviceptr p;
    if (alloc(&p, 4096) != CUDA_SUCCESS || free_fn(p) != CUDA_SUCCESS) state.SkipWithError("alloc");
  }
}
BENCHMARK_CAPTURE(BM_AllocFree, direct, false);
BENCHMARK_CAPTURE(BM_AllocFree, interposed, true);

void BM_Launch(benchmark::State& state, bool interposed) {
  E();
  auto launch = interposed ? E().Hook<cuda::cuLaunchKernel_t>("cuLaunchKernel")
                           : FakeSym<cuda::cuLaunchKernel_t>("cuLaunchKernel");
  // Kernels of one block (1 us on the fake's timeline); the timeline grows but nothing waits.
  for (auto _ : state) launch(E().fn, 1, 1, 1, 32, 1, 1, 0, E().stream, nullptr, nullptr);
}
BENCHMARK_CAPTURE(BM_Launch, direct, false);
BENCHMARK_CAPTURE(BM_Launch, interposed_unthrottled, true);

// A paced launch (limit 50 %) of 1 us kernels on the virtual clock, through the pacer as the
// shim calls it: the CPU cost of admission, sampling and (one launch in 8) the two event records,
// the idle-stream query and the harvest; against the same launches unpaced (limit 100).
void BM_LaunchPaced(benchmark::State& state) {
  auto region = std::make_unique<vgpu::AccountingRegion>();
  VirtualGpu gpu(static_cast<uint32_t>(state.range(0)), static_cast<uint32_t>(state.range(0)),
                 region.get());
  int n = 0;
  for (auto _ : state) {
    gpu.Launch(1);
    if (++n % 1024 == 0) gpu.sync(gpu.stream);
  }
}
BENCHMARK(BM_LaunchPaced)->Arg(100)->Arg(50);

// The accounting protocol alone: Reserve + Unreserve on a shared region (one process).
void BM_ReserveUnreserve(benchmark::State& state) {
  static vgpu::AccountingRegion region{};
  region.memory_limit.store(1ull << 40);
  uint64_t owner = vgpu::OwnerWord(getpid(), vgpu::ProcessStartTicks(getpid()));
  static int slot = vgpu::ClaimSlot(region, owner);
  for (auto _ : state) {
    benchmark::DoNotOptimize(vgpu::Reserve(region, slot, owner, 4096));
    vgpu::Unreserve(region, slot, 4096);
  }
}
BENCHMARK(BM_ReserveUnreserve);

// One pass of ReclaimDead, the slow path of a reservation over the limit, over N slots of live
// processes: a lock attempt on the file per slot (interposers before the locks read
// /proc/<pid>/stat per slot). The owners' locks are held through a second mapping of the file,
// an open file description of its own, as another process's would be; the owner word names a
// live process that is not this one (our parent).
void BM_ReclaimPass(benchmark::State& state) {
  std::string path = ProcessTempDir() + "/vcuda-bench-reclaim-" + std::to_string(getpid());
  unlink(path.c_str());
  const char* error = "";
  vgpu::AccountingRegion* others = vgpu::MapAccounting(path.c_str(), true, &error);
  vgpu::AccountingRegion* self = vgpu::MapAccounting(path.c_str(), true, &error);
  if (others == nullptr || self == nullptr) return state.SkipWithError(error);
  int parent = static_cast<int>(getppid());
  uint64_t live = vgpu::OwnerWord(parent, vgpu::ProcessStartTicks(parent));
  for (int64_t i = 0; i < state.range(0); ++i) vgpu::ClaimSlot(*others, live);
  uint64_t me = vgpu::OwnerWord(getpid(), vgpu::ProcessStartTicks(getpid()));
  for (auto _ : state) benchmark::DoNotOptimize(vgpu::ReclaimDead(*self, me));
}
BENCHMARK(BM_ReclaimPass)->Arg(16)->Unit(benchmark::kMicrosecond);

// Compute pacing accuracy: 30 simulated seconds of a greedy 1 ms-kernel workload at each share.
void BM_Pacing(benchmark::State& state) {
  uint32_t share = static_cast<uint32_t>(state.range(0));
  double lo = 100, hi = 0;
  for (auto _ : state) {
    auto region = std::make_unique<vgpu::AccountingRegion>();
    for (double s : RunGreedy(share, share, 30'000'000'000, 10'000'000'000, region.get()))
      lo = std::min(lo, s), hi = std::max(hi, s);
  }
  state.counters["share_min"] = lo;
  state.counters["share_max"] = hi;
}
BENCHMARK(BM_Pacing)->Arg(10)->Arg(30)->Arg(50)->Arg(90)->Iterations(1)->Unit(
    benchmark::kMillisecond);

// Share as a floor: limit/ceiling next to a neighbour keeping NEIGHBOUR % of the GPU busy
// (10 simulated s after 3 s of warm-up, in 5 s windows).
void BM_PacingNeighbour(benchmark::State& state) {
  auto limit = static_cast<uint32_t>(state.range(0));
  auto ceiling = static_cast<uint32_t>(state.range(1));
  double lo = 100, hi = 0;
  for (auto _ : state) {
    auto region = std::make_unique<vgpu::AccountingRegion>();
    for (double s : RunGreedy(limit, ceiling, 10'000'000'000, 5'000'000'000, region.get(),
                              3'000'000'000, static_cast<int>(state.range(2))))
      lo = std::min(lo, s), hi = std::max(hi, s);
  }
  state.counters["share_min"] = lo;
  state.counters["share_max"] = hi;
}
BENCHMARK(BM_PacingNeighbour)
    ->Args({30, 30, 50})
    ->Args({30, 60, 50})
    ->Args({30, 30, 70})
    ->Args({99, 99, 70})
    ->Args({10, 10, 90})
    ->Args({99, 99, 90})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// Shares as floors (issue 20.2): greedy containers, each paced by its own Core at its share, one
// thread each on the shared virtual clock, on the fake GPU that time-slices between contexts
// (2 ms slices); 10 simulated s after 3 s of warm-up. Counters: each tenant's percent of the GPU.
void BM_PacingTenants(benchmark::State& state, std::vector<uint32_t> shares) {
  std::vector<double> got;
  for (auto _ : state) {
    std::vector<TenantSpec> specs;
    for (uint32_t s : shares) specs.push_back({s, s});
    got = RunTenants(specs, 10'000'000'000, 3'000'000'000);
  }
  for (size_t i = 0; i < got.size(); ++i)
    state.counters[std::string("t") + std::to_string(i) + "_" + std::to_string(shares[i])] = got[i];
}
BENCHMARK_CAPTURE(BM_PacingTenants, 10_90, std::vector<uint32_t>{10, 90})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PacingTenants, 30_50, std::vector<uint32_t>{30, 50})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PacingTenants, 30_70, std::vector<uint32_t>{30, 70})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PacingTenants, 30_30_40, std::vector<uint32_t>{30, 30, 40})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
// Unpaced, for comparison: what time slicing alone gives (1/k each).
BENCHMARK_CAPTURE(BM_PacingTenants, unpaced_100_100, std::vector<uint32_t>{100, 100})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
