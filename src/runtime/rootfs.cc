#include "runtime/rootfs.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace gpulet::runtime {
namespace {

absl::Status Errno(const std::string& what) {
  int e = errno;
  std::string msg = absl::StrCat(what, ": ", std::strerror(e));
  return e == ENOENT ? absl::NotFoundError(msg) : absl::FailedPreconditionError(msg);
}

int OpenAt2(int dirfd, const std::string& path, uint64_t flags) {
  struct open_how how = {};
  how.flags = flags | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  size_t skip = path.find_first_not_of('/');
  std::string rel = skip == std::string::npos ? std::string(1, '.') : path.substr(skip);
  int fd;
  do {
    fd = static_cast<int>(::syscall(SYS_openat2, dirfd, rel.c_str(), &how, sizeof how));
  } while (fd < 0 && errno == EAGAIN);  // a concurrent rename in the tree: retry
  return fd;
}

// Splits a container path into (parent, last component); rejects "." and "..".
absl::Status Split(const std::string& path, std::string* parent, std::string* base) {
  if (path.empty() || path[0] != '/')
    return absl::InvalidArgumentError(absl::StrCat("path \"", path, "\" is not absolute"));
  size_t slash = path.find_last_of('/');
  *parent = path.substr(0, slash);
  *base = path.substr(slash + 1);
  if (base->empty() || *base == "." || *base == "..")
    return absl::InvalidArgumentError(absl::StrCat("path \"", path, "\" has no file name"));
  return absl::OkStatus();
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}
Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}
std::string Fd::ProcPath() const { return absl::StrCat("/proc/self/fd/", fd_); }

absl::StatusOr<Fd> OpenRoot(const std::string& rootfs) {
  int fd = ::open(rootfs.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open rootfs " + rootfs);
  return Fd(fd);
}

absl::StatusOr<Fd> OpenInRoot(const Fd& root, const std::string& path) {
  int fd = OpenAt2(root.get(), path, O_PATH);
  if (fd < 0) return Errno("cannot resolve " + path + " in the container rootfs");
  return Fd(fd);
}

absl::StatusOr<Fd> MkdirAllInRoot(const Fd& root, const std::string& path) {
  Fd dir(OpenAt2(root.get(), "/", O_PATH | O_DIRECTORY));
  if (dir.get() < 0) return Errno("cannot open the container rootfs");
  std::string so_far;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (part == "." || part == "..")
      return absl::InvalidArgumentError(absl::StrCat("path \"", path, "\" contains . or .."));
    std::string name(part);
    so_far += "/" + name;
    // Resolve the prefix from the root every time: a symlink met on the way stays inside the root.
    int fd = OpenAt2(root.get(), so_far, O_PATH | O_DIRECTORY);
    if (fd < 0 && errno == ENOENT) {
      if (::mkdirat(dir.get(), name.c_str(), 0755) != 0 && errno != EEXIST)
        return Errno("cannot create " + so_far + " in the container rootfs");
      fd = OpenAt2(root.get(), so_far, O_PATH | O_DIRECTORY);
    }
    if (fd < 0) return Errno("cannot open " + so_far + " in the container rootfs");
    dir = Fd(fd);
  }
  return dir;
}

