// The agent's reader of a container's accounting file (layout: abi/vgpu_accounting.h).
//
// The file is bind-mounted read-write into the container, so its content, size and type are the
// tenant's. The reader therefore never maps it (a container truncating the file would turn every
// access of a mapping into SIGBUS in the agent): it opens the path with O_NOFOLLOW|O_NONBLOCK (no
// symlink, no FIFO that blocks), requires a regular file, copies the region with one pread() into
// its own buffer and decodes that copy. A file grown past the region (a container filling the
// host disk through it) is cut back to the region size; the interposer maps only the region, so
// cutting the excess cannot fault it.
// Thread-safe (no shared state). Agent-side only: the interposer uses accounting.h directly.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

#include "abi/vgpu_accounting.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace gpulet::vgpu {

namespace accounting_read_internal {
// One field of the copied region, by its offset in the layout (the copy is plain bytes).
template <typename T>
T At(const unsigned char* region, size_t offset) {
  T v;
  memcpy(&v, region + offset, sizeof v);
  return v;
}
}  // namespace accounting_read_internal

// Reads the accounting file at `path`. NotFound when it does not exist; FailedPrecondition when it
// is a symlink or not a regular file; DataLoss when it is shorter than the region, foreign or of
// another layout version. `*cut` (may be null) is set when the file had grown and was cut back.
inline absl::StatusOr<AccountingSnapshot> ReadAccountingFile(const std::string& path,
                                                             bool* cut = nullptr) {
  using accounting_read_internal::At;
  if (cut) *cut = false;
  int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no accounting file"));
    if (e == ELOOP)
      return absl::FailedPreconditionError(absl::StrCat(path, ": is a symlink; not read"));
    return absl::UnavailableError(absl::StrCat(path, ": cannot open: ", strerror(e)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file; not read"));
  }
  constexpr size_t kSize = sizeof(AccountingRegion);
  alignas(64) unsigned char region[kSize];
  ssize_t n = pread(fd, region, kSize, 0);
  // The slots' owners alive or gone by their locks on the file, as the interposer decides (never
  // by /proc: the agent's pids are not the container's). Asked on this descriptor (F_OFD_GETLK
  // needs no write access), before it is closed.
  bool gone[kAccountingSlots] = {};
  if (n == static_cast<ssize_t>(kSize)) {
    for (int i = 0; i < kAccountingSlots; ++i) {
      uint64_t o = At<uint64_t>(region, offsetof(AccountingRegion, owner) + i * sizeof(uint64_t));
      uint32_t tag =
          At<uint32_t>(region, offsetof(AccountingRegion, lock_tag) + i * sizeof(uint32_t));
      gone[i] = o != 0 && SlotAlive(fd, i, o, tag) == 0;
    }
  }
  close(fd);
  if (static_cast<size_t>(st.st_size) > kSize) {
    // Cut back what the container appended; the region itself stays as it is.
    int wfd = open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (wfd >= 0) {
      struct stat wst;
      if (fstat(wfd, &wst) == 0 && S_ISREG(wst.st_mode) && wst.st_ino == st.st_ino &&
          ftruncate(wfd, kSize) == 0 && cut) {
        *cut = true;
      }
      close(wfd);
    }
  }
  if (n < 0 || static_cast<size_t>(n) < kSize) {
    return absl::DataLossError(absl::StrCat(
        path, ": ", n < 0 ? 0 : n, " bytes, shorter than the accounting region (", kSize, ")"));
  }
  AccountingSnapshot out;
  uint32_t magic = At<uint32_t>(region, offsetof(AccountingRegion, magic));
  if (magic == 0) return out;  // created by the node, no CUDA process yet
  if (magic != kAccountingMagic)
    return absl::DataLossError(absl::StrCat(path, ": foreign magic number"));
  if (At<uint32_t>(region, offsetof(AccountingRegion, version)) != kAccountingVersion)
    return absl::DataLossError(absl::StrCat(path, ": unsupported layout version"));
  out.memory_limit = At<uint64_t>(region, offsetof(AccountingRegion, memory_limit));
  out.peak_used = At<uint64_t>(region, offsetof(AccountingRegion, peak_used));
  out.core_limit = At<uint32_t>(region, offsetof(AccountingRegion, core_limit));
  out.core_ceiling = At<uint32_t>(region, offsetof(AccountingRegion, core_ceiling));
  out.effective_share_permille =
      At<uint32_t>(region, offsetof(AccountingRegion, effective_share_permille));
  uint32_t slots = std::min<uint32_t>(At<uint32_t>(region, offsetof(AccountingRegion, high_water)),
                                      kAccountingSlots);
  for (uint32_t i = 0; i < slots; ++i) {
    if (gone[i]) continue;  // reclaimed by the interposer as soon as it needs the memory
    size_t held = offsetof(AccountingRegion, held) + i * sizeof(uint64_t);
    size_t owner = offsetof(AccountingRegion, owner) + i * sizeof(uint64_t);
    out.memory_used += At<uint64_t>(region, held) & kHeldBytesMask;
    out.processes += At<uint64_t>(region, owner) != 0;
  }
  out.busy_ns = At<uint64_t>(region, offsetof(AccountingRegion, busy_ns));
  out.launches = At<uint64_t>(region, offsetof(AccountingRegion, launches));
  out.throttled_ns = At<uint64_t>(region, offsetof(AccountingRegion, throttled_ns));
  out.alloc_failures = At<uint64_t>(region, offsetof(AccountingRegion, alloc_failures));
  memcpy(out.device_uuid, region + offsetof(AccountingRegion, device_uuid), sizeof out.device_uuid);
  out.device_uuid[sizeof out.device_uuid - 1] = 0;
  return out;
}

}  // namespace gpulet::vgpu
