// The interposer's policy core: memory limit, allocation bookkeeping, device selection and the
// compute pacer, over a table of real driver entry points. The extern "C" shims (shim.cc) only
// forward into one process-wide Core; tests drive a Core against the fake driver directly.
//
// Constraints (it runs inside other people's CUDA processes): no exceptions, no heap, no
// non-trivial destructors (a Core may be a global that is still used while the process exits),
// libc only. Thread-safety: every public member may be called concurrently after Init(); Init()
// itself runs once, before any other call.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>

#include "abi/cuda_abi.h"
#include "abi/vgpu_accounting.h"
#include "abi/vgpu_contract.h"
#include "vgpu/interposer/hooks.h"

namespace gpulet::vcuda {

// Real entry points. Required ones are marked; the rest may be null (e.g. an old driver).
struct RealDriver {
// The hooks' own entry points (hooks.h), then the ones the core calls itself.
// clang-format does not reach a fixed point on these lists.
// clang-format off
#define GPULET_REAL_CUDA(X)                                                                   \
  GPULET_VCUDA_CUDA_HOOKS(X)                                                                  \
  X(cuDeviceGetCount) X(cuDeviceGetUuid) X(cuCtxGetDevice) X(cuCtxGetCurrent)                 \
  X(cuEventCreate) X(cuEventDestroy_v2) X(cuEventRecord) X(cuEventRecord_ptsz)                \
  X(cuEventQuery) X(cuEventSynchronize) X(cuEventElapsedTime)
#define GPULET_REAL_NVML(X)                                                                   \
  GPULET_VCUDA_NVML_HOOKS(X)                                                                  \
  X(nvmlDeviceGetUUID) X(nvmlDeviceGetUtilizationRates) X(nvmlInit_v2)                        \
  X(nvmlDeviceGetHandleByUUID) X(nvmlDeviceGetHandleByIndex_v2)                               \
  X(nvmlDeviceGetComputeRunningProcesses_v3) X(nvmlDeviceGetProcessUtilization)
// clang-format on
// NOLINTNEXTLINE(bugprone-macro-parentheses): a declarator, which parentheses would break
#define GPULET_DECLARE_PTR(name) void* name = nullptr;
  GPULET_REAL_CUDA(GPULET_DECLARE_PTR)
  GPULET_REAL_NVML(GPULET_DECLARE_PTR)
#undef GPULET_DECLARE_PTR
};

// Fills `out` from libcuda (cuda) and libnvidia-ml (nvml, may be null) with `sym` (the real
// dlsym). Returns false if a required entry point is missing.
bool ResolveRealDriver(void* cuda, void* nvml, void* (*sym)(void*, const char*), RealDriver* out);

// Time source; the real one is CLOCK_MONOTONIC. Tests pass a virtual clock shared with the fake.
struct ClockFns {
  int64_t (*now_ns)();
  void (*sleep_until_ns)(int64_t);
};
ClockFns RealClockFns();

struct Config {
  bool disabled = false;        // GPULET_VGPU_DISABLE=1: pure pass-through
  bool invalid = false;         // a malformed limit: fail closed (every allocation refused)
  uint64_t memory_limit = 0;    // bytes, 0 = unlimited
  uint32_t core_limit = 100;    // percent; >= 100 = no pacing
  uint32_t core_ceiling = 100;  // percent; == core_limit = hard limit
  // Charge per CUDA context when NVML cannot tell what the process really holds, and the
  // reservation taken before a context is created (GPULET_VGPU_CONTEXT_BYTES, else the default).
  uint64_t context_bytes = kDefaultContextBytes;
  static constexpr uint64_t kDefaultContextBytes = uint64_t{640} << 20;
  bool has_uuid = false;  // limit only the GPU with this UUID
  char uuid[16] = {};
  char error[256] = {};  // set when invalid
};

// Parses the contract's values (GPULET_VGPU_*; the GPU from GPULET_VGPU_UUID, else
// NVIDIA_VISIBLE_DEVICES) through `get`: the limits file's entries in production, getenv where
// no limits file is mounted (abi/vgpu_contract.h). Never fails: a bad value sets config.invalid
// and config.error.
Config ParseConfig(const char* (*get)(const char*));
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" -> 16 bytes.
bool ParseUuid(const char* text, char out[16]);

// What a memory handle is, so that equal values of different handle types never collide.
// kMapping: a VMM mapping's address -> its handle, kMapSize: -> its size; kVmmMaps: a VMM handle
// -> its live mappings; kVmmReleased: a handle released while mapped -> its charge (see Release).
enum class Kind : uint64_t {
  kPointer = 1,
  kArray = 2,
  kMipmap = 3,
  kVmm = 4,
  kContext = 5,
  kMapping = 6,
  kMapSize = 7,
  kVmmMaps = 8,
  kVmmReleased = 9,
};

class Core {
 public:
  // `region` must outlive the Core (the shim maps it forever). Not thread-safe; call once.
  void Init(const RealDriver& real, const Config& config, vgpu::AccountingRegion* region,
            ClockFns clock);
  const RealDriver& real() const { return real_; }
  const Config& config() const { return config_; }
  bool pacing() const { return pacing_; }

