// vcuda_probe: a CUDA driver-API program linked against libcuda.so.1 by name, run by the
// end-to-end tests and benchmarks with LD_PRELOAD=libgpulet-vcuda.so over the fake driver, and
// by hand on a GPU host over the real one (it is built without a run path, so the libcuda.so.1
// found at run time is the host's; NVML and the fake's test hooks are looked up with dlsym, so
// nothing else binds it to the fake). Modes:
//   fill CHUNK            print "ready", wait for a byte on stdin, cuMemAlloc_v2 CHUNK until it
//                         fails, print "held BYTES", wait for EOF on stdin, exit without freeing
//   churn CHUNK N         N rounds (N<0: forever) of allocate, keep at most 8, free; "done OK"
//   info                  cuMemGetInfo_v2 / cuDeviceTotalMem_v2 / nvmlDeviceGetMemoryInfo lines
//   device ORDINAL CHUNK  allocate on that ordinal until it fails; "held BYTES"
//   limit CHUNK           "meminfo FREE TOTAL" before, cuMemAlloc_v2 CHUNK until the first
//                         failure: "held BYTES", "refused RESULT" (its CUresult, no retry), and
//                         "meminfo_full FREE TOTAL" after (a container's exact limit, cluster.dra)
//   greedy SECONDS        1 ms kernels back to back; prints the GPU-time share of each second
//   legacy SECONDS KIND   the same with a legacy launch of one block (KIND: launch = cuLaunch,
//                         grid = cuLaunchGrid, async = cuLaunchGridAsync); 1 ms per block with
//                         FAKE_CUDA_NS_PER_BLOCK=1000000
//   exec CHUNK            cuMemAlloc_v2 CHUNK ("pre RESULT"), then exec itself as "hold 1 CHUNK"
//                         without freeing (the new image starts the interposer afresh)
//   alloc-loop N | launch-loop N   N alloc+free pairs / launches (for callgrind)
// and, written for the real driver as well (machine-readable "key value..." lines):
//   ctxfill CHUNK         print "ready", wait for a byte on stdin, then retain the primary context
//                         ("context RESULT"), load a module, allocate CHUNK until refused
//                         ("held BYTES", "meminfo FREE TOTAL" as the program sees them), and
//                         print NVML's view: "nvml_self PID BYTES" (this process's entry, found
//                         as getpid() or else as the only entry; "nvml_self none" otherwise),
//                         "nvml_procs N SUM" (every process on the GPU); wait for EOF on stdin
//   latency N             N launches of an empty kernel (hand-written PTX, cuModuleLoadData),
//                         then a sync: "launch_us AVG" per launch, host wall time
//   busy SECONDS USEC     kernels that spin USEC us on %globaltimer, two in flight, for SECONDS:
//                         "busy_share PERCENT" = kernels x USEC / wall (the GPU time it got)
//   workcal USEC          alone: how many iterations of the fixed-work kernel take USEC us
//                         ("iters N"); on the fake 1 iteration = 1 us
//   work SECONDS ITERS    fixed-work kernels (ITERS volatile shared-memory loads in one thread,
//                         so their duration is the SM time they get, not wall time as with
//                         %globaltimer), two in flight, for SECONDS: "kernels K", "rate R" per
//                         second; rate / rate alone = the share of the GPU it got
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "abi/cuda_abi.h"

extern "C" {
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext*, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr*, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t*, size_t*);
CUresult cuDeviceTotalMem_v2(size_t*, CUdevice);
CUresult cuModuleGetFunction(CUfunction*, CUmodule, const char*);
CUresult cuModuleLoadData(CUmodule*, const void*);
CUresult cuCtxSynchronize();
CUresult cuStreamCreate(CUstream*, unsigned);
CUresult cuStreamSynchronize(CUstream);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void**, void**);
CUresult cuFuncSetBlockShape(CUfunction, int, int, int);
CUresult cuLaunch(CUfunction);
CUresult cuLaunchGrid(CUfunction, int, int);
CUresult cuLaunchGridAsync(CUfunction, int, int, CUstream);
}

