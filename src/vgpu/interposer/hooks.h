/* The interposer's hooked entry points: the one list. From it come the exported symbols (CMake
   writes the version script exports.map from the names below), the driver pointers the core
   resolves (core.h RealDriver), the table that maps a driver entry point or a dlsym name to our
   hook (shim.cc kHooks; a listed hook without a definition does not compile), and the export test
   (tests/vgpu/interposer). dlsym, the one non-driver hook, is exported beside them.
   Plain preprocessor text (no C++): CMake reads it with a regular expression, one name per X(). */
#pragma once

// One name per line; clang-format does not reach a fixed point on such lists.
// clang-format off
#define GPULET_VCUDA_CUDA_HOOKS(X) \
  X(cuGetProcAddress) \
  X(cuGetProcAddress_v2) \
  X(cuMemAlloc) \
  X(cuMemAlloc_v2) \
  X(cuMemAllocPitch) \
  X(cuMemAllocPitch_v2) \
  X(cuMemAllocManaged) \
  X(cuMemAllocAsync) \
  X(cuMemAllocAsync_ptsz) \
  X(cuMemAllocFromPoolAsync) \
  X(cuMemAllocFromPoolAsync_ptsz) \
  X(cuMemCreate) \
  X(cuMemRelease) \
  X(cuMemMap) \
  X(cuMemUnmap) \
  X(cuArrayCreate) \
  X(cuArrayCreate_v2) \
  X(cuArray3DCreate) \
  X(cuArray3DCreate_v2) \
  X(cuMipmappedArrayCreate) \
  X(cuArrayDestroy) \
  X(cuMipmappedArrayDestroy) \
  X(cuMemFree) \
  X(cuMemFree_v2) \
  X(cuMemFreeAsync) \
  X(cuMemFreeAsync_ptsz) \
  X(cuMemGetInfo) \
  X(cuMemGetInfo_v2) \
  X(cuDeviceTotalMem) \
  X(cuDeviceTotalMem_v2) \
  X(cuCtxCreate) \
  X(cuCtxCreate_v2) \
  X(cuCtxCreate_v3) \
  X(cuCtxCreate_v4) \
  X(cuCtxDestroy) \
  X(cuCtxDestroy_v2) \
  X(cuDevicePrimaryCtxRetain) \
  X(cuDevicePrimaryCtxRelease) \
  X(cuDevicePrimaryCtxRelease_v2) \
  X(cuLaunchKernel) \
  X(cuLaunchKernel_ptsz) \
  X(cuLaunchKernelEx) \
  X(cuLaunchKernelEx_ptsz) \
  X(cuLaunchCooperativeKernel) \
  X(cuLaunchCooperativeKernel_ptsz) \
  X(cuGraphLaunch) \
  X(cuGraphLaunch_ptsz) \
  X(cuLaunch) \
  X(cuLaunchGrid) \
  X(cuLaunchGridAsync)

#define GPULET_VCUDA_NVML_HOOKS(X) \
  X(nvmlDeviceGetMemoryInfo) \
  X(nvmlDeviceGetMemoryInfo_v2)
// clang-format on

#define GPULET_VCUDA_HOOKS(X) GPULET_VCUDA_CUDA_HOOKS(X) GPULET_VCUDA_NVML_HOOKS(X)
