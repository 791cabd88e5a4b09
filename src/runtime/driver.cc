#include "runtime/driver.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/fs.h"
#include "common/status.h"

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
  static const auto* k = new std::map<std::string, std::string>{
      {"libnvidia-ml", "utility"}, {"libnvidia-cfg", "utility"}, {"libnvidia-nscq", "utility"},
      {"nvidia-smi", "utility"}, {"nvidia-debugdump", "utility"},
      {"nvidia-persistenced", "utility"}, {"nv-fabricmanager", "utility"},
      {"libcuda", "compute"}, {"libcudadebugger", "compute"}, {"libnvidia-opencl", "compute"},
      {"libnvidia-gpucomp", "compute"}, {"libnvidia-ptxjitcompiler", "compute"},
      {"libnvidia-fatbinaryloader", "compute"}, {"libnvidia-allocator", "compute"},
      {"libnvidia-compiler", "compute"}, {"libnvidia-pkcs11", "compute"},
      {"libnvidia-pkcs11-openssl3", "compute"}, {"libnvidia-nvvm", "compute"},
      {"libnvidia-tileiras", "compute"}, {"nvidia-cuda-mps-control", "compute"},
      {"nvidia-cuda-mps-server", "compute"},
      {"libvdpau_nvidia", "video"}, {"libnvidia-encode", "video"},
      {"libnvidia-opticalflow", "video"}, {"libnvcuvid", "video"},
      {"libnvidia-eglcore", "graphics"}, {"libnvidia-glcore", "graphics"},
      {"libnvidia-tls", "graphics"}, {"libnvidia-glsi", "graphics"}, {"libnvidia-fbc", "graphics"},
      {"libnvidia-ifr", "graphics"}, {"libnvidia-rtcore", "graphics"}, {"libnvoptix", "graphics"},
      {"libGLX_nvidia", "graphics"}, {"libEGL_nvidia", "graphics"},
      {"libGLESv2_nvidia", "graphics"}, {"libGLESv1_CM_nvidia", "graphics"},
      {"libnvidia-glvkspirv", "graphics"}, {"libnvidia-cbl", "graphics"},
      {"libnvidia-ngx", "ngx"}};
  return *k;
}

}  // namespace

absl::StatusOr<std::vector<LdCacheEntry>> ParseLdCache(const std::string& d,
                                                       const std::string& what) {
  size_t base = 0;
  if (d.compare(0, sizeof kOldMagic - 1, kOldMagic) == 0) {
    // Old format first: 12-byte header and 12-byte entries, then the new format 8-byte aligned.
    if (d.size() < 16) return absl::InvalidArgumentError(absl::StrCat(what, ": truncated ld cache"));
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
  if (absl::StartsWith(path, "/dev/nvidia-uvm")) return caps.count("compute") || caps.count("video");
  if (path == "/dev/nvidia-modeset") return caps.count("display") > 0;
  return true;
}

std::string InRoot(const std::string& root, const std::string& path) {
  std::string r(absl::StripSuffix(root, "/"));
  return r.empty() ? path : r + path;
}

absl::StatusOr<DriverFiles> DiscoverDriver(const std::string& root, std::string version) {
  DriverFiles out;
  out.root = root;
  std::string cache_path = InRoot(root, "/etc/ld.so.cache");
  auto data = ReadFileToString(cache_path);
  if (!data.ok())
    return absl::NotFoundError(absl::StrCat("driver root ", root, ": no ld cache (",
                                            data.status().message(), ")"));
  ASSIGN_OR_RETURN(auto entries, ParseLdCache(*data, cache_path));
  if (version.empty()) {
    if (auto v = ReadFileToString(InRoot(root, "/proc/driver/nvidia/version")); v.ok()) {
      // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ..."
      std::vector<std::string> words = absl::StrSplit(*v, ' ', absl::SkipEmpty());
      for (size_t i = 0; i + 1 < words.size() && version.empty(); ++i)
        if (words[i] == "Module") version = words[i + 1];
    }
  }
  // Cache entries are keyed by soname and usually point at the soname link (libcuda.so.1 ->
  // libcuda.so.550.54.15): follow one level of link inside the driver root to the real file.
  std::vector<std::string> resolved;
  for (const auto& e : entries) {
    if (e.flags != kLdCacheX8664) continue;
    std::string p = e.path;
    char target[4096];
    ssize_t n = ::readlink(InRoot(root, p).c_str(), target, sizeof target - 1);
    if (n > 0) {
      std::string t(target, static_cast<size_t>(n));
      p = t[0] == '/' ? t : p.substr(0, p.rfind('/') + 1) + t;
    }
    resolved.push_back(p);
  }
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
    return absl::NotFoundError(absl::StrCat("driver root ", root,
                                            ": cannot tell the NVIDIA driver version (no "
                                            "/proc/driver/nvidia/version, no libcuda.so.<version>)"));
  out.version = version;
  std::set<std::string> seen;
  for (const auto& path : resolved)
    if (absl::EndsWith(path, ".so." + version) && seen.insert(path).second)
      out.libraries.push_back(path);
  for (const auto& [name, cap] : FileCapabilities()) {
    if (absl::StartsWith(name, "lib")) continue;
    for (const char* dir : {"/usr/bin/", "/usr/sbin/", "/bin/", "/sbin/"}) {
      struct stat st;
      std::string p = std::string(dir) + name;
      if (::stat(InRoot(root, p).c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
        out.binaries.push_back(p);
        break;
      }
    }
  }
  for (const char* node : {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                           "/dev/nvidia-modeset"}) {
    struct stat st;
    if (::stat(InRoot(root, node).c_str(), &st) == 0 && S_ISCHR(st.st_mode))
      out.control_nodes.push_back(node);
  }
  return out;
}

ContainerEdits CommonEdits(const DriverFiles& driver) {
  ContainerEdits e;
  for (const auto& n : driver.control_nodes) {
    DeviceNode d;
    d.path = n;
    if (InRoot(driver.root, n) != n) d.host_path = InRoot(driver.root, n);
    e.device_nodes.push_back(d);
  }
  for (const auto* list : {&driver.libraries, &driver.binaries})
    for (const auto& p : *list)
      e.mounts.push_back(Mount{InRoot(driver.root, p), p, "",
                               {"ro", "nosuid", "nodev", "rbind", "rprivate"}});
  return e;
}

}  // namespace gpulet::runtime
