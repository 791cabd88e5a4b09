// libgpulet-vcuda.so: the extern "C" entry points that the dynamic linker, dlsym and
// cuGetProcAddress hand to CUDA programs instead of the driver's. Each one is a thin forward into
// the process-wide Core (core.h); only the symbols in exports.map leave the library.
//
// Reached three ways: (1) LD_PRELOAD puts these definitions before libcuda's for programs
// linked against libcuda; (2) our dlsym() returns them for a program (like libcudart) that
// dlopens libcuda.so.1 and looks symbols up in its handle; (3) cuGetProcAddress(_v2) returns them
// for entry points the CUDA 12+ runtime requests, with the driver deciding the version and we
// mapping the driver's answer back to our hook by pointer identity.
//
// Initialisation is lazy (first hooked call, never from dlsym), single, and lock-free; all
// globals are constant-initialised and trivially destructible, so calls arriving during exit or
// from destructors of other libraries still find a valid Core.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <type_traits>

#include "vgpu/interposer/core.h"
#include "vgpu/interposer/glibc_floor.h"  // binds our glibc references to old versions

using namespace gpulet;
using vcuda::Kind;

namespace {

constinit vcuda::Core g_core;
constinit vgpu::AccountingRegion g_local_region{};  // when the shared file cannot be mapped
constinit std::atomic<int> g_state{0};              // 0 new, 1 initialising, 2 ready
static_assert(std::is_trivially_destructible_v<vcuda::Core>);
static_assert(std::is_trivially_destructible_v<vgpu::AccountingRegion>);

using DlsymFn = void* (*)(void*, const char*);
constinit std::atomic<DlsymFn> g_real_dlsym{nullptr};
constinit void* g_cuda_handle = nullptr;  // the real libcuda, set once by DoInit

DlsymFn RealDlsym() {
  DlsymFn f = g_real_dlsym.load(std::memory_order_acquire);
  if (f == nullptr) {
    f = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
    if (f == nullptr) f = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"));
    g_real_dlsym.store(f, std::memory_order_release);
  }
  return f;
}

// The limits file the agent mounts read-only; when it exists, the environment is not read.
constinit vgpu::LimitsFile g_limits_file;
constinit int g_limits_source = 0;  // 0: the environment, 1: the file, -1: the file is unusable

// Reads kContainerLimits into g_limits_file. Absent: the environment is the source (a container
// started by hand). Present but unreadable or malformed: fail closed, with the reason in `error`.
void LoadLimitsFile(char* error, size_t error_len) {
  int fd = open(vgpu::kContainerLimits, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) {
      g_limits_source = -1;
      snprintf(error, error_len,
               "gpulet-vcuda: cannot read %s: %s; refusing GPU memory allocations",
               vgpu::kContainerLimits, strerror(errno));
    }
    return;
  }
  static char buf[vgpu::kLimitsFileMax + 1];
  size_t n = 0;
  for (ssize_t r; n < sizeof buf && (r = read(fd, buf + n, sizeof buf - n)) != 0;) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    n += static_cast<size_t>(r);
  }
  close(fd);
  if (g_limits_file.Parse(buf, n)) {
    g_limits_source = 1;
    return;
  }
  g_limits_source = -1;
  snprintf(error, error_len, "gpulet-vcuda: %s; refusing GPU memory allocations",
           g_limits_file.error);
}

const char* Contract(const char* name) {
  return g_limits_source != 0 ? g_limits_file.Get(name) : getenv(name);
}

void* OpenLib(const char* var, const char* soname) {
  const char* name = Contract(var);
  if (name == nullptr || *name == 0) name = soname;
  void* h = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
  return h ? h : dlopen(name, RTLD_NOW | RTLD_GLOBAL);
}

