// Paths inside a container's root filesystem, resolved without ever leaving it: every lookup goes
// through openat2(RESOLVE_IN_ROOT), so an absolute symlink or ".." in the image resolves inside
// the rootfs rather than on the host (the CVE-2024-0132 class). Creation is done one component at a
// time relative to a directory fd obtained that way, and never follows a symlink at the final
// component. Thread-compatible; fds are owned by the returned Fd.
#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"

namespace gpulet::runtime {

// An owned file descriptor (closed on destruction).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  ~Fd();
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  // "/proc/self/fd/N": a path to the very object the fd refers to (for mount(2)).
  std::string ProcPath() const;

 private:
  int fd_ = -1;
};

// A directory fd for the rootfs (O_PATH).
absl::StatusOr<Fd> OpenRoot(const std::string& rootfs);

// Opens `path` (absolute, as seen in the container) inside the root as O_PATH, following symlinks
// only within the root. NotFound when absent.
absl::StatusOr<Fd> OpenInRoot(const Fd& root, const std::string& path);

// Creates the directory `path` and its parents inside the root (mode 0755); returns it (O_PATH).
absl::StatusOr<Fd> MkdirAllInRoot(const Fd& root, const std::string& path);

// Creates an empty regular file (a bind-mount target) or reuses an existing one; parents are made.
absl::StatusOr<Fd> CreateFileInRoot(const Fd& root, const std::string& path);

// Bind-mounts `source` (a host path as this process sees it; directories recursively) onto
// `target` (from CreateFileInRoot/MkdirAllInRoot) read-only, nosuid, nodev and private. The mount
// is built detached and read-only first (open_tree(OPEN_TREE_CLONE), mount_setattr) and only then
// attached to the target fd (move_mount): it is never writable where the container (or a sibling
// swapping symlinks in a shared image directory) could reach it, and no path is resolved again.
// Kernels without that API (ENOSYS: before 5.12) get bind + remount, where the remount target is
// `path` resolved again in `root` and must be the very mount just made (same device, inode and
// mount id as the bind), else the bind is undone and it is an error.
absl::Status BindReadOnly(const std::string& source, const Fd& root, const std::string& path,
                          const Fd& target);

// Creates a device node (or keeps an existing one with the same type and numbers).
absl::Status MknodInRoot(const Fd& root, const std::string& path, mode_t mode, dev_t dev);

}  // namespace gpulet::runtime