absl::StatusOr<Fd> CreateFileInRoot(const Fd& root, const std::string& path) {
  std::string parent, base;
  RETURN_IF_ERROR(Split(path, &parent, &base));
  ASSIGN_OR_RETURN(Fd dir, MkdirAllInRoot(root, parent));
  // O_PATH fds cannot create: reopen the parent (already resolved inside the root) for writing.
  Fd wdir(::openat(dir.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (wdir.get() < 0) return Errno("cannot open " + parent + " in the container rootfs");
  int fd = ::openat(wdir.get(), base.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC,
                    0644);
  if (fd >= 0) {
    ::close(fd);
  } else if (errno != EEXIST) {
    return Errno("cannot create " + path + " in the container rootfs");
  }
  return OpenInRoot(root, path);
}

namespace {

// glibc 2.36 declares these; older ones do not: the raw system calls serve both.
int OpenTree(int dirfd, const char* path, unsigned flags) {
  return static_cast<int>(::syscall(SYS_open_tree, dirfd, path, flags));
}
int MountSetattr(int dirfd, const char* path, unsigned flags, struct mount_attr* attr) {
  return static_cast<int>(::syscall(SYS_mount_setattr, dirfd, path, flags, attr, sizeof *attr));
}
int MoveMount(int from_dirfd, const char* from, int to_dirfd, const char* to, unsigned flags) {
  return static_cast<int>(::syscall(SYS_move_mount, from_dirfd, from, to_dirfd, to, flags));
}

// The mount id of an fd's mount (statx STATX_MNT_ID, 5.8+), or 0 when unknown.
uint64_t MountId(int fd) {
  struct statx sx = {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_MNT_ID, &sx) != 0 || !(sx.stx_mask & STATX_MNT_ID))
    return 0;
  return sx.stx_mnt_id;
}

// Kernels without the new mount API: bind read-write through the target fd, then find the mount
// again by path and make it read-only only when it is the one just made. A window remains in
// which the bind is writable; the new API has none.
absl::Status BindReadOnlyOld(const std::string& source, const Fd& root, const std::string& path,
                             const Fd& target) {
  struct stat src;
  if (::stat(source.c_str(), &src) != 0) return Errno("cannot stat " + source);
  if (::mount(source.c_str(), target.ProcPath().c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0)
    return Errno("cannot mount " + source + " at " + path);
  absl::StatusOr<Fd> again = OpenInRoot(root, path);
  struct stat st;
  // The mount ids tell the new mount from the old target (0: a kernel before 5.8 cannot say).
  uint64_t now_id = again.ok() ? MountId(again->get()) : 0;
  bool same = again.ok() && ::fstat(again->get(), &st) == 0 && st.st_dev == src.st_dev &&
              st.st_ino == src.st_ino && (now_id == 0 || now_id != MountId(target.get()));
  if (!same) {
    ::umount2(target.ProcPath().c_str(), MNT_DETACH);
    return absl::FailedPreconditionError(absl::StrCat(
        path, " changed while ", source, " was being mounted there read-only; not mounted"));
  }
  if (::mount(nullptr, again->ProcPath().c_str(), nullptr,
              MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0) {
    absl::Status s = Errno("cannot make " + path + " read-only");
    ::umount2(again->ProcPath().c_str(), MNT_DETACH);
    return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BindReadOnly(const std::string& source, const Fd& root, const std::string& path,
                          const Fd& target) {
  Fd tree(OpenTree(AT_FDCWD, source.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE));
  if (tree.get() < 0 && errno == ENOSYS) return BindReadOnlyOld(source, root, path, target);
  if (tree.get() < 0) return Errno("cannot open " + source + " for mounting");
  struct mount_attr attr = {};
  attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  attr.propagation = MS_PRIVATE;
  if (MountSetattr(tree.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr) != 0) {
    // open_tree without mount_setattr (5.2 to 5.11): nothing is attached yet; the old way.
    if (errno == ENOSYS) return BindReadOnlyOld(source, root, path, target);
    return Errno("cannot make the mount of " + source + " read-only");
  }
  if (MoveMount(tree.get(), "", target.get(), "",
                MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) != 0)
    return Errno("cannot mount " + source + " at " + path);
  return absl::OkStatus();
}

absl::Status MknodInRoot(const Fd& root, const std::string& path, mode_t mode, dev_t dev) {
  std::string parent, base;
  RETURN_IF_ERROR(Split(path, &parent, &base));
  ASSIGN_OR_RETURN(Fd dir, MkdirAllInRoot(root, parent));
  Fd wdir(::openat(dir.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (wdir.get() < 0) return Errno("cannot open " + parent + " in the container rootfs");
  if (::mknodat(wdir.get(), base.c_str(), mode, dev) == 0) return absl::OkStatus();
  if (errno != EEXIST) return Errno("cannot create device " + path + " in the container rootfs");
  struct stat st;
  if (::fstatat(wdir.get(), base.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
    return Errno("cannot stat " + path);
  if ((st.st_mode & S_IFMT) != (mode & S_IFMT) || st.st_rdev != dev)
    return absl::FailedPreconditionError(
        absl::StrCat(path, " exists in the container rootfs and is not the expected device"));
  return absl::OkStatus();
}

}  // namespace gpulet::runtime