void DoInit() {
  char file_error[256] = {};
  LoadLimitsFile(file_error, sizeof file_error);
  vcuda::Config config = vcuda::ParseConfig(Contract);
  if (g_limits_source < 0 && !config.invalid) {
    config.disabled = false;
    config.invalid = true;
    memcpy(config.error, file_error, sizeof config.error);
  }
  if (config.invalid) fprintf(stderr, "%s\n", config.error);
  void* cuda = OpenLib(vgpu::kVarRealLibcuda, "libcuda.so.1");
  g_cuda_handle = cuda;
  // NVML: the soft limit reads the GPU's utilisation, and a memory limit measures what the
  // driver really holds for the process. Otherwise it is not loaded (the memory-info hooks find
  // it on their first call: the program has loaded it by then).
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (nvml == nullptr && !config.disabled &&
      (config.core_ceiling > config.core_limit || config.memory_limit > 0 || config.invalid))
    nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
  vcuda::RealDriver real;
  if (cuda == nullptr || !vcuda::ResolveRealDriver(cuda, nvml, RealDlsym(), &real)) {
    fprintf(stderr, "gpulet-vcuda: cannot load the CUDA driver (libcuda.so.1): %s\n",
            cuda ? "entry points missing" : dlerror());
    if (cuda) vcuda::ResolveRealDriver(cuda, nvml, RealDlsym(), &real);  // forward what exists
  }
  vgpu::AccountingRegion* region = &g_local_region;
  if (!config.disabled) {
    const char* path = Contract(vgpu::kVarAccounting);
    if (path == nullptr || *path == 0) path = vgpu::kContainerAccounting;
    const char* error = nullptr;
    if (vgpu::AccountingRegion* r = vgpu::MapAccounting(path, true, &error)) {
      region = r;
    } else if (config.memory_limit > 0 || config.core_limit < 100) {
      fprintf(stderr,
              "gpulet-vcuda: %s %s; limits apply to this process alone, not the container\n", error,
              path);
    }
  }
  g_core.Init(real, config, region, vcuda::RealClockFns());
  if (!config.disabled) {
    atexit(+[] { g_core.Exit(); });
    pthread_atfork(
        nullptr, nullptr, +[] { g_core.AfterFork(); });
  }
}

__attribute__((noinline, cold)) void InitSlow() {
  int expect = 0;
  if (g_state.compare_exchange_strong(expect, 1)) {
    DoInit();
    g_state.store(2, std::memory_order_release);
  } else {
    while (g_state.load(std::memory_order_acquire) != 2) sched_yield();
  }
}

inline vcuda::Core& C() {
  if (__builtin_expect(g_state.load(std::memory_order_acquire) != 2, 0)) InitSlow();
  return g_core;
}

template <class T>
inline T R(void* p) {
  return reinterpret_cast<T>(p);
}
// Calls the real entry point `name` with the hook's own type, or fails like a missing driver.
// Only after C() has run in the calling hook (g_core is then initialised).
#define FORWARD_OR_FAIL(name, ...)                                          \
  (g_core.real().name ? R<decltype(&name)>(g_core.real().name)(__VA_ARGS__) \
                      : CUDA_ERROR_NOT_INITIALIZED)

// Everything but the unthrottled fast path, out of line and taking the arguments by value, so
// that the hook itself keeps nothing live across a call and compiles to a tail call.
template <class Fn, class... Args>
__attribute__((noinline)) CUresult SlowLaunch(void* vcuda::RealDriver::*member, CUstream stream,
                                              bool per_thread, Args... args) {
  vcuda::Core& c = C();
  Fn fn = R<Fn>(c.real().*member);
  if (fn == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (!c.pacing()) return fn(args...);
  int slot = c.BeforeLaunch(stream, per_thread);
  CUresult r = fn(args...);
  c.AfterLaunch(slot, stream, per_thread, r);
  return r;
}
// Unthrottled launches (initialised, no core limit): two loads, three branches, a tail call.
#define LAUNCH(name, stream, per_thread, ...)                                           \
  if (__builtin_expect(g_state.load(std::memory_order_acquire) == 2, 1)) {              \
    auto fn = R<decltype(&name)>(g_core.real().name);                                   \
    if (__builtin_expect(!g_core.pacing() && fn != nullptr, 1)) return fn(__VA_ARGS__); \
  }                                                                                     \
  return SlowLaunch<decltype(&name)>(&vcuda::RealDriver::name, stream, per_thread, __VA_ARGS__)

}  // namespace

