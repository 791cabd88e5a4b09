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
//   * each process owns one slot: owner word = start_ticks << 22 | pid (one CAS claims it), and
//     holds an OFD lock on that word's bytes of the file for as long as it lives;
//   * a reservation does held[slot] += bytes (seq_cst RMW), then sums every slot (seq_cst loads);
//     if the sum exceeds the limit it undoes its add and fails. Of any set of concurrent
//     reservations, the one whose add is last in the single total order of seq_cst operations
//     sees all the others, so the committed total never passes the limit (Dekker's argument);
//     contention can only cause a conservative failure, which callers retry.
//   * a dead process is reclaimed by any survivor: mark the owner word dead (CAS), zero the held
//     word with a CAS that also bumps a 16-bit generation in its top bits (so a stale reaper
//     cannot wipe a new owner's count), then free the owner word. Every step is idempotent and
//     re-runnable by another survivor if the reaper dies too.
//   * "dead" is decided by the kernel, not by /proc: a slot's owner is alive while some process
//     holds the slot's lock (below). The lock is an OFD (open file description) byte-range lock,
//     which the kernel keeps per inode across pid, user and mount namespaces and drops when the
//     owner dies (SIGKILL included), execs (the descriptor is close-on-exec) or closes it; so a
//     SIGKILL at any instruction still leaves nothing held. /proc/<pid>/stat is only the fallback
//     for slots of interposers that predate the locks (their lock_tag does not match). Before,
//     a process could not see the pid of another pid namespace sharing the file (another pod of
//     the same DRA claim, a tenant's own user namespace), judged it dead and zeroed its memory.
//
// Header-only, no exceptions, no allocation, libc only: the interposer (loaded into other
// people's CUDA processes) and the agent both include it. Thread-safety: every function may be
// called concurrently from any thread of any process mapping the region.
#pragma once

#include <errno.h>
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
  // LockTag(owner) of a slot whose owner holds the slot's lock on the file (SlotLockOffset),
  // written before its owner word; anything else (0, interposers before this field, a stale value
  // an old reaper left) means the owner's liveness can only be read from /proc. Appended in the
  // reserved room: old interposers ignore it and keep their /proc rule for every slot.
  alignas(64) std::atomic<uint32_t> lock_tag[kAccountingSlots];
  uint8_t reserved[2048 - 64 - kAccountingSlots * 8];  // room for later fields, no version bump
};
static_assert(sizeof(AccountingRegion) == 256 + kAccountingSlots * 16 + 2048,
              "accounting layout v1 changed: bump kAccountingVersion");
static_assert(offsetof(AccountingRegion, device_uuid) == 64);
static_assert(offsetof(AccountingRegion, virtual_time_ns) == 128);
static_assert(offsetof(AccountingRegion, held) == 256);
static_assert(offsetof(AccountingRegion, context_probe_lock) == 256 + kAccountingSlots * 16);
static_assert(offsetof(AccountingRegion, nvml_pid) == 256 + kAccountingSlots * 16 + 64);
static_assert(offsetof(AccountingRegion, lock_tag) == 256 + kAccountingSlots * 20 + 64);

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

// --- liveness: one lock per slot on the file ---------------------------------------------------
//
// A slot's owner holds a write lock on the 8 bytes of its owner word in the file (F_OFD_SETLK,
// an open-file-description lock) from before it claims the slot until it gives it back; a
// reaper or a claimer takes the same lock first, so two processes never reclaim or claim one
// slot at once. The descriptor is the process's own (one per mapped region, opened O_CLOEXEC by
// MapAccounting, never mapped: a mapping keeps its open file description, and with it the locks,
// alive in every fork child that inherits the mapping): a fork child opens a fresh one before it
// claims (AccountingAfterFork, or on its first claim), so it never shares its parent's locks, and
// exec drops the image's lock with the descriptor. Regions without a file (a process-local
// stand-in) keep the /proc rule.

// The lock of slot `i`: its owner word's bytes in the file (the context probe lease: that word's).
inline off_t SlotLockOffset(int i) {
  return static_cast<off_t>(offsetof(AccountingRegion, owner) + sizeof(uint64_t) * i);
}
inline uint32_t LockTag(uint64_t owner) {
  uint32_t t = static_cast<uint32_t>(owner) ^ static_cast<uint32_t>(owner >> 32);
  return t != 0 ? t : 1;
}

