#include "runtime/rootfs.h"

#include <fcntl.h>
#include <linux/openat2.h>
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
  if (path.empty() || path[0] != '/') return absl::InvalidArgumentError(absl::StrCat("path \"", path, "\" is not absolute"));
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
  int fd = ::openat(wdir.get(), base.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::close(fd);
  } else if (errno != EEXIST) {
    return Errno("cannot create " + path + " in the container rootfs");
  }
  return OpenInRoot(root, path);
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
