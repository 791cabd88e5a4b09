// Per-container vGPU accounting region: the shared-memory layout through which all CUDA processes
// of one container share a single memory limit and a single GPU-time budget, and through which the
// node agent reads per-container usage (read-only API at the bottom).
//
// The region is a file (host: /var/lib/gpulet/vgpu/<pod-uid>/<container>/accounting, bind-mounted
// read-write at GPULET_VGPU_ACCOUNTING inside the container) mapped MAP_SHARED by every process.
// A zero-filled file is a valid empty region, so creation needs no lock: whoever maps it first
// fills the header with the same constants.
//
// Memory is reserved before the driver allocates ("reserve-before-allocate") with a lock-free
// protocol that cannot exceed the limit by one byte under any interleaving and that a SIGKILL at
// any instruction cannot wedge:
//   * each process owns one slot: owner word = start_ticks << 22 | pid (one CAS claims it);
//   * a reservation does held[slot] += bytes (seq_cst RMW), then sums every slot (seq_cst loads);
//     if the sum exceeds the limit it undoes its add and fails. Of any set of concurrent
//     reservations, the one whose add is last in the single total order of seq_cst operations
//     sees all the others, so the committed total never passes the limit (Dekker's argument);
//     contention can only cause a conservative failure, which callers retry.
//   * a dead process (no /proc/<pid>/stat, zombie, or a different start time = reused pid) is
//     reclaimed by any survivor: mark the owner word dead (CAS), zero the held word with a CAS
//     that also bumps a 16-bit generation in its top bits (so a stale reaper cannot wipe a new
//     owner's count), then free the owner word. Every step is idempotent and re-runnable by
//     another survivor if the reaper dies too. There are no locks at all.
//
// Header-only, no exceptions, no allocation, libc only: the interposer (loaded into other
// people's CUDA processes) and the agent both include it. Thread-safety: every function may be
// called concurrently from any thread of any process mapping the region.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace gpulet::vgpu {

inline constexpr uint32_t kAccountingMagic = 0x56475055;  // "UPGV" little-endian: gpulet vGPU
inline constexpr uint32_t kAccountingVersion = 1;
inline constexpr int kAccountingSlots = 128;  // processes per container that may hold memory
inline constexpr char kDefaultAccountingPath[] = "/var/run/gpulet/vgpu/accounting";

// held[] word: generation (16 bits) << 48 | bytes (48 bits, 256 TiB).
inline constexpr uint64_t kHeldBytesMask = (uint64_t{1} << 48) - 1;
inline constexpr uint64_t kHeldGenOne = uint64_t{1} << 48;
// owner[] word: start_ticks << 22 | pid; bit 63 marks "dead, being reclaimed".
inline constexpr uint64_t kOwnerDead = uint64_t{1} << 63;
inline constexpr int kPidBits = 22;  // Linux pid_max is at most 2^22

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics must be lock-free");
static_assert(std::atomic<int64_t>::is_always_lock_free, "shared atomics must be lock-free");

// Version 1 layout. Fields are only ever appended into `reserved`; a layout change that moves a
// field bumps kAccountingVersion. Offsets are fixed by the static_asserts below.
struct alignas(64) AccountingRegion {
  // Header (written once, identically, by whichever process maps the zero file first).
  std::atomic<uint32_t> magic;
  uint32_t version;
  uint32_t size;       // sizeof(AccountingRegion) of the writer
  uint32_t max_slots;  // kAccountingSlots
  // Limits: copied from the container environment by each attaching process (same values).
  std::atomic<uint64_t> memory_limit;  // bytes; 0 = unlimited
  std::atomic<uint32_t> core_limit;    // percent of the GPU, 1..100
  std::atomic<uint32_t> core_ceiling;  // percent the soft limit may borrow up to (>= limit)
  // Largest memory one process of this container was measured to hold beyond its allocations
  // (CUDA contexts, module code, rounding); only ever raised. Processes that cannot measure their
  // own charge this much per context (see docs/interposer.md, "Memory the driver holds").
  std::atomic<uint64_t> context_bytes;
  uint8_t header_reserved[24];
  char device_uuid[64];  // "GPU-..." of the limited GPU; empty = every visible device

