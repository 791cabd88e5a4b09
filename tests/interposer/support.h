// Shared by the interposer tests and benchmarks: paths of the built artifacts, loading the fake
// driver and the interposer into this process, and a virtual clock shared with the fake.
#pragma once

#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>

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

}  // namespace gpulet::testing_interposer
