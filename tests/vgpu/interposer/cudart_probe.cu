// A CUDA runtime program for the interposer's nvcc test (tests/vgpu/interposer/e2e_test.cc): built with
// nvcc where the toolkit is installed and run with libgpulet-vcuda.so preloaded over the fake
// libcuda.so.1. It prints what cudaMemGetInfo reports, then allocates half of that total and then
// the whole total again, which must be refused under the container's limit.
#include <cuda_runtime.h>

#include <cstdio>

int main() {
  size_t free_bytes = 0, total = 0;
  cudaError_t e = cudaMemGetInfo(&free_bytes, &total);
  std::printf("meminfo %d %zu %zu\n", static_cast<int>(e), free_bytes, total);
  void* half = nullptr;
  e = cudaMalloc(&half, total / 2);
  std::printf("half %d\n", static_cast<int>(e));
  void* past = nullptr;
  e = cudaMalloc(&past, total);
  std::printf("past %d\n", static_cast<int>(e));
  if (past) cudaFree(past);
  if (half) std::printf("free %d\n", static_cast<int>(cudaFree(half)));
  return 0;
}