  // Compute pacing and statistics (its own cache lines; see docs/interposer.md).
  alignas(64) std::atomic<int64_t> virtual_time_ns;  // shared finish-time of the GPU-time budget
  std::atomic<uint64_t> busy_ns;                     // measured GPU time of this container's work
  std::atomic<uint64_t> launches;                    // kernel and graph launches seen
  std::atomic<uint64_t> throttled_ns;                // time launches were held back
  std::atomic<uint64_t> alloc_failures;              // allocations refused at the limit
  std::atomic<uint64_t> peak_used;                 // highest committed total seen by a reservation
  std::atomic<uint32_t> effective_share_permille;  // current pacing share (soft limit moves it)
  uint32_t stats_reserved0;
  uint8_t stats_reserved[8];

  alignas(64) std::atomic<uint32_t> high_water;  // slots [0, high_water) have ever been claimed
  alignas(64) std::atomic<uint64_t> held[kAccountingSlots];
  alignas(64) std::atomic<uint64_t> owner[kAccountingSlots];
  // Owner word of the process that is creating its first CUDA context and telling its own entry
  // in NVML's process list apart from the others (0 = free). A lease: a dead holder's word is
  // taken over, a slow one is waited for at most a few seconds (LockContextProbe).
  alignas(64) std::atomic<uint64_t> context_probe_lock;
  // Each slot's pid as NVML lists it (the host's pid namespace), written by the slot's owner once
  // it has found its NVML entry; 0 = not known (also from interposers before this field). Lets a
  // process near the limit see what the driver holds for the whole container (ContainerHeld).
  alignas(64) std::atomic<uint32_t> nvml_pid[kAccountingSlots];
  uint8_t reserved[2048 - 64 - kAccountingSlots * 4];  // room for later fields, no version bump
};
static_assert(sizeof(AccountingRegion) == 256 + kAccountingSlots * 16 + 2048,
              "accounting layout v1 changed: bump kAccountingVersion");
static_assert(offsetof(AccountingRegion, device_uuid) == 64);
static_assert(offsetof(AccountingRegion, virtual_time_ns) == 128);
static_assert(offsetof(AccountingRegion, held) == 256);
static_assert(offsetof(AccountingRegion, context_probe_lock) == 256 + kAccountingSlots * 16);
static_assert(offsetof(AccountingRegion, nvml_pid) == 256 + kAccountingSlots * 16 + 64);

// --- process identity -------------------------------------------------------------------------

// Start time of `pid` in clock ticks since boot (/proc/<pid>/stat field 22); 0 if the process
// is gone or a zombie. No allocation: reads into a stack buffer.
inline uint64_t ProcessStartTicks(int pid) {
  char path[32];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char* p = strrchr(buf, ')');  // comm may contain spaces and parentheses
  if (p == nullptr || p[1] != ' ') return 0;
  p += 2;
  if (*p == 'Z' || *p == 'X') return 0;       // zombie/dead: its GPU memory is already gone
  for (int field = 3; field < 22; ++field) {  // p points at field 3 (state)
    p = strchr(p, ' ');
    if (p == nullptr) return 0;
    ++p;
  }
  uint64_t v = 0;
  for (; *p >= '0' && *p <= '9'; ++p) v = v * 10 + static_cast<uint64_t>(*p - '0');
  return v;
}

inline uint64_t OwnerWord(int pid, uint64_t start_ticks) {
  return (start_ticks << kPidBits) | static_cast<uint64_t>(pid);
}

