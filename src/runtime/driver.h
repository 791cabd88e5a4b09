// The NVIDIA driver as installed under a driver root (default "/", a temporary tree in tests):
// its device nodes, and its user-space libraries and binaries found through the root's ld cache.
// Also which of them each NVIDIA_DRIVER_CAPABILITIES value selects. Plain functions; thread-safe.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/edits.h"

namespace gpulet::runtime {

// One entry of /etc/ld.so.cache: a library's name (its soname, the cache key) and its path.
struct LdCacheEntry {
  std::string name;   // e.g. "libcuda.so.1"
  std::string path;   // e.g. "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
  int32_t flags = 0;  // glibc FLAG_* bits: 0x0303 = x86-64 libc6, 0x0003 = i386 libc6
};
constexpr int32_t kLdCacheX8664 = 0x0303;

// Parses the glibc "glibc-ld.so.cache1.1" format (also when it follows an old "ld.so-1.7.0" part).
// Written by hand: glibc keeps its parser private to ld.so/ldconfig, no Debian library exposes one,
// and `ldconfig -p` is a fork/exec per container start with human-oriented output.
// Truncated data, a bad magic or an out-of-range string offset is an error naming `what`.
absl::StatusOr<std::vector<LdCacheEntry>> ParseLdCache(const std::string& data,
                                                       const std::string& what);

// Driver capabilities (NVIDIA_DRIVER_CAPABILITIES values).
inline const std::set<std::string>& AllCapabilities() {
  static const std::set<std::string> k = {"compute", "compat32", "graphics", "utility",
                                          "video",   "display",  "ngx"};
  return k;
}
// The capability that needs a library (by name stem "libcuda") or binary ("nvidia-smi"); empty when
// gpulet does not know the file (it is then given with any capability).
std::string CapabilityOfFile(const std::string& file_name);
// Whether a control device node (by container path) is given for the capability set.
bool ControlNodeWanted(const std::string& path, const std::set<std::string>& caps);

struct DriverFiles {
  std::string root;                    // driver root, as given
  std::string version;                 // "550.54.15"
  std::vector<std::string> libraries;  // paths inside the driver root ("/usr/lib/.../libcuda.so.X")
  std::vector<std::string> binaries;   // paths inside the driver root, mounted at the same path
  // {ELF binary (path inside the driver root), another container path it is mounted at}: the
  // ELF behind a wrapper script, mounted at the script's path (see DiscoverDriver).
  std::vector<std::pair<std::string, std::string>> binary_aliases;
  std::vector<std::string> control_nodes;  // "/dev/nvidiactl", ... those present under root
};

// Finds the driver's files under `root` ("/", or a driver container's root such as
// /run/nvidia/driver), in the layouts drivers are installed in: Debian/Ubuntu packages (/usr/bin,
// /usr/lib/x86_64-linux-gnu), GKE-style (/usr/local/nvidia/{bin,lib64}), RHEL (/usr/lib64).
// Libraries: the x86-64 entries of <root>/etc/ld.so.cache and the files of the known library
// directories whose name ends in ".so.<version>", links followed inside the root, each file once
// (a file listed from two directories: the better-ranked directory). Binaries: the known driver
// binaries in the bin directories; a wrapper script is replaced by the ELF it wraps (see
// binary_aliases). Control nodes under <root>/dev.
// `version` empty: taken from <root>/proc/driver/nvidia/version, else from libcuda/libnvidia-ml's
// file name in the cache. No cache or no version is an error naming the root.
absl::StatusOr<DriverFiles> DiscoverDriver(const std::string& root, std::string version = "");

// The driver's NVML library (libnvidia-ml.so.<version>) as this process can dlopen it, for a
// process in a container that reads the host under `host_root` (the node DaemonSet's agent and
// install): the runtime that started it (runc) injected no driver and the image has none. The
// host's own driver first, else a driver container's root (`driver_container_root`, a host path).
// NotFound names both roots.
absl::StatusOr<std::string> FindNvmlLibrary(
    const std::string& host_root, const std::string& driver_container_root = "/run/nvidia/driver");

// The driver's programs (nvidia-cuda-mps-control, nvidia-smi, ...) for a process in such a
// container, which has no driver of its own: `dir` (replaced when it exists) gets `bin/`, links to
// the driver's binaries (the ELF behind a wrapper script), and `lib/`, links to its libraries by
// soname and by file name. The programs then run on this container's C library with
// LD_LIBRARY_PATH=lib/ (the host's whole library directory would also bring the host's C
// library, which must match this container's loader) and PATH starting with bin/. Which driver:
// as FindNvmlLibrary. NotFound names both roots.
struct DriverTools {
  std::string root;     // the driver root the links point into (under host_root)
  std::string bin_dir;  // <dir>/bin
  std::string lib_dir;  // <dir>/lib
};
absl::StatusOr<DriverTools> LinkDriverTools(
    const std::string& host_root, const std::string& dir,
    const std::string& driver_container_root = "/run/nvidia/driver");
// The paths DiscoverDriver reads under a driver root: the ld cache and the library and binary
// directories. An agent that reads the host under --host-root needs each of them mounted there
// (the node DaemonSet; tests/node/agent_mounts_test.cc checks it).
std::vector<std::string> DriverPaths();

// The edits every GPU container gets (control nodes, libraries read-only, binaries), as a CDI
// `containerEdits` block: container paths equal the paths inside the driver root.
ContainerEdits CommonEdits(const DriverFiles& driver);

}  // namespace gpulet::runtime
