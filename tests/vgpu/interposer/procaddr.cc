// vcuda_procaddr: what libcudart 13.0 does to reach the driver, without libcudart (which needs the
// driver's private export tables and so cannot run on a fake, DESIGN.md). It dlopens libcuda.so.1,
// looks up cuGetProcAddress_v2 with dlsym, requests every entry point of
// reference/cuda/cudart-13.0-getprocaddress.txt in that order with those versions (a repeat of a
// symbol:version pair asks for the per-thread-default-stream flavour), then uses what it got to
// allocate past the container's limit.
//   usage: vcuda_procaddr LIST CHUNK
// Prints "requests N found M", "hooked cuMemAlloc yes|no", "total T", "held H last-error E".
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <set>
#include <string>

#include "abi/cuda_abi.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: vcuda_procaddr LIST CHUNK\n");
    return 2;
  }
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW);
  if (cuda == nullptr) {
    fprintf(stderr, "vcuda_procaddr: %s\n", dlerror());
    return 1;
  }
  auto gpa =
      reinterpret_cast<gpulet::cuda::cuGetProcAddress_v2_t>(dlsym(cuda, "cuGetProcAddress_v2"));
  FILE* list = fopen(argv[1], "r");
  if (gpa == nullptr || list == nullptr) {
    fprintf(stderr, "vcuda_procaddr: no cuGetProcAddress_v2 or cannot read %s\n", argv[1]);
    return 1;
  }
  std::map<std::string, void*> got;
  std::set<std::string> seen;
  int requests = 0, found = 0;
  char line[512];
  while (fgets(line, sizeof line, list)) {
    if (line[0] == '#' || line[0] == '\n') continue;
    char* colon = strrchr(line, ':');
    if (colon == nullptr) continue;
    *colon = 0;
    int version = atoi(colon + 1);
    std::string key = std::string(line) + ":" + std::to_string(version);
    cuuint64_t flags = seen.insert(key).second ? CU_GET_PROC_ADDRESS_DEFAULT
                                               : CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status;
    ++requests;
    if (gpa(line, &fn, version, flags, &status) == CUDA_SUCCESS && fn) {
      ++found;
      if (flags == CU_GET_PROC_ADDRESS_DEFAULT) got[line] = fn;
    }
  }
  fclose(list);
  printf("requests %d found %d\n", requests, found);
  auto need = [&](const char* name) {
    if (!got.count(name)) {
      fprintf(stderr, "vcuda_procaddr: driver gave no %s\n", name);
      exit(1);
    }
    return got[name];
  };
  Dl_info info{};
  dladdr(need("cuMemAlloc"), &info);
  printf("hooked cuMemAlloc %s\n",
         info.dli_fname && strstr(info.dli_fname, "gpulet-vcuda") ? "yes" : "no");
  reinterpret_cast<CUresult (*)(unsigned)>(need("cuInit"))(0);
  CUcontext ctx;
  reinterpret_cast<gpulet::cuda::cuDevicePrimaryCtxRetain_t>(need("cuDevicePrimaryCtxRetain"))(&ctx,
                                                                                               0);
  reinterpret_cast<CUresult (*)(CUcontext)>(need("cuCtxSetCurrent"))(ctx);
  size_t free_b = 0, total = 0;
  reinterpret_cast<gpulet::cuda::cuMemGetInfo_t>(need("cuMemGetInfo"))(&free_b, &total);
  printf("total %zu\n", total);
  auto alloc = reinterpret_cast<gpulet::cuda::cuMemAlloc_t>(need("cuMemAlloc"));
  size_t chunk = strtoull(argv[2], nullptr, 10);
  unsigned long long held = 0;
  CUresult last = CUDA_SUCCESS;
  for (;;) {
    CUdeviceptr p;
    last = alloc(&p, chunk);
    if (last != CUDA_SUCCESS) break;
    held += chunk;
  }
  printf("held %llu last-error %d\n", held, last);
  return 0;
}