// One OFD lock request `cmd` (F_OFD_SETLK / F_OFD_GETLK) of `type` on the 8 bytes at `offset`;
// fcntl's result, `*l` as the kernel left it.
inline int OfdLock(int fd, int cmd, short type, off_t offset, struct flock* l) {
  *l = {};
  l->l_type = type;
  l->l_whence = SEEK_SET;
  l->l_start = offset;
  l->l_len = sizeof(uint64_t);
  return fcntl(fd, cmd, l);
}
// 1: this descriptor now holds the write lock on [offset, +8); 0: another open file description
// holds a lock there (its owner is alive); -1: the lock cannot be taken (an error).
inline int TryLockRange(int fd, off_t offset) {
  struct flock l;
  if (OfdLock(fd, F_OFD_SETLK, F_WRLCK, offset, &l) == 0) return 1;
  return errno == EAGAIN || errno == EACCES ? 0 : -1;
}
inline void UnlockRange(int fd, off_t offset) {
  struct flock l;
  OfdLock(fd, F_OFD_SETLK, F_UNLCK, offset, &l);
}
// For readers (any descriptor, read-only too): 1 some open file description holds a lock on
// [offset, +8), 0 none, -1 cannot tell.
inline int RangeLocked(int fd, off_t offset) {
  struct flock l;
  if (OfdLock(fd, F_OFD_GETLK, F_WRLCK, offset, &l) != 0) return -1;
  return l.l_type != F_UNLCK;
}
// What a reader knows of slot `i` with owner word `owner` (non-zero) and lock tag `tag`:
// 1 alive, 0 dead (a lock-holding owner whose lock is gone), -1 cannot tell (an interposer that
// predates the locks, or no descriptor): count it as alive.
inline int SlotAlive(int fd, int i, uint64_t owner, uint32_t tag) {
  if (fd < 0 || (owner & kOwnerDead) != 0 || tag != LockTag(owner)) return -1;
  int locked = RangeLocked(fd, SlotLockOffset(i));
  return locked < 0 ? -1 : locked;
}

namespace accounting_internal {
// "/proc/self/fd/<fd>": opening it gives a new open file description of the same file. Written
// by hand: a fork child of a threaded program may call only async-signal-safe functions.
inline void SelfFdPath(int fd, char (&out)[32]) {
  static const char kPrefix[] = "/proc/self/fd/";
  memcpy(out, kPrefix, sizeof kPrefix - 1);
  char digits[12];
  int n = 0;
  for (unsigned v = static_cast<unsigned>(fd); n == 0 || v != 0; v /= 10)
    digits[n++] = static_cast<char>('0' + v % 10);
  int o = sizeof kPrefix - 1;
  while (n > 0) out[o++] = digits[--n];
  out[o] = 0;
}

// This process's descriptor of each mapped region, and the slots it holds there. Process-local
// (never in the shared file); guarded by ProcessLock.
struct LockFile {
  const void* region;  // the mapping (nullptr: free entry)
  int fd;              // O_RDWR | O_CLOEXEC; -1: none (the /proc rule)
  int pid;             // the process that opened fd; another pid: a fork child, which reopens
  uint64_t mine[kAccountingSlots / 64];  // slots claimed through this entry
};
inline constexpr int kLockFiles = 16;
inline LockFile g_lock_files[kLockFiles] = {};
// Holder's pid, 0 = free. A fork child finds its parent's pid here if a parent thread held it at
// fork (that thread does not exist in the child): it takes the lock over.
inline std::atomic<int> g_process_lock{0};

inline void ProcessLock() {
  const int self = static_cast<int>(getpid());
  for (;;) {
    int o = 0;
    if (g_process_lock.compare_exchange_strong(o, self)) return;
    if (o != self && g_process_lock.compare_exchange_strong(o, self)) return;
    sched_yield();
  }
}
inline void ProcessUnlock() { g_process_lock.store(0); }

// A fresh open file description of the same file for a fork child (whose descriptor is its
// parent's description, and so its parent's locks); the inherited descriptor is closed.
inline void ReopenLocked(LockFile& f, int self) {
  f.pid = self;
  for (uint64_t& m : f.mine) m = 0;
  if (f.fd < 0) return;
  char path[32];
  SelfFdPath(f.fd, path);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  close(f.fd);
  f.fd = fd;  // -1 if /proc is not there: the child keeps the /proc rule, never shared locks
}

// This process's entry for region `r`, reopened first in a fork child; nullptr: no descriptor.
inline LockFile* FindLocked(const AccountingRegion& r) {
  const int self = static_cast<int>(getpid());
  for (LockFile& f : g_lock_files) {
    if (f.region != &r) continue;
    if (f.pid != self) ReopenLocked(f, self);
    return f.fd >= 0 ? &f : nullptr;
  }
  return nullptr;
}

inline bool Mine(const LockFile* f, int i) { return f && (f->mine[i / 64] >> (i % 64)) & 1; }

// Keeps `fd` (which MapAccounting would close) as the descriptor of `region`; closes it if the
// kernel has no OFD locks or the table is full (the region then keeps the /proc rule).
inline void RegisterLockFile(const void* region, int fd) {
  if (RangeLocked(fd, 0) < 0) {
    close(fd);
    return;
  }
  ProcessLock();
  LockFile* slot = nullptr;
  for (LockFile& f : g_lock_files) {
    if (f.region == region) {  // a new mapping at the address of one unmapped since
      if (f.fd >= 0) close(f.fd);
      f.region = nullptr;
    }
    if (f.region == nullptr && slot == nullptr) slot = &f;
  }
  if (slot != nullptr) {
    *slot = LockFile{region, fd, static_cast<int>(getpid()), {}};
  } else {
    close(fd);
  }
  ProcessUnlock();
}
}  // namespace accounting_internal