namespace {

// NVML and the fake driver's hooks by name: the real libcuda.so.1 defines neither.
template <class T>
T Sym(const char* name) {
  static void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
  void* p = dlsym(RTLD_DEFAULT, name);  // the preloaded interposer's hook first, like a program
  if (p == nullptr && nvml != nullptr) p = dlsym(nvml, name);
  return reinterpret_cast<T>(p);
}
bool OnFake() { return Sym<void*>("fakecuda_set_clock") != nullptr; }

// Hand-written PTX (no nvcc): an empty kernel, and one that spins until %globaltimer has moved
// `ns` nanoseconds. PTX 8.0 for sm_75 and newer; the driver compiles it for the GPU it runs on.
const char kPtx[] = R"(.version 8.0
.target sm_75
.address_size 64
.visible .entry gpulet_empty()
{
  ret;
}
.shared .align 4 .u32 gpulet_sink;
.visible .entry gpulet_work(.param .u64 n)
{
  .reg .pred %p;
  .reg .b64 %rd<3>;
  .reg .b32 %r<2>;
  ld.param.u64 %rd1, [n];
  mov.u64 %rd2, 0;
WORK:
  ld.volatile.shared.u32 %r1, [gpulet_sink];
  add.u64 %rd2, %rd2, 1;
  setp.lt.u64 %p, %rd2, %rd1;
  @%p bra WORK;
  ret;
}
.visible .entry gpulet_spin(.param .u64 ns)
{
  .reg .pred %p;
  .reg .b64 %rd<5>;
  ld.param.u64 %rd1, [ns];
  mov.u64 %rd2, %globaltimer;
SPIN:
  mov.u64 %rd3, %globaltimer;
  sub.u64 %rd4, %rd3, %rd2;
  setp.lt.u64 %p, %rd4, %rd1;
  @%p bra SPIN;
  ret;
}
)";

CUfunction Kernel(const char* name) {
  static CUmodule module = nullptr;
  if (module == nullptr) {
    CUresult r = cuModuleLoadData(&module, kPtx);
    if (r != CUDA_SUCCESS) {
      fprintf(stderr, "probe: cuModuleLoadData failed: %d\n", r);
      return nullptr;
    }
  }
  CUfunction f = nullptr;
  if (cuModuleGetFunction(&f, module, name) != CUDA_SUCCESS) return nullptr;
  return f;
}

// This process's entry in NVML's list of GPU 0 (getpid(), else the only entry), and the sum of
// every entry.
void PrintNvml() {
  using Init = nvmlReturn_t (*)();
  using Handle = nvmlReturn_t (*)(unsigned, nvmlDevice_t*);
  using List = nvmlReturn_t (*)(nvmlDevice_t, unsigned*, nvmlProcessInfo_t*);
  auto init = Sym<Init>("nvmlInit_v2");
  auto handle = Sym<Handle>("nvmlDeviceGetHandleByIndex_v2");
  auto list = Sym<List>("nvmlDeviceGetComputeRunningProcesses_v3");
  nvmlDevice_t d;
  nvmlProcessInfo_t infos[256];
  unsigned n = 256;
  if (!init || !handle || !list || init() != NVML_SUCCESS || handle(0, &d) != NVML_SUCCESS ||
      list(d, &n, infos) != NVML_SUCCESS) {
    printf("nvml_self none\nnvml_procs -1 0\n");
    return;
  }
  unsigned long long sum = 0;
  int self = -1;
  for (unsigned i = 0; i < n; ++i) {
    sum += infos[i].usedGpuMemory;
    if (infos[i].pid == static_cast<unsigned>(getpid())) self = static_cast<int>(i);
  }
  if (self < 0 && n == 1) self = 0;
  if (self >= 0)
    printf("nvml_self %u %llu\n", infos[self].pid, infos[self].usedGpuMemory);
  else
    printf("nvml_self none\n");
  printf("nvml_procs %u %llu\n", n, sum);
}

int Context(int ordinal) {
  CUcontext ctx;
  if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, ordinal) != CUDA_SUCCESS) {
    fprintf(stderr, "probe: no context on device %d\n", ordinal);
    return 1;
  }
  cuCtxSetCurrent(ctx);
  return 0;
}

