// Built against the older glibc of testing/glibc/get, as a program in an Ubuntu 20.04-era image:
// loads libcuda.so.1, allocates 48 MiB twice. Under a 64 MiB limit the second must be refused
// (CUDA_ERROR_OUT_OF_MEMORY, 2) and the total shown is the limit; exit 0 only then.
#include <dlfcn.h>
#include <stdio.h>
typedef unsigned long long CUdeviceptr;
int main(void) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    printf("no libcuda: %s\n", dlerror());
    return 3;
  }
  int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
  int (*alloc)(CUdeviceptr*, size_t) = (int (*)(CUdeviceptr*, size_t))dlsym(h, "cuMemAlloc_v2");
  size_t fr = 0, tot = 0;
  int (*info)(size_t*, size_t*) = (int (*)(size_t*, size_t*))dlsym(h, "cuMemGetInfo_v2");
  init(0);
  CUdeviceptr a = 0, b = 0;
  int r1 = alloc(&a, (size_t)48 << 20), r2 = alloc(&b, (size_t)48 << 20);
  info(&fr, &tot);
  printf("first %d second %d total %zu MiB\n", r1, r2, tot >> 20);
  return !(r1 == 0 && r2 == 2 && (tot >> 20) == 64);
}