// True if the owner word names a process that no longer exists (or reused its pid).
inline bool OwnerIsDead(uint64_t owner) {
  if (owner & kOwnerDead) return true;
  int pid = static_cast<int>(owner & ((uint64_t{1} << kPidBits) - 1));
  uint64_t start = (owner & ~kOwnerDead) >> kPidBits;
  return ProcessStartTicks(pid) != start;
}

// --- mapping ----------------------------------------------------------------------------------

// Maps the region file. writable: create it (mode 0666) and size it if needed, and fill the
// header; else map read-only. On failure returns nullptr and sets *error to a static message
// (errno still holds the cause). The mapping lives until process exit (never unmapped: other
// threads may be inside the interposer).
inline AccountingRegion* MapAccounting(const char* path, bool writable, const char** error) {
  int fd = open(path, writable ? (O_RDWR | O_CREAT | O_CLOEXEC) : (O_RDONLY | O_CLOEXEC), 0666);
  if (fd < 0) {
    *error = "cannot open accounting file";
    return nullptr;
  }
  // The size by lseek, not fstat: fstat is a libc symbol only since glibc 2.33, and the
  // interposer must load on older ones (glibc_floor.h).
  off_t size = lseek(fd, 0, SEEK_END);
  if (size < 0) {
    close(fd);
    *error = "cannot size up accounting file";
    return nullptr;
  }
  if (static_cast<size_t>(size) < sizeof(AccountingRegion)) {
    // Growing a file with ftruncate is atomic and zero-fills; racing growers agree on the size.
    if (!writable || ftruncate(fd, sizeof(AccountingRegion)) != 0) {
      close(fd);
      *error = writable ? "cannot size accounting file" : "accounting file is truncated";
      return nullptr;
    }
  }
  void* p = mmap(nullptr, sizeof(AccountingRegion), writable ? PROT_READ | PROT_WRITE : PROT_READ,
                 MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    *error = "cannot map accounting file";
    return nullptr;
  }
  auto* r = static_cast<AccountingRegion*>(p);
  if (writable && r->magic.load(std::memory_order_acquire) == 0) {
    r->version = kAccountingVersion;
    r->size = sizeof(AccountingRegion);
    r->max_slots = kAccountingSlots;
    uint32_t zero = 0;
    r->magic.compare_exchange_strong(zero, kAccountingMagic, std::memory_order_release);
  }
  uint32_t magic = r->magic.load(std::memory_order_acquire);
  if (magic != kAccountingMagic && !(magic == 0 && !writable)) {
    munmap(p, sizeof(AccountingRegion));
    *error = "accounting file has a foreign magic number";
    return nullptr;
  }
  if (magic == kAccountingMagic && r->version != kAccountingVersion) {
    munmap(p, sizeof(AccountingRegion));
    *error = "accounting file has an unsupported layout version";
    return nullptr;
  }
  return r;
}

// --- context probe lease ------------------------------------------------------------------------

// Serialises the first context creation of this container's processes, so that each can find
// its own (host) pid as the one new entry in NVML's process list. Returns true when held; false
// after `wait_ms` without it (the caller then measures without the lease and may find its pid
// ambiguous). A holder that died is replaced.
inline bool LockContextProbe(AccountingRegion& r, uint64_t self, int wait_ms) {
  for (int waited = 0;; ++waited) {
    uint64_t o = 0;
    if (r.context_probe_lock.compare_exchange_strong(o, self)) return true;
    if (o == self) return true;
    if (OwnerIsDead(o) && r.context_probe_lock.compare_exchange_strong(o, self)) return true;
    if (waited >= wait_ms) return false;
    usleep(1000);
  }
}
inline void UnlockContextProbe(AccountingRegion& r, uint64_t self) {
  r.context_probe_lock.compare_exchange_strong(self, 0);
}

// --- memory reservation -----------------------------------------------------------------------

