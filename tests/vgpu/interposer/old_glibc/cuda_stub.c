// A stand-in CUDA driver in C, built against the older glibc of testing/glibc/get (the fake
// driver, testing/fake_cuda, is C++ built against ours and cannot load there): what the
// interposer needs to start (src/vgpu/interposer/core.cc, ResolveRealDriver), memory from malloc.
#include <stdlib.h>
#include <string.h>
typedef int CUresult;
typedef int CUdevice;
typedef void* CUcontext;
typedef unsigned long long CUdeviceptr;
static int ctx;
CUresult cuInit(unsigned f) {
  (void)f;
  return 0;
}
CUresult cuDeviceGet(CUdevice* d, int o) {
  *d = o;
  return 0;
}
CUresult cuDeviceGetCount(int* n) {
  *n = 1;
  return 0;
}
CUresult cuDeviceGetUuid(char* u, CUdevice d) {
  (void)d;
  memset(u, 0, 16);
  u[15] = 1;
  return 0;
}
CUresult cuCtxGetCurrent(CUcontext* c) {
  *c = &ctx;
  return 0;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  (void)d;
  *c = &ctx;
  return 0;
}
CUresult cuCtxSetCurrent(CUcontext c) {
  (void)c;
  return 0;
}
CUresult cuCtxGetDevice(CUdevice* d) {
  *d = 0;
  return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  *p = (CUdeviceptr)malloc(n ? n : 1);
  return *p ? 0 : 2;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  free((void*)p);
  return 0;
}
CUresult cuMemGetInfo_v2(size_t* f, size_t* t) {
  *f = *t = (size_t)80 << 30;
  return 0;
}
CUresult cuDeviceTotalMem_v2(size_t* b, CUdevice d) {
  (void)d;
  *b = (size_t)80 << 30;
  return 0;
}
