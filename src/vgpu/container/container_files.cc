#include "vgpu/container/container_files.h"

#include <errno.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <vector>

#include "abi/vgpu_accounting.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/fs.h"
#include "common/status.h"

namespace gpulet::vgpu {
namespace {

std::string Parent(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      int v = 0;
      bool octal = true;
      for (size_t k = 1; k <= 3; ++k) {
        char c = s[i + k];
        if (c < '0' || c > '7') octal = false;
        v = v * 8 + (c - '0');
      }
      if (octal) {
        out += static_cast<char>(v);
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

bool Under(const std::string& path, const std::string& mount_point) {
  if (mount_point == "/") return true;
  return path.compare(0, mount_point.size(), mount_point) == 0 &&
         (path.size() == mount_point.size() || path[mount_point.size()] == '/');
}

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
}

// Rewritten only when it changed: a full tmpfs (a tenant filled the slack) still serves a grant
// made again with the same limits, and the node's one preload file is not rewritten per grant.
absl::Status WriteIfChanged(const std::string& path, const std::string& text, mode_t mode) {
  auto old = ReadFileToString(path);
  if (old.ok() && *old == text) return absl::OkStatus();
  return WriteFileAtomic(path, text, mode);
}

}  // namespace

bool IsMountPoint(const std::string& path) {
  struct stat self {
  }, parent{};
  if (::lstat(path.c_str(), &self) != 0 || ::stat(Parent(path).c_str(), &parent) != 0) return false;
  return self.st_dev != parent.st_dev;
}

absl::Status CheckMountsPropagate(const std::string& path, const std::string& mountinfo) {
  std::error_code ec;
  std::string real = std::filesystem::weakly_canonical(path, ec).string();
  if (ec || real.empty()) real = path;
  std::string best_point, best_fields;
  std::istringstream in(mountinfo);
  for (std::string line; std::getline(in, line);) {
    // id parent major:minor root mount-point options [optional fields...] - fstype source opts
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 7) continue;
    std::string point = Unescape(f[4]);
    if (!Under(real, point) || point.size() < best_point.size()) continue;
    std::string fields;
    for (size_t i = 6; i < f.size() && f[i] != "-"; ++i) absl::StrAppend(&fields, f[i], " ");
    best_point = point;  // a later line at the same point is the mount on top
    best_fields = fields;
  }
  if (best_point.empty())
    return absl::FailedPreconditionError(absl::StrCat("no mount holds ", real));
  if (best_fields.find("shared:") != std::string::npos) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the mount at ", best_point, " (holding ", real,
      ") is not shared, so a tmpfs mounted there would not reach the container runtime; give the "
      "agent's state directory mountPropagation: Bidirectional (the shipped manifests do), or "
      "run with --vgpu-accounting-tmpfs=false to accept accounting files a tenant can grow"));
}

absl::StatusOr<ContractFiles> PrepareGrantDir(const std::string& dir, const ContainerLimits& limits,
                                              const GrantDirOptions& options) {
  RETURN_IF_ERROR(MakeDirs(dir, 0700));
  ::chmod(dir.c_str(), 0700);
  bool mounted = false;
  if (options.tmpfs && !IsMountPoint(dir)) {
    auto mountinfo = ReadFileToString("/proc/self/mountinfo");
    if (!mountinfo.ok()) return mountinfo.status();
    RETURN_IF_ERROR(CheckMountsPropagate(Parent(dir), *mountinfo));
    std::string data = absl::StrCat("size=", kGrantDirBytes, ",nr_inodes=8,mode=0700");
    if (::mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, data.c_str()) != 0)
      return Errno(absl::StrCat("mounting a ", kGrantDirBytes / 1024, " KiB tmpfs at ", dir,
                                " (--vgpu-accounting-tmpfs)"));
    mounted = true;
  }
  auto undo = [&](absl::Status s) {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
    return s;
  };
  ContractFiles f = GrantDirFiles(dir, options.library, options.preload);
  // The file is bind-mounted read-write into the container, whose user is known only when the
  // pod says (runAsUser): then it alone may open it (0600/0660, owned by it); otherwise any user
  // in the container must (0666). The directory is the agent's (0700), so no host user reaches
  // the file either way. A zero-filled file is a valid empty region (accounting.h). An existing
  // file is kept (the container's processes hold memory in it) but its owner and mode are set
  // again: a grant given to another pod before its container starts (Correct) serves that pod's
  // user.
  mode_t mode = options.uid < 0 ? 0666 : options.gid < 0 ? 0600 : 0660;
  if (!PathExists(f.accounting)) {
    if (absl::Status s =
            WriteFileAtomic(f.accounting, std::string(sizeof(AccountingRegion), '\0'), mode);
        !s.ok())
      return undo(s);
  } else {
    ::chmod(f.accounting.c_str(), mode);
  }
  if (options.uid >= 0 &&
      ::chown(f.accounting.c_str(), static_cast<uid_t>(options.uid),
              options.gid < 0 ? static_cast<gid_t>(-1) : static_cast<gid_t>(options.gid)) != 0)
    ::chmod(f.accounting.c_str(), 0666);  // not root (tests, a sim): let the container open it
  if (absl::Status s = WriteIfChanged(f.limits, LimitsFileText(limits), 0444); !s.ok())
    return undo(s);
  if (limits.inject && !f.preload.empty())
    if (absl::Status s = WriteIfChanged(f.preload, PreloadFileText(), 0644); !s.ok())
      return undo(s);
  return f;
}

ContractFiles GrantDirFiles(const std::string& dir, const std::string& library,
                            const std::string& preload) {
  return {dir + "/accounting", dir + "/limits", library, preload};
}

absl::Status RemoveGrantDir(const std::string& dir) {
  if (dir.empty()) return absl::OkStatus();
  if (IsMountPoint(dir) && ::umount2(dir.c_str(), MNT_DETACH) != 0)
    return Errno(absl::StrCat("unmounting ", dir));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("removing ", dir, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace gpulet::vgpu