  // --- memory: reserve, let the driver allocate, record; or undo. -----------------------------
  // `ordinal` is the process-local device the memory lands on, -1 = the current context's.
  // Returns CUDA_SUCCESS with the reservation taken, or CUDA_ERROR_OUT_OF_MEMORY.
  // (Inline: these are the per-allocation hot path.)
  CUresult Reserve(int ordinal, uint64_t bytes, bool* counted) {
    *counted = Limited(ordinal);
    if (!*counted) return CUDA_SUCCESS;
    int s = slot_.load(std::memory_order_relaxed);
    if (s < 0) {  // first allocation, or after fork(); 128 live processes per container at most
      if (!EnsureSlot()) return CUDA_ERROR_OUT_OF_MEMORY;
      s = slot_.load(std::memory_order_relaxed);
    }
    uint64_t total;
    if (!vgpu::Reserve(*region_, s, owner_, bytes, config_.memory_limit, &total))
      return CUDA_ERROR_OUT_OF_MEMORY;
    if (measured_.load(std::memory_order_relaxed)) {
      // Every limit/16 bytes (or 1024 calls) of allocations, and on every allocation in the last
      // eighth of the limit, compare with what the driver really holds (NVML) before the driver
      // allocates. A racy countdown (plain loads and stores) is enough: a lost update only
      // shifts the next check.
      int64_t b =
          budget_.load(std::memory_order_relaxed) - static_cast<int64_t>(bytes) - call_bytes_;
      budget_.store(b, std::memory_order_relaxed);
      if (b < 0 || total > near_limit_) return RecheckAfterReserve(s, bytes);
    }
    return CUDA_SUCCESS;
  }
  void Commit(Kind kind, uint64_t handle, uint64_t bytes, bool counted) {
    // An uncounted allocation (another GPU) is not recorded; its free then finds nothing.
    // Table full: the charge stays (it can never be returned, which errs on the safe side).
    if (counted && !TableInsert(Key(kind, handle), bytes))
      table_overflow_.fetch_add(1, std::memory_order_relaxed);
  }
  void Undo(uint64_t bytes, bool counted) {
    if (counted) vgpu::Unreserve(*region_, slot_.load(std::memory_order_relaxed), bytes);
  }
  // Free path: Take before the real free (so a recycled handle can never be mistaken for the
  // freed one), then Settle with the driver's result.
  uint64_t Take(Kind kind, uint64_t handle) { return TableErase(Key(kind, handle)); }
  void Settle(Kind kind, uint64_t handle, uint64_t bytes, CUresult freed) {
    if (bytes == 0) return;
    if (freed == CUDA_SUCCESS) {
      vgpu::Unreserve(*region_, slot_.load(std::memory_order_relaxed), bytes);
    } else {
      TableInsert(Key(kind, handle), bytes);  // still allocated: keep it on the books
    }
  }

  // Runs `alloc` (which returns a CUresult and fills *handle) under a reservation.
  template <class F>
  CUresult Charged(Kind kind, int ordinal, uint64_t bytes, F&& alloc) {
    uint64_t handle = 0;
    if (config_.disabled) return alloc(&handle);
    bool counted;
    if (CUresult r = Reserve(ordinal, bytes, &counted); r != CUDA_SUCCESS) return r;
    CUresult r = alloc(&handle);
    if (r == CUDA_SUCCESS) {
      Commit(kind, handle, bytes, counted);
    } else {
      Undo(bytes, counted);
    }
    if (__builtin_expect(pads_.load(std::memory_order_relaxed) != 0, 0)) SettlePad();
    return r;
  }
  template <class F>
  CUresult Freed(Kind kind, uint64_t handle, F&& free_fn) {
    if (config_.disabled) return free_fn();
    uint64_t bytes = Take(kind, handle);
    CUresult r = free_fn();
    Settle(kind, handle, bytes, r);
    return r;
  }