#define EXPORT extern "C" __attribute__((visibility("default")))

// --- memory allocation and free -----------------------------------------------------------------
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
  return C().Charged(Kind::kPointer, -1, bytes, [&](uint64_t* h) {
    CUresult r = FORWARD_OR_FAIL(cuMemAlloc_v2, p, bytes);
    if (r == CUDA_SUCCESS) *h = *p;
    return r;
  });
}
EXPORT CUresult cuMemAlloc(CUdeviceptr_v1* p, unsigned int bytes) {
  return C().Charged(Kind::kPointer, -1, bytes, [&](uint64_t* h) {
    CUresult r = FORWARD_OR_FAIL(cuMemAlloc, p, bytes);
    if (r == CUDA_SUCCESS) *h = *p;
    return r;
  });
}
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* p, size_t* pitch, size_t w, size_t h, unsigned e) {
  if (!C().real().cuMemAllocPitch_v2) return CUDA_ERROR_NOT_INITIALIZED;
  return C().AllocPitch(p, pitch, w, h, e);
}
EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1* p, unsigned* pitch, unsigned w, unsigned h,
                                unsigned e) {
  // The 32-bit form cannot report an exact pitch before allocating either: charge the bound.
  uint64_t bound = ((uint64_t{w} + 511) & ~uint64_t{511}) * h;
  return C().Charged(Kind::kPointer, -1, bound, [&](uint64_t* hd) {
    CUresult r = FORWARD_OR_FAIL(cuMemAllocPitch, p, pitch, w, h, e);
    if (r == CUDA_SUCCESS) *hd = *p;
    return r;
  });
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr* p, size_t bytes, unsigned int flags) {
  return C().Charged(Kind::kPointer, -1, bytes, [&](uint64_t* h) {
    CUresult r = FORWARD_OR_FAIL(cuMemAllocManaged, p, bytes, flags);
    if (r == CUDA_SUCCESS) *h = *p;
    return r;
  });
}
#define ASYNC_ALLOC(name, ...)                                     \
  return C().Charged(Kind::kPointer, -1, bytes, [&](uint64_t* h) { \
    CUresult r = FORWARD_OR_FAIL(name, __VA_ARGS__);               \
    if (r == CUDA_SUCCESS) *h = *p;                                \
    return r;                                                      \
  })
