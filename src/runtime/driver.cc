#include "runtime/driver.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/fs.h"
#include "common/status.h"
#include "gpu/device_nodes.h"

namespace gpulet::runtime {
namespace {

constexpr char kOldMagic[] = "ld.so-1.7.0";
constexpr char kNewMagic[] = "glibc-ld.so.cache1.1";
constexpr size_t kNewHeader = 48;  // magic+version(20) nlibs len_strings flags pad ext unused[3]
constexpr size_t kNewEntry = 24;   // int32 flags, u32 key, u32 value, u32 osversion, u64 hwcap

uint32_t U32(const std::string& d, size_t off) {
  uint32_t v;
  std::memcpy(&v, d.data() + off, 4);
  return v;
}

// Capability of the libraries and binaries libnvidia-container knows (by file-name stem).
const std::map<std::string, std::string>& FileCapabilities() {
  static const auto* k =
      new std::map<std::string, std::string>{{"libnvidia-ml", "utility"},
                                             {"libnvidia-cfg", "utility"},
                                             {"libnvidia-nscq", "utility"},
                                             {"nvidia-smi", "utility"},
                                             {"nvidia-debugdump", "utility"},
                                             {"nvidia-persistenced", "utility"},
                                             {"nv-fabricmanager", "utility"},
                                             {"libcuda", "compute"},
                                             {"libcudadebugger", "compute"},
                                             {"libnvidia-opencl", "compute"},
                                             {"libnvidia-gpucomp", "compute"},
                                             {"libnvidia-ptxjitcompiler", "compute"},
                                             {"libnvidia-fatbinaryloader", "compute"},
                                             {"libnvidia-allocator", "compute"},
                                             {"libnvidia-compiler", "compute"},
                                             {"libnvidia-pkcs11", "compute"},
                                             {"libnvidia-pkcs11-openssl3", "compute"},
                                             {"libnvidia-nvvm", "compute"},
                                             {"libnvidia-tileiras", "compute"},
                                             {"nvidia-cuda-mps-control", "compute"},
                                             {"nvidia-cuda-mps-server", "compute"},
                                             {"libvdpau_nvidia", "video"},
                                             {"libnvidia-encode", "video"},
                                             {"libnvidia-opticalflow", "video"},
                                             {"libnvcuvid", "video"},
                                             {"libnvidia-eglcore", "graphics"},
                                             {"libnvidia-glcore", "graphics"},
                                             {"libnvidia-tls", "graphics"},
                                             {"libnvidia-glsi", "graphics"},
                                             {"libnvidia-fbc", "graphics"},
                                             {"libnvidia-ifr", "graphics"},
                                             {"libnvidia-rtcore", "graphics"},
                                             {"libnvoptix", "graphics"},
                                             {"libGLX_nvidia", "graphics"},
                                             {"libEGL_nvidia", "graphics"},
                                             {"libGLESv2_nvidia", "graphics"},
                                             {"libGLESv1_CM_nvidia", "graphics"},
                                             {"libnvidia-glvkspirv", "graphics"},
                                             {"libnvidia-cbl", "graphics"},
                                             {"libnvidia-ngx", "ngx"}};
  return *k;
}

}  // namespace

absl::StatusOr<std::vector<LdCacheEntry>> ParseLdCache(const std::string& d,
                                                       const std::string& what) {
  size_t base = 0;
  if (d.compare(0, sizeof kOldMagic - 1, kOldMagic) == 0) {
    // Old format first: 12-byte header and 12-byte entries, then the new format 8-byte aligned.
    if (d.size() < 16)
      return absl::InvalidArgumentError(absl::StrCat(what, ": truncated ld cache"));
    uint64_t n = U32(d, 12);
    base = (16 + n * 12 + 7) & ~size_t{7};
  }
  if (d.size() < base + kNewHeader || d.compare(base, sizeof kNewMagic - 1, kNewMagic) != 0)
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": not a glibc ld.so.cache (no \"", kNewMagic, "\" header)"));
  uint64_t nlibs = U32(d, base + 20);
  if (base + kNewHeader + nlibs * kNewEntry > d.size())
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": truncated ld cache (", nlibs, " entries announced)"));
  auto str = [&](uint32_t off, std::string& out) {
    size_t at = base + off;  // string offsets are relative to the new-format header
    if (at >= d.size()) return false;
    size_t end = d.find('\0', at);
    if (end == std::string::npos) return false;
    out.assign(d, at, end - at);
    return true;
  };
  std::vector<LdCacheEntry> out;
  out.reserve(nlibs);
  for (uint64_t i = 0; i < nlibs; ++i) {
    size_t e = base + kNewHeader + i * kNewEntry;
    LdCacheEntry entry;
    std::memcpy(&entry.flags, d.data() + e, 4);
    if (!str(U32(d, e + 4), entry.name) || !str(U32(d, e + 8), entry.path))
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ld cache entry ", i, " points outside the file"));
    out.push_back(std::move(entry));
  }
  return out;
}