  // VMM: a physical allocation (cuMemCreate) stays on the device while it is mapped, released or
  // not (NVIDIA's VMM samples and Paddle's allocator release the handle right after cuMemMap), so
  // its charge goes when it is both released and unmapped: at cuMemRelease if it is not mapped,
  // else at the cuMemUnmap of its last mapping. Process-local bookkeeping under vmm_mu_ (VMM calls
  // are rare and slow in the driver); a full table keeps the charge (the safe side).
  template <class F>
  CUresult Map(uint64_t ptr, uint64_t size, uint64_t handle, F&& map) {
    if (config_.disabled) return map();
    pthread_mutex_lock(&vmm_mu_);
    CUresult r = map();
    if (r == CUDA_SUCCESS) NoteMapped(ptr, size, handle);
    pthread_mutex_unlock(&vmm_mu_);
    return r;
  }
  template <class F>
  CUresult Unmap(uint64_t ptr, uint64_t size, F&& unmap) {
    if (config_.disabled) return unmap();
    pthread_mutex_lock(&vmm_mu_);
    CUresult r = unmap();
    if (r == CUDA_SUCCESS) NoteUnmapped(ptr, size);
    pthread_mutex_unlock(&vmm_mu_);
    return r;
  }
  template <class F>
  CUresult Release(uint64_t handle, F&& release) {
    if (config_.disabled) return release();
    pthread_mutex_lock(&vmm_mu_);
    uint64_t bytes = Take(Kind::kVmm, handle);
    CUresult r = release();
    if (bytes != 0) NoteReleased(handle, bytes, r);
    pthread_mutex_unlock(&vmm_mu_);
    return r;
  }

  // Pitch allocations learn their size only from the driver: reserve an upper bound, then
  // adjust to pitch x height (or refuse if the driver's pitch exceeds the bound and the
  // remainder does not fit).
  CUresult AllocPitch(CUdeviceptr* p, size_t* pitch, size_t width, size_t height, unsigned elem);

  // Contexts: the memory the driver holds for this process beyond its counted allocations
  // (docs/interposer.md, "Memory the driver holds"). `create` makes the context (returns a
  // CUresult and fills *ctx); `destroy` undoes it when what it really costs does not fit.
  template <class Create>
  CUresult CtxCreate(CUcontext* ctx, CUdevice dev, Create&& create) {
    if (!track_memory_ || ctx == nullptr) return create();
    pthread_mutex_lock(&ctx_mu_);
    Probe probe;
    CUresult r = BeginContext(dev, &probe);
    if (r == CUDA_SUCCESS) r = EndContext(dev, create(), ctx, /*primary=*/false, &probe);
    pthread_mutex_unlock(&ctx_mu_);
    if (pads_.load(std::memory_order_relaxed) != 0) SettlePad();
    return r;
  }
  template <class Destroy>
  CUresult CtxDestroy(CUcontext ctx, Destroy&& destroy) {
    if (!track_memory_) return destroy();
    pthread_mutex_lock(&ctx_mu_);
    uint64_t dev1 = Take(Kind::kContext, reinterpret_cast<uint64_t>(ctx));
    CUresult r = destroy();
    if (r == CUDA_SUCCESS && dev1 != 0)
      ContextGone(static_cast<int>(dev1 - 1));
    else if (dev1 != 0)
      TableInsert(Key(Kind::kContext, reinterpret_cast<uint64_t>(ctx)), dev1);
    pthread_mutex_unlock(&ctx_mu_);
    return r;
  }
  CUresult PrimaryRetain(CUcontext* ctx, CUdevice dev);
  CUresult PrimaryRelease(CUdevice dev, bool v2);
  // Re-reads what the driver holds for this process (NVML) and raises the charge if it grew.
  // False if the process cannot be measured. Tests and the allocation path call it.
  bool Reconcile();
  // What this process is charged beyond its allocations, and whether NVML measures it.
  uint64_t overhead() const { return overhead_; }
  bool measured() const { return measured_.load(std::memory_order_relaxed); }
  int nvml_pid() const { return host_pid_; }
  // NVML's pid for this process where it is known without a context probe (tests that run
  // several tenants as contexts of one process; call before the first launch).
  void set_nvml_pid(int pid) { host_pid_ = pid; }