EXPORT CUresult cuMemAllocAsync(CUdeviceptr* p, size_t bytes, CUstream s) {
  ASYNC_ALLOC(cuMemAllocAsync, p, bytes, s);
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* p, size_t bytes, CUstream s) {
  ASYNC_ALLOC(cuMemAllocAsync_ptsz, p, bytes, s);
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* p, size_t bytes, CUmemoryPool pool,
                                        CUstream s) {
  ASYNC_ALLOC(cuMemAllocFromPoolAsync, p, bytes, pool, s);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* p, size_t bytes, CUmemoryPool pool,
                                             CUstream s) {
  ASYNC_ALLOC(cuMemAllocFromPoolAsync_ptsz, p, bytes, pool, s);
}
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t bytes,
                            const CUmemAllocationProp* prop, unsigned long long flags) {
  // Only device-located physical memory counts; host/NUMA locations pass through (and a bad prop
  // is the driver's to reject -- we never read through a null prop).
  C();
  if (prop == nullptr || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return FORWARD_OR_FAIL(cuMemCreate, handle, bytes, prop, flags);
  return C().Charged(Kind::kVmm, prop->location.id, bytes, [&](uint64_t* h) {
    CUresult r = FORWARD_OR_FAIL(cuMemCreate, handle, bytes, prop, flags);
    if (r == CUDA_SUCCESS) *h = *handle;
    return r;
  });
}
EXPORT CUresult cuArrayCreate_v2(CUarray* a, const CUDA_ARRAY_DESCRIPTOR* d) {
  C();
  if (d == nullptr) return FORWARD_OR_FAIL(cuArrayCreate_v2, a, d);
  CUDA_ARRAY3D_DESCRIPTOR d3{d->Width, d->Height, 0, d->Format, d->NumChannels, 0};
  return C().Charged(Kind::kArray, -1, vcuda::Core::ArrayBytes(d3, 1), [&](uint64_t* h) {
    CUresult r = FORWARD_OR_FAIL(cuArrayCreate_v2, a, d);
    if (r == CUDA_SUCCESS) *h = reinterpret_cast<uint64_t>(*a);
    return r;
  });
}
EXPORT CUresult cuArrayCreate(CUarray* a, const CUDA_ARRAY_DESCRIPTOR_v1* d) {
  C();
  if (d == nullptr) return FORWARD_OR_FAIL(cuArrayCreate, a, d);
  CUDA_ARRAY3D_DESCRIPTOR d3{d->Width, d->Height, 0, d->Format, d->NumChannels, 0};
  return C().Charged(Kind::kArray, -1, vcuda::Core::ArrayBytes(d3, 1), [&](uint64_t* h) {
    CUresult r = FORWARD_OR_FAIL(cuArrayCreate, a, d);
    if (r == CUDA_SUCCESS) *h = reinterpret_cast<uint64_t>(*a);
    return r;
  });
}
EXPORT CUresult cuArray3DCreate_v2(CUarray* a, const CUDA_ARRAY3D_DESCRIPTOR* d) {
  C();
  if (d == nullptr) return FORWARD_OR_FAIL(cuArray3DCreate_v2, a, d);
  return C().Charged(Kind::kArray, -1, vcuda::Core::ArrayBytes(*d, 1), [&](uint64_t* h) {
    CUresult r = FORWARD_OR_FAIL(cuArray3DCreate_v2, a, d);
    if (r == CUDA_SUCCESS) *h = reinterpret_cast<uint64_t>(*a);
    return r;
  });
}
EXPORT CUresult cuArray3DCreate(CUarray* a, const CUDA_ARRAY3D_DESCRIPTOR_v1* d) {
  C();
  if (d == nullptr) return FORWARD_OR_FAIL(cuArray3DCreate, a, d);
  CUDA_ARRAY3D_DESCRIPTOR d3{d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags};
  return C().Charged(Kind::kArray, -1, vcuda::Core::ArrayBytes(d3, 1), [&](uint64_t* h) {
    CUresult r = FORWARD_OR_FAIL(cuArray3DCreate, a, d);
    if (r == CUDA_SUCCESS) *h = reinterpret_cast<uint64_t>(*a);
    return r;
  });
}
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray* m, const CUDA_ARRAY3D_DESCRIPTOR* d,
                                       unsigned int levels) {
  C();
  if (d == nullptr) return FORWARD_OR_FAIL(cuMipmappedArrayCreate, m, d, levels);
  return C().Charged(Kind::kMipmap, -1, vcuda::Core::ArrayBytes(*d, levels), [&](uint64_t* h) {
    CUresult r = FORWARD_OR_FAIL(cuMipmappedArrayCreate, m, d, levels);
    if (r == CUDA_SUCCESS) *h = reinterpret_cast<uint64_t>(*m);
    return r;
  });
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  return C().Freed(Kind::kPointer, p, [&] { return FORWARD_OR_FAIL(cuMemFree_v2, p); });
}
EXPORT CUresult cuMemFree(CUdeviceptr_v1 p) {
  return C().Freed(Kind::kPointer, p, [&] { return FORWARD_OR_FAIL(cuMemFree, p); });
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
  return C().Freed(Kind::kPointer, p, [&] { return FORWARD_OR_FAIL(cuMemFreeAsync, p, s); });
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
  return C().Freed(Kind::kPointer, p, [&] { return FORWARD_OR_FAIL(cuMemFreeAsync_ptsz, p, s); });
}
// The charge of VMM memory stays while it is mapped, released or not (Core::Release).
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  return C().Release(h, [&] { return FORWARD_OR_FAIL(cuMemRelease, h); });
}
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle h, unsigned long long flags) {
  return C().Map(ptr, size, h,
                 [&] { return FORWARD_OR_FAIL(cuMemMap, ptr, size, offset, h, flags); });
}
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return C().Unmap(ptr, size, [&] { return FORWARD_OR_FAIL(cuMemUnmap, ptr, size); });
}
EXPORT CUresult cuArrayDestroy(CUarray a) {
  return C().Freed(Kind::kArray, reinterpret_cast<uint64_t>(a),
                   [&] { return FORWARD_OR_FAIL(cuArrayDestroy, a); });
}
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) {
  return C().Freed(Kind::kMipmap, reinterpret_cast<uint64_t>(m),
                   [&] { return FORWARD_OR_FAIL(cuMipmappedArrayDestroy, m); });
}

