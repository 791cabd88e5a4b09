#include "vgpu/interposer/core.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vgpu/interposer/glibc_floor.h"  // binds our glibc references to old versions

namespace gpulet::vcuda {
namespace {

template <class T>
T Fn(void* p) {
  return reinterpret_cast<T>(p);
}

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
void SleepUntilNs(int64_t t) {
  timespec ts{static_cast<time_t>(t / 1000000000), static_cast<long>(t % 1000000000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

// Strict decimal; false on empty, sign, junk or overflow.
bool ParseU64(const char* s, uint64_t* out) {
  if (s == nullptr || *s == 0) return false;
  uint64_t v = 0;
  for (; *s; ++s) {
    if (*s < '0' || *s > '9') return false;
    uint64_t d = static_cast<uint64_t>(*s - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

uint64_t Mix(uint64_t k) {  // Fibonacci hashing: the top bits of k x 2^64/phi index the table
  return (k * 0x9e3779b97f4a7c15ull) >> 40;
}
constexpr uint64_t kTombstone = 1;

// 16 UUID bytes -> "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (NVML's spelling).
void UuidText(const char* bytes, char out[64]) {
  static const char kHex[] = "0123456789abcdef";
  int o = 0;
  memcpy(out, "GPU-", 4);
  o = 4;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out[o++] = '-';
    out[o++] = kHex[(bytes[i] >> 4) & 15];
    out[o++] = kHex[bytes[i] & 15];
  }
  out[o] = 0;
}

}  // namespace

ClockFns RealClockFns() { return {&MonotonicNs, &SleepUntilNs}; }

bool ResolveRealDriver(void* cuda, void* nvml, void* (*sym)(void*, const char*), RealDriver* out) {
#define GPULET_RESOLVE_CUDA(name) out->name = sym(cuda, #name);
// NVML from libnvidia-ml; else from the driver's handle, which only the fake driver answers.
#define GPULET_RESOLVE_NVML(name)                \
  out->name = nvml ? sym(nvml, #name) : nullptr; \
  if (out->name == nullptr && cuda != nullptr) out->name = sym(cuda, #name);
  GPULET_REAL_CUDA(GPULET_RESOLVE_CUDA)
  GPULET_REAL_NVML(GPULET_RESOLVE_NVML)
#undef GPULET_RESOLVE_CUDA
#undef GPULET_RESOLVE_NVML
  // What the core itself cannot work without; everything else is forwarded only if present.
  return out->cuMemAlloc_v2 && out->cuMemFree_v2 && out->cuCtxGetDevice && out->cuDeviceGetCount &&
         out->cuDeviceGetUuid && out->cuCtxGetCurrent;
}

bool ParseUuid(const char* text, char out[16]) {
  if (text == nullptr || strncmp(text, "GPU-", 4) != 0) return false;
  int n = 0;
  for (const char* p = text + 4; *p; ++p) {
    if (*p == '-') continue;
    int v = *p >= '0' && *p <= '9'   ? *p - '0'
            : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10
            : *p >= 'A' && *p <= 'F' ? *p - 'A' + 10
                                     : -1;
    if (v < 0 || n >= 32) return false;
    if (n % 2 == 0)
      out[n / 2] = static_cast<char>(v << 4);
    else
      out[n / 2] = static_cast<char>(out[n / 2] | v);
    ++n;
  }
  return n == 32;
}

Config ParseConfig(const char* (*get)(const char*)) {
  Config c;
  const char* disable = get(vgpu::kVarDisable);
  if (disable && strcmp(disable, "1") == 0) {
    c.disabled = true;
    return c;
  }
  auto fail = [&c](const char* name, const char* value, const char* want) {
    if (c.invalid) return;  // keep the first problem: one clear message
    c.invalid = true;
    snprintf(c.error, sizeof c.error,
             "gpulet-vcuda: %s=\"%s\" is not %s; refusing GPU memory allocations", name, value,
             want);
  };
  if (const char* v = get(vgpu::kVarMemoryLimit)) {
    if (!ParseU64(v, &c.memory_limit) || c.memory_limit >= (uint64_t{1} << 48))
      fail(vgpu::kVarMemoryLimit, v, "a decimal byte count below 2^48");
  }
  uint64_t v64;
  if (const char* v = get(vgpu::kVarCoreLimit)) {
    if (!ParseU64(v, &v64) || v64 < 1 || v64 > 100)
      fail(vgpu::kVarCoreLimit, v, "a percentage 1-100");
    else
      c.core_limit = static_cast<uint32_t>(v64);
  }
  c.core_ceiling = c.core_limit;
  if (const char* v = get(vgpu::kVarCoreCeiling)) {
    if (!ParseU64(v, &v64) || v64 < c.core_limit || v64 > 100)
      fail(vgpu::kVarCoreCeiling, v, "a percentage between GPULET_VGPU_CORE_LIMIT and 100");
    else
      c.core_ceiling = static_cast<uint32_t>(v64);
  }
  if (const char* v = get(vgpu::kVarContextBytes)) {
    if (!ParseU64(v, &c.context_bytes)) fail(vgpu::kVarContextBytes, v, "a decimal byte count");
  }
  // The container's GPU, by UUID: the process-local ordinal follows from it whatever
  // CUDA_VISIBLE_DEVICES reorders or hides. Several GPUs or an index: limit every device.
  // GPULET_VGPU_UUID first: NVIDIA_VISIBLE_DEVICES belongs to the runtime, and a container that
  // gets its GPU through CDI has it set to "void" by the spec (the shim's volume mounts: a path).
  const char* v = get(vgpu::kVarUuid);
  if (v == nullptr) v = get("NVIDIA_VISIBLE_DEVICES");
  if (v != nullptr && strchr(v, ',') == nullptr) c.has_uuid = ParseUuid(v, c.uuid);
  return c;
}

void Core::Init(const RealDriver& real, const Config& config, vgpu::AccountingRegion* region,
                ClockFns clock) {
  real_ = real;
  config_ = config;
  region_ = region;
  clock_ = clock;
  all_limited_ = !config.has_uuid;
  if (config.disabled) return;
  if (config.invalid) config_.memory_limit = 1;  // fail closed: nothing but a byte fits
  region_->memory_limit.store(config_.memory_limit, std::memory_order_relaxed);
  region_->core_limit.store(config.core_limit, std::memory_order_relaxed);
  region_->core_ceiling.store(config.core_ceiling, std::memory_order_relaxed);
  if (config.has_uuid && region_->device_uuid[0] == 0) {
    char text[64];
    UuidText(config.uuid, text);
    memcpy(region_->device_uuid, text, sizeof text);
  }
  track_memory_ = config_.memory_limit > 0;
  if (track_memory_) {
    uint64_t limit = config_.memory_limit;
    budget_reset_ = static_cast<int64_t>(limit / 16 > (1u << 20) ? limit / 16 : (1u << 20));
    call_bytes_ = budget_reset_ / 1024;
    budget_.store(budget_reset_, std::memory_order_relaxed);
    near_limit_ = limit - limit / 8;
  }
  pacing_ = config.core_limit < 100 && real_.cuEventCreate && real_.cuEventRecord &&
            real_.cuEventQuery && real_.cuEventElapsedTime && real_.cuEventSynchronize;
  if (config.core_ceiling > config.core_limit && real_.nvmlInit_v2 &&
      Fn<nvmlReturn_t (*)()>(real_.nvmlInit_v2)() == NVML_SUCCESS) {
    if (config.has_uuid && real_.nvmlDeviceGetHandleByUUID) {
      Fn<nvmlReturn_t (*)(const char*, nvmlDevice_t*)>(real_.nvmlDeviceGetHandleByUUID)(
          region_->device_uuid, &nvml_device_);
    } else if (real_.nvmlDeviceGetHandleByIndex_v2) {
      Fn<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>(real_.nvmlDeviceGetHandleByIndex_v2)(
          0, &nvml_device_);
    }
  }
  uint32_t expect = 0;
  region_->effective_share_permille.compare_exchange_strong(expect, config.core_limit * 10);
  EnsureSlot();
}

bool Core::EnsureSlot() {
  if (slot_.load(std::memory_order_acquire) >= 0) return true;
  int pid = static_cast<int>(getpid());
  uint64_t owner = vgpu::OwnerWord(pid, vgpu::ProcessStartTicks(pid));
  int s = vgpu::ClaimSlot(*region_, owner);
  if (s < 0) return false;
  int expect = -1;
  owner_ = owner;
  if (!slot_.compare_exchange_strong(expect, s)) vgpu::ReleaseSlot(*region_, s, owner);
  return true;
}

void Core::AfterFork() {
  // A descriptor of the accounting file of its own (the parent's carries the parent's slot
  // locks, which must die with the parent), then a slot of its own on first use.
  vgpu::AccountingAfterFork();
  slot_.store(-1, std::memory_order_release);
  // The child has no CUDA context (they do not survive fork) and a pid of its own to find.
  ctx_mu_ = PTHREAD_MUTEX_INITIALIZER;
  vmm_mu_ = PTHREAD_MUTEX_INITIALIZER;
  measured_.store(false, std::memory_order_relaxed);
  host_pid_ = 0;
  nvml_state_ = 0;
  overhead_ = 0;
  contexts_ = 0;
  ctx_mask_ = 0;
  for (auto& n : dev_contexts_) n = 0;
  for (auto& d : nvml_dev_) d = nullptr;
  for (Entry& e : hot_) e.key.store(0, std::memory_order_relaxed);
  for (Entry& e : table_) e.key.store(0, std::memory_order_relaxed);
  for (auto& r : primary_refs_) r.store(0, std::memory_order_relaxed);
  ring_head_ = ring_count_ = 0;
  for (Pending& p : ring_) p = Pending{};
  // The child's GPU time is its own: NVML samples it under its own pid.
  charged_window_.store(0, std::memory_order_relaxed);
  charged_total_ = own_total_ = 0;
  refunded_ = 0;
  credit_ns_.store(0, std::memory_order_relaxed);
}

void Core::Exit() {
  int s = slot_.exchange(-1);
  if (s >= 0) vgpu::ReleaseSlot(*region_, s, owner_);
}

// --- devices ------------------------------------------------------------------------------------

void Core::ResolveDevices() {
  int expect = 0;
  if (!devices_state_.compare_exchange_strong(expect, 1)) {
    while (devices_state_.load(std::memory_order_acquire) == 1) sched_yield();
    return;
  }
  int count = 0;
  uint64_t mask = 0;
  bool ok = Fn<cuda::cuDeviceGetCount_t>(real_.cuDeviceGetCount)(&count) == CUDA_SUCCESS;
  for (int i = 0; ok && i < count && i < 64; ++i) {
    CUuuid u;
    if (Fn<cuda::cuDeviceGetUuid_t>(real_.cuDeviceGetUuid)(&u, i) != CUDA_SUCCESS)
      ok = false;
    else if (memcmp(u.bytes, config_.uuid, 16) == 0)
      mask |= uint64_t{1} << i;
  }
  if (!ok) {  // driver not initialised yet: count everything for now, resolve next time
    devices_state_.store(0, std::memory_order_release);
    return;
  }
  limited_mask_.store(mask, std::memory_order_relaxed);
  // count >= 1 and every ordinal below it limited; ordinals >= count do not exist (the driver
  // refuses them, and a refused allocation is un-reserved), so counting them is harmless.
  if (count >= 1 && count <= 64 &&
      mask == (count == 64 ? ~uint64_t{0} : (uint64_t{1} << count) - 1))
    visible_all_limited_.store(true, std::memory_order_relaxed);
  devices_state_.store(2, std::memory_order_release);
}

bool Core::LimitedSlow(int ordinal) {
  if (devices_state_.load(std::memory_order_acquire) != 2) ResolveDevices();
  if (ordinal < 0) {
    CUdevice d;
    if (Fn<cuda::cuCtxGetDevice_t>(real_.cuCtxGetDevice)(&d) != CUDA_SUCCESS) return true;
    ordinal = d;
  }
  return ordinal >= 64 || (limited_mask_.load(std::memory_order_relaxed) >> ordinal) & 1;
}

// --- memory -------------------------------------------------------------------------------------

// Two open-addressing tables with linear probing, lock-free: a handle lives in exactly one entry
// (the CAS that claims an empty or tombstoned entry makes it exclusive). It goes to the first free
// entry of its window of kHotProbes in hot_ (1024 entries, 16 KiB), else of table_ (65536). An
// entry only ever goes 0 -> key -> tombstone -> key ..., never back to 0, so a search may stop at
// the first 0 of a probe sequence: the key cannot lie beyond it. Why two levels: with one 1 MiB
// table every allocation touched a random cache line, and that miss was most of the per-allocation
// cost (perf: 77% of TableInsert's samples on the load of the key).
bool Core::TableInsert(uint64_t key, uint64_t bytes) {
  const uint64_t h = Mix(key);
  // The key is claimed first and the size written after: writing the size first let two threads
  // racing for one free entry leave the winner's key beside the loser's size. Nobody looks this
  // handle up before the allocation returns (its free comes after), so the size is in place by
  // then.
  auto claim = [&](Entry& e) {
    uint64_t k = e.key.load(std::memory_order_relaxed);
    if (k != 0 && k != kTombstone) return false;
    if (!e.key.compare_exchange_strong(k, key, std::memory_order_acq_rel)) return false;
    e.bytes.store(bytes, std::memory_order_release);
    return true;
  };
  for (int probe = 0; probe < kHotProbes; ++probe) {
    if (claim(hot_[(h + probe) & (kHotSize - 1)])) return true;
  }
  for (int probe = 0; probe < kTableSize; ++probe) {
    if (claim(table_[(h + probe) & (kTableSize - 1)])) return true;
  }
  return false;
}

uint64_t Core::TableErase(uint64_t key) {
  const uint64_t h = Mix(key);
  // 1: found (result in *bytes), 0: not in this table, -1: stop (absent, or a concurrent free).
  auto find = [key](Entry* t, int mask, int probes, uint64_t h, uint64_t* bytes) {
    for (int probe = 0; probe < probes; ++probe) {
      Entry& e = t[(h + probe) & mask];
      uint64_t k = e.key.load(std::memory_order_acquire);
      if (k == 0) return 0;
      if (k != key) continue;
      *bytes = e.bytes.load(std::memory_order_acquire);
      return e.key.compare_exchange_strong(k, kTombstone) ? 1 : -1;  // -1: a concurrent double
    }                                                                // free; the driver reports it
    return 0;
  };
  uint64_t bytes = 0;
  int r = find(hot_, kHotSize - 1, kHotProbes, h, &bytes);
  if (r == 0) r = find(table_, kTableSize - 1, kTableSize, h, &bytes);
  return r == 1 ? bytes : 0;
}

uint64_t Core::TableFind(uint64_t key) {
  const uint64_t h = Mix(key);
  auto find = [key, h](Entry* t, int mask, int probes, uint64_t* bytes) {
    for (int probe = 0; probe < probes; ++probe) {
      Entry& e = t[(h + probe) & mask];
      uint64_t k = e.key.load(std::memory_order_acquire);
      if (k == 0) return false;
      if (k != key) continue;
      *bytes = e.bytes.load(std::memory_order_acquire);
      return true;
    }
    return false;
  };
  uint64_t bytes = 0;
  if (!find(hot_, kHotSize - 1, kHotProbes, &bytes))
    find(table_, kTableSize - 1, kTableSize, &bytes);
  return bytes;
}

// --- VMM: the charge of a physical allocation stays while it is mapped (see Release) ----------
// Every mapping is recorded (address -> handle and size) and every handle's count of mappings,
// whether its memory is counted or not (a handle of another GPU, or host memory, is only counted
// in kVmmMaps and never charged). Caller holds vmm_mu_.

void Core::NoteMapped(uint64_t ptr, uint64_t size, uint64_t handle) {
  if (!TableInsert(Key(Kind::kMapping, ptr), handle) ||
      !TableInsert(Key(Kind::kMapSize, ptr), size)) {
    table_overflow_.fetch_add(1, std::memory_order_relaxed);  // untracked: a release keeps it
  }
  uint64_t maps = TableErase(Key(Kind::kVmmMaps, handle));
  if (!TableInsert(Key(Kind::kVmmMaps, handle), maps + 1))
    table_overflow_.fetch_add(1, std::memory_order_relaxed);
}

// cuMemUnmap takes the whole mapped range, which may span several adjacent mappings.
void Core::NoteUnmapped(uint64_t ptr, uint64_t size) {
  for (uint64_t p = ptr; p < ptr + size;) {
    uint64_t handle = TableErase(Key(Kind::kMapping, p));
    uint64_t len = TableErase(Key(Kind::kMapSize, p));
    if (handle == 0) return;
    uint64_t maps = TableErase(Key(Kind::kVmmMaps, handle));
    if (maps > 1) {
      TableInsert(Key(Kind::kVmmMaps, handle), maps - 1);
    } else if (uint64_t bytes = TableErase(Key(Kind::kVmmReleased, handle)); bytes != 0) {
      // Released earlier and now unmapped everywhere: the driver frees it.
      vgpu::Unreserve(*region_, slot_.load(std::memory_order_relaxed), bytes);
    }
    if (len == 0) return;
    p += len;
  }
}

void Core::NoteReleased(uint64_t handle, uint64_t bytes, CUresult released) {
  if (released != CUDA_SUCCESS) {
    TableInsert(Key(Kind::kVmm, handle), bytes);  // still allocated: keep it on the books
  } else if (TableFind(Key(Kind::kVmmMaps, handle)) != 0) {
    // Still mapped: the driver keeps the memory until the last cuMemUnmap. A full table keeps
    // the charge for good (the safe side).
    if (!TableInsert(Key(Kind::kVmmReleased, handle), bytes))
      table_overflow_.fetch_add(1, std::memory_order_relaxed);
  } else {
    vgpu::Unreserve(*region_, slot_.load(std::memory_order_relaxed), bytes);
  }
}

CUresult Core::AllocPitch(CUdeviceptr* p, size_t* pitch, size_t width, size_t height,
                          unsigned elem) {
  auto call = [&] {
    return Fn<cuda::cuMemAllocPitch_t>(real_.cuMemAllocPitch_v2)(p, pitch, width, height, elem);
  };
  if (config_.disabled || p == nullptr || pitch == nullptr) return call();
  // Pitch alignment is at most 512 bytes on every NVIDIA GPU so far (texturePitchAlignment).
  uint64_t bound = ((uint64_t{width} + 511) & ~uint64_t{511}) * height;
  bool counted;
  if (CUresult r = Reserve(-1, bound, &counted); r != CUDA_SUCCESS) return r;
  CUresult r = call();
  if (r != CUDA_SUCCESS) {
    Undo(bound, counted);
    if (pads_.load(std::memory_order_relaxed) != 0) SettlePad();
    return r;
  }
  uint64_t actual = uint64_t{*pitch} * height;
  if (actual < bound) {
    Undo(bound - actual, counted);
  } else if (actual > bound) {
    bool extra_counted;
    if (Reserve(-1, actual - bound, &extra_counted) != CUDA_SUCCESS) {
      Fn<cuda::cuMemFree_t>(real_.cuMemFree_v2)(*p);
      Undo(bound, counted);
      if (pads_.load(std::memory_order_relaxed) != 0) SettlePad();
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  Commit(Kind::kPointer, *p, actual, counted);
  if (pads_.load(std::memory_order_relaxed) != 0) SettlePad();
  return CUDA_SUCCESS;
}

uint64_t Core::ArrayBytes(const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned levels) {
  uint64_t elem;
  switch (d.Format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      elem = 1;
      break;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      elem = 2;
      break;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      elem = 4;
      break;
    default:
      elem = 4;
      break;  // packed/compressed formats: at most 4 bytes per channel element
  }
  uint64_t total = 0;
  for (unsigned l = 0; l < (levels ? levels : 1); ++l) {
    auto dim = [l](size_t v, bool optional) -> uint64_t {
      if (v == 0) return optional ? 1 : 0;
      uint64_t s = v >> l;
      return s ? s : 1;
    };
    total += dim(d.Width, false) * dim(d.Height, true) * dim(d.Depth, true) * elem * d.NumChannels;
  }
  return total;
}

// --- contexts: the memory the driver holds beyond allocations ---------------------------------
//
// A CUDA context holds device memory no allocation call shows (about 518 MiB for a bare context,
// about 610 MiB for a PyTorch process on an H200), and the driver's rounding and lazily loaded
// module code add more. The process is charged what NVML says it really holds beyond its counted
// allocations ("overhead"): reserved as an estimate before the context exists, set to the
// measured value right after (the context is undone if that does not fit), and raised whenever a
// later measurement finds more. Where NVML cannot tell (no NVML, our pid not identifiable), the
// estimate stays as the charge. See docs/interposer.md, "Memory the driver holds".

bool Core::NvmlReady() {
  if (nvml_state_ == 0) {
    nvml_state_ = -1;
    if (real_.nvmlInit_v2 && real_.nvmlDeviceGetHandleByUUID &&
        real_.nvmlDeviceGetComputeRunningProcesses_v3 &&
        Fn<nvmlReturn_t (*)()>(real_.nvmlInit_v2)() == NVML_SUCCESS)
      nvml_state_ = 1;
  }
  return nvml_state_ == 1;
}

nvmlDevice_t Core::NvmlHandle(int ordinal) {
  if (ordinal < 0 || ordinal >= 64 || !NvmlReady()) return nullptr;
  if (nvml_dev_[ordinal] != nullptr) return nvml_dev_[ordinal];
  CUuuid u;
  if (Fn<cuda::cuDeviceGetUuid_t>(real_.cuDeviceGetUuid)(&u, ordinal) != CUDA_SUCCESS)
    return nullptr;
  char text[64];
  UuidText(u.bytes, text);
  nvmlDevice_t d = nullptr;
  if (Fn<nvmlReturn_t (*)(const char*, nvmlDevice_t*)>(real_.nvmlDeviceGetHandleByUUID)(text, &d) !=
      NVML_SUCCESS)
    return nullptr;
  nvml_dev_[ordinal] = d;
  return d;
}

int Core::NvmlProcesses(int ordinal, unsigned* pids, uint64_t* bytes, int max) {
  nvmlDevice_t d = NvmlHandle(ordinal);
  if (d == nullptr) return -1;
  nvmlProcessInfo_t infos[128];
  unsigned count = 128;
  using ListFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned*, nvmlProcessInfo_t*);
  // More than 128 processes on one GPU (INSUFFICIENT_SIZE): treated as "cannot tell".
  if (Fn<ListFn>(real_.nvmlDeviceGetComputeRunningProcesses_v3)(d, &count, infos) != NVML_SUCCESS)
    return -1;
  int n = 0;
  for (unsigned i = 0; i < count && i < 128 && n < max; ++i, ++n) {
    pids[n] = infos[i].pid;
    if (bytes) bytes[n] = infos[i].usedGpuMemory;
  }
  return n;
}

bool Core::OwnUsed(uint64_t* used) {
  if (host_pid_ <= 0 || ctx_mask_ == 0) return false;
  uint64_t sum = 0;
  for (int i = 0; i < 64; ++i) {
    if (((ctx_mask_ >> i) & 1) == 0) continue;
    unsigned pids[128];
    uint64_t bytes[128];
    int n = NvmlProcesses(i, pids, bytes, 128);
    if (n < 0) return false;
    bool found = false;
    for (int k = 0; k < n && !found; ++k) {
      if (pids[k] != static_cast<unsigned>(host_pid_)) continue;
      if (bytes[k] == ~0ull) return false;  // NVML_VALUE_NOT_AVAILABLE
      sum += bytes[k];
      found = true;
    }
    if (!found) return false;
  }
  *used = sum;
  return true;
}

// What the driver holds for the whole container on this process's GPUs: each slot's charge, or
// what NVML lists for its process where that is more (another process's rounding or context that
// it has not reconciled yet: each process reconciles only itself). False if NVML cannot tell.
// Caller holds ctx_mu_.
bool Core::ContainerHeld(uint64_t* total) {
  if (ctx_mask_ == 0) return false;
  uint32_t n = region_->high_water.load(std::memory_order_seq_cst);
  if (n > vgpu::kAccountingSlots) n = vgpu::kAccountingSlots;
  uint64_t nvml[vgpu::kAccountingSlots] = {};
  for (int d = 0; d < 64; ++d) {
    if (((ctx_mask_ >> d) & 1) == 0) continue;
    unsigned pids[128];
    uint64_t bytes[128];
    int k = NvmlProcesses(d, pids, bytes, 128);
    if (k < 0) return false;
    for (int i = 0; i < k; ++i) {
      if (bytes[i] == ~0ull) continue;  // NVML_VALUE_NOT_AVAILABLE: the charge stands
      for (uint32_t s = 0; s < n; ++s) {
        // A free or dead slot's process is not this container's any more (a dead one's memory
        // is being returned by the driver, and the slot may be taken by a new process).
        uint64_t o = region_->owner[s].load(std::memory_order_relaxed);
        if (o != 0 && (o & vgpu::kOwnerDead) == 0 &&
            region_->nvml_pid[s].load(std::memory_order_relaxed) == pids[i])
          nvml[s] += bytes[i];
      }
    }
  }
  uint64_t sum = 0;
  for (uint32_t s = 0; s < n; ++s) {
    uint64_t held = region_->held[s].load(std::memory_order_seq_cst) & vgpu::kHeldBytesMask;
    sum += held > nvml[s] ? held : nvml[s];
  }
  *total = sum;
  return true;
}

uint64_t Core::ContextEstimate() const {
  // The file's learned value may only raise the charge (the container can write it).
  uint64_t learned = region_->context_bytes.load(std::memory_order_relaxed);
  return learned > config_.context_bytes ? learned : config_.context_bytes;
}

void Core::SetOverhead(uint64_t target) {
  int s = slot_.load(std::memory_order_relaxed);
  if (s < 0) return;
  // The driver already holds this memory: it is charged even past the limit (later allocations
  // are then refused until the container is back under it).
  if (target > overhead_)
    region_->held[s].fetch_add(target - overhead_, std::memory_order_seq_cst);
  else if (target < overhead_)
    vgpu::Unreserve(*region_, s, overhead_ - target);
  overhead_ = target;
}

CUresult Core::BeginContext(CUdevice dev, Probe* p) {
  p->estimate = ContextEstimate();
  if (CUresult r = Reserve(dev, p->estimate, &p->counted); r != CUDA_SUCCESS) return r;
  if (p->counted && host_pid_ == 0 && dev >= 0 && dev < 64 && NvmlReady()) {
    // This process's first context: NVML lists host pids, which in a container's pid namespace
    // are not getpid(). Our entry is the one that appears with the context; the lease keeps the
    // container's other processes from creating theirs in the same instant.
    p->leased = vgpu::LockContextProbe(*region_, owner_, 5000);
    p->n = NvmlProcesses(dev, p->pids, nullptr, 128);
  }
  return CUDA_SUCCESS;
}

CUresult Core::EndContext(CUdevice dev, CUresult created, CUcontext* ctx, bool primary, Probe* p) {
  if (!p->counted || dev < 0 || dev >= 64) return created;
  if (created != CUDA_SUCCESS) {
    if (p->leased) vgpu::UnlockContextProbe(*region_, owner_);
    Undo(p->estimate, true);
    return created;
  }
  ++contexts_;
  ++dev_contexts_[dev];
  ctx_mask_ |= uint64_t{1} << dev;
  if (host_pid_ == 0 && p->n >= 0) {
    unsigned after[128];
    int n = NvmlProcesses(dev, after, nullptr, 128);
    unsigned self = static_cast<unsigned>(getpid()), only = 0;
    int fresh = 0;
    bool self_fresh = false;
    for (int k = 0; k < n; ++k) {
      bool old = false;
      for (int j = 0; j < p->n && !old; ++j) old = p->pids[j] == after[k];
      if (old) continue;
      ++fresh;
      only = after[k];
      self_fresh |= after[k] == self;
    }
    // getpid() among the new entries: no pid namespace. Else exactly one new entry: ours.
    // Anything else (a neighbour's context appeared in the same instant): not identified.
    if (self_fresh)
      host_pid_ = static_cast<int>(self);
    else if (fresh == 1)
      host_pid_ = static_cast<int>(only);
  }
  if (p->leased) vgpu::UnlockContextProbe(*region_, owner_);
  if (int s = slot_.load(std::memory_order_relaxed); s >= 0 && host_pid_ > 0)
    region_->nvml_pid[s].store(static_cast<uint32_t>(host_pid_), std::memory_order_seq_cst);
  uint64_t charged = overhead_ + p->estimate;  // the estimate is now part of the overhead
  overhead_ = charged;
  uint64_t target = charged, used;
  if (OwnUsed(&used)) {
    measured_.store(true, std::memory_order_relaxed);
    uint64_t held = region_->held[slot_.load()].load() & vgpu::kHeldBytesMask;
    uint64_t allocations = held > charged ? held - charged : 0;
    target = used > allocations ? used - allocations : 0;
  } else {
    measured_.store(false, std::memory_order_relaxed);
  }
  if (target > charged) {
    bool counted;
    if (Reserve(dev, target - charged, &counted) != CUDA_SUCCESS) {
      // What the context really holds does not fit: undo it, as if the driver had run out.
      if (primary) {
        void* rel = real_.cuDevicePrimaryCtxRelease_v2 ? real_.cuDevicePrimaryCtxRelease_v2
                                                       : real_.cuDevicePrimaryCtxRelease;
        if (rel) Fn<cuda::cuDevicePrimaryCtxRelease_t>(rel)(dev);
      } else if (real_.cuCtxDestroy_v2) {
        Fn<cuda::cuCtxDestroy_t>(real_.cuCtxDestroy_v2)(*ctx);
      }
      --contexts_;
      if (--dev_contexts_[dev] == 0) ctx_mask_ &= ~(uint64_t{1} << dev);
      SetOverhead(charged - p->estimate);
      region_->alloc_failures.fetch_add(1, std::memory_order_relaxed);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    overhead_ = target;
  } else {
    SetOverhead(target);
  }
  if (measured_.load(std::memory_order_relaxed) && contexts_ == 1) {
    // What one process's context was measured to cost: the estimate for processes that cannot
    // measure theirs. Learned only here, not from later growth (rounding grows with allocations).
    uint64_t cur = region_->context_bytes.load();
    while (cur < target && !region_->context_bytes.compare_exchange_weak(cur, target)) {
    }
  }
  if (!primary)
    Commit(Kind::kContext, reinterpret_cast<uint64_t>(*ctx), static_cast<uint64_t>(dev) + 1, true);
  return CUDA_SUCCESS;
}

void Core::ContextGone(int dev) {
  if (dev < 0 || dev >= 64 || contexts_ == 0) return;
  --contexts_;
  if (--dev_contexts_[dev] <= 0) dev_contexts_[dev] = 0, ctx_mask_ &= ~(uint64_t{1} << dev);
  uint64_t used;
  if (contexts_ == 0) {
    SetOverhead(0);
  } else if (measured_.load(std::memory_order_relaxed) && OwnUsed(&used)) {
    uint64_t held = region_->held[slot_.load()].load() & vgpu::kHeldBytesMask;
    uint64_t allocations = held > overhead_ ? held - overhead_ : 0;
    SetOverhead(used > allocations ? used - allocations : 0);
  } else {
    uint64_t n = static_cast<uint64_t>(contexts_);
    SetOverhead(overhead_ / (n + 1) * n);
  }
}

bool Core::Reconcile() {
  if (!track_memory_ || pthread_mutex_trylock(&ctx_mu_) != 0) return false;
  uint64_t used;
  bool ok = measured_.load(std::memory_order_relaxed) && slot_.load() >= 0 && OwnUsed(&used);
  if (ok) {
    // Only raised here: an allocation reserved but not yet made (or freed but not yet returned)
    // makes `used` look smaller than it will be, never larger.
    uint64_t held = region_->held[slot_.load()].load() & vgpu::kHeldBytesMask;
    uint64_t stand_in = overhead_ + pads_.load(std::memory_order_relaxed);
    uint64_t allocations = held > stand_in ? held - stand_in : 0;
    if (used > allocations && used - allocations > overhead_) SetOverhead(used - allocations);
  }
  pthread_mutex_unlock(&ctx_mu_);
  return ok;
}

// The driver's rounding reserved near the limit by this thread, until the allocation is made and
// measured (SettlePad). Slow path only.
static thread_local uint64_t t_pad = 0;

CUresult Core::RecheckAfterReserve(int slot, uint64_t bytes) {
  Reconcile();
  uint64_t limit = vgpu::EffectiveLimit(*region_, config_.memory_limit);
  // Until its next check a process's allocations may take up to about twice their charge (the
  // driver's rounding, which only NVML shows), and a process checks only its own. So the next
  // check comes sooner as the container nears its limit: every process's unmeasured rounding
  // together must fit in what is left, whichever process then crosses into the last eighth.
  int64_t next = budget_reset_;
  if (limit != 0) {
    uint64_t used_now = vgpu::UsedBytes(*region_);
    uint64_t procs = region_->high_water.load(std::memory_order_relaxed);
    uint64_t share = (used_now < limit ? limit - used_now : 0) / (2 * (procs > 0 ? procs : 1));
    if (static_cast<int64_t>(share) < next) next = static_cast<int64_t>(share);
  }
  budget_.store(next, std::memory_order_relaxed);
  auto refuse = [&] {
    vgpu::Unreserve(*region_, slot, bytes);
    region_->alloc_failures.fetch_add(1, std::memory_order_relaxed);
    return CUDA_ERROR_OUT_OF_MEMORY;
  };
  // What the reconciliation found may have taken the container past the limit.
  if (limit != 0 && vgpu::UsedBytes(*region_) > limit &&
      (vgpu::ReclaimDead(*region_, owner_) == 0 || vgpu::UsedBytes(*region_) > limit))
    return refuse();
  // In the last eighth, the whole container as the driver holds it must leave room too.
  if (limit != 0 && vgpu::UsedBytes(*region_) > near_limit_ &&
      pthread_mutex_trylock(&ctx_mu_) == 0) {
    uint64_t real = 0;
    bool over = ContainerHeld(&real) && real > limit;
    if (over && vgpu::ReclaimDead(*region_, owner_) != 0)
      over = ContainerHeld(&real) && real > limit;
    pthread_mutex_unlock(&ctx_mu_);
    if (over) return refuse();
  }
  // Near the limit the allocation must fit as the driver will really place it: rounded up to its
  // 2 MiB granule (a smaller allocation may open a new page), which only NVML shows afterwards.
  // The rounding is reserved too, with the same race-free protocol, until SettlePad has measured
  // what the driver really took.
  uint64_t rounding = ((bytes + kDriverGranule - 1) & ~(kDriverGranule - 1)) - bytes;
  if (rounding != 0 && vgpu::UsedBytes(*region_) > near_limit_) {
    if (!vgpu::Reserve(*region_, slot, owner_, rounding, config_.memory_limit)) return refuse();
    t_pad += rounding;
    pads_.fetch_add(rounding, std::memory_order_relaxed);
  }
  return CUDA_SUCCESS;
}

void Core::SettlePad() {
  uint64_t pad = t_pad;
  if (pad == 0) return;
  t_pad = 0;
  Reconcile();  // the allocation is made (or refused): charge the rounding it really took ...
  pads_.fetch_sub(pad, std::memory_order_relaxed);
  int s = slot_.load(std::memory_order_relaxed);
  if (s >= 0) vgpu::Unreserve(*region_, s, pad);  // ... then drop the stand-in
}

CUresult Core::PrimaryRetain(CUcontext* ctx, CUdevice dev) {
  auto call = [&] {
    return Fn<cuda::cuDevicePrimaryCtxRetain_t>(real_.cuDevicePrimaryCtxRetain)(ctx, dev);
  };
  if (config_.disabled || !track_memory_ || dev < 0 || dev >= 64 || ctx == nullptr) return call();
  pthread_mutex_lock(&ctx_mu_);
  CUresult r;
  if (primary_refs_[dev].load() > 0) {  // exists: only a reference
    r = call();
    if (r == CUDA_SUCCESS) primary_refs_[dev].fetch_add(1);
  } else {  // the first retain creates the context
    Probe probe;
    r = BeginContext(dev, &probe);
    if (r == CUDA_SUCCESS) r = EndContext(dev, call(), ctx, /*primary=*/true, &probe);
    if (r == CUDA_SUCCESS && probe.counted) primary_refs_[dev].store(1);  // else: another GPU
  }
  pthread_mutex_unlock(&ctx_mu_);
  if (pads_.load(std::memory_order_relaxed) != 0) SettlePad();
  return r;
}

CUresult Core::PrimaryRelease(CUdevice dev, bool v2) {
  void* fn = v2 && real_.cuDevicePrimaryCtxRelease_v2 ? real_.cuDevicePrimaryCtxRelease_v2
                                                      : real_.cuDevicePrimaryCtxRelease;
  if (config_.disabled || !track_memory_ || dev < 0 || dev >= 64)
    return Fn<cuda::cuDevicePrimaryCtxRelease_t>(fn)(dev);
  pthread_mutex_lock(&ctx_mu_);
  CUresult r = Fn<cuda::cuDevicePrimaryCtxRelease_t>(fn)(dev);
  if (r == CUDA_SUCCESS && primary_refs_[dev].load() > 0 && primary_refs_[dev].fetch_sub(1) == 1)
    ContextGone(dev);
  pthread_mutex_unlock(&ctx_mu_);
  return r;
}

// --- reports ------------------------------------------------------------------------------------

void Core::AdjustMemInfo(size_t* free_bytes, size_t* total) {
  if (config_.disabled || config_.memory_limit == 0 || !Limited(-1)) return;
  uint64_t limit = config_.memory_limit < *total ? config_.memory_limit : *total;
  uint64_t used = vgpu::UsedBytes(*region_);
  uint64_t avail = used < limit ? limit - used : 0;
  *total = limit;
  if (avail < *free_bytes) *free_bytes = avail;  // never more than the card really has free
}

void Core::AdjustTotalMem(size_t* total, CUdevice dev) {
  if (config_.disabled || config_.memory_limit == 0 || !Limited(dev)) return;
  if (config_.memory_limit < *total) *total = config_.memory_limit;
}

void Core::AdjustNvmlMemory(nvmlDevice_t dev, void* get_uuid, unsigned long long* total,
                            unsigned long long* free_b, unsigned long long* used) {
  if (config_.disabled || config_.memory_limit == 0) return;
  if (config_.has_uuid) {
    char text[96];
    char uuid[16];
    if (get_uuid == nullptr ||
        Fn<cuda::nvmlDeviceGetUUID_t>(get_uuid)(dev, text, sizeof text) != NVML_SUCCESS ||
        !ParseUuid(text, uuid) || memcmp(uuid, config_.uuid, 16) != 0)
      return;  // another GPU of the node: shown as it is
  }
  uint64_t limit = config_.memory_limit < *total ? config_.memory_limit : *total;
  uint64_t u = vgpu::UsedBytes(*region_);
  *total = limit;
  *used = u < limit ? u : limit;
  *free_b = limit - *used;
}

// --- compute pacer ------------------------------------------------------------------------------
//
// The container owns a GPU-time budget expressed as one shared "virtual finish time" V: running
// d ns of GPU work at share s moves V forward by d/s. A launch may start only when V <= now, so
// over any interval the container's measured GPU time is at most s x (interval + burst): the
// share is exact by construction (no gain to tune, nothing to oscillate). Idle time banks at
// most kBurstNs of credit (V is never allowed to fall further behind). GPU time is measured, not
// guessed: events recorded around every launch on its own stream give the work's duration on
// the GPU's timeline; it is charged when the end event completes (at most kRing launches per
// process are in flight unmeasured). See docs/interposer.md.

// `since`: when the charged launch was admitted. Idle credit is counted from there, not from
// its completion: time its work then spent queued on the GPU behind other contexts' time slices
// was not idle, and clamping at completion threw a busy container's budget away (a 90 % share
// beside a 10 % one lost 4 points to the neighbour's 2 ms slices).
void Core::Charge(int64_t busy_ns, int64_t since) {
  // The shared share is container-writable: it may move only within this process's own
  // [limit, ceiling] from its environment.
  uint32_t share = region_->effective_share_permille.load(std::memory_order_relaxed);
  if (share < config_.core_limit * 10) share = config_.core_limit * 10;
  if (share > config_.core_ceiling * 10) share = config_.core_ceiling * 10;
  int64_t cost = busy_ns * 1000 / share;
  int64_t v = region_->virtual_time_ns.load(std::memory_order_relaxed), nv;
  do {
    nv = (v < since - kBurstNs ? since - kBurstNs : v) + cost;
  } while (!region_->virtual_time_ns.compare_exchange_weak(v, nv, std::memory_order_relaxed));
  region_->busy_ns.fetch_add(static_cast<uint64_t>(busy_ns), std::memory_order_relaxed);
}

void Core::Harvest(bool wait_oldest) {
  while (ring_count_ > 0) {
    Pending& p = ring_[ring_head_];
    if (p.busy) break;  // its launch is still being issued by another thread
    if (wait_oldest) {
      Fn<cuda::cuEventSynchronize_t>(real_.cuEventSynchronize)(p.end);
      wait_oldest = false;
    }
    CUresult q = Fn<cuda::cuEventQuery_t>(real_.cuEventQuery)(p.end);
    if (q == CUDA_ERROR_NOT_READY) break;
    float ms = 0;
    // Any other error (e.g. the context was destroyed under the events): drop the entry uncharged
    // rather than let it block the ring; the slot's events are recreated on next use.
    if (q != CUDA_SUCCESS) p.ctx = nullptr;
    if (q == CUDA_SUCCESS && Fn<cuda::cuEventElapsedTime_t>(real_.cuEventElapsedTime)(
                                 &ms, p.start, p.end) == CUDA_SUCCESS) {
      // A start event on an idle stream completes at once and the kernel only arrives when the
      // launch call has submitted it: that wait is host time, not GPU time used.
      int64_t d = static_cast<int64_t>(static_cast<double>(ms) * 1e6) - p.gap;
      if (d < 0) d = 0;
      // On an idle stream the GPU's front end also spends time before the kernel reaches the
      // SMs (~2-3 us on an H200, no SM work): not GPU time used. Its estimate is the running mean
      // (1/16) of such measurements under kFrontEndCapNs (a mean, not the minimum: one odd short
      // reading must not undo it); a process whose launches all run longer (any real work) never
      // learns one and is charged in full. Queued launches hide the front end: charged in full.
      // At most half of a reading is forgiven: timing cannot tell an empty kernel from a short
      // real one (a 1024^3 bf16 matmul is ~3.5 us on an H200), and forgiving all of it let such
      // kernels run at 44 % GPU utilisation under a 30 % share. Half keeps empty-kernel loops
      // (~2.5 us front end per ~3.3 us launch) under a 50 % share unpaced.
      if (p.gap > 0) {
        if (d < kFrontEndCapNs)
          front_end_ns_ = front_end_ns_ < 0 ? d : front_end_ns_ + (d - front_end_ns_) / 16;
        if (front_end_ns_ > 0) d -= front_end_ns_ < d / 2 ? front_end_ns_ : d / 2;
      }
      int64_t avg = avg_launch_ns_.load(std::memory_order_relaxed);
      avg_launch_ns_.store(avg + (d - avg) / 8, std::memory_order_relaxed);
      measured_window_.fetch_add(static_cast<uint64_t>(d) * p.weight, std::memory_order_relaxed);
      int64_t charge = d * p.weight * own_permille_.load(std::memory_order_relaxed) / 1000;
      charged_window_.fetch_add(static_cast<uint64_t>(charge), std::memory_order_relaxed);
      // What the true-up found charged beyond what ran comes off the next charges (a negative
      // credit, a refund taken back, is added to them).
      int64_t credit = credit_ns_.load(std::memory_order_relaxed);
      if (credit != 0) {
        int64_t take = credit > charge ? charge : credit;
        credit_ns_.fetch_sub(take, std::memory_order_relaxed);
        charge -= take;
      }
      Charge(charge, p.started);
    }
    ring_head_ = (ring_head_ + 1) % kRing;
    --ring_count_;
  }
}

void Core::UpdateSoftShare(int64_t now) {
  // Soft limit: borrow what the rest of the GPU leaves idle, up to the ceiling. Every 200 ms one
  // process compares the device's utilisation (NVML) with the container's own measured busy time
  // and moves the share half-way towards limit..ceiling; halving the step damps the loop.
  int64_t due = next_share_update_.load(std::memory_order_relaxed);
  if (now < due || !next_share_update_.compare_exchange_strong(due, now + 200'000'000)) return;
  if (!real_.nvmlDeviceGetUtilizationRates || due == 0) {
    if (due == 0) last_busy_.store(region_->busy_ns.load());
    return;
  }
  struct {
    unsigned gpu, memory;
  } util{};
  using UtilFn = nvmlReturn_t (*)(nvmlDevice_t, void*);
  if (nvml_device_ == nullptr ||
      Fn<UtilFn>(real_.nvmlDeviceGetUtilizationRates)(nvml_device_, &util) != NVML_SUCCESS)
    return;
  uint64_t busy = region_->busy_ns.load();
  uint64_t own =
      (busy - last_busy_.exchange(busy)) * 100 / static_cast<uint64_t>(now - due + 200'000'000);
  int64_t others = static_cast<int64_t>(util.gpu) - static_cast<int64_t>(own);
  if (others < 0) others = 0;
  int64_t target = 100 - others - 5;  // keep 5 points of headroom for the neighbours' bursts
  if (target < config_.core_limit) target = config_.core_limit;
  if (target > config_.core_ceiling) target = config_.core_ceiling;
  int64_t cur = region_->effective_share_permille.load();
  region_->effective_share_permille.store(static_cast<uint32_t>(cur + (target * 10 - cur) / 2));
}

void Core::UpdateOwnFactor(int64_t now) {
  // Every second one thread compares what NVML says this process's kernels ran (its smUtil
  // samples since the last look) with the start-to-end time it measured; the ratio scales the
  // charges from then on. Without NVML's per-process samples it stays 1 (a strict cap).
  int64_t due = next_factor_update_.load(std::memory_order_relaxed);
  if (now < due || !next_factor_update_.compare_exchange_strong(due, now + kFactorWindowNs)) return;
  uint64_t measured = measured_window_.exchange(0, std::memory_order_relaxed);
  uint64_t charged = charged_window_.exchange(0, std::memory_order_relaxed);
  if (due == 0 || real_.nvmlDeviceGetProcessUtilization == nullptr) return;
  int ordinal = 0;
  while (ordinal < 63 && ctx_mask_ != 0 && ((ctx_mask_ >> ordinal) & 1) == 0) ++ordinal;
  nvmlDevice_t dev = NvmlHandle(ordinal);
  if (dev == nullptr) return;
  nvmlProcessUtilizationSample_t samples[64];
  unsigned count = 64;
  unsigned long long seen = util_seen_us_;
  if (Fn<cuda::nvmlDeviceGetProcessUtilization_t>(real_.nvmlDeviceGetProcessUtilization)(
          dev, samples, &count, seen) != NVML_SUCCESS)
    return;
  unsigned pid = static_cast<unsigned>(host_pid_ > 0 ? host_pid_ : getpid());
  uint64_t util_sum = 0, n = 0;
  for (unsigned i = 0; i < count && i < 64; ++i) {
    if (samples[i].timeStamp > util_seen_us_) util_seen_us_ = samples[i].timeStamp;
    if (samples[i].pid != pid) continue;
    util_sum += samples[i].smUtil;
    ++n;
  }
  int64_t window = now - due + kFactorWindowNs;
  if (n == 0) return;  // NVML does not list this process (pid unknown): a strict cap
  // NVML's percentages are whole numbers (truncated): count each as half a point more.
  uint64_t own = (2 * util_sum + n) * static_cast<uint64_t>(window) / (200 * n);
  TrueUp(own, charged, now);
  // Too little measured to judge (a mostly idle process): keep the factor. Within 5 % of the
  // measured time nothing is corrected, so that rounding cannot lift a lone container above its
  // share.
  if (measured < static_cast<uint64_t>(window) / 100) return;
  uint64_t f = own * 1000 / measured;
  if (f > 950) f = 1000;
  if (f < 10) f = 10;
  uint32_t cur = own_permille_.load(std::memory_order_relaxed);
  uint32_t next = static_cast<uint32_t>((cur + 3 * f) / 4);
  own_permille_.store(next, std::memory_order_relaxed);
  // The budget still owed was charged at the old factor: rescale it, or a container that waited
  // long behind a neighbour stays blocked by debt that was mostly the neighbour's time.
  if (next < cur) {
    int64_t v = region_->virtual_time_ns.load(std::memory_order_relaxed);
    if (v > now) {
      int64_t nv = now + (v - now) / static_cast<int64_t>(cur) * static_cast<int64_t>(next);
      region_->virtual_time_ns.compare_exchange_strong(v, nv, std::memory_order_relaxed);
    }
  }
}

void Core::TrueUp(uint64_t own, uint64_t charged, int64_t now) {
  // The factor scales the next second's charges by the last second's ratio; what it got wrong
  // (the ratio moves as neighbours come and go, and is averaged) is settled here, so that in
  // total this process is charged no more GPU time than NVML says it ran: the budget handed back
  // is what was charged beyond that, over the whole run (cumulative, so window edges - a kernel
  // charged in one window and sampled in the next - cancel instead of biasing). Never more than
  // that either way: what NVML counts beyond the charges (a launch's front end on an idle
  // stream, see Harvest) stays forgiven, and a refund taken back is only one given before.
  charged_total_ += charged;
  own_total_ += own;
  int64_t target =
      charged_total_ > own_total_ ? static_cast<int64_t>(charged_total_ - own_total_) : 0;
  // Half the difference at a time: the credit acts a window later, and settling all of it at
  // once made the shares swing from one window to the next.
  int64_t delta = (target - refunded_) / 2;
  refunded_ += delta;
  // Settled through the next charges (Harvest), not by moving the finish time back: Charge
  // would clamp that to kBurstNs of idle credit, and this is time charged, not idle time.
  if (delta != 0) credit_ns_.fetch_add(delta, std::memory_order_relaxed);
}

int Core::BeforeLaunch(CUstream stream, bool per_thread) {
  region_->launches.fetch_add(1, std::memory_order_relaxed);
  int64_t now = clock_.now_ns();
  if (config_.core_ceiling > config_.core_limit) UpdateSoftShare(now);
  UpdateOwnFactor(now);
  for (;;) {  // admission: wait while the container is ahead of its budget
    int64_t v = region_->virtual_time_ns.load(std::memory_order_relaxed);
    if (v <= now) break;
    clock_.sleep_until_ns(v);
    int64_t after = clock_.now_ns();
    region_->throttled_ns.fetch_add(static_cast<uint64_t>(after - now), std::memory_order_relaxed);
    now = after;
  }
  // Pace on GPU time really used, at a small cost per launch: long launches are all measured;
  // of short ones (where two event records would cost as much as the launch) a random one in
  // kSampleEvery is, and stands for kSampleEvery (an unbiased estimate of their GPU time).
  uint32_t weight = 1;
  if (avg_launch_ns_.load(std::memory_order_relaxed) < kShortLaunchNs) {
    uint32_t x = rng_.load(std::memory_order_relaxed);  // xorshift32; races only reseed it
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    rng_.store(x, std::memory_order_relaxed);
    if (x % kSampleEvery != 0) return -1;
    weight = kSampleEvery;
  }
  CUcontext ctx = nullptr;
  Fn<cuda::cuCtxGetCurrent_t>(real_.cuCtxGetCurrent)(&ctx);
  while (ring_lock_.test_and_set(std::memory_order_acquire)) sched_yield();
  Harvest(false);
  if (ring_count_ == kRing) Harvest(true);  // bound the unmeasured work in flight
  int slot = -1;
  if (ring_count_ < kRing) {
    slot = (ring_head_ + ring_count_) % kRing;
    Pending& p = ring_[slot];
    if (p.start == nullptr || p.ctx != ctx) {
      if (p.start) Fn<cuda::cuEventDestroy_t>(real_.cuEventDestroy_v2)(p.start);
      if (p.end) Fn<cuda::cuEventDestroy_t>(real_.cuEventDestroy_v2)(p.end);
      p.start = p.end = nullptr;
      if (Fn<cuda::cuEventCreate_t>(real_.cuEventCreate)(&p.start, CU_EVENT_DEFAULT) !=
              CUDA_SUCCESS ||
          Fn<cuda::cuEventCreate_t>(real_.cuEventCreate)(&p.end, CU_EVENT_DEFAULT) !=
              CUDA_SUCCESS) {
        p.start = p.end = nullptr;
        slot = -1;
      }
      p.ctx = ctx;
    }
    if (slot >= 0) {
      void* rec =
          per_thread && real_.cuEventRecord_ptsz ? real_.cuEventRecord_ptsz : real_.cuEventRecord;
      Fn<cuda::cuEventRecord_t>(rec)(p.start, stream);
      p.started = clock_.now_ns();
      p.weight = weight;
      p.gap = 0;
      p.busy = true;
      ++ring_count_;
    }
  }
  ring_lock_.clear(std::memory_order_release);
  return slot;
}

void Core::AfterLaunch(int slot, CUstream stream, bool per_thread, CUresult launched) {
  if (slot < 0) return;
  while (ring_lock_.test_and_set(std::memory_order_acquire)) sched_yield();
  Pending& p = ring_[slot];
  // Start event already complete once the launch call returned: the stream was idle, and the
  // start-to-end time includes the launch call itself (subtracted when charged).
  if (Fn<cuda::cuEventQuery_t>(real_.cuEventQuery)(p.start) == CUDA_SUCCESS)
    p.gap = clock_.now_ns() - p.started;
  void* rec =
      per_thread && real_.cuEventRecord_ptsz ? real_.cuEventRecord_ptsz : real_.cuEventRecord;
  // A failed launch still completes its events (zero elapsed time): nothing is charged.
  Fn<cuda::cuEventRecord_t>(rec)(p.end, stream);
  (void)launched;
  p.busy = false;
  ring_lock_.clear(std::memory_order_release);
}

}  // namespace gpulet::vcuda
