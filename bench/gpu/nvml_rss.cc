// What loading the real NVML costs in resident memory, apart from gpulet: a process that only
// dlopens libnvidia-ml.so.1, initialises it and reads one sample of every GPU, printing its memory
// at each step. Compare its last line with the exporter's RSS on the same node (README
// "Performance", docs/metrics.md "Resident memory").
//
//   nvml_rss [--library PATH] [--layer]
//
// Without --layer: plain dlsym calls, the getters the exporter's sampler makes per GPU and cycle
// (nothing of gpulet is involved). With --layer: gpulet's GPU layer (inventory, a basic sample,
// the nvidia-smi extras, two GPM samples), to tell NVML's share from the layer's and to see what
// GPM sample buffers cost. Each line: step, VmRSS, RssAnon, RssFile (KiB), threads and
// malloc arenas (glibc: one per thread that allocated, up to 8 per core).
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

#include "abi/nvml_api.h"
#include "fake_nvml/malloc_arenas.h"
#include "gpu/nvml/nvml_layer.h"

namespace {

long StatusKib(const std::string& status, const char* field) {
  size_t at = status.find(field);
  return at == std::string::npos ? -1 : std::atol(status.c_str() + at + std::strlen(field));
}

void Report(const char* step) {
  std::ifstream in("/proc/self/status");
  std::string s((std::istreambuf_iterator<char>(in)), {});
  std::printf("%-22s VmRSS %7ld kB  RssAnon %7ld kB  RssFile %7ld kB  threads %3ld  arenas %d\n",
              step, StatusKib(s, "VmRSS:"), StatusKib(s, "RssAnon:"), StatusKib(s, "RssFile:"),
              StatusKib(s, "Threads:"), gpulet::sim::MallocArenas());
  std::fflush(stdout);
}

template <typename F>
F Sym(void* h, const char* name) {
  return reinterpret_cast<F>(dlsym(h, name));
}

// One sample of every GPU with plain NVML calls: the sampler's per-GPU getters.
int Raw(const std::string& library) {
  void* h = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::fprintf(stderr, "nvml_rss: cannot load %s: %s\n", library.c_str(), dlerror());
    return 1;
  }
  Report("after dlopen");
  auto init = Sym<nvmlInitFn>(h, "nvmlInit_v2");
  auto count_fn = Sym<nvmlDeviceGetCountFn>(h, "nvmlDeviceGetCount_v2");
  auto handle_fn = Sym<nvmlDeviceGetHandleByIndexFn>(h, "nvmlDeviceGetHandleByIndex_v2");
  if (!init || !count_fn || !handle_fn) {
    std::fprintf(stderr, "nvml_rss: %s lacks nvmlInit_v2 / nvmlDeviceGetCount_v2\n",
                 library.c_str());
    return 1;
  }
  if (nvmlReturn_t r = init(); r != NVML_SUCCESS) {
    std::fprintf(stderr, "nvml_rss: nvmlInit_v2 failed: %d\n", r);
    return 1;
  }
  Report("after nvmlInit");
  unsigned n = 0;
  count_fn(&n);
  auto temp = Sym<nvmlDeviceGetTemperatureFn>(h, "nvmlDeviceGetTemperature");
  auto clock = Sym<nvmlDeviceGetClockInfoFn>(h, "nvmlDeviceGetClockInfo");
  auto power = Sym<nvmlDeviceGetUintFn>(h, "nvmlDeviceGetPowerUsage");
  auto energy = Sym<nvmlDeviceGetUllFn>(h, "nvmlDeviceGetTotalEnergyConsumption");
  auto util = Sym<nvmlDeviceGetUtilizationRatesFn>(h, "nvmlDeviceGetUtilizationRates");
  auto mem = Sym<nvmlDeviceGetMemoryInfoV2Fn>(h, "nvmlDeviceGetMemoryInfo_v2");
  auto ecc = Sym<nvmlDeviceGetTotalEccErrorsFn>(h, "nvmlDeviceGetTotalEccErrors");
  auto fields = Sym<nvmlDeviceGetFieldValuesFn>(h, "nvmlDeviceGetFieldValues");
  auto procs = Sym<nvmlDeviceGetProcessesFn>(h, "nvmlDeviceGetComputeRunningProcesses_v3");
  auto pcie = Sym<nvmlDeviceGetPcieThroughputFn>(h, "nvmlDeviceGetPcieThroughput");
  for (unsigned i = 0; i < n; ++i) {
    nvmlDevice_t d = nullptr;
    if (handle_fn(i, &d) != NVML_SUCCESS) continue;
    unsigned v = 0;
    unsigned long long ull = 0;
    if (temp) temp(d, NVML_TEMPERATURE_GPU, &v);
    for (int c = 0; clock && c < 4; ++c) clock(d, c, &v);
    if (power) power(d, &v);
    if (energy) energy(d, &ull);
    nvmlUtilization_t u{};
    if (util) util(d, &u);
    nvmlMemory_v2_t m{};
    m.version = nvmlMemory_v2;
    if (mem) mem(d, &m);
    for (int t = 0; ecc && t < 4; ++t) ecc(d, t & 1, t >> 1, &ull);
    nvmlFieldValue_t fv[3]{};
    fv[0].fieldId = NVML_FI_DEV_MEMORY_TEMP;
    fv[1].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX;
    fv[2].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;
    fv[1].scopeId = fv[2].scopeId = kNvmlScopeAllLinks;
    if (fields) fields(d, 3, fv);
    for (int c = 0; pcie && c < 2; ++c) pcie(d, c, &v);
    nvmlProcessInfo_t p[64];
    unsigned np = 64;
    if (procs) procs(d, &np, p);
  }
  std::printf("GPUs: %u\n", n);
  Report("after one sample");
  return 0;
}

int Layer(const std::string& library) {
  gpulet::gpu::NvmlBackendOptions o;
  o.library = library;
  auto layer = gpulet::gpu::OpenNvmlGpuLayer(o);
  if (!layer.ok()) {
    std::fprintf(stderr, "nvml_rss: %s\n", std::string(layer.status().message()).c_str());
    return 1;
  }
  Report("after layer open");
  auto inv = (*layer)->GetInventory();
  const size_t n = inv.ok() ? inv->devices.size() : 0;
  std::printf("GPUs: %zu\n", n);
  // As the exporter's cycles: basic set (default families), then the nvidia-smi extras, then GPM
  // (two samples per GPU, the second one computing the metrics).
  const std::pair<const char*, gpulet::gpu::TelemetryRequest> steps[] = {
      {"after basic sample", {false, false}},
      {"after nvidia-smi set", {true, false}},
      {"after GPM sample 1", {false, true}},
      {"after GPM sample 2", {false, true}}};
  for (const auto& [step, what] : steps) {
    for (size_t i = 0; i < n; ++i) (void)(*layer)->ReadTelemetry(inv->devices[i].index, what);
    Report(step);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string library = "libnvidia-ml.so.1";
  bool layer = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--library" && i + 1 < argc) {
      library = argv[++i];
    } else if (a == "--layer") {
      layer = true;
    } else {
      std::fprintf(stderr, "usage: nvml_rss [--library PATH] [--layer]\n");
      return 2;
    }
  }
  Report("start");
  return layer ? Layer(library) : Raw(library);
}