  // Reports: the limit instead of the card.
  void AdjustMemInfo(size_t* free_bytes, size_t* total);
  void AdjustTotalMem(size_t* total, CUdevice dev);
  // get_uuid: NVML's nvmlDeviceGetUUID (the shim finds it even if NVML was loaded after Init).
  void AdjustNvmlMemory(nvmlDevice_t dev, void* get_uuid, unsigned long long* total,
                        unsigned long long* free_b, unsigned long long* used);

  // --- compute: called around every launch when pacing() -------------------------------------
  // Blocks until the container may launch, then records the start event on `stream`.
  // Returns the ring slot to pass to AfterLaunch (or -1 if measurement is unavailable).
  int BeforeLaunch(CUstream stream, bool per_thread);
  void AfterLaunch(int slot, CUstream stream, bool per_thread, CUresult launched);

  // Array sizes from descriptors (element size x channels x extent, summed over mip levels).
  static uint64_t ArrayBytes(const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned levels);

  // fork(): the child is a new process with its own slot and no inherited allocations.
  void AfterFork();
  // Normal exit: give the slot back.
  void Exit();
  int slot() const { return slot_.load(std::memory_order_relaxed); }

  static constexpr int kTableSize = 1 << 16;  // live allocations tracked per process
  // The first level of the handle table: small enough to stay in L1, so the common case (few
  // live allocations, or allocate-then-free churn with ever new addresses) never misses cache.
  static constexpr int kHotSize = 1 << 10;
  static constexpr int kHotProbes = 8;  // window per key; a full window spills to table_
  static constexpr uint64_t kDriverGranule = uint64_t{2} << 20;  // device page the driver maps
  static constexpr int kRing = 8;                 // launches in flight being measured
  static constexpr int64_t kBurstNs = 5'000'000;  // idle credit a container may bank

 private:
  static uint64_t Key(Kind kind, uint64_t handle) {
    return handle ^ (static_cast<uint64_t>(kind) << 60);
  }
  bool Limited(int ordinal) {
    return all_limited_ || visible_all_limited_.load(std::memory_order_relaxed) ||
           LimitedSlow(ordinal);
  }
  bool LimitedSlow(int ordinal);
  bool EnsureSlot();
  __attribute__((noinline)) CUresult RecheckAfterReserve(int slot, uint64_t bytes);
  __attribute__((noinline)) void SettlePad();
  // State carried across a context creation: the reservation and NVML's process list before.
  struct Probe {
    unsigned pids[128];
    int n = -1;  // -1: no list taken
    bool leased = false, counted = false;
    uint64_t estimate = 0;
  };
  CUresult BeginContext(CUdevice dev, Probe* p);
  // Settles the charge once the driver answered `created`; destroys the new context (through
  // the real driver) and returns CUDA_ERROR_OUT_OF_MEMORY when what it really holds does not fit.
  CUresult EndContext(CUdevice dev, CUresult created, CUcontext* ctx, bool primary, Probe* p);
  void ContextGone(int dev);
  bool NvmlReady();
  nvmlDevice_t NvmlHandle(int ordinal);
  // NVML's process list of `ordinal`'s GPU: up to `max` (pid, bytes); -1 if NVML cannot tell.
  int NvmlProcesses(int ordinal, unsigned* pids, uint64_t* bytes, int max);
  bool OwnUsed(uint64_t* used);
  bool ContainerHeld(uint64_t* total);
  uint64_t ContextEstimate() const;
  void SetOverhead(uint64_t target);
  void ResolveDevices();
  void Harvest(bool wait_oldest);
  void UpdateSoftShare(int64_t now);
  void UpdateOwnFactor(int64_t now);
  void TrueUp(uint64_t own, uint64_t charged, int64_t now);
  void Charge(int64_t busy_ns, int64_t since);
  bool TableInsert(uint64_t key, uint64_t bytes);
  uint64_t TableErase(uint64_t key);
  uint64_t TableFind(uint64_t key);  // the value, or 0; the entry stays
  void NoteMapped(uint64_t ptr, uint64_t size, uint64_t handle);
  void NoteUnmapped(uint64_t ptr, uint64_t size);
  void NoteReleased(uint64_t handle, uint64_t bytes, CUresult released);