// Committed bytes of the whole container (every slot, live or not yet reclaimed).
inline uint64_t UsedBytes(const AccountingRegion& r) {
  uint32_t n = r.high_water.load(std::memory_order_seq_cst);
  if (n > kAccountingSlots) n = kAccountingSlots;
  uint64_t sum = 0;
  for (uint32_t i = 0; i < n; ++i)
    sum += r.held[i].load(std::memory_order_seq_cst) & kHeldBytesMask;
  return sum;
}

// Claims a free slot for `owner`; -1 if all slots are taken (after reclaiming dead ones).
inline int ClaimSlot(AccountingRegion& r, uint64_t owner);

// Reclaims the slots of dead processes; returns the bytes returned to the container.
inline uint64_t ReclaimDead(AccountingRegion& r, uint64_t self_owner) {
  uint64_t reclaimed = 0;
  uint32_t n = r.high_water.load(std::memory_order_seq_cst);
  if (n > kAccountingSlots) n = kAccountingSlots;
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t o = r.owner[i].load(std::memory_order_seq_cst);
    if (o == 0 || (o & ~kOwnerDead) == self_owner || !OwnerIsDead(o)) continue;
    uint64_t marked = o | kOwnerDead;
    if (o != marked && !r.owner[i].compare_exchange_strong(o, marked)) continue;
    uint64_t w = r.held[i].load(std::memory_order_seq_cst);
    // Only while the slot is still marked dead for this owner may its count be dropped; a CAS on
    // the exact word (with generation) fails if a new owner has touched it since.
    if (r.owner[i].load(std::memory_order_seq_cst) != marked) continue;
    uint64_t fresh = (w & ~kHeldBytesMask) + kHeldGenOne;
    if (r.held[i].compare_exchange_strong(w, fresh)) reclaimed += w & kHeldBytesMask;
    r.nvml_pid[i].store(0, std::memory_order_seq_cst);
    r.owner[i].compare_exchange_strong(marked, 0);
  }
  return reclaimed;
}

inline int ClaimSlot(AccountingRegion& r, uint64_t owner) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (int i = 0; i < kAccountingSlots; ++i) {
      uint64_t expect = 0;
      if (r.owner[i].load(std::memory_order_relaxed) != 0) continue;
      if (!r.owner[i].compare_exchange_strong(expect, owner)) continue;
      r.nvml_pid[i].store(0, std::memory_order_seq_cst);  // the previous owner's
      uint32_t hw = r.high_water.load();
      while (hw < static_cast<uint32_t>(i + 1) && !r.high_water.compare_exchange_weak(hw, i + 1)) {
      }
      return i;
    }
    ReclaimDead(r, owner);
  }
  return -1;
}

// Gives the slot back (normal exit); its bytes leave the container total.
inline void ReleaseSlot(AccountingRegion& r, int slot, uint64_t owner) {
  uint64_t w = r.held[slot].load();
  while (!r.held[slot].compare_exchange_weak(w, (w & ~kHeldBytesMask) + kHeldGenOne)) {
  }
  r.nvml_pid[slot].store(0, std::memory_order_seq_cst);
  r.owner[slot].compare_exchange_strong(owner, 0);
}

// The limit a process enforces: its own (from its environment, which the container cannot
// change for a running process), lowered but never raised by the value in the shared file,
// which every process of the container can write.
inline uint64_t EffectiveLimit(const AccountingRegion& r, uint64_t own_limit) {
  uint64_t file = r.memory_limit.load(std::memory_order_relaxed);
  if (file != 0 && (own_limit == 0 || file < own_limit)) return file;
  return own_limit;
}