// --- contexts -----------------------------------------------------------------------------------
#define CTX_CREATE(name, ...) \
  return C().CtxCreate(ctx, dev, [&] { return FORWARD_OR_FAIL(name, __VA_ARGS__); })
EXPORT CUresult cuCtxCreate(CUcontext* ctx, unsigned int flags, CUdevice dev) {
  CTX_CREATE(cuCtxCreate, ctx, flags, dev);
}
EXPORT CUresult cuCtxCreate_v2(CUcontext* ctx, unsigned int flags, CUdevice dev) {
  CTX_CREATE(cuCtxCreate_v2, ctx, flags, dev);
}
EXPORT CUresult cuCtxCreate_v3(CUcontext* ctx, void* params, int n, unsigned int flags,
                               CUdevice dev) {
  CTX_CREATE(cuCtxCreate_v3, ctx, params, n, flags, dev);
}
EXPORT CUresult cuCtxCreate_v4(CUcontext* ctx, void* params, unsigned int flags, CUdevice dev) {
  CTX_CREATE(cuCtxCreate_v4, ctx, params, flags, dev);
}
EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  return C().CtxDestroy(ctx, [&] { return FORWARD_OR_FAIL(cuCtxDestroy_v2, ctx); });
}
EXPORT CUresult cuCtxDestroy(CUcontext ctx) {
  return C().CtxDestroy(ctx, [&] { return FORWARD_OR_FAIL(cuCtxDestroy, ctx); });
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  if (!C().real().cuDevicePrimaryCtxRetain) return CUDA_ERROR_NOT_INITIALIZED;
  return C().PrimaryRetain(ctx, dev);
}
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  if (!C().real().cuDevicePrimaryCtxRelease) return CUDA_ERROR_NOT_INITIALIZED;
  return C().PrimaryRelease(dev, false);
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  if (!C().real().cuDevicePrimaryCtxRelease_v2) return CUDA_ERROR_NOT_INITIALIZED;
  return C().PrimaryRelease(dev, true);
}

