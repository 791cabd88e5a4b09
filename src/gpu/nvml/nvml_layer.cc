#include "gpu/nvml/nvml_layer.h"

#include <dlfcn.h>
#include <elf.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "abi/nvml_api.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/fs.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace gpulet::gpu {
namespace {

// How long one nvmlEventSetWait call blocks. Events wake it at once; the timeout only bounds how
// long Reinit and shutdown wait for the event thread to notice it should stop.
constexpr unsigned kEventWaitMs = 50;

// Every NVML entry point gpulet calls, listed once: X(field, type, exported names...). From it come
// NvmlLib's function pointers and their resolution in LoadLibrary. The names are tried in order,
// the newest version first; a library exporting none of them lacks the first.
// clang-format would pack the entries several to a line.
// clang-format off
// Required: a library that lacks one is refused (the driver is too old for gpulet).
#define GPULET_NVML_REQUIRED(X) \
  X(init, nvmlInitFn, "nvmlInit_v2", "nvmlInit") \
  X(shutdown, nvmlShutdownFn, "nvmlShutdown") \
  X(count, nvmlDeviceGetCountFn, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount") \
  X(handle_by_index, nvmlDeviceGetHandleByIndexFn, "nvmlDeviceGetHandleByIndex_v2", \
    "nvmlDeviceGetHandleByIndex") \
  X(uuid, nvmlDeviceGetStringFn, "nvmlDeviceGetUUID")

// Optional: a missing one leaves its field null and its data unset; one warning names it.
#define GPULET_NVML_OPTIONAL(X) \
  X(error_string, nvmlErrorStringFn, "nvmlErrorString") \
  X(driver_version, nvmlSystemGetStringFn, "nvmlSystemGetDriverVersion") \
  X(nvml_version, nvmlSystemGetStringFn, "nvmlSystemGetNVMLVersion") \
  X(cuda_version, nvmlSystemGetCudaDriverVersionFn, "nvmlSystemGetCudaDriverVersion_v2", \
    "nvmlSystemGetCudaDriverVersion") \
  X(name, nvmlDeviceGetStringFn, "nvmlDeviceGetName") \
  X(brand, nvmlDeviceGetIntFn, "nvmlDeviceGetBrand") \
  X(arch, nvmlDeviceGetUintFn, "nvmlDeviceGetArchitecture") \
  X(minor, nvmlDeviceGetUintFn, "nvmlDeviceGetMinorNumber") \
  X(pci, nvmlDeviceGetPciInfoFn, "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2") \
  X(memory_v2, nvmlDeviceGetMemoryInfoV2Fn, "nvmlDeviceGetMemoryInfo_v2") \
  X(memory, nvmlDeviceGetMemoryInfoFn, "nvmlDeviceGetMemoryInfo") \
  X(cc, nvmlDeviceGetCudaComputeCapabilityFn, "nvmlDeviceGetCudaComputeCapability") \
  X(attributes, nvmlDeviceGetAttributesFn, "nvmlDeviceGetAttributes_v2") \
  X(power_limit, nvmlDeviceGetUintFn, "nvmlDeviceGetEnforcedPowerLimit", \
    "nvmlDeviceGetPowerManagementLimit") \
  X(mig_mode, nvmlDeviceGetMigModeFn, "nvmlDeviceGetMigMode") \
  X(max_mig, nvmlDeviceGetUintFn, "nvmlDeviceGetMaxMigDeviceCount") \
  X(mig_handle, nvmlDeviceGetMigDeviceHandleByIndexFn, "nvmlDeviceGetMigDeviceHandleByIndex") \
  X(gi_id, nvmlDeviceGetUintFn, "nvmlDeviceGetGpuInstanceId") \
  X(ci_id, nvmlDeviceGetUintFn, "nvmlDeviceGetComputeInstanceId") \
  X(common_ancestor, nvmlDeviceGetTopologyCommonAncestorFn, "nvmlDeviceGetTopologyCommonAncestor") \
  X(nvlink_state, nvmlDeviceGetNvLinkStateFn, "nvmlDeviceGetNvLinkState") \
  X(nvlink_remote_pci, nvmlDeviceGetNvLinkRemotePciInfoFn, "nvmlDeviceGetNvLinkRemotePciInfo_v2") \
  X(nvlink_remote_type, nvmlDeviceGetNvLinkRemoteDeviceTypeFn, \
    "nvmlDeviceGetNvLinkRemoteDeviceType") \
  X(temperature, nvmlDeviceGetTemperatureFn, "nvmlDeviceGetTemperature") \
  X(field_values, nvmlDeviceGetFieldValuesFn, "nvmlDeviceGetFieldValues") \
  X(clock, nvmlDeviceGetClockInfoFn, "nvmlDeviceGetClockInfo") \
  X(power, nvmlDeviceGetUintFn, "nvmlDeviceGetPowerUsage") \
  X(energy, nvmlDeviceGetUllFn, "nvmlDeviceGetTotalEnergyConsumption") \
  X(utilization, nvmlDeviceGetUtilizationRatesFn, "nvmlDeviceGetUtilizationRates") \
  X(encoder, nvmlDeviceGetCodecUtilizationFn, "nvmlDeviceGetEncoderUtilization") \
  X(decoder, nvmlDeviceGetCodecUtilizationFn, "nvmlDeviceGetDecoderUtilization") \
  X(ecc, nvmlDeviceGetTotalEccErrorsFn, "nvmlDeviceGetTotalEccErrors") \
  X(throttle, nvmlDeviceGetUllFn, "nvmlDeviceGetCurrentClocksEventReasons", \
    "nvmlDeviceGetCurrentClocksThrottleReasons") \
  X(pcie_replay, nvmlDeviceGetUintFn, "nvmlDeviceGetPcieReplayCounter") \
  X(pcie_throughput, nvmlDeviceGetPcieThroughputFn, "nvmlDeviceGetPcieThroughput") \
  X(fan, nvmlDeviceGetUintFn, "nvmlDeviceGetFanSpeed") \
  X(pstate, nvmlDeviceGetIntFn, "nvmlDeviceGetPerformanceState") \
  X(processes, nvmlDeviceGetProcessesFn, "nvmlDeviceGetComputeRunningProcesses_v3", \
    "nvmlDeviceGetComputeRunningProcesses_v2") \
  X(event_set_create, nvmlEventSetCreateFn, "nvmlEventSetCreate") \
  X(event_set_free, nvmlEventSetFreeFn, "nvmlEventSetFree") \
  X(register_events, nvmlDeviceRegisterEventsFn, "nvmlDeviceRegisterEvents") \
  X(supported_events, nvmlDeviceGetUllFn, "nvmlDeviceGetSupportedEventTypes") \
  X(event_wait, nvmlEventSetWaitFn, "nvmlEventSetWait_v2", "nvmlEventSetWait") \
  /* The nvidia-smi set. */ \
  X(serial, nvmlDeviceGetStringFn, "nvmlDeviceGetSerial") \
  X(vbios, nvmlDeviceGetStringFn, "nvmlDeviceGetVbiosVersion") \
  X(inforom, nvmlDeviceGetInforomVersionFn, "nvmlDeviceGetInforomVersion") \
  X(max_clock, nvmlDeviceGetClockInfoFn, "nvmlDeviceGetMaxClockInfo") \
  X(supported_reasons, nvmlDeviceGetUllFn, "nvmlDeviceGetSupportedClocksEventReasons", \
    "nvmlDeviceGetSupportedClocksThrottleReasons") \
  X(pcie_gen, nvmlDeviceGetUintFn, "nvmlDeviceGetCurrPcieLinkGeneration") \
  X(pcie_gen_max, nvmlDeviceGetUintFn, "nvmlDeviceGetMaxPcieLinkGeneration") \
  X(pcie_gen_gpu_max, nvmlDeviceGetUintFn, "nvmlDeviceGetGpuMaxPcieLinkGeneration") \
  X(pcie_width, nvmlDeviceGetUintFn, "nvmlDeviceGetCurrPcieLinkWidth") \
  X(pcie_width_max, nvmlDeviceGetUintFn, "nvmlDeviceGetMaxPcieLinkWidth") \
  X(power_default, nvmlDeviceGetUintFn, "nvmlDeviceGetPowerManagementDefaultLimit") \
  X(power_mgmt_limit, nvmlDeviceGetUintFn, "nvmlDeviceGetPowerManagementLimit") \
  X(power_constraints, nvmlDeviceGetTwoUintFn, "nvmlDeviceGetPowerManagementLimitConstraints") \
  X(accounting_buffer, nvmlDeviceGetUintFn, "nvmlDeviceGetAccountingBufferSize") \
  X(gsp_mode, nvmlDeviceGetTwoUintFn, "nvmlDeviceGetGspFirmwareMode") \
  X(persistence, nvmlDeviceGetEnableStateFn, "nvmlDeviceGetPersistenceMode") \
  X(display_active, nvmlDeviceGetEnableStateFn, "nvmlDeviceGetDisplayActive") \
  X(display_mode, nvmlDeviceGetEnableStateFn, "nvmlDeviceGetDisplayMode") \
  X(accounting_mode, nvmlDeviceGetEnableStateFn, "nvmlDeviceGetAccountingMode") \
  X(compute_mode, nvmlDeviceGetIntFn, "nvmlDeviceGetComputeMode") \
  X(ecc_mode, nvmlDeviceGetEccModeFn, "nvmlDeviceGetEccMode") \
  X(memory_errors, nvmlDeviceGetMemoryErrorCounterFn, "nvmlDeviceGetMemoryErrorCounter") \
  X(remapped_rows, nvmlDeviceGetRemappedRowsFn, "nvmlDeviceGetRemappedRows") \
  X(remap_histogram, nvmlDeviceGetRowRemapperHistogramFn, "nvmlDeviceGetRowRemapperHistogram") \
  X(jpeg, nvmlDeviceGetCodecUtilizationFn, "nvmlDeviceGetJpgUtilization") \
  X(ofa, nvmlDeviceGetCodecUtilizationFn, "nvmlDeviceGetOfaUtilization") \
  X(encoder_stats, nvmlDeviceGetEncoderStatsFn, "nvmlDeviceGetEncoderStats") \
  /* GPM. */ \
  X(gpm_support, nvmlGpmQueryDeviceSupportFn, "nvmlGpmQueryDeviceSupport") \
  X(gpm_alloc, nvmlGpmSampleAllocFn, "nvmlGpmSampleAlloc") \
  X(gpm_free, nvmlGpmSampleFreeFn, "nvmlGpmSampleFree") \
  X(gpm_sample, nvmlGpmSampleGetFn, "nvmlGpmSampleGet") \
  X(gpm_mig_sample, nvmlGpmMigSampleGetFn, "nvmlGpmMigSampleGet") \
  X(gpm_metrics, nvmlGpmMetricsGetFn, "nvmlGpmMetricsGet")
// clang-format on

// The loaded library and every entry point gpulet uses. Owns the dlopen handle; immutable after
// Load(), so it is shared freely between threads.
struct NvmlLib {
  void* handle = nullptr;
  std::string path;
  bool simulate = false;
  std::vector<std::string> missing;  // optional symbols this library lacks

#define GPULET_NVML_FIELD(field, type, ...) type field = nullptr;
  GPULET_NVML_REQUIRED(GPULET_NVML_FIELD)
  GPULET_NVML_OPTIONAL(GPULET_NVML_FIELD)
#undef GPULET_NVML_FIELD
  const char* (*sim_last_error)() = nullptr;
  void (*sim_configure)(const char*, const char*) = nullptr;

  ~NvmlLib() {
    if (handle) dlclose(handle);
  }

  // The first of `names` the library exports; records the first name as missing otherwise.
  template <typename F>
  void Resolve(F& fn, std::initializer_list<const char*> names) {
    for (const char* n : names) {
      if (void* p = dlsym(handle, n)) {
        fn = reinterpret_cast<F>(p);
        return;
      }
    }
    missing.push_back(*names.begin());
  }

  std::string Error(nvmlReturn_t r) const {
    const char* s = error_string ? error_string(r) : nullptr;
    return s ? std::string(s) : absl::StrCat("NVML error ", r);
  }
};

// A library named by path is checked before dlopen maps it: the loader maps its segments as the
// headers say, and a truncated file (a partial copy, a full disk) then faults with SIGBUS inside
// dlopen, killing the process before any message. A bare soname is left to the loader's search.
absl::Status CheckSharedObject(const std::string& path) {
  if (path.find('/') == std::string::npos) return absl::OkStatus();
  auto bad = [&](const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load NVML library '", path, "': ", why));
  };
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return absl::OkStatus();  // missing or unreadable: dlopen says which, below
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return absl::OkStatus();
  Elf64_Ehdr eh{};
  std::vector<Elf64_Phdr> ph;
  bool read = std::fread(&eh, sizeof eh, 1, f) == 1;
  bool elf = read && std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
             eh.e_ident[EI_CLASS] == ELFCLASS64 && eh.e_type == ET_DYN &&
             eh.e_phentsize == sizeof(Elf64_Phdr) && eh.e_phnum > 0 && eh.e_phnum < 4096;
  if (elf && eh.e_phoff + uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr) <= size) {
    ph.resize(eh.e_phnum);
    elf = std::fseek(f, static_cast<long>(eh.e_phoff), SEEK_SET) == 0 &&
          std::fread(ph.data(), sizeof(Elf64_Phdr), ph.size(), f) == ph.size();
  } else if (elf) {
    std::fclose(f);
    return bad(absl::StrCat("truncated: its program headers end past the end of the ", size,
                            "-byte file"));
  }
  std::fclose(f);
  if (!elf) return bad(absl::StrCat("not a 64-bit ELF shared library (", size, " bytes)"));
  for (const Elf64_Phdr& p : ph) {
    if (p.p_type == PT_LOAD && (p.p_offset > size || p.p_filesz > size - p.p_offset)) {
      return bad(absl::StrCat("truncated: a segment at offset ", p.p_offset, " needs ", p.p_filesz,
                              " bytes, past the end of the ", size, "-byte file"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<NvmlLib>> LoadLibrary(const NvmlBackendOptions& o) {
  RETURN_IF_ERROR(CheckSharedObject(o.library));
  auto lib = std::make_shared<NvmlLib>();
  lib->path = o.library;
  lib->simulate = o.simulate;
  dlerror();
  // RTLD_LOCAL keeps NVML's symbols out of the global namespace (the interposer and CUDA libraries
  // loaded later must not bind to them by accident).
  lib->handle = dlopen(o.library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib->handle == nullptr) {
    const char* err = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load NVML library '", o.library, "': ", err ? err : "unknown dlopen error",
        o.simulate ? " (build the gpulet_fake_nvml target)"
                   : " (is the NVIDIA driver installed and libnvidia-ml.so.1 on the loader path? "
                     "check `ldconfig -p | grep nvidia-ml`, or pass --nvml-library PATH; "
                     "without a GPU use --simulate PROFILE)"));
  }
  NvmlLib& l = *lib;
#define GPULET_NVML_RESOLVE(field, type, ...) l.Resolve(l.field, {__VA_ARGS__});
  GPULET_NVML_REQUIRED(GPULET_NVML_RESOLVE)
  if (!l.missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("NVML library '", o.library,
                                                      "' lacks the required symbol ",
                                                      l.missing.front(), " (driver too old?)"));
  }
  GPULET_NVML_OPTIONAL(GPULET_NVML_RESOLVE)
#undef GPULET_NVML_RESOLVE
  if (o.simulate) {  // gpulet's own extensions, present only in the fake library
    l.sim_last_error = reinterpret_cast<const char* (*)()>(dlsym(l.handle, "gpuletSimLastError"));
    l.sim_configure =
        reinterpret_cast<void (*)(const char*, const char*)>(dlsym(l.handle, "gpuletSimConfigure"));
  }
  // memory_v2 and memory are alternatives: only both missing is a loss.
  std::erase_if(l.missing, [&](const std::string& m) {
    return (m == "nvmlDeviceGetMemoryInfo_v2" && l.memory) ||
           (m == "nvmlDeviceGetMemoryInfo" && l.memory_v2);
  });
  for (const std::string& m : l.missing) {
    spdlog::warn("NVML library {} lacks {}: the data it provides will be missing", o.library, m);
  }
  return lib;
}

// NVML's "this device cannot tell" answers: the field is left unset, not an error.
bool Unsupported(nvmlReturn_t r) {
  return r == NVML_ERROR_NOT_SUPPORTED || r == NVML_ERROR_FUNCTION_NOT_FOUND ||
         r == NVML_ERROR_NO_PERMISSION || r == NVML_ERROR_NO_DATA ||
         r == NVML_ERROR_INVALID_ARGUMENT;
}

uint64_t FieldAsU64(const nvmlFieldValue_t& f) {
  switch (f.valueType) {
    case 0:
      return f.value.dVal > 0 ? static_cast<uint64_t>(f.value.dVal) : 0;
    case 1:
      return f.value.uiVal;
    case 2:
      return f.value.ulVal;
    case 4:
      return f.value.sllVal > 0 ? static_cast<uint64_t>(f.value.sllVal) : 0;
    case 5:
      return f.value.siVal > 0 ? static_cast<uint64_t>(f.value.siVal) : 0;
    default:
      return f.value.ullVal;
  }
}

// GPM metric ids and where each lands (DCGM's PROF fields are these, as ratios).
constexpr std::pair<unsigned, std::optional<double> GpmMetrics::*> kGpmMetrics[] = {
    {NVML_GPM_METRIC_GRAPHICS_UTIL, &GpmMetrics::graphics_util},
    {NVML_GPM_METRIC_SM_UTIL, &GpmMetrics::sm_util},
    {NVML_GPM_METRIC_SM_OCCUPANCY, &GpmMetrics::sm_occupancy},
    {NVML_GPM_METRIC_ANY_TENSOR_UTIL, &GpmMetrics::tensor_util},
    {NVML_GPM_METRIC_DRAM_BW_UTIL, &GpmMetrics::dram_bw_util},
    {NVML_GPM_METRIC_FP64_UTIL, &GpmMetrics::fp64_util},
    {NVML_GPM_METRIC_FP32_UTIL, &GpmMetrics::fp32_util},
    {NVML_GPM_METRIC_FP16_UTIL, &GpmMetrics::fp16_util},
};

std::string NormalBusId(const char* bus_id) {  // NVML's 8-digit domain, upper case
  std::string s = absl::AsciiStrToUpper(bus_id);
  if (s.size() == 12) s = "0000" + s;  // "0000:18:00.0"
  return s;
}

PcieRelation FromTopologyLevel(nvmlGpuTopologyLevel_t l) {
  switch (l) {
    case NVML_TOPOLOGY_INTERNAL:
      return PcieRelation::kSameBoard;
    case NVML_TOPOLOGY_SINGLE:
      return PcieRelation::kSingleSwitch;
    case NVML_TOPOLOGY_MULTIPLE:
      return PcieRelation::kMultiSwitch;
    case NVML_TOPOLOGY_HOSTBRIDGE:
      return PcieRelation::kHostBridge;
    case NVML_TOPOLOGY_NODE:
      return PcieRelation::kSameNuma;
    case NVML_TOPOLOGY_SYSTEM:
      return PcieRelation::kCrossNuma;
    default:
      return PcieRelation::kUnknown;
  }
}

const char* BrandName(int b) {
  static const char* kNames[] = {"Unknown",
                                 "Quadro",
                                 "Tesla",
                                 "NVS",
                                 "GRID",
                                 "GeForce",
                                 "Titan",
                                 "NVIDIA Virtual Applications",
                                 "NVIDIA Virtual PC",
                                 "NVIDIA Virtual Compute Server",
                                 "NVIDIA RTX Virtual Workstation",
                                 "NVIDIA Cloud Gaming",
                                 "Quadro RTX",
                                 "NVIDIA RTX",
                                 "NVIDIA",
                                 "GeForce RTX",
                                 "Titan RTX"};
  return b >= 0 && b < static_cast<int>(std::size(kNames)) ? kNames[b] : "Unknown";
}

const char* ArchName(unsigned a) {
  static const char* kNames[] = {"",       "",       "Kepler", "Maxwell", "Pascal",   "Volta",
                                 "Turing", "Ampere", "Ada",    "Hopper",  "Blackwell"};
  return a < std::size(kNames) ? kNames[a] : "Unknown";
}

// Delivers events to subscribers. Shared with the Subscription handles so that a handle outliving
// the layer is harmless. Delivery and unsubscription serialise on `mu`.
struct Subscribers {
  std::mutex mu;
  std::map<int, GpuLayer::EventCallback> callbacks;
  int next_id = 0;
};

class SubscriptionImpl : public GpuLayer::Subscription {
 public:
  SubscriptionImpl(std::shared_ptr<Subscribers> s, int id) : s_(std::move(s)), id_(id) {}
  ~SubscriptionImpl() override {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->callbacks.erase(id_);
  }

 private:
  std::shared_ptr<Subscribers> s_;
  int id_;
};

// Thread-safety: `mu_` (shared for reads, exclusive for Reinit's swap) guards the inventory and
// handles; `reinit_mu_` serialises Reinit/destruction; the event thread only touches its own copy
// of the handle map and the Subscribers.
class NvmlGpuLayer : public GpuLayer {
 public:
  NvmlGpuLayer(std::shared_ptr<NvmlLib> lib, const NvmlBackendOptions& o)
      : lib_(std::move(lib)),
        fs_(o.host_root),
        owned_dir_(o.owned_dir),
        subscribers_(std::make_shared<Subscribers>()) {}

  ~NvmlGpuLayer() override {
    std::lock_guard<std::mutex> lock(reinit_mu_);
    StopEvents();
    FreeGpm();
    if (initialized_) lib_->shutdown();
    if (!owned_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(owned_dir_, ec);
    }
  }

  absl::Status Init() {
    std::lock_guard<std::mutex> lock(reinit_mu_);
    return InitLocked();
  }

  absl::StatusOr<Inventory> GetInventory() override {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (!has_inventory_) return absl::FailedPreconditionError("NVML was never initialised");
    return inventory_;
  }

  absl::StatusOr<Telemetry> GetTelemetry(uint32_t index) override {
    return ReadTelemetry(index, TelemetryRequest{});
  }

  absl::StatusOr<Telemetry> ReadTelemetry(uint32_t index, const TelemetryRequest& what) override {
    std::shared_lock<std::shared_mutex> lock(mu_);
    ASSIGN_OR_RETURN(nvmlDevice_t d, Handle(index));
    const NvmlLib& l = *lib_;
    Telemetry t;
    nvmlReturn_t fatal = NVML_SUCCESS;
    const char* fatal_call = "";
    // Runs one getter: success sets the field, "unsupported" leaves it unset, anything else (GPU
    // lost, driver gone) aborts the sample.
    auto get = [&](const char* call, auto fn, auto&& assign) {
      if (fatal != NVML_SUCCESS || fn == nullptr) return;
      nvmlReturn_t r = assign(fn);
      if (r != NVML_SUCCESS && !Unsupported(r)) fatal = r, fatal_call = call;
    };
    auto uint_into = [&](std::optional<uint32_t>& field) {
      return [&field, d](auto fn) {
        unsigned v = 0;
        nvmlReturn_t r = fn(d, &v);
        if (r == NVML_SUCCESS) field = v;
        return r;
      };
    };
    get("nvmlDeviceGetTemperature", l.temperature, [&](auto fn) {
      unsigned v = 0;
      nvmlReturn_t r = fn(d, NVML_TEMPERATURE_GPU, &v);
      if (r == NVML_SUCCESS) t.gpu_temp_c = v;
      return r;
    });
    // One call for all fields; each carries its own return code (unsupported = unset).
    get("nvmlDeviceGetFieldValues", l.field_values, [&](auto fn) {
      nvmlFieldValue_t fv[7]{};
      fv[0].fieldId = NVML_FI_DEV_MEMORY_TEMP;
      fv[1].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX;
      fv[2].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;
      fv[1].scopeId = fv[2].scopeId = kNvmlScopeAllLinks;
      fv[3].fieldId = NVML_FI_DEV_POWER_AVERAGE;
      fv[4].fieldId = NVML_FI_DEV_POWER_INSTANT;
      fv[5].fieldId = NVML_FI_DEV_PERF_POLICY_POWER;
      fv[6].fieldId = NVML_FI_DEV_PERF_POLICY_SYNC_BOOST;
      nvmlReturn_t r = fn(d, what.extended ? 7 : 3, fv);
      if (r != NVML_SUCCESS) return r;
      if (what.extended) {
        auto u32 = [&](int i, std::optional<uint32_t>& out) {
          if (fv[i].nvmlReturn == NVML_SUCCESS) out = static_cast<uint32_t>(FieldAsU64(fv[i]));
        };
        u32(3, t.power_average_mw);
        u32(4, t.power_instant_mw);
        if (fv[5].nvmlReturn == NVML_SUCCESS) t.clocks_event_power_cap_ns = FieldAsU64(fv[5]);
        if (fv[6].nvmlReturn == NVML_SUCCESS) t.clocks_event_sync_boost_ns = FieldAsU64(fv[6]);
      }
      if (fv[0].nvmlReturn == NVML_SUCCESS) {
        t.memory_temp_c =
            fv[0].valueType == 5 ? static_cast<uint32_t>(fv[0].value.siVal) : fv[0].value.uiVal;
      }
      for (auto [i, field] : {std::pair{1, &t.nvlink_tx_kib}, {2, &t.nvlink_rx_kib}}) {
        if (fv[i].nvmlReturn != NVML_SUCCESS) continue;
        *field = fv[i].valueType == 1 ? fv[i].value.uiVal : fv[i].value.ullVal;
      }
      return r;
    });
    std::pair<int, std::optional<uint32_t>*> clocks[] = {
        {NVML_CLOCK_SM, &t.sm_clock_mhz},
        {NVML_CLOCK_MEM, &t.memory_clock_mhz},
        {NVML_CLOCK_GRAPHICS, &t.graphics_clock_mhz},
        {NVML_CLOCK_VIDEO, &t.video_clock_mhz}};
    // Loop bindings reach the lambdas as init-captures: clang 14 (make lint, the thread-safety
    // preset) cannot capture structured bindings.
    for (auto [type, field] : clocks) {
      get("nvmlDeviceGetClockInfo", l.clock, [&, type = type, field = field](auto fn) {
        unsigned v = 0;
        nvmlReturn_t r = fn(d, type, &v);
        if (r == NVML_SUCCESS) *field = v;
        return r;
      });
    }
    get("nvmlDeviceGetPowerUsage", l.power, uint_into(t.power_usage_mw));
    get("nvmlDeviceGetEnforcedPowerLimit", l.power_limit, uint_into(t.power_limit_mw));
    get("nvmlDeviceGetTotalEnergyConsumption", l.energy, [&](auto fn) {
      unsigned long long v = 0;
      nvmlReturn_t r = fn(d, &v);
      if (r == NVML_SUCCESS) t.total_energy_mj = v;
      return r;
    });
    get("nvmlDeviceGetUtilizationRates", l.utilization, [&](auto fn) {
      nvmlUtilization_t u{};
      nvmlReturn_t r = fn(d, &u);
      if (r == NVML_SUCCESS) t.gpu_util_pct = u.gpu, t.memory_util_pct = u.memory;
      return r;
    });
    for (auto [fn, field] :
         {std::pair{l.encoder, &t.encoder_util_pct}, {l.decoder, &t.decoder_util_pct}}) {
      get("nvmlDeviceGetEncoder/DecoderUtilization", fn, [&, field = field](auto f) {
        unsigned v = 0, period = 0;
        nvmlReturn_t r = f(d, &v, &period);
        if (r == NVML_SUCCESS) *field = v;
        return r;
      });
    }
    get("nvmlDeviceGetMemoryInfo", l.memory_v2 ? nullptr : l.memory, [&](auto fn) {
      nvmlMemory_t m{};
      nvmlReturn_t r = fn(d, &m);
      if (r == NVML_SUCCESS)
        t.fb_total_bytes = m.total, t.fb_used_bytes = m.used, t.fb_free_bytes = m.free;
      return r;
    });
    get("nvmlDeviceGetMemoryInfo_v2", l.memory_v2, [&](auto fn) {
      nvmlMemory_v2_t m{};
      m.version = nvmlMemory_v2;
      nvmlReturn_t r = fn(d, &m);
      if (r == NVML_SUCCESS) {
        t.fb_total_bytes = m.total, t.fb_used_bytes = m.used, t.fb_free_bytes = m.free;
        t.fb_reserved_bytes = m.reserved;
      }
      return r;
    });
    std::tuple<int, int, std::optional<uint64_t>*> eccs[] = {
        {NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC, &t.ecc_sbe_volatile},
        {NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &t.ecc_dbe_volatile},
        {NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC, &t.ecc_sbe_aggregate},
        {NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC, &t.ecc_dbe_aggregate}};
    for (auto [type, counter, field] : eccs) {
      get("nvmlDeviceGetTotalEccErrors", l.ecc,
          [&, type = type, counter = counter, field = field](auto fn) {
            unsigned long long v = 0;
            nvmlReturn_t r = fn(d, type, counter, &v);
            if (r == NVML_SUCCESS) *field = v;
            return r;
          });
    }
    get("nvmlDeviceGetCurrentClocksEventReasons", l.throttle, [&](auto fn) {
      unsigned long long v = 0;
      nvmlReturn_t r = fn(d, &v);
      if (r == NVML_SUCCESS) t.throttle_reasons = v;
      return r;
    });
    get("nvmlDeviceGetPcieReplayCounter", l.pcie_replay, uint_into(t.pcie_replay_count));
    for (auto [counter, field] : {std::pair{NVML_PCIE_UTIL_TX_BYTES, &t.pcie_tx_kbps},
                                  {NVML_PCIE_UTIL_RX_BYTES, &t.pcie_rx_kbps}}) {
      get("nvmlDeviceGetPcieThroughput", l.pcie_throughput,
          [&, counter = counter, field = field](auto fn) {
            unsigned v = 0;
            nvmlReturn_t r = fn(d, counter, &v);
            if (r == NVML_SUCCESS) *field = v;
            return r;
          });
    }
    get("nvmlDeviceGetFanSpeed", l.fan, uint_into(t.fan_speed_pct));
    get("nvmlDeviceGetPerformanceState", l.pstate, [&](auto fn) {
      int v = 0;
      nvmlReturn_t r = fn(d, &v);
      if (r == NVML_SUCCESS && v >= 0 && v < 16) t.pstate = static_cast<uint32_t>(v);
      return r;
    });
    get("nvmlDeviceGetComputeRunningProcesses", l.processes, [&](auto fn) {
      std::vector<nvmlProcessInfo_t> buf(16);
      for (int attempt = 0; attempt < 4; ++attempt) {
        unsigned n = static_cast<unsigned>(buf.size());
        nvmlReturn_t r = fn(d, &n, buf.data());
        if (r == NVML_ERROR_INSUFFICIENT_SIZE) {  // processes started meanwhile: grow and retry
          buf.resize(n + 8);
          continue;
        }
        if (r == NVML_SUCCESS) {
          for (unsigned i = 0; i < n && i < buf.size(); ++i) {
            t.processes.push_back({buf[i].pid, buf[i].usedGpuMemory});
          }
        }
        return r;
      }
      return nvmlReturn_t{
          NVML_SUCCESS};  // still racing after 4 tries: report no processes this sample
    });
    if (what.extended) ReadExtended(d, t, get);
    if (fatal != NVML_SUCCESS) return CallError(fatal, fatal_call, index);
    if (what.profiling && inventory_.devices[index].gpm_supported) {
      ReadGpm(index, d, inventory_.devices[index], t);
    }
    return t;
  }

  // The nvidia-smi set's per-cycle fields. `get` is GetTelemetry's runner: unsupported answers
  // leave a field unset, a lost GPU aborts the sample.
  template <typename Get>
  void ReadExtended(nvmlDevice_t d, Telemetry& t, Get& get) const {
    const NvmlLib& l = *lib_;
    auto u32 = [d](std::optional<uint32_t>& field) {
      return [&field, d](auto fn) {
        unsigned v = 0;
        nvmlReturn_t r = fn(d, &v);
        if (r == NVML_SUCCESS) field = v;
        return r;
      };
    };
    auto flag = [d](std::optional<bool>& field) {
      return [&field, d](auto fn) {
        nvmlEnableState_t v = NVML_FEATURE_DISABLED;
        nvmlReturn_t r = fn(d, &v);
        if (r == NVML_SUCCESS) field = v == NVML_FEATURE_ENABLED;
        return r;
      };
    };
    get("nvmlDeviceGetPowerManagementLimit", l.power_mgmt_limit, u32(t.power_management_limit_mw));
    get("nvmlDeviceGetPersistenceMode", l.persistence, flag(t.persistence_mode));
    get("nvmlDeviceGetDisplayActive", l.display_active, flag(t.display_active));
    get("nvmlDeviceGetDisplayMode", l.display_mode, flag(t.display_attached));
    get("nvmlDeviceGetAccountingMode", l.accounting_mode, flag(t.accounting_mode));
    get("nvmlDeviceGetComputeMode", l.compute_mode, [&](auto fn) {
      int v = 0;
      nvmlReturn_t r = fn(d, &v);
      if (r == NVML_SUCCESS && v >= 0) t.compute_mode = static_cast<uint32_t>(v);
      return r;
    });
    get("nvmlDeviceGetEccMode", l.ecc_mode, [&](auto fn) {
      nvmlEnableState_t cur = NVML_FEATURE_DISABLED, pending = NVML_FEATURE_DISABLED;
      nvmlReturn_t r = fn(d, &cur, &pending);
      if (r == NVML_SUCCESS) {
        t.ecc_mode_current = cur == NVML_FEATURE_ENABLED;
        t.ecc_mode_pending = pending == NVML_FEATURE_ENABLED;
      }
      return r;
    });
    get("nvmlDeviceGetMigMode", l.mig_mode, [&](auto fn) {
      unsigned cur = 0, pending = 0;
      nvmlReturn_t r = fn(d, &cur, &pending);
      if (r == NVML_SUCCESS) t.mig_mode_pending = pending == NVML_FEATURE_ENABLED;
      return r;
    });
    get("nvmlDeviceGetCurrPcieLinkGeneration", l.pcie_gen, u32(t.pcie_link_gen_current));
    get("nvmlDeviceGetCurrPcieLinkWidth", l.pcie_width, u32(t.pcie_link_width_current));
    for (auto [fn, field] : {std::pair{l.jpeg, &t.jpeg_util_pct}, {l.ofa, &t.ofa_util_pct}}) {
      get("nvmlDeviceGetJpg/OfaUtilization", fn, [&, field = field](auto f) {
        unsigned v = 0, period = 0;
        nvmlReturn_t r = f(d, &v, &period);
        if (r == NVML_SUCCESS) *field = v;
        return r;
      });
    }
    get("nvmlDeviceGetEncoderStats", l.encoder_stats, [&](auto fn) {
      unsigned sessions = 0, fps = 0, latency = 0;
      nvmlReturn_t r = fn(d, &sessions, &fps, &latency);
      if (r == NVML_SUCCESS) {
        t.encoder_sessions = sessions, t.encoder_average_fps = fps;
        t.encoder_average_latency_us = latency;
      }
      return r;
    });
    for (int type = 0; type < 2; ++type) {
      for (int counter = 0; counter < 2; ++counter) {
        for (auto [loc, field] : {std::pair{NVML_MEMORY_LOCATION_DRAM, &t.ecc_dram[type][counter]},
                                  {NVML_MEMORY_LOCATION_SRAM, &t.ecc_sram[type][counter]}}) {
          get("nvmlDeviceGetMemoryErrorCounter", l.memory_errors,
              [&, loc = loc, field = field](auto fn) {
                unsigned long long v = 0;
                nvmlReturn_t r = fn(d, type, counter, loc, &v);
                if (r == NVML_SUCCESS) *field = v;
                return r;
              });
        }
      }
    }
    get("nvmlDeviceGetRemappedRows", l.remapped_rows, [&](auto fn) {
      unsigned corr = 0, unc = 0, pending = 0, failed = 0;
      nvmlReturn_t r = fn(d, &corr, &unc, &pending, &failed);
      if (r == NVML_SUCCESS) {
        t.remapped_rows_correctable = corr, t.remapped_rows_uncorrectable = unc;
        t.remapped_rows_pending = pending != 0, t.remapped_rows_failure = failed != 0;
      }
      return r;
    });
    get("nvmlDeviceGetRowRemapperHistogram", l.remap_histogram, [&](auto fn) {
      nvmlRowRemapperHistogramValues_t h{};
      nvmlReturn_t r = fn(d, &h);
      if (r == NVML_SUCCESS) {
        unsigned v[5] = {h.max, h.high, h.partial, h.low, h.none};
        for (int i = 0; i < 5; ++i) t.remap_histogram[i] = v[i];
      }
      return r;
    });
  }

  // One GPM sample of the GPU (or of each of its GPU instances when MIG is on) into the slot's
  // spare buffer; with the previous one, the metrics over the time between. A failed sample
  // starts that slot over (no metrics until two good samples in a row).
  void ReadGpm(uint32_t index, nvmlDevice_t d, const Device& dev, Telemetry& t) {
    const NvmlLib& l = *lib_;
    if (!l.gpm_alloc || !l.gpm_free || !l.gpm_sample || !l.gpm_metrics) return;
    std::lock_guard<std::mutex> lock(gpm_mu_);
    auto one = [&](uint32_t gi) -> std::optional<GpmMetrics> {
      GpmSlot& s = gpm_[{index, gi}];
      for (nvmlGpmSample_t* b : {&s.prev, &s.cur}) {
        if (*b == nullptr && l.gpm_alloc(b) != NVML_SUCCESS) *b = nullptr;
      }
      if (s.prev == nullptr || s.cur == nullptr) return std::nullopt;
      nvmlReturn_t r = gi == kWholeGpu    ? l.gpm_sample(d, s.cur)
                       : l.gpm_mig_sample ? l.gpm_mig_sample(d, gi, s.cur)
                                          : NVML_ERROR_FUNCTION_NOT_FOUND;
      if (r != NVML_SUCCESS) {
        s.have_prev = false;
        return std::nullopt;
      }
      std::optional<GpmMetrics> out;
      if (s.have_prev) {
        nvmlGpmMetricsGet_t mg{};
        mg.version = NVML_GPM_METRICS_GET_VERSION;
        mg.numMetrics = std::size(kGpmMetrics);
        mg.sample1 = s.prev;
        mg.sample2 = s.cur;
        for (size_t i = 0; i < std::size(kGpmMetrics); ++i) {
          mg.metrics[i].metricId = kGpmMetrics[i].first;
        }
        if (l.gpm_metrics(&mg) == NVML_SUCCESS) {
          out.emplace();
          for (size_t i = 0; i < std::size(kGpmMetrics); ++i) {
            if (mg.metrics[i].nvmlReturn != NVML_SUCCESS) continue;
            (*out).*kGpmMetrics[i].second = mg.metrics[i].value;
          }
        }
      }
      std::swap(s.prev, s.cur);
      s.have_prev = true;
      return out;
    };
    if (!dev.mig_enabled) {
      t.gpm = one(kWholeGpu);
      return;
    }
    for (const MigDevice& m : dev.mig_devices) {
      if (t.gpm_instances.count(m.gpu_instance_id)) continue;  // several compute instances
      if (auto g = one(m.gpu_instance_id)) t.gpm_instances[m.gpu_instance_id] = *g;
    }
  }

  // GPM buffers belong to the NVML session: freed before nvmlShutdown.
  void FreeGpm() {
    std::lock_guard<std::mutex> lock(gpm_mu_);
    for (auto& [key, s] : gpm_) {
      for (nvmlGpmSample_t b : {s.prev, s.cur}) {
        if (b) lib_->gpm_free(b);
      }
    }
    gpm_.clear();
  }

  absl::Status ProbeDevice(uint32_t index) override {
    {
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (!initialized_) return NotInitialised();
      if (index >= handles_.size()) return UnknownIndex(index);
      if (nvmlDevice_t d = handles_[index]) {
        char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        nvmlReturn_t r = lib_->uuid(d, buf, sizeof buf);
        return r == NVML_SUCCESS ? absl::OkStatus() : CallError(r, "nvmlDeviceGetUUID", index);
      }
    }
    // The GPU was lost when the inventory was read: see whether NVML gives a handle again.
    std::unique_lock<std::shared_mutex> lock(mu_);
    nvmlDevice_t d = nullptr;
    nvmlReturn_t r = lib_->handle_by_index(index, &d);
    if (r != NVML_SUCCESS) return CallError(r, "nvmlDeviceGetHandleByIndex", index);
    if (index < handles_.size()) handles_[index] = d;
    return absl::OkStatus();
  }

  absl::Status Reinit() override {
    std::lock_guard<std::mutex> lock(reinit_mu_);
    StopEvents();
    FreeGpm();
    if (initialized_) {
      lib_->shutdown();
      std::unique_lock<std::shared_mutex> l(mu_);
      initialized_ = false;
    }
    return InitLocked();
  }

  std::unique_ptr<Subscription> Subscribe(EventCallback cb) override {
    std::lock_guard<std::mutex> lock(subscribers_->mu);
    int id = subscribers_->next_id++;
    subscribers_->callbacks[id] = std::move(cb);
    return std::make_unique<SubscriptionImpl>(subscribers_, id);
  }

 private:
  absl::Status NotInitialised() const {
    return absl::UnavailableError(absl::StrCat(
        "NVML is not initialised", last_init_error_.empty() ? "" : ": ", last_init_error_));
  }
  absl::Status UnknownIndex(uint32_t index) const {
    return absl::NotFoundError(
        absl::StrCat("no GPU with index ", index, " (the node has ", handles_.size(), ")"));
  }

  absl::StatusOr<nvmlDevice_t> Handle(uint32_t index) const {
    if (!initialized_) return NotInitialised();
    if (index >= handles_.size()) return UnknownIndex(index);
    if (handles_[index] == nullptr) {
      return absl::UnavailableError(absl::StrCat("GPU ", index, " is lost (no NVML handle)"));
    }
    return handles_[index];
  }

  absl::Status CallError(nvmlReturn_t r, const char* call, int64_t index) const {
    std::string msg = absl::StrCat(call, index >= 0 ? absl::StrCat(" (GPU ", index, ")") : "", ": ",
                                   lib_->Error(r));
    if (r == NVML_ERROR_GPU_IS_LOST || r == NVML_ERROR_UNINITIALIZED ||
        r == NVML_ERROR_DRIVER_NOT_LOADED || r == NVML_ERROR_RESET_REQUIRED ||
        r == NVML_ERROR_TIMEOUT) {
      return absl::UnavailableError(msg);
    }
    if (Unsupported(r)) return absl::UnimplementedError(msg);
    return absl::InternalError(msg);
  }

  void SetInitError(std::string msg) {
    std::unique_lock<std::shared_mutex> lock(mu_);
    last_init_error_ = std::move(msg);
  }

  absl::Status InitLocked() {
    const NvmlLib& l = *lib_;
    nvmlReturn_t r = l.init();
    if (r != NVML_SUCCESS) {
      std::string detail = l.sim_last_error ? l.sim_last_error() : "";
      std::string msg =
          detail.empty() ? absl::StrCat("NVML initialisation failed: ", l.Error(r)) : detail;
      SetInitError(msg);
      return r == NVML_ERROR_DRIVER_NOT_LOADED || r == NVML_ERROR_UNINITIALIZED || !detail.empty()
                 ? absl::FailedPreconditionError(msg)
                 : absl::UnavailableError(msg);
    }
    std::vector<nvmlDevice_t> handles;
    absl::StatusOr<Inventory> inv = ReadInventory(handles);
    if (!inv.ok()) {
      l.shutdown();
      SetInitError(std::string(inv.status().message()));
      return inv.status();
    }
    {
      std::unique_lock<std::shared_mutex> lock(mu_);
      inventory_ = *std::move(inv);
      handles_ = std::move(handles);
      has_inventory_ = initialized_ = true;
      last_init_error_.clear();
    }
    StartEvents();
    return absl::OkStatus();
  }

  absl::StatusOr<Inventory> ReadInventory(std::vector<nvmlDevice_t>& handles) {
    const NvmlLib& l = *lib_;
    Inventory inv;
    char buf[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    if (l.driver_version && l.driver_version(buf, sizeof buf) == NVML_SUCCESS)
      inv.driver_version = buf;
    if (l.nvml_version && l.nvml_version(buf, sizeof buf) == NVML_SUCCESS) inv.nvml_version = buf;
    if (l.cuda_version) l.cuda_version(&inv.cuda_driver_version);
    unsigned count = 0;
    nvmlReturn_t r = l.count(&count);
    if (r != NVML_SUCCESS) return CallError(r, "nvmlDeviceGetCount", -1);
    handles.assign(count, nullptr);
    for (unsigned i = 0; i < count; ++i) {
      r = l.handle_by_index(i, &handles[i]);
      if (r == NVML_ERROR_GPU_IS_LOST && has_inventory_ && i < inventory_.devices.size()) {
        // A GPU fell off the bus: keep what we knew of it so indices stay stable; calls on it
        // answer Unavailable until it comes back (ProbeDevice) or the node is reset.
        spdlog::warn("GPU {} is lost; keeping its last known inventory", i);
        handles[i] = nullptr;
        inv.devices.push_back(inventory_.devices[i]);
        continue;
      }
      absl::StatusOr<Device> dev =
          r == NVML_SUCCESS ? ReadDevice(i, handles[i])
                            : absl::StatusOr<Device>(CallError(r, "nvmlDeviceGetHandleByIndex", i));
      if (!dev.ok() && !absl::IsUnavailable(dev.status())) return dev.status();
      if (!dev.ok()) {
        // Lost (or reset-required) before we ever read it: as nvidia-smi does, the others are still
        // listed and this one is flagged, rather than one GPU failing the whole node.
        const std::string why(dev.status().message());  // "<call> (GPU i): <NVML's words>"
        spdlog::warn("GPU {} cannot be read: {}", i, why);
        Device placeholder;
        placeholder.index = i;
        const size_t colon = why.rfind(": ");
        placeholder.error = colon == std::string::npos ? why : why.substr(colon + 2);
        handles[i] = nullptr;
        inv.devices.push_back(std::move(placeholder));
        continue;
      }
      inv.devices.push_back(*std::move(dev));
    }
    ReadTopology(inv, handles);
    return inv;
  }

  absl::StatusOr<Device> ReadDevice(unsigned i, nvmlDevice_t d) {
    const NvmlLib& l = *lib_;
    Device dev;
    dev.index = i;
    char buf[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    nvmlReturn_t r = l.uuid(d, buf, sizeof buf);
    if (r != NVML_SUCCESS) return CallError(r, "nvmlDeviceGetUUID", i);
    dev.uuid = buf;
    if (l.name && l.name(d, buf, sizeof buf) == NVML_SUCCESS) dev.name = buf;
    int brand = 0;
    if (l.brand && l.brand(d, &brand) == NVML_SUCCESS) dev.brand = BrandName(brand);
    unsigned v = 0;
    if (l.arch && l.arch(d, &v) == NVML_SUCCESS) dev.architecture = ArchName(v);
    if (l.minor && l.minor(d, &v) == NVML_SUCCESS) dev.minor = v;
    nvmlPciInfo_t pci{};
    if (l.pci && l.pci(d, &pci) == NVML_SUCCESS) {
      dev.pci_bus_id = NormalBusId(pci.busId);
      dev.pci_device_id = pci.pciDeviceId;
    }
    dev.memory_bytes = MemoryTotal(d);
    if (l.cc) l.cc(d, &dev.cc_major, &dev.cc_minor);
    nvmlDeviceAttributes_t attr{};
    if (l.attributes && l.attributes(d, &attr) == NVML_SUCCESS)
      dev.sm_count = attr.multiprocessorCount;
    if (l.power_limit && l.power_limit(d, &v) == NVML_SUCCESS) dev.power_limit_mw = v;
    unsigned current = 0, pending = 0;
    if (l.mig_mode && l.mig_mode(d, &current, &pending) == NVML_SUCCESS) {
      dev.mig_capable = true;
      dev.mig_enabled = current == NVML_FEATURE_ENABLED;
    }
    if (dev.mig_enabled) ReadMigDevices(dev, d);
    if (!dev.pci_bus_id.empty()) ReadSysfs(dev);
    ReadFacts(dev, d, pci, l.pci != nullptr && !dev.pci_bus_id.empty());
    nvmlGpmSupport_t gpm{};
    gpm.version = NVML_GPM_SUPPORT_VERSION;
    dev.gpm_supported =
        l.gpm_support && l.gpm_support(d, &gpm) == NVML_SUCCESS && gpm.isSupportedDevice != 0;
    return dev;
  }

  // The nvidia-smi set's static facts: read once here, not per sample.
  void ReadFacts(Device& dev, nvmlDevice_t d, const nvmlPciInfo_t& pci, bool have_pci) const {
    const NvmlLib& l = *lib_;
    DeviceFacts& f = dev.facts;
    char buf[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    if (l.serial && l.serial(d, buf, sizeof buf) == NVML_SUCCESS) f.serial = buf;
    if (l.vbios && l.vbios(d, buf, sizeof buf) == NVML_SUCCESS) f.vbios_version = buf;
    for (auto [object, out] :
         {std::pair{NVML_INFOROM_OEM, &f.inforom_oem}, {NVML_INFOROM_ECC, &f.inforom_ecc}}) {
      if (l.inforom && l.inforom(d, object, buf, sizeof buf) == NVML_SUCCESS) *out = buf;
    }
    if (have_pci) {
      f.pci_domain = pci.domain, f.pci_bus = pci.bus, f.pci_device = pci.device;
      f.pci_subsystem_id = pci.pciSubSystemId;
    }
    auto u32 = [d](auto fn, std::optional<uint32_t>& out) {
      unsigned v = 0;
      if (fn && fn(d, &v) == NVML_SUCCESS) out = v;
    };
    std::pair<int, std::optional<uint32_t>*> clocks[] = {
        {NVML_CLOCK_GRAPHICS, &f.max_graphics_clock_mhz},
        {NVML_CLOCK_SM, &f.max_sm_clock_mhz},
        {NVML_CLOCK_MEM, &f.max_memory_clock_mhz}};
    for (auto [type, out] : clocks) {
      unsigned v = 0;
      if (l.max_clock && l.max_clock(d, type, &v) == NVML_SUCCESS) *out = v;
    }
    unsigned long long reasons = 0;
    if (l.supported_reasons && l.supported_reasons(d, &reasons) == NVML_SUCCESS) {
      f.supported_clock_event_reasons = reasons;
    }
    u32(l.pcie_gen_max, f.pcie_link_gen_max);
    u32(l.pcie_gen_gpu_max, f.pcie_link_gen_gpu_max);
    u32(l.pcie_width_max, f.pcie_link_width_max);
    u32(l.power_default, f.power_default_limit_mw);
    u32(l.accounting_buffer, f.accounting_buffer_size);
    unsigned a = 0, b = 0;
    if (l.power_constraints && l.power_constraints(d, &a, &b) == NVML_SUCCESS) {
      f.power_min_limit_mw = a, f.power_max_limit_mw = b;
    }
    if (l.gsp_mode && l.gsp_mode(d, &a, &b) == NVML_SUCCESS) {
      f.gsp_firmware_enabled = a != 0, f.gsp_firmware_default = b != 0;
    }
  }

  uint64_t MemoryTotal(nvmlDevice_t d) const {
    if (lib_->memory_v2) {
      nvmlMemory_v2_t m{};
      m.version = nvmlMemory_v2;
      if (lib_->memory_v2(d, &m) == NVML_SUCCESS) return m.total;
    }
    nvmlMemory_t m{};
    if (lib_->memory && lib_->memory(d, &m) == NVML_SUCCESS) return m.total;
    return 0;
  }

  void ReadMigDevices(Device& dev, nvmlDevice_t d) {
    const NvmlLib& l = *lib_;
    unsigned max = 0;
    if (!l.mig_handle || !l.max_mig || l.max_mig(d, &max) != NVML_SUCCESS) {
      spdlog::warn("GPU {}: MIG is enabled but NVML cannot list MIG devices", dev.index);
      return;
    }
    for (unsigned j = 0; j < max; ++j) {
      nvmlDevice_t m = nullptr;
      if (l.mig_handle(d, j, &m) != NVML_SUCCESS) continue;  // unused slots answer NOT_FOUND
      MigDevice mig;
      mig.index = j;
      char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
      if (l.uuid(m, buf, sizeof buf) == NVML_SUCCESS) mig.uuid = buf;
      if (l.gi_id) l.gi_id(m, &mig.gpu_instance_id);
      if (l.ci_id) l.ci_id(m, &mig.compute_instance_id);
      nvmlDeviceAttributes_t a{};
      if (l.attributes && l.attributes(m, &a) == NVML_SUCCESS) {
        mig.gi_slices = a.gpuInstanceSliceCount;
        mig.ci_slices = a.computeInstanceSliceCount;
        mig.sm_count = a.multiprocessorCount;
        mig.memory_bytes = a.memorySizeMB << 20;
        mig.copy_engines = a.sharedCopyEngineCount;
        mig.decoders = a.sharedDecoderCount;
        mig.encoders = a.sharedEncoderCount;
        mig.jpeg_engines = a.sharedJpegCount;
        mig.ofa_engines = a.sharedOfaCount;
        mig.profile = MigProfileName(a.gpuInstanceSliceCount, a.computeInstanceSliceCount,
                                     a.memorySizeMB, dev.memory_bytes);
      } else {
        mig.memory_bytes = MemoryTotal(m);
      }
      dev.mig_devices.push_back(std::move(mig));
    }
  }

  // NUMA node and CPU list of the GPU's PCI function: sysfs wants a 4-digit domain, lower case.
  void ReadSysfs(Device& dev) {
    std::string dir = "/sys/bus/pci/devices/" + absl::AsciiStrToLower(dev.pci_bus_id.substr(4));
    auto numa = fs_.ReadFile(dir + "/numa_node");
    int n = -1;
    if (!numa.ok() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*numa), &n)) {
      spdlog::warn(
          "GPU {}: NUMA node unknown ({})", dev.index,
          numa.ok() ? "unparsable " + dir + "/numa_node" : std::string(numa.status().message()));
      n = -1;
    }
    dev.numa_node = n;
    auto cpus = fs_.ReadFile(dir + "/local_cpulist");
    if (cpus.ok()) dev.cpu_affinity = std::string(absl::StripAsciiWhitespace(*cpus));
    uint32_t cls = 0;
    if (auto c = fs_.ReadFile(dir + "/class");
        c.ok() && absl::SimpleHexAtoi(absl::StripAsciiWhitespace(*c), &cls)) {
      dev.facts.pci_base_class = (cls >> 16) & 0xff;
      dev.facts.pci_sub_class = (cls >> 8) & 0xff;
    }
  }

  void ReadTopology(Inventory& inv, const std::vector<nvmlDevice_t>& handles) {
    const NvmlLib& l = *lib_;
    const size_t n = handles.size();
    inv.topology.assign(n, std::vector<Link>(n));
    std::map<std::string, size_t> by_bus;
    for (size_t i = 0; i < n; ++i)
      if (!inv.devices[i].pci_bus_id.empty()) by_bus[inv.devices[i].pci_bus_id] = i;
    std::vector<int> switch_links(n, 0);
    for (size_t i = 0; i < n && l.nvlink_state && l.nvlink_remote_pci; ++i) {
      if (!handles[i]) continue;
      for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
        nvmlEnableState_t active = NVML_FEATURE_DISABLED;
        if (l.nvlink_state(handles[i], link, &active) != NVML_SUCCESS) break;  // no more links
        if (active != NVML_FEATURE_ENABLED) continue;
        nvmlPciInfo_t remote{};
        if (l.nvlink_remote_pci(handles[i], link, &remote) != NVML_SUCCESS) continue;
        nvmlIntNvLinkDeviceType_t type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
        if (l.nvlink_remote_type) l.nvlink_remote_type(handles[i], link, &type);
        auto peer = by_bus.find(NormalBusId(remote.busId));
        if (peer != by_bus.end() && peer->second != i) {
          ++inv.topology[i][peer->second].nvlinks;
        } else if (type == NVML_NVLINK_DEVICE_TYPE_SWITCH) {
          ++switch_links[i];
        }
      }
    }
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) {
        if (i == j) continue;
        Link& link = inv.topology[i][j];
        // Through NVSwitch every pair talks over all links of the GPU with fewer of them.
        if (switch_links[i] > 0 && switch_links[j] > 0) {
          link.nvlinks += std::min(switch_links[i], switch_links[j]);
        }
        nvmlGpuTopologyLevel_t level;
        if (l.common_ancestor && handles[i] && handles[j] &&
            l.common_ancestor(handles[i], handles[j], &level) == NVML_SUCCESS) {
          link.pcie = FromTopologyLevel(level);
        }
      }
    }
  }

  // ---- events ----

  void StartEvents() {
    const NvmlLib& l = *lib_;
    if (!l.event_set_create || !l.register_events || !l.event_wait || !l.event_set_free) return;
    nvmlEventSet_t set = nullptr;
    if (l.event_set_create(&set) != NVML_SUCCESS) {
      spdlog::warn("NVML: cannot create an event set; XID/ECC events will not be delivered");
      return;
    }
    std::map<nvmlDevice_t, std::pair<uint32_t, std::string>> devices;
    {
      std::shared_lock<std::shared_mutex> lock(mu_);
      for (size_t i = 0; i < handles_.size(); ++i) {
        if (!handles_[i]) continue;
        unsigned long long want = nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError |
                                  nvmlEventTypeDoubleBitEccError;
        unsigned long long supported = want;
        if (l.supported_events) l.supported_events(handles_[i], &supported);
        nvmlReturn_t r = l.register_events(handles_[i], want & supported, set);
        if (r != NVML_SUCCESS) {
          spdlog::warn("GPU {}: cannot register for XID/ECC events: {}", i, l.Error(r));
          continue;
        }
        devices[handles_[i]] = {static_cast<uint32_t>(i), inventory_.devices[i].uuid};
      }
    }
    stop_events_ = false;
    event_thread_ = std::thread([this, set, devices = std::move(devices)] {
      const NvmlLib& l = *lib_;
      while (!stop_events_.load()) {
        nvmlEventData_t data{};
        nvmlReturn_t r = l.event_wait(set, &data, kEventWaitMs);
        if (r == NVML_ERROR_TIMEOUT) continue;
        if (r != NVML_SUCCESS) {  // driver trouble: health checks see it; do not spin
          std::this_thread::sleep_for(std::chrono::milliseconds(kEventWaitMs));
          continue;
        }
        auto it = devices.find(data.device);
        if (it == devices.end()) continue;
        Event e;
        e.type = data.eventType & nvmlEventTypeXidCriticalError    ? Event::Type::kXid
                 : data.eventType & nvmlEventTypeDoubleBitEccError ? Event::Type::kDoubleBitEcc
                                                                   : Event::Type::kSingleBitEcc;
        e.device_index = it->second.first;
        e.uuid = it->second.second;
        e.data = data.eventData;
        e.gpu_instance_id = data.gpuInstanceId;
        e.compute_instance_id = data.computeInstanceId;
        e.time = std::chrono::system_clock::now();
        std::lock_guard<std::mutex> lock(subscribers_->mu);
        for (auto& [id, cb] : subscribers_->callbacks) cb(e);
      }
      l.event_set_free(set);
    });
  }

  void StopEvents() {
    stop_events_ = true;
    if (event_thread_.joinable()) event_thread_.join();
  }

  std::shared_ptr<NvmlLib> lib_;
  RootedFilesystem fs_;
  std::string owned_dir_;
  std::shared_ptr<Subscribers> subscribers_;

  std::mutex reinit_mu_;
  std::shared_mutex mu_;
  Inventory inventory_;
  std::vector<nvmlDevice_t> handles_;  // nullptr: lost when last read
  bool has_inventory_ = false, initialized_ = false;
  std::string last_init_error_;

  std::atomic<bool> stop_events_{false};
  std::thread event_thread_;

  // GPM sample buffers per (GPU index, GPU instance id or kWholeGpu): the previous sample and a
  // spare, swapped each read. Own lock: ReadTelemetry runs under the shared inventory lock.
  static constexpr uint32_t kWholeGpu = 0xFFFFFFFFu;
  struct GpmSlot {
    nvmlGpmSample_t prev = nullptr, cur = nullptr;
    bool have_prev = false;
  };
  std::mutex gpm_mu_;
  std::map<std::pair<uint32_t, uint32_t>, GpmSlot> gpm_;
};

}  // namespace