std::string CapabilityOfFile(const std::string& file_name) {
  std::string stem = file_name.substr(0, file_name.find(".so"));
  auto it = FileCapabilities().find(stem);
  return it == FileCapabilities().end() ? "" : it->second;
}

bool ControlNodeWanted(const std::string& path, const std::set<std::string>& caps) {
  // As libnvidia-container: uvm nodes only with the compute libraries, modeset only for display.
  if (absl::StartsWith(path, "/dev/nvidia-uvm"))
    return caps.count("compute") || caps.count("video");
  if (path == "/dev/nvidia-modeset") return caps.count("display") > 0;
  return true;
}

namespace {

// Where driver packages put their libraries and binaries, most specific first: GKE-style
// installs (/usr/local/nvidia), Debian/Ubuntu packages (multiarch), the RHEL family (lib64), then
// the generic and merged-/usr names. The order decides which path of a library listed twice (the
// same file reached from two directories) is mounted.
constexpr const char* kLibDirs[] = {"/usr/local/nvidia/lib64",
                                    "/usr/lib/x86_64-linux-gnu",
                                    "/usr/lib64",
                                    "/lib/x86_64-linux-gnu",
                                    "/lib64",
                                    "/usr/lib",
                                    "/lib"};
// The directories read directly (not only through the cache): those that hold x86-64 libraries
// only. /usr/lib and /lib are ranked above but not read: on the RHEL family they hold the 32-bit
// libraries.
constexpr size_t kScannedLibDirs = 5;
constexpr const char* kBinDirs[] = {"/usr/bin", "/usr/sbin", "/bin", "/sbin",
                                    "/usr/local/nvidia/bin"};

size_t LibDirRank(const std::string& path) {
  std::string dir = path.substr(0, path.rfind('/'));
  for (size_t i = 0; i < std::size(kLibDirs); ++i)
    if (dir == kLibDirs[i]) return i;
  return std::size(kLibDirs);
}

// Follows symlinks at the last component of a driver-root path, inside the root (absolute targets
// are root-relative), up to 8 links; returns the cleaned final path.
std::string ResolveInRoot(const std::string& root, std::string p) {
  for (int hops = 0; hops < 8; ++hops) {
    char target[4096];
    ssize_t n = ::readlink(JoinRoot(root, p).c_str(), target, sizeof target - 1);
    if (n <= 0) break;
    std::string t(target, static_cast<size_t>(n));
    p = CleanPath(t[0] == '/' ? t : p.substr(0, p.rfind('/') + 1) + t);
  }
  return CleanPath(p);
}

// The first bytes of a file: 1 x86-64 ELF, 2 "#!" script, 0 anything else or unreadable.
int FileKind(const std::string& host_path) {
  unsigned char head[20] = {};  // e_ident (16), e_type (2), e_machine (2)
  int fd = ::open(host_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = ::read(fd, head, sizeof head);
  ::close(fd);
  if (n == sizeof head &&
      std::memcmp(head,
                  "\x7f"
                  "ELF",
                  4) == 0 &&
      head[4] == 2 /* 64-bit */ && head[18] == 62 /* EM_X86_64, little-endian */ && head[19] == 0)
    return 1;
  if (n >= 2 && head[0] == '#' && head[1] == '!') return 2;
  return 0;
}

}  // namespace

absl::StatusOr<DriverFiles> DiscoverDriver(const std::string& root, std::string version) {
  DriverFiles out;
  out.root = root;
  std::string cache_path = JoinRoot(root, "/etc/ld.so.cache");
  auto data = ReadFileToString(cache_path);
  if (!data.ok())
    return absl::NotFoundError(
        absl::StrCat("driver root ", root, ": no ld cache (", data.status().message(), ")"));
  ASSIGN_OR_RETURN(auto entries, ParseLdCache(*data, cache_path));
  if (version.empty()) {
    if (auto v = ReadFileToString(JoinRoot(root, "/proc/driver/nvidia/version")); v.ok()) {
      // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ..."
      std::vector<std::string> words = absl::StrSplit(*v, ' ', absl::SkipEmpty());
      for (size_t i = 0; i + 1 < words.size() && version.empty(); ++i)
        if (words[i] == "Module") version = words[i + 1];
    }
  }
  // Cache entries are keyed by soname and usually point at the soname link (libcuda.so.1 ->
  // libcuda.so.550.54.15): follow the links inside the driver root to the real file.
  std::vector<std::string> resolved;
  for (const auto& e : entries)
    if (e.flags == kLdCacheX8664) resolved.push_back(ResolveInRoot(root, e.path));
  if (version.empty()) {
    for (const auto& path : resolved) {
      std::string file = path.substr(path.rfind('/') + 1);
      for (const char* lib : {"libcuda.so.", "libnvidia-ml.so."})
        if (absl::StartsWith(file, lib) && file.find('.', strlen(lib)) != std::string::npos)
          version = file.substr(strlen(lib));
      if (!version.empty()) break;
    }
  }
  if (version.empty())
    return absl::NotFoundError(
        absl::StrCat("driver root ", root,
                     ": cannot tell the NVIDIA driver version (no "
                     "/proc/driver/nvidia/version, no libcuda.so.<version>)"));
  out.version = version;
  // The driver's own directories too, for libraries the cache does not list (a cache made before
  // the driver was installed under /usr/local/nvidia).
  std::string suffix = ".so." + version;
  for (size_t i = 0; i < kScannedLibDirs; ++i)
    if (DIR* d = ::opendir(JoinRoot(root, kLibDirs[i]).c_str())) {
      while (dirent* e = ::readdir(d)) {
        std::string p = absl::StrCat(kLibDirs[i], "/", e->d_name);
        if (absl::EndsWith(e->d_name, suffix) && FileKind(JoinRoot(root, p)) == 1)
          resolved.push_back(p);
      }
      ::closedir(d);
    }
  // One mount per library file: the cache of a GKE-style node lists each library from
  // /usr/local/nvidia/lib64 and again from /lib; the same file (device and inode) is mounted once,
  // from the directory ranked first in kLibDirs.
  std::vector<std::string> libs;
  for (const auto& path : resolved)
    if (absl::EndsWith(path, suffix)) libs.push_back(path);
  std::stable_sort(libs.begin(), libs.end(), [](const std::string& a, const std::string& b) {
    return LibDirRank(a) < LibDirRank(b);
  });
  std::set<std::string> seen_path;
  std::set<std::pair<dev_t, ino_t>> seen_file;
  for (const auto& path : libs) {
    struct stat st;
    if (!seen_path.insert(path).second || ::stat(JoinRoot(root, path).c_str(), &st) != 0 ||
        !S_ISREG(st.st_mode) || !seen_file.insert({st.st_dev, st.st_ino}).second)
      continue;
    out.libraries.push_back(path);
  }
  // Binaries: the first found in kBinDirs is what PATH finds on the host. When it is a wrapper
  // script (Ubuntu GKE-style nodes: /usr/bin/nvidia-smi execs /usr/local/nvidia/bin/nvidia-smi),
  // the ELF of the same name in another driver bin dir is mounted at its own path and, in place
  // of the script, at the script's path: the image may have no shell for the script, and the
  // script would only start that ELF (the container's ld cache finds the libraries). A script
  // with no ELF behind it is mounted as it is.
  for (const auto& [name, cap] : FileCapabilities()) {
    if (absl::StartsWith(name, "lib")) continue;
    std::vector<std::string> found;
    std::set<std::pair<dev_t, ino_t>> ids;
    for (const char* dir : kBinDirs) {
      struct stat st;
      std::string p = std::string(dir) + "/" + name;
      if (::stat(JoinRoot(root, p).c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
          ids.insert({st.st_dev, st.st_ino}).second)
        found.push_back(p);
    }
    if (found.empty()) continue;
    if (FileKind(JoinRoot(root, found[0])) == 1) {
      out.binaries.push_back(found[0]);
      continue;
    }
    auto elf = std::find_if(found.begin() + 1, found.end(),
                            [&](const std::string& p) { return FileKind(JoinRoot(root, p)) == 1; });
    if (elf == found.end()) {
      out.binaries.push_back(found[0]);
      continue;
    }
    out.binaries.push_back(*elf);
    out.binary_aliases.push_back({*elf, found[0]});
  }
  for (const char* node : gpu::kControlNodes) {
    struct stat st;
    if (::stat(JoinRoot(root, node).c_str(), &st) == 0 && S_ISCHR(st.st_mode))
      out.control_nodes.push_back(node);
  }
  return out;
}

ContainerEdits CommonEdits(const DriverFiles& driver) {
  ContainerEdits e;
  for (const auto& n : driver.control_nodes) {
    DeviceNode d;
    d.path = n;
    if (JoinRoot(driver.root, n) != n) d.host_path = JoinRoot(driver.root, n);
    e.device_nodes.push_back(d);
  }
  for (const auto* list : {&driver.libraries, &driver.binaries})
    for (const auto& p : *list)
      e.mounts.push_back(
          Mount{JoinRoot(driver.root, p), p, "", {"ro", "nosuid", "nodev", "rbind", "rprivate"}});
  for (const auto& [from, at] : driver.binary_aliases)
    e.mounts.push_back(
        Mount{JoinRoot(driver.root, from), at, "", {"ro", "nosuid", "nodev", "rbind", "rprivate"}});
  return e;
}

std::vector<std::string> DriverPaths() {
  std::vector<std::string> paths = {"/etc/ld.so.cache"};
  paths.insert(paths.end(), std::begin(kLibDirs), std::end(kLibDirs));
  paths.insert(paths.end(), std::begin(kBinDirs), std::end(kBinDirs));
  return paths;
}

namespace {

// The driver a process in a container reads under `host_root`: the host's own, else a driver
// container's root, the first that `lacks` finds nothing missing in (it returns what is missing,
// or ""). NotFound names `what`, both roots and why each was passed over.
absl::StatusOr<DriverFiles> FindHostDriver(
    const std::string& host_root, const std::string& driver_container_root, const std::string& what,
    const std::function<std::string(const DriverFiles&)>& lacks) {
  std::vector<std::string> why;
  for (const std::string& root : {host_root, JoinRoot(host_root, driver_container_root)}) {
    absl::StatusOr<DriverFiles> d = DiscoverDriver(root);
    if (!d.ok()) {
      why.push_back(std::string(d.status().message()));
      continue;
    }
    std::string missing = lacks(*d);
    if (missing.empty()) return d;
    why.push_back(absl::StrCat(root, ": the driver has no ", missing));
  }
  return absl::NotFoundError(absl::StrCat(
      "no ", what, " under ", host_root, " or the driver container's root ",
      JoinRoot(host_root, driver_container_root), " (", absl::StrJoin(why, "; "), ")"));
}

bool IsNvml(const std::string& path) {
  return absl::StartsWith(path.substr(path.rfind('/') + 1), "libnvidia-ml.so.");
}

}  // namespace

absl::StatusOr<std::string> FindNvmlLibrary(const std::string& host_root,
                                            const std::string& driver_container_root) {
  ASSIGN_OR_RETURN(
      DriverFiles d,
      FindHostDriver(host_root, driver_container_root, "NVML library", [](const DriverFiles& f) {
        return std::any_of(f.libraries.begin(), f.libraries.end(), IsNvml) ? "" : "libnvidia-ml.so";
      }));
  return JoinRoot(d.root, *std::find_if(d.libraries.begin(), d.libraries.end(), IsNvml));
}

absl::StatusOr<DriverTools> LinkDriverTools(const std::string& host_root, const std::string& dir,
                                            const std::string& driver_container_root) {
  ASSIGN_OR_RETURN(
      DriverFiles d,
      FindHostDriver(host_root, driver_container_root, "NVIDIA driver programs",
                     [](const DriverFiles& f) { return f.binaries.empty() ? "programs" : ""; }));
  const std::string& root = d.root;
  // name in lib/ -> the library file it stands for: every file by its own name, and by each
  // ld cache name (the soname the loader asks for) that leads to it.
  std::map<std::string, std::string> libs;
  for (const auto& l : d.libraries) libs[l.substr(l.rfind('/') + 1)] = l;
  const std::string cache_path = JoinRoot(root, "/etc/ld.so.cache");
  ASSIGN_OR_RETURN(std::string cache, ReadFileToString(cache_path));
  ASSIGN_OR_RETURN(std::vector<LdCacheEntry> entries, ParseLdCache(cache, cache_path));
  const std::set<std::string> files(d.libraries.begin(), d.libraries.end());
  for (const auto& e : entries)
    if (e.flags == kLdCacheX8664 && e.name.find('/') == std::string::npos)
      if (std::string real = ResolveInRoot(root, e.path); files.count(real))
        libs.emplace(e.name, real);
  DriverTools t{root, dir + "/bin", dir + "/lib"};
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  for (const std::string& sub : {t.bin_dir, t.lib_dir})
    if (std::filesystem::create_directories(sub, ec); ec)
      return absl::PermissionDeniedError(absl::StrCat("cannot create ", sub, ": ", ec.message()));
  auto link = [&](const std::string& target, const std::string& at) -> absl::Status {
    if (::symlink(target.c_str(), at.c_str()) != 0)
      return absl::PermissionDeniedError(
          absl::StrCat("cannot link ", at, " to ", target, ": ", std::strerror(errno)));
    return absl::OkStatus();
  };
  for (const auto& b : d.binaries)
    RETURN_IF_ERROR(link(JoinRoot(root, b), t.bin_dir + b.substr(b.rfind('/'))));
  for (const auto& [name, file] : libs)
    RETURN_IF_ERROR(link(JoinRoot(root, file), t.lib_dir + "/" + name));
  return t;
}

}  // namespace gpulet::runtime