// In a fork child (pthread_atfork's child handler; only the forking thread exists): drops the
// parent's descriptors for fresh ones at once, so that the child never keeps its parent's locks
// alive after the parent dies (e.g. forked workers of a killed program), and frees the process
// lock if a vanished parent thread held it. Without it, a child reopens on its first claim.
inline void AccountingAfterFork() {
  using namespace accounting_internal;
  g_process_lock.store(0);
  const int self = static_cast<int>(getpid());
  for (LockFile& f : g_lock_files)
    if (f.region != nullptr && f.pid != self) ReopenLocked(f, self);
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
  if (p == MAP_FAILED) {
    close(fd);
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
    close(fd);
    munmap(p, sizeof(AccountingRegion));
    *error = "accounting file has a foreign magic number";
    return nullptr;
  }
  if (magic == kAccountingMagic && r->version != kAccountingVersion) {
    close(fd);
    munmap(p, sizeof(AccountingRegion));
    *error = "accounting file has an unsupported layout version";
    return nullptr;
  }
  // A writer keeps a descriptor for its slot locks (liveness, above): an open file description
  // of its own, not the one mapped. A mapping holds its description open, and a fork child
  // inherits the mapping: locks on the mapped description would outlive the process that took
  // them for as long as any child lives.
  if (writable) {
    char self[32];
    accounting_internal::SelfFdPath(fd, self);
    int lock_fd = open(self, O_RDWR | O_CLOEXEC);
    if (lock_fd < 0) lock_fd = open(path, O_RDWR | O_CLOEXEC);  // no /proc: the same path
    if (lock_fd >= 0) accounting_internal::RegisterLockFile(p, lock_fd);
  }
  close(fd);
  return r;
}

// --- context probe lease ------------------------------------------------------------------------

namespace accounting_internal {
// Whether the holder `o` of a lease word is gone: by its slot's lock where it holds one (a live
// holder in another pid namespace is not mistaken for a dead one), else by /proc.
inline bool OwnerGoneLocked(AccountingRegion& r, LockFile* f, uint64_t o) {
  uint64_t who = o & ~kOwnerDead;
  uint32_t n = r.high_water.load(std::memory_order_seq_cst);
  for (uint32_t i = 0; f != nullptr && i < n && i < kAccountingSlots; ++i) {
    if ((r.owner[i].load() & ~kOwnerDead) != who || r.lock_tag[i].load() != LockTag(who)) continue;
    if (Mine(f, static_cast<int>(i))) return false;
    int t = TryLockRange(f->fd, SlotLockOffset(static_cast<int>(i)));
    if (t == 1) UnlockRange(f->fd, SlotLockOffset(static_cast<int>(i)));
    if (t >= 0) return t == 1;
  }
  return OwnerIsDead(o);
}
}  // namespace accounting_internal

