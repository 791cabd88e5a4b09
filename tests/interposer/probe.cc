// vcuda_probe: a CUDA driver-API program linked against libcuda.so.1 by name (here: the fake),
// run by the end-to-end tests and benchmarks with LD_PRELOAD=libgpulet-vcuda.so. Modes:
//   fill CHUNK            print "ready", wait for a byte on stdin, cuMemAlloc_v2 CHUNK until it
//                         fails, print "held BYTES", wait for EOF on stdin, exit without freeing
//   churn CHUNK N         N rounds (N<0: forever) of allocate, keep at most 8, free; "done OK"
//   info                  cuMemGetInfo_v2 / cuDeviceTotalMem_v2 / nvmlDeviceGetMemoryInfo lines
//   device ORDINAL CHUNK  allocate on that ordinal until it fails; "held BYTES"
//   greedy SECONDS        1 ms kernels back to back; prints the GPU-time share of each second
//   alloc-loop N | launch-loop N   N alloc+free pairs / launches (for callgrind)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "vgpu/interposer/cuda_abi.h"

extern "C" {
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext*, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr*, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t*, size_t*);
CUresult cuDeviceTotalMem_v2(size_t*, CUdevice);
CUresult cuModuleGetFunction(CUfunction*, CUmodule, const char*);
CUresult cuStreamCreate(CUstream*, unsigned);
CUresult cuStreamSynchronize(CUstream);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void**, void**);
nvmlReturn_t nvmlInit_v2();
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t*);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t*);
int64_t fakecuda_busy_between(int64_t, int64_t);
}

namespace {

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
      ++fails;         // may be transient while other processes' reservations are in flight:
      usleep(2000);    // let them settle before concluding that the container is full
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
    fprintf(stderr, "usage: vcuda_probe fill|churn|info|device|greedy|alloc-loop|launch-loop ...\n");
    return 2;
  }
  setvbuf(stdout, nullptr, _IONBF, 0);
  std::string mode = argv[1];
  auto arg = [&](int i) { return i < argc ? strtoll(argv[i], nullptr, 10) : 0; };
  if (mode == "device") {
    if (Context(static_cast<int>(arg(2)))) return 1;
    printf("held %llu\n", static_cast<unsigned long long>(Fill(static_cast<size_t>(arg(3)))));
    return 0;
  }
  if (Context(0)) return 1;
  if (mode == "fill") {
    printf("ready\n");
    char c;
    if (read(0, &c, 1) != 1) return 1;
    printf("held %llu\n", static_cast<unsigned long long>(Fill(static_cast<size_t>(arg(2)))));
    while (read(0, &c, 1) > 0) {
    }
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
    nvmlDevice_t d;
    nvmlMemory_t m{};
    nvmlInit_v2();
    nvmlDeviceGetHandleByIndex_v2(0, &d);
    nvmlDeviceGetMemoryInfo(d, &m);
    printf("meminfo %zu %zu\ntotalmem %zu\nnvml %llu %llu %llu\n", free_b, total, dev_total,
           m.total, m.used, m.free);
    return 0;
  }
  if (mode == "greedy" || mode == "launch-loop") {
    CUfunction f;
    CUstream s;
    cuModuleGetFunction(&f, nullptr, "k");
    cuStreamCreate(&s, 0);
    if (mode == "launch-loop") {
      for (long long i = 0; i < arg(2); ++i) cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, nullptr, nullptr);
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
      printf("share %.2f\n", 100.0 * static_cast<double>(fakecuda_busy_between(t, t + 1000000000)) / 1e9);
    }
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