// Reserves `bytes` for the process owning `slot` before the driver allocates them, against
// `own_limit` (0 = none; see EffectiveLimit). Returns false (nothing reserved) if the container
// total would exceed the limit, after reclaiming dead processes' memory and retrying through
// transient contention. On success *total (if given) is the container total the reservation saw
// (0 when there is no limit).
inline bool Reserve(AccountingRegion& r, int slot, uint64_t owner, uint64_t bytes,
                    uint64_t own_limit = 0, uint64_t* total = nullptr) {
  uint64_t limit = EffectiveLimit(r, own_limit);
  if (total) *total = 0;
  if (limit == 0) {
    r.held[slot].fetch_add(bytes, std::memory_order_relaxed);
    return true;
  }
  if (bytes > limit) {
    r.alloc_failures.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  for (int attempt = 0; attempt < 4; ++attempt) {
    r.held[slot].fetch_add(bytes, std::memory_order_seq_cst);
    uint64_t sum = UsedBytes(r);
    if (sum <= limit) {
      if (total) *total = sum;
      uint64_t peak = r.peak_used.load(std::memory_order_relaxed);
      while (peak < sum && !r.peak_used.compare_exchange_weak(peak, sum)) {
      }
      return true;
    }
    r.held[slot].fetch_sub(bytes, std::memory_order_seq_cst);
    // Over the limit: recover memory of dead processes, else let reservations of other
    // processes that are in flight (and may be about to fail themselves) settle, and retry.
    if (ReclaimDead(r, owner) == 0) sched_yield();
  }
  r.alloc_failures.fetch_add(1, std::memory_order_relaxed);
  return false;
}

// Returns bytes reserved earlier (after a free, or when the driver refused the allocation).
inline void Unreserve(AccountingRegion& r, int slot, uint64_t bytes) {
  r.held[slot].fetch_sub(bytes, std::memory_order_seq_cst);
}

// --- read-only API for the agent --------------------------------------------------------------

struct AccountingSnapshot {
  uint64_t memory_limit = 0;  // bytes, 0 = unlimited
  uint64_t memory_used = 0;   // committed bytes (includes dead processes not yet reclaimed)
  uint64_t peak_used = 0;
  uint32_t core_limit = 0;    // percent
  uint32_t core_ceiling = 0;  // percent
  uint32_t effective_share_permille = 0;
  uint32_t processes = 0;  // claimed slots
  uint64_t busy_ns = 0;    // cumulative GPU time; utilisation = d(busy_ns)/d(wall ns)
  uint64_t launches = 0;
  uint64_t throttled_ns = 0;
  uint64_t alloc_failures = 0;
  char device_uuid[64] = {};
};

// Reads one consistent-enough snapshot (each field atomically; fields may be from instants a few
// nanoseconds apart) of the accounting file at `path`. Returns false and sets *error to a static
// message if the file is missing, truncated, foreign or of another layout version.
inline bool ReadAccounting(const char* path, AccountingSnapshot* out, const char** error) {
  AccountingRegion* r = MapAccounting(path, /*writable=*/false, error);
  if (r == nullptr) return false;
  if (r->magic.load(std::memory_order_acquire) == 0) {  // created but no CUDA process yet
    *out = AccountingSnapshot{};
    munmap(r, sizeof(AccountingRegion));
    return true;
  }
  out->memory_limit = r->memory_limit.load();
  out->memory_used = UsedBytes(*r);
  out->peak_used = r->peak_used.load();
  out->core_limit = r->core_limit.load();
  out->core_ceiling = r->core_ceiling.load();
  out->effective_share_permille = r->effective_share_permille.load();
  uint32_t n = r->high_water.load();
  out->processes = 0;
  for (uint32_t i = 0; i < n && i < kAccountingSlots; ++i)
    out->processes += r->owner[i].load() != 0;
  out->busy_ns = r->busy_ns.load();
  out->launches = r->launches.load();
  out->throttled_ns = r->throttled_ns.load();
  out->alloc_failures = r->alloc_failures.load();
  memcpy(out->device_uuid, r->device_uuid, sizeof out->device_uuid);
  out->device_uuid[sizeof out->device_uuid - 1] = 0;
  munmap(r, sizeof(AccountingRegion));
  return true;
}

}  // namespace gpulet::vgpu