// Serialises the first context creation of this container's processes, so that each can find
// its own (host) pid as the one new entry in NVML's process list. Returns true when held; false
// after `wait_ms` without it (the caller then measures without the lease and may find its pid
// ambiguous). A holder that died is replaced. The lease is the word's CAS (which interposers
// before the locks use too) under the lock on the word's bytes in the file: a live holder keeps
// that lock, whatever pid namespace it is in; a dead one's went with it.
inline bool LockContextProbe(AccountingRegion& r, uint64_t self, int wait_ms) {
  using namespace accounting_internal;
  const off_t at = static_cast<off_t>(offsetof(AccountingRegion, context_probe_lock));
  for (int waited = 0;; ++waited) {
    ProcessLock();
    LockFile* f = FindLocked(r);
    int t = f ? TryLockRange(f->fd, at) : -1;
    if (t != 0) {  // no live holder that takes the lock (or no descriptor: the word alone)
      uint64_t o = 0;
      if (r.context_probe_lock.compare_exchange_strong(o, self) || o == self ||
          (OwnerGoneLocked(r, f, o) && r.context_probe_lock.compare_exchange_strong(o, self))) {
        ProcessUnlock();
        return true;
      }
      if (t == 1) UnlockRange(f->fd, at);
    }
    ProcessUnlock();
    if (waited >= wait_ms) return false;
    usleep(1000);
  }
}
inline void UnlockContextProbe(AccountingRegion& r, uint64_t self) {
  using namespace accounting_internal;
  r.context_probe_lock.compare_exchange_strong(self, 0);
  ProcessLock();
  if (LockFile* f = FindLocked(r))
    UnlockRange(f->fd, static_cast<off_t>(offsetof(AccountingRegion, context_probe_lock)));
  ProcessUnlock();
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

namespace accounting_internal {
// ReclaimDead under ProcessLock, with this process's descriptor `f` (nullptr: the /proc rule).
inline uint64_t ReclaimDeadLocked(AccountingRegion& r, LockFile* f, uint64_t self_owner) {
  uint64_t reclaimed = 0;
  uint32_t n = r.high_water.load(std::memory_order_seq_cst);
  if (n > kAccountingSlots) n = kAccountingSlots;
  for (uint32_t u = 0; u < n; ++u) {
    const int i = static_cast<int>(u);
    uint64_t o = r.owner[i].load(std::memory_order_seq_cst);
    if (o == 0 || Mine(f, i)) continue;
    // Without a descriptor the owner word is all there is to tell our own slots by.
    if (f == nullptr && (o & ~kOwnerDead) == self_owner) continue;
    bool locked = false;
    if (f != nullptr) {
      int t = TryLockRange(f->fd, SlotLockOffset(i));
      if (t != 1) continue;  // its owner holds it (or a claimer, a reaper): alive; or unknown
      locked = true;
    }
    // Lock free: an owner that took it (its tag) is gone (dead, exec'd, or closed the file); an
    // owner that predates the locks is judged by /proc, as before.
    uint64_t who = o & ~kOwnerDead;
    bool dead =
        (o & kOwnerDead) != 0 || (locked && r.lock_tag[i].load() == LockTag(who)) || OwnerIsDead(o);
    if (dead) {
      uint64_t marked = o | kOwnerDead;
      if (o == marked || r.owner[i].compare_exchange_strong(o, marked)) {
        uint64_t w = r.held[i].load(std::memory_order_seq_cst);
        // Only while the slot is still marked dead for this owner may its count be dropped; a
        // CAS on the exact word (with generation) fails if a new owner has touched it since.
        if (r.owner[i].load(std::memory_order_seq_cst) == marked) {
          uint64_t fresh = (w & ~kHeldBytesMask) + kHeldGenOne;
          if (r.held[i].compare_exchange_strong(w, fresh)) reclaimed += w & kHeldBytesMask;
          r.nvml_pid[i].store(0, std::memory_order_seq_cst);
          r.lock_tag[i].store(0, std::memory_order_seq_cst);
          r.owner[i].compare_exchange_strong(marked, 0);
        }
      }
    }
    if (locked) UnlockRange(f->fd, SlotLockOffset(i));
  }
  return reclaimed;
}
}  // namespace accounting_internal

// Reclaims the slots of dead processes; returns the bytes returned to the container. Slow path
// (a reservation over the limit, no free slot): a lock attempt per other process's slot. Out of
// line, so that Reserve stays small enough to be inlined into every allocation hook.
__attribute__((noinline, cold)) inline uint64_t ReclaimDead(AccountingRegion& r,
                                                            uint64_t self_owner) {
  using namespace accounting_internal;
  ProcessLock();
  uint64_t reclaimed = ReclaimDeadLocked(r, FindLocked(r), self_owner);
  ProcessUnlock();
  return reclaimed;
}

// Claims a free slot for `owner` (taking its lock first); -1 if all slots are taken (after
// reclaiming dead ones).
inline int ClaimSlot(AccountingRegion& r, uint64_t owner) {
  using namespace accounting_internal;
  ProcessLock();
  LockFile* f = FindLocked(r);
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (int i = 0; i < kAccountingSlots; ++i) {
      if (r.owner[i].load(std::memory_order_relaxed) != 0) continue;
      // The lock first: held by another description, the slot is being claimed or reclaimed.
      int t = f ? TryLockRange(f->fd, SlotLockOffset(i)) : -1;
      if (t == 0) continue;
      r.lock_tag[i].store(t == 1 ? LockTag(owner) : 0, std::memory_order_seq_cst);
      uint64_t expect = 0;
      if (!r.owner[i].compare_exchange_strong(expect, owner)) {
        if (t == 1) {
          r.lock_tag[i].store(0, std::memory_order_seq_cst);
          UnlockRange(f->fd, SlotLockOffset(i));
        }
        continue;
      }
      r.nvml_pid[i].store(0, std::memory_order_seq_cst);  // the previous owner's
      uint32_t hw = r.high_water.load();
      while (hw < static_cast<uint32_t>(i + 1) && !r.high_water.compare_exchange_weak(hw, i + 1)) {
      }
      if (t == 1) f->mine[i / 64] |= uint64_t{1} << (i % 64);
      ProcessUnlock();
      return i;
    }
    ReclaimDeadLocked(r, f, owner);
  }
  ProcessUnlock();
  return -1;
}