  RealDriver real_;
  Config config_;
  vgpu::AccountingRegion* region_ = nullptr;
  ClockFns clock_{};
  bool pacing_ = false;
  std::atomic<int> slot_{-1};
  uint64_t owner_ = 0;
  std::atomic<int> devices_state_{0};  // 0 unresolved, 1 resolving, 2 resolved
  bool all_limited_ = true;
  std::atomic<uint64_t> limited_mask_{~uint64_t{0}};
  // Every device the process sees is the limited GPU (the usual container: it sees only its own
  // GPU), so allocations need not ask the driver for the current context's device.
  std::atomic<bool> visible_all_limited_{false};
  std::atomic<int> primary_refs_[64] = {};
  // --- memory the driver holds beyond counted allocations (guarded by ctx_mu_) ---
  bool track_memory_ = false;  // a memory limit is set (and not disabled)
  pthread_mutex_t ctx_mu_ = PTHREAD_MUTEX_INITIALIZER;
  std::atomic<bool> measured_{false};  // NVML reports this process (host_pid_ known)
  int host_pid_ = 0;                   // this process's pid in NVML's (host) namespace
  int nvml_state_ = 0;                 // 0 untried, 1 ready, -1 unavailable
  uint64_t overhead_ = 0;              // charged beyond allocations (part of held[slot])
  int contexts_ = 0;                   // live contexts on limited devices
  uint64_t ctx_mask_ = 0;              // ordinals with live contexts
  int dev_contexts_[64] = {};          // live contexts per ordinal
  nvmlDevice_t nvml_dev_[64] = {};
  std::atomic<int64_t> budget_{0};      // bytes until the next reconcile
  std::atomic<uint64_t> pads_{0};       // rounding reserved near the limit, not yet settled
  int64_t budget_reset_ = 0;            // limit/16
  int64_t call_bytes_ = 0;              // budget_reset_/1024: at least every 1024 calls
  uint64_t near_limit_ = UINT64_MAX;    // above this container total every allocation reconciles
  nvmlDevice_t nvml_device_ = nullptr;  // the limited GPU, for the soft limit's utilisation
  std::atomic<int64_t> next_share_update_{0};
  std::atomic<uint64_t> last_busy_{0};
  std::atomic<uint64_t> table_overflow_{0};
  // Launch measurement ring, guarded by a process-local spin flag (never in shared memory).
  std::atomic_flag ring_lock_ = ATOMIC_FLAG_INIT;
  struct Pending {
    CUevent start, end;
    CUcontext ctx;
    bool busy;
    int64_t started;  // clock when the start event's record returned
    int64_t gap;      // host time the start event waited for the launch (stream was idle)
    uint32_t weight;  // launches this measurement stands for (1 / sampling probability)
  };
  // Short launches are measured one in kSampleEvery (picked at random, so that a periodic
  // launch pattern cannot alias), each measurement charged for kSampleEvery launches.
  static constexpr uint32_t kSampleEvery = 8;
  static constexpr int64_t kShortLaunchNs = 50'000;
  std::atomic<int64_t> avg_launch_ns_{1'000'000};  // running mean of measured launches
  std::atomic<uint32_t> rng_{0x9e3779b9u};
  // Share of measured (start-to-end) GPU time that was this process's own execution, per mille,
  // from NVML's per-process utilisation: the rest was waiting behind other contexts' work, which
  // is not charged (so a share is a floor next to busy neighbours, not only a cap).
  std::atomic<uint32_t> own_permille_{1000};
  std::atomic<uint64_t> measured_window_{0};  // measured ns charged since the last update
  // True-up (see UpdateOwnFactor): GPU time charged since the last update, and in total what
  // was charged, what NVML says ran, and what has been handed back for the difference.
  std::atomic<uint64_t> charged_window_{0};
  uint64_t charged_total_ = 0, own_total_ = 0;
  int64_t refunded_ = 0;
  std::atomic<int64_t> credit_ns_{0};  // charged beyond what ran, still to come off charges
  std::atomic<int64_t> next_factor_update_{0};
  static constexpr int64_t kFactorWindowNs = 1'000'000'000;
  unsigned long long util_seen_us_ = 0;
  // GPU front-end time of a launch onto an idle stream (see Harvest): the running mean of the
  // start-to-end times measured there under the cap; -1 until one is seen (guarded by ring_lock_).
  static constexpr int64_t kFrontEndCapNs = 5'000;
  int64_t front_end_ns_ = -1;
  Pending ring_[kRing] = {};
  int ring_head_ = 0, ring_count_ = 0;
  struct Entry {
    std::atomic<uint64_t> key;
    std::atomic<uint64_t> bytes;
  };
  Entry hot_[kHotSize] = {};
  Entry table_[kTableSize] = {};
  // VMM map/unmap/release bookkeeping (last: the hot members above keep their offsets).
  pthread_mutex_t vmm_mu_ = PTHREAD_MUTEX_INITIALIZER;
};

}  // namespace gpulet::vcuda