std::string MigProfileName(uint32_t gi_slices, uint32_t ci_slices, uint64_t memory_mib,
                           uint64_t parent_memory_bytes) {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  uint64_t gb = 0;
  if (parent_memory_bytes > 0) {
    double fraction =
        static_cast<double>(memory_mib << 20) / static_cast<double>(parent_memory_bytes);
    fraction = std::ceil(fraction * 8) / 8;
    gb = static_cast<uint64_t>(std::llround(fraction * std::ceil(parent_memory_bytes / kGiB)));
  } else {
    gb = static_cast<uint64_t>(std::llround(memory_mib / 1024.0));
  }
  return ci_slices == gi_slices ? absl::StrFormat("%dg.%dgb", gi_slices, gb)
                                : absl::StrFormat("%dc.%dg.%dgb", ci_slices, gi_slices, gb);
}

absl::StatusOr<std::unique_ptr<GpuLayer>> OpenNvmlGpuLayer(const NvmlBackendOptions& options) {
  auto cleanup = [&] {
    if (!options.owned_dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(options.owned_dir, ec);
    }
  };
  auto lib = LoadLibrary(options);
  if (!lib.ok()) {
    cleanup();
    return lib.status();
  }
  if (options.simulate && (*lib)->sim_configure) {
    (*lib)->sim_configure(options.machine.c_str(), options.sim_root.c_str());
  }
  auto layer = std::make_unique<NvmlGpuLayer>(*std::move(lib), options);
  RETURN_IF_ERROR(layer->Init());  // the layer's destructor removes owned_dir
  return layer;
}

}  // namespace gpulet::gpu
