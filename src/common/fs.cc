#include "common/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"

namespace gpulet {
namespace {

absl::Status ErrnoStatus(int err, const std::string& what, const std::string& path) {
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  std::string out;
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoStatus(err, "cannot read", path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::Status WriteFileAtomic(const std::string& path, const std::string& content, mode_t mode) {
  std::filesystem::path p(path);
  std::string dir = p.parent_path().empty() ? "." : p.parent_path().string();
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string tmp = absl::StrCat(dir, "/.", p.filename().string(), ".tmp", rng() % 1000000000);
  // Errors name `path`, what the user gave: the temporary name beside it is ours, and means
  // nothing to them (the errno says what is wrong with the directory).
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoStatus(errno, "cannot write", path);
  size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ::write(fd, content.data() + off, content.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoStatus(err, "cannot write", path);
    }
    off += static_cast<size_t>(n);
  }
  ::fchmod(fd, mode);  // O_CREAT's mode is filtered by the umask; the caller asked for this one
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot write", path);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot write", path);
  }
  return absl::OkStatus();
}

absl::Status CheckWritable(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("no file named");
  std::filesystem::path p(path);
  std::string dir = p.parent_path().empty() ? "." : p.parent_path().string();
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return absl::NotFoundError(absl::StrCat(path, ": no such directory ", dir));
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory"));
  if (::access(dir.c_str(), W_OK) != 0)
    return ErrnoStatus(errno, absl::StrCat("cannot write ", path, ": directory"), dir);
  return absl::OkStatus();
}

bool PathExists(const std::string& path) { return RootedFilesystem().Exists(path); }

absl::Status MakeDirs(const std::string& path, mode_t mode) {
  return RootedFilesystem().MakeDirs(path, mode);
}

RootedFilesystem::RootedFilesystem(std::string root) : root_(std::move(root)) {
  while (!root_.empty() && root_.back() == '/') root_.pop_back();
}

std::string JoinRoot(const std::string& root, const std::string& path) {
  size_t n = root.size();
  while (n > 0 && root[n - 1] == '/') --n;
  if (n == 0) return path;
  std::string r = root.substr(0, n);
  return path.empty() || path[0] != '/' ? absl::StrCat(r, "/", path) : r + path;
}

std::string RootedFilesystem::Resolve(const std::string& path) const {
  return JoinRoot(root_, path);
}

absl::StatusOr<std::string> RootedFilesystem::ReadFile(const std::string& path) const {
  return ReadFileToString(Resolve(path));
}

absl::Status RootedFilesystem::WriteFileAtomic(const std::string& path, const std::string& content,
                                               mode_t mode) const {
  return gpulet::WriteFileAtomic(Resolve(path), content, mode);
}

bool RootedFilesystem::Exists(const std::string& path) const {
  struct stat st;
  return ::stat(Resolve(path).c_str(), &st) == 0;
}

absl::StatusOr<std::vector<std::string>> RootedFilesystem::ListDir(const std::string& path) const {
  std::string host = Resolve(path);
  DIR* d = ::opendir(host.c_str());
  if (d == nullptr) return ErrnoStatus(errno, "cannot list", host);
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status RootedFilesystem::MakeDirs(const std::string& path, mode_t mode) const {
  std::error_code ec;
  std::filesystem::create_directories(Resolve(path), ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot create ", Resolve(path), ": ", ec.message()));
  ::chmod(Resolve(path).c_str(), mode);
  return absl::OkStatus();
}

absl::Status RootedFilesystem::Remove(const std::string& path) const {
  if (::unlink(Resolve(path).c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, "cannot remove", Resolve(path));
  }
  return absl::OkStatus();
}

}  // namespace gpulet