// Gives the slot back (normal exit); its bytes leave the container total.
inline void ReleaseSlot(AccountingRegion& r, int slot, uint64_t owner) {
  using namespace accounting_internal;
  uint64_t w = r.held[slot].load();
  while (!r.held[slot].compare_exchange_weak(w, (w & ~kHeldBytesMask) + kHeldGenOne)) {
  }
  r.nvml_pid[slot].store(0, std::memory_order_seq_cst);
  ProcessLock();
  LockFile* f = FindLocked(r);
  bool locked = Mine(f, slot);
  if (locked) r.lock_tag[slot].store(0, std::memory_order_seq_cst);
  r.owner[slot].compare_exchange_strong(owner, 0);
  if (locked) {
    UnlockRange(f->fd, SlotLockOffset(slot));
    f->mine[slot / 64] &= ~(uint64_t{1} << (slot % 64));
  }
  ProcessUnlock();
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
  // Committed bytes, without those of processes known to be gone (their slot's lock is free),
  // which the interposer reclaims as soon as it needs them; an interposer that predates the locks
  // cannot be told dead from alive here, and counts.
  uint64_t memory_used = 0;
  uint64_t peak_used = 0;
  uint32_t core_limit = 0;    // percent
  uint32_t core_ceiling = 0;  // percent
  uint32_t effective_share_permille = 0;
  uint32_t processes = 0;  // claimed slots whose owner is alive (or cannot be told dead)
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
  out->peak_used = r->peak_used.load();
  out->core_limit = r->core_limit.load();
  out->core_ceiling = r->core_ceiling.load();
  out->effective_share_permille = r->effective_share_permille.load();
  // Liveness as the interposer decides it: the slots' locks (never /proc, whose pids are not the
  // container's), through a descriptor of our own (a read-only one may ask, F_OFD_GETLK).
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  uint32_t n = r->high_water.load();
  out->processes = 0;
  out->memory_used = 0;
  for (uint32_t i = 0; i < n && i < kAccountingSlots; ++i) {
    uint64_t o = r->owner[i].load();
    if (o != 0 && SlotAlive(fd, static_cast<int>(i), o, r->lock_tag[i].load()) == 0) continue;
    out->processes += o != 0;
    out->memory_used += r->held[i].load() & kHeldBytesMask;
  }
  if (fd >= 0) close(fd);
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