// --- reports ------------------------------------------------------------------------------------
EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
  C();
  CUresult r = FORWARD_OR_FAIL(cuMemGetInfo_v2, free_bytes, total);
  if (r == CUDA_SUCCESS && free_bytes && total) C().AdjustMemInfo(free_bytes, total);
  return r;
}
EXPORT CUresult cuMemGetInfo(unsigned int* free_bytes, unsigned int* total) {
  if (free_bytes == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  size_t f, t;
  CUresult r = cuMemGetInfo_v2(&f, &t);
  if (r == CUDA_SUCCESS) {
    *free_bytes = static_cast<unsigned>(f < 0xffffffffu ? f : 0xffffffffu);
    *total = static_cast<unsigned>(t < 0xffffffffu ? t : 0xffffffffu);
  }
  return r;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t* total, CUdevice dev) {
  C();
  CUresult r = FORWARD_OR_FAIL(cuDeviceTotalMem_v2, total, dev);
  if (r == CUDA_SUCCESS && total) C().AdjustTotalMem(total, dev);
  return r;
}
EXPORT CUresult cuDeviceTotalMem(unsigned int* total, CUdevice dev) {
  if (total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  size_t t;
  CUresult r = cuDeviceTotalMem_v2(&t, dev);
  if (r == CUDA_SUCCESS) *total = static_cast<unsigned>(t < 0xffffffffu ? t : 0xffffffffu);
  return r;
}

namespace {
// NVML may be loaded after our initialisation: find the definition that follows ours (the real
// libnvidia-ml), else the one in the driver's handle (the fake serves both).
void* NvmlReal(void* vcuda::RealDriver::*member, const char* name) {
  vcuda::Core& c = C();
  if (void* fn = c.real().*member) return fn;
  void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
  void* fn = h ? RealDlsym()(h, name) : nullptr;
  if (fn == nullptr && g_cuda_handle) fn = RealDlsym()(g_cuda_handle, name);
  return fn;
}
}  // namespace
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t* m) {
  void* fn = NvmlReal(&vcuda::RealDriver::nvmlDeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo");
  if (fn == nullptr) return NVML_ERROR_LIBRARY_NOT_FOUND;
  nvmlReturn_t r = R<decltype(&nvmlDeviceGetMemoryInfo)>(fn)(dev, m);
  if (r == NVML_SUCCESS && m)
    C().AdjustNvmlMemory(dev, NvmlReal(&vcuda::RealDriver::nvmlDeviceGetUUID, "nvmlDeviceGetUUID"),
                         &m->total, &m->free, &m->used);
  return r;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t* m) {
  void* fn = NvmlReal(&vcuda::RealDriver::nvmlDeviceGetMemoryInfo_v2, "nvmlDeviceGetMemoryInfo_v2");
  if (fn == nullptr) return NVML_ERROR_LIBRARY_NOT_FOUND;
  nvmlReturn_t r = R<decltype(&nvmlDeviceGetMemoryInfo_v2)>(fn)(dev, m);
  if (r == NVML_SUCCESS && m)
    C().AdjustNvmlMemory(dev, NvmlReal(&vcuda::RealDriver::nvmlDeviceGetUUID, "nvmlDeviceGetUUID"),
                         &m->total, &m->free, &m->used);
  return r;
}

// --- launches -----------------------------------------------------------------------------------
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned sh, CUstream s, void** p,
                               void** e) {
  LAUNCH(cuLaunchKernel, s, false, f, gx, gy, gz, bx, by, bz, sh, s, p, e);
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                    unsigned bx, unsigned by, unsigned bz, unsigned sh, CUstream s,
                                    void** p, void** e) {
  LAUNCH(cuLaunchKernel_ptsz, s, true, f, gx, gy, gz, bx, by, bz, sh, s, p, e);
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned sh,
                                          CUstream s, void** p) {
  LAUNCH(cuLaunchCooperativeKernel, s, false, f, gx, gy, gz, bx, by, bz, sh, s, p);
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                               unsigned bx, unsigned by, unsigned bz, unsigned sh,
                                               CUstream s, void** p) {
  LAUNCH(cuLaunchCooperativeKernel_ptsz, s, true, f, gx, gy, gz, bx, by, bz, sh, s, p);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* cfg, CUfunction f, void** p, void** e) {
  LAUNCH(cuLaunchKernelEx, cfg ? cfg->hStream : nullptr, false, cfg, f, p, e);
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* cfg, CUfunction f, void** p, void** e) {
  LAUNCH(cuLaunchKernelEx_ptsz, cfg ? cfg->hStream : nullptr, true, cfg, f, p, e);
}
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { LAUNCH(cuGraphLaunch, s, false, g, s); }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) {
  LAUNCH(cuGraphLaunch_ptsz, s, true, g, s);
}
// The legacy launches (block shape from cuFuncSetBlockShape): onto the legacy default stream,
// except cuLaunchGridAsync's own.
EXPORT CUresult cuLaunch(CUfunction f) { LAUNCH(cuLaunch, nullptr, false, f); }
EXPORT CUresult cuLaunchGrid(CUfunction f, int w, int h) {
  LAUNCH(cuLaunchGrid, nullptr, false, f, w, h);
}
EXPORT CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s) {
  LAUNCH(cuLaunchGridAsync, s, false, f, w, h, s);
}

