// Built against the older glibc of testing/glibc/get, as a program in an Ubuntu 20.04-era image
// (interposer.glibc_floor on the stand-in driver, make gpu-check on a real one). Usage:
//   alloc CHUNK_MIB COUNT [PAUSE_SECONDS]
// loads libcuda.so.1, makes the first GPU's primary context current, allocates CHUNK_MIB up to
// COUNT times and stops at the first refusal; prints
//   held <MiB> refused <CUresult or -> total <MiB the driver reports>
// then sleeps PAUSE_SECONDS (for nvidia-smi to look) and exits 0, or 3 when the driver is missing.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s CHUNK_MIB COUNT [PAUSE_SECONDS]\n", argv[0]);
    return 2;
  }
  size_t chunk = (size_t)atol(argv[1]) << 20;
  int count = atoi(argv[2]);
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    printf("no libcuda: %s\n", dlerror());
    return 3;
  }
  int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
  int (*get)(int*, int) = (int (*)(int*, int))dlsym(h, "cuDeviceGet");
  int (*retain)(CUcontext*, int) = (int (*)(CUcontext*, int))dlsym(h, "cuDevicePrimaryCtxRetain");
  int (*set)(CUcontext) = (int (*)(CUcontext))dlsym(h, "cuCtxSetCurrent");
  int (*alloc)(CUdeviceptr*, size_t) = (int (*)(CUdeviceptr*, size_t))dlsym(h, "cuMemAlloc_v2");
  int (*info)(size_t*, size_t*) = (int (*)(size_t*, size_t*))dlsym(h, "cuMemGetInfo_v2");
  if (!init || !get || !retain || !set || !alloc || !info) {
    printf("no libcuda: entry points missing\n");
    return 3;
  }
  int dev = 0;
  CUcontext ctx = NULL;
  if (init(0) != 0 || get(&dev, 0) != 0 || retain(&ctx, dev) != 0 || set(ctx) != 0) {
    printf("no GPU context\n");
    return 3;
  }
  size_t held = 0;
  int refused = -1;
  for (int i = 0; i < count; ++i) {
    CUdeviceptr p = 0;
    int r = alloc(&p, chunk);
    if (r != 0) {
      refused = r;
      break;
    }
    held += chunk;
  }
  size_t fr = 0, tot = 0;
  info(&fr, &tot);
  if (refused < 0)
    printf("held %zu refused - total %zu\n", held >> 20, tot >> 20);
  else
    printf("held %zu refused %d total %zu\n", held >> 20, refused, tot >> 20);
  fflush(stdout);
  if (argc > 3) sleep((unsigned)atoi(argv[3]));
  return 0;
}