uint64_t Fill(size_t chunk) {
  uint64_t held = 0;
  for (int fails = 0; fails < 3;) {
    CUdeviceptr p;
    CUresult r = cuMemAlloc_v2(&p, chunk);
    if (r == CUDA_SUCCESS) {
      held += chunk;
    } else if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      ++fails;       // may be transient while other processes' reservations are in flight:
      usleep(2000);  // let them settle before concluding that the container is full
    } else {
      return held;
    }
  }
  return held;
}

int64_t Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr,
            "usage: vcuda_probe "
            "fill|hold|churn|info|device|limit|greedy|legacy|exec|alloc-loop|launch-loop|"
            "ctxfill|latency|busy|workcal|work ...\n");
    return 2;
  }
  setvbuf(stdout, nullptr, _IONBF, 0);
  std::string mode = argv[1];
  auto arg = [&](int i) { return i < argc ? strtoll(argv[i], nullptr, 10) : 0; };
  if (mode == "ctxfill") {
    printf("ready\n");
    char c;
    if (read(0, &c, 1) != 1) return 1;
    CUcontext ctx;
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&ctx, 0);
    printf("context %d\n", r);
    uint64_t held = 0;
    if (r == CUDA_SUCCESS) {
      cuCtxSetCurrent(ctx);
      // Module code is device memory no allocation call shows, as a program's kernels are.
      printf("module %d\n", Kernel("gpulet_empty") != nullptr ? 0 : 1);
      held = Fill(static_cast<size_t>(arg(2)));
      size_t free_b = 0, total = 0;
      cuMemGetInfo_v2(&free_b, &total);
      printf("meminfo %zu %zu\n", free_b, total);
    }
    printf("held %llu\n", static_cast<unsigned long long>(held));
    PrintNvml();
    while (read(0, &c, 1) > 0) {
    }
    return 0;
  }
  if (mode == "device") {
    if (Context(static_cast<int>(arg(2)))) return 1;
    printf("held %llu\n", static_cast<unsigned long long>(Fill(static_cast<size_t>(arg(3)))));
    return 0;
  }
  if (Context(0)) return 1;
  if (mode == "hold") {  // hold COUNT CHUNK: allocate COUNT chunks (fewer if refused), keep them
    printf("ready\n");
    char c;
    if (read(0, &c, 1) != 1) return 1;
    uint64_t held = 0;
    for (long long i = 0; i < arg(2); ++i) {
      CUdeviceptr p;
      if (cuMemAlloc_v2(&p, static_cast<size_t>(arg(3))) != CUDA_SUCCESS) break;
      held += static_cast<uint64_t>(arg(3));
    }
    printf("held %llu\n", static_cast<unsigned long long>(held));
    while (read(0, &c, 1) > 0) {
    }
    return 0;
  }
  if (mode == "fill") {
    printf("ready\n");
    char c;
    if (read(0, &c, 1) != 1) return 1;
    printf("held %llu\n", static_cast<unsigned long long>(Fill(static_cast<size_t>(arg(2)))));
    while (read(0, &c, 1) > 0) {
    }
    return 0;
  }
  if (mode == "limit") {
    size_t free_b = 0, total = 0, chunk = static_cast<size_t>(arg(2));
    cuMemGetInfo_v2(&free_b, &total);
    printf("meminfo %zu %zu\n", free_b, total);
    uint64_t held = 0;
    CUresult r = CUDA_SUCCESS;
    for (CUdeviceptr p; chunk > 0 && (r = cuMemAlloc_v2(&p, chunk)) == CUDA_SUCCESS;) held += chunk;
    printf("held %llu\nrefused %d\n", static_cast<unsigned long long>(held), r);
    cuMemGetInfo_v2(&free_b, &total);
    printf("meminfo_full %zu %zu\n", free_b, total);
    return 0;
  }
  if (mode == "churn") {
    size_t chunk = static_cast<size_t>(arg(2));
    long long rounds = arg(3), ok = 0;
    std::vector<CUdeviceptr> held;
    for (long long i = 0; rounds < 0 || i < rounds; ++i) {
      CUdeviceptr p;
      if (cuMemAlloc_v2(&p, chunk + static_cast<size_t>(i % 7) * 4096) == CUDA_SUCCESS) {
        held.push_back(p);
        ++ok;
      }
      if (held.size() > 8) {
        if (cuMemFree_v2(held.front()) != CUDA_SUCCESS) return 3;
        held.erase(held.begin());
      }
    }
    for (CUdeviceptr p : held) cuMemFree_v2(p);
    printf("done %lld\n", ok);
    return 0;
  }
  if (mode == "info") {
    size_t free_b = 0, total = 0, dev_total = 0;
    cuMemGetInfo_v2(&free_b, &total);
    cuDeviceTotalMem_v2(&dev_total, 0);
    nvmlDevice_t d = nullptr;
    nvmlMemory_t m{};
    auto init = Sym<nvmlReturn_t (*)()>("nvmlInit_v2");
    auto handle = Sym<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>("nvmlDeviceGetHandleByIndex_v2");
    auto info = Sym<nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*)>("nvmlDeviceGetMemoryInfo");
    if (init && handle && info && init() == NVML_SUCCESS && handle(0, &d) == NVML_SUCCESS)
      info(d, &m);
    printf("meminfo %zu %zu\ntotalmem %zu\nnvml %llu %llu %llu\n", free_b, total, dev_total,
           m.total, m.used, m.free);
    return 0;
  }
  if (mode == "exec") {
    CUdeviceptr p;
    printf("pre %d\n", cuMemAlloc_v2(&p, static_cast<size_t>(arg(2))));
    std::string chunk = std::to_string(arg(2));
    char hold[] = "hold", one[] = "1";
    char* args[] = {argv[0], hold, one, chunk.data(), nullptr};
    execv("/proc/self/exe", args);
    return 4;
  }
  if (mode == "greedy" || mode == "launch-loop" || mode == "legacy") {
    CUfunction f;
    CUstream s;
    cuModuleGetFunction(&f, nullptr, "k");
    cuStreamCreate(&s, 0);
    if (mode == "legacy") {
      std::string kind = argc > 3 ? argv[3] : "";
      cuFuncSetBlockShape(f, 128, 1, 1);
      int64_t start = Now(), seconds = arg(2);
      for (int n = 0; Now() < start + seconds * 1000000000; ++n) {
        CUresult r = kind == "launch" ? cuLaunch(f)
                     : kind == "grid" ? cuLaunchGrid(f, 1, 1)
                                      : cuLaunchGridAsync(f, 1, 1, s);
        if (r != CUDA_SUCCESS) return 3;
        if (n % 2) cuStreamSynchronize(s);
      }
      cuStreamSynchronize(s);
      auto busy = Sym<int64_t (*)(int64_t, int64_t)>("fakecuda_busy_between");
      if (busy == nullptr) return 1;  // the fake's timeline only
      for (int64_t i = 0; i < seconds; ++i) {
        int64_t t = start + i * 1000000000;
        printf("share %.2f\n", 100.0 * static_cast<double>(busy(t, t + 1000000000)) / 1e9);
      }
      return 0;
    }
    if (mode == "launch-loop") {
      for (long long i = 0; i < arg(2); ++i)
        cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, nullptr, nullptr);
      return 0;
    }
    int64_t start = Now(), seconds = arg(2);
    for (int n = 0; Now() < start + seconds * 1000000000; ++n) {
      cuLaunchKernel(f, 1000, 1, 1, 128, 1, 1, 0, s, nullptr, nullptr);  // 1 ms on the fake
      if (n % 2) cuStreamSynchronize(s);
    }
    cuStreamSynchronize(s);
    for (int64_t i = 0; i < seconds; ++i) {
      int64_t t = start + i * 1000000000;
      auto busy = Sym<int64_t (*)(int64_t, int64_t)>("fakecuda_busy_between");
      if (busy == nullptr) return 1;  // the fake's timeline only
      printf("share %.2f\n", 100.0 * static_cast<double>(busy(t, t + 1000000000)) / 1e9);
    }
    return 0;
  }
  if (mode == "latency" || mode == "busy") {
    CUfunction empty = Kernel("gpulet_empty"), spin = Kernel("gpulet_spin");
    CUstream s;
    if (empty == nullptr || spin == nullptr || cuStreamCreate(&s, 0) != CUDA_SUCCESS) return 1;
    if (mode == "latency") {
      long long n = arg(2) > 0 ? arg(2) : 10000;
      for (int i = 0; i < 100; ++i) cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, s, nullptr, nullptr);
      cuStreamSynchronize(s);  // warm: module loaded, first-launch costs paid
      int64_t t0 = Now();
      for (long long i = 0; i < n; ++i) {
        if (cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, s, nullptr, nullptr) != CUDA_SUCCESS)
          return 3;
      }
      cuStreamSynchronize(s);
      printf("launch_us %.3f\n", static_cast<double>(Now() - t0) / 1e3 / static_cast<double>(n));
      return 0;
    }
    int64_t seconds = arg(2), usec = arg(3) > 0 ? arg(3) : 1000;
    unsigned long long ns = static_cast<unsigned long long>(usec) * 1000;
    void* params[] = {&ns};
    // One block spins for USEC on a real GPU; the fake runs a launch for grid x 1 us instead.
    unsigned grid = OnFake() ? static_cast<unsigned>(usec) : 1;
    int64_t t0 = Now();
    long long kernels = 0;
    while (Now() < t0 + seconds * 1000000000) {
      if (cuLaunchKernel(spin, grid, 1, 1, 1, 1, 1, 0, s, params, nullptr) != CUDA_SUCCESS)
        return 3;
      if (++kernels % 2 == 0) cuStreamSynchronize(s);
    }
    cuStreamSynchronize(s);
    double wall = static_cast<double>(Now() - t0);
    printf("kernels %lld\nbusy_share %.2f\n", kernels,
           100.0 * static_cast<double>(kernels) * static_cast<double>(ns) / wall);
    return 0;
  }
  if (mode == "workcal" || mode == "work") {
    CUfunction work = Kernel("gpulet_work");
    CUstream s;
    if (work == nullptr || cuStreamCreate(&s, 0) != CUDA_SUCCESS) return 1;
    // The fake runs a launch for grid x 1 us: one "iteration" is one block there.
    auto launch = [&](unsigned long long iters) {
      void* params[] = {&iters};
      unsigned grid = OnFake() ? static_cast<unsigned>(iters) : 1;
      return cuLaunchKernel(work, grid, 1, 1, 1, 1, 1, 0, s, OnFake() ? nullptr : params, nullptr);
    };
    if (mode == "workcal") {
      int64_t usec = arg(2) > 0 ? arg(2) : 1000;
      if (OnFake()) {
        printf("iters %lld\n", static_cast<long long>(usec));
        return 0;
      }
      unsigned long long n = 20000;
      for (;;) {  // grow until one kernel takes >= 20 ms, then scale (launch cost negligible)
        launch(n);
        cuStreamSynchronize(s);
        int64_t t0 = Now();
        for (int i = 0; i < 5; ++i) launch(n);
        if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 3;
        int64_t each = (Now() - t0) / 5;
        if (each >= 20'000'000 || n > (1ull << 40)) {
          printf("iters %llu\n", static_cast<unsigned long long>(static_cast<double>(n) *
                                                                 static_cast<double>(usec) * 1e3 /
                                                                 static_cast<double>(each)));
          return 0;
        }
        n *= 4;
      }
    }
    int64_t seconds = arg(2);
    unsigned long long iters = static_cast<unsigned long long>(arg(3) > 0 ? arg(3) : 1000);
    int64_t t0 = Now();
    long long kernels = 0;
    while (Now() < t0 + seconds * 1000000000) {
      if (launch(iters) != CUDA_SUCCESS) return 3;
      if (++kernels % 2 == 0) cuStreamSynchronize(s);
    }
    cuStreamSynchronize(s);
    double wall = static_cast<double>(Now() - t0);
    printf("kernels %lld\nrate %.3f\n", kernels, static_cast<double>(kernels) * 1e9 / wall);
    return 0;
  }
  if (mode == "alloc-loop") {
    for (long long i = 0; i < arg(2); ++i) {
      CUdeviceptr p;
      if (cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS) cuMemFree_v2(p);
    }
    return 0;
  }
  fprintf(stderr, "vcuda_probe: unknown mode \"%s\"\n", mode.c_str());
  return 2;
}