// --- lookup paths -------------------------------------------------------------------------------
EXPORT CUresult cuGetProcAddress_v2(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);
EXPORT CUresult cuGetProcAddress(const char*, void**, int, cuuint64_t);

namespace {
struct Hook {
  const char* name;
  void* vcuda::RealDriver::*real;
  void* hook;
};
// NOLINTNEXTLINE(bugprone-macro-parentheses): `n` is a name (member, function); () would break it
#define H(n) {#n, &vcuda::RealDriver::n, reinterpret_cast<void*>(&n)},
const Hook kHooks[] = {GPULET_VCUDA_HOOKS(H)};
#undef H

// The driver resolved (symbol, version, flags) to one of its entry points; hand back ours if we
// wrap that entry point. Pointer identity keeps the driver the judge of versions and stream
// flavours (cuMemAlloc at 3020 -> cuMemAlloc_v2, per-thread -> _ptsz, ...).
void* HookForReal(void* fn) {
  if (fn == nullptr) return fn;
  const vcuda::RealDriver& real = C().real();
  for (const Hook& h : kHooks)
    if (real.*(h.real) == fn) return h.hook;
  return fn;
}

// For dlsym: by name, with no initialisation, allocation or lock on this path.
void* HookForName(const char* name) {
  if (name == nullptr || !((name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0))
    return nullptr;
  for (const Hook& h : kHooks)
    if (strcmp(h.name, name) == 0) return h.hook;
  return nullptr;
}
}  // namespace

EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* status) {
  vcuda::Core& c = C();
  CUresult r = FORWARD_OR_FAIL(cuGetProcAddress_v2, symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && pfn && !c.config().disabled) *pfn = HookForReal(*pfn);
  return r;
}
EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  vcuda::Core& c = C();
  CUresult r = FORWARD_OR_FAIL(cuGetProcAddress, symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS && pfn && !c.config().disabled) *pfn = HookForReal(*pfn);
  return r;
}

// RTLD_NEXT is relative to the caller, which for the real dlsym would be us: search the objects
// loaded after the caller's, in load order, for one that defines the symbol itself.
static void* NextAfter(const void* caller, const char* name) {
  Dl_info info;
  struct link_map* lm = nullptr;
  if (dladdr1(caller, &info, reinterpret_cast<void**>(&lm), RTLD_DL_LINKMAP) == 0 || !lm)
    return RealDlsym()(RTLD_NEXT, name);
  for (struct link_map* l = lm->l_next; l != nullptr; l = l->l_next) {
    void* p = RealDlsym()(l, name);
    struct link_map* owner = nullptr;
    if (p && dladdr1(p, &info, reinterpret_cast<void**>(&owner), RTLD_DL_LINKMAP) && owner == l)
      return p;
  }
  return nullptr;
}

EXPORT void* dlsym(void* handle, const char* name) {
  void* p = handle == RTLD_NEXT ? NextAfter(__builtin_return_address(0), name)
                                : RealDlsym()(handle, name);
  if (p == nullptr) return p;
  void* hook = HookForName(name);
  // GPULET_VGPU_DISABLE is honoured without initialising: the opt-out must not touch the driver.
  if (hook == nullptr || (g_state.load(std::memory_order_acquire) == 2 && g_core.config().disabled))
    return p;
  return hook;
}
