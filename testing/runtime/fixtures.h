// Test fixtures for the runtime tests: temporary directories, a stand-in NVIDIA driver root (real
// ELF stand-in libraries with sonames, a real ld.so.cache made by the host's ldconfig, mknod'ed
// device nodes when root), a busybox rootfs, and a fake GPU inventory.
#pragma once

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/gpu.h"

namespace gpulet::runtime::testing {

inline const char* kDriverVersion = "550.54.15";
inline const char* kLibDir = "/usr/lib/x86_64-linux-gnu";

inline std::string MakeTempDir(const std::string& tag) {
  std::string t =
      (std::filesystem::temp_directory_path() / ("gpulet-rt-" + tag + "-XXXXXX")).string();
  char* d = ::mkdtemp(t.data());
  return d ? std::string(d) : "";
}

inline void WriteFile(const std::string& path, const std::string& content, mode_t mode = 0644) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << content;
  ::chmod(path.c_str(), mode);
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs a shell command; returns its exit status and (optionally) its stdout+stderr.
inline int Sh(const std::string& cmd, std::string* out = nullptr) {
  std::string full = cmd + " 2>&1";
  FILE* p = ::popen(full.c_str(), "r");
  if (!p) return -1;
  std::string o;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) o.append(buf, n);
  int st = ::pclose(p);
  if (out) *out = o;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

inline bool Have(const std::string& tool) { return Sh("command -v " + tool + " >/dev/null") == 0; }
inline bool IsRoot() { return ::geteuid() == 0; }

// A shared object with a soname (what ldconfig keys the cache by), built with the host compiler.
inline bool BuildLibrary(const std::string& path, const std::string& soname,
                         const std::string& code = "int gpulet_stand_in(void) { return 1; }\n") {
  std::string src = path + ".c";
  WriteFile(src, code);
  int rc = Sh("cc -shared -fPIC -o '" + path + "' '" + src + "' -Wl,-soname," + soname);
  std::filesystem::remove(src);
  return rc == 0;
}

// Where a fake driver root puts the driver (see DiscoverDriver for the layouts):
// Debian/Ubuntu packages (the default), RHEL ({"/usr/lib64"}), GKE-style
// ({"/usr/local/nvidia/lib64", "/usr/local/nvidia/bin", "/usr/bin", "/lib"}).
struct DriverLayout {
  std::string lib_dir = kLibDir;
  std::string bin_dir = "/usr/bin";
  // Non-empty: nvidia-smi in bin_dir is a static ELF, and wrapper_dir/nvidia-smi a #!/bin/sh
  // script that execs it (as /usr/bin/nvidia-smi on a GKE-style Ubuntu node).
  std::string wrapper_dir;
  // Non-empty: the libraries are also hard-linked here and the ld cache lists them from both
  // directories (the same files, as /usr/local/nvidia/lib64 and /lib on that node).
  std::string also_lib_dir;
};

// A driver root: libraries (utility, compute, video, graphics), nvidia-smi, version file,
// ld.so.cache, and (as root) device nodes for `gpus` GPUs plus the control nodes.
// Returns false (with `why`) when the host cannot build it.
inline bool MakeDriverRoot(const std::string& root, int gpus, std::string* why,
                           const DriverLayout& layout = {}) {
  std::string v = kDriverVersion;
  for (const char* lib : {"libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libnvidia-encode",
                          "libnvidia-glcore"}) {
    std::string so = std::string(lib) + ".so.";
    std::string soname =
        so + (std::string(lib) == "libcuda" || std::string(lib) == "libnvidia-ml" ? "1" : v);
    if (!BuildLibrary(root + layout.lib_dir + "/" + so + v, soname)) {
      *why = "cannot build stand-in libraries with cc";
      return false;
    }
    if (!layout.also_lib_dir.empty()) {
      std::filesystem::create_directories(root + layout.also_lib_dir);
      std::filesystem::create_hard_link(root + layout.lib_dir + "/" + so + v,
                                        root + layout.also_lib_dir + "/" + so + v);
    }
  }
  if (layout.wrapper_dir.empty()) {
    WriteFile(root + layout.bin_dir + "/nvidia-smi", "#!/bin/sh\necho stand-in nvidia-smi\n", 0755);
  } else {
    std::string smi = root + layout.bin_dir + "/nvidia-smi";
    WriteFile(smi + ".c",
              "#include <stdio.h>\nint main(void) { puts(\"stand-in nvidia-smi (ELF)\"); }\n");
    std::filesystem::create_directories(root + layout.bin_dir);
    std::string out;
    int rc = Sh("cc -static -o '" + smi + "' '" + smi + ".c'", &out);
    std::filesystem::remove(smi + ".c");
    if (rc != 0) {
      *why = "cannot link a static stand-in nvidia-smi: " + out;
      return false;
    }
    WriteFile(root + layout.wrapper_dir + "/nvidia-smi",
              "#!/bin/sh\nexec " + layout.bin_dir + "/nvidia-smi \"$@\"\n", 0755);
  }
  WriteFile(
      root + "/proc/driver/nvidia/version",
      "NVRM version: NVIDIA UNIX x86_64 Kernel Module  " + v + "  Tue Mar  5 22:14:24 UTC 2024\n");
  std::string conf = layout.lib_dir + "\n";
  if (!layout.also_lib_dir.empty()) conf += layout.also_lib_dir + "\n";
  WriteFile(root + "/etc/ld.so.conf", conf);
  std::string out;
  if (Sh("ldconfig -r '" + root + "'", &out) != 0) {
    *why = "host ldconfig -r failed: " + out;
    return false;
  }
  if (!IsRoot()) return true;  // device nodes need root; callers that need them skip
  std::filesystem::create_directories(root + "/dev");
  for (int i = 0; i < gpus; ++i)
    ::mknod((root + "/dev/nvidia" + std::to_string(i)).c_str(), S_IFCHR | 0666, makedev(195, i));
  ::mknod((root + "/dev/nvidiactl").c_str(), S_IFCHR | 0666, makedev(195, 255));
  ::mknod((root + "/dev/nvidia-modeset").c_str(), S_IFCHR | 0666, makedev(195, 254));
  ::mknod((root + "/dev/nvidia-uvm").c_str(), S_IFCHR | 0666, makedev(509, 0));
  ::mknod((root + "/dev/nvidia-uvm-tools").c_str(), S_IFCHR | 0666, makedev(509, 1));
  return true;
}

// A GPU inventory like NVML would report: `gpus` GPUs, minors = indices; GPU 0 with two MIG
// devices when `mig`.
inline gpu::Inventory FakeInventory(int gpus, bool mig = false) {
  gpu::Inventory inv;
  inv.driver_version = kDriverVersion;
  inv.cuda_driver_version = 12040;
  for (int i = 0; i < gpus; ++i) {
    gpu::Device d;
    d.index = i;
    d.minor = i;
    char uuid[64];
    std::snprintf(uuid, sizeof uuid, "GPU-%08d-1111-2222-3333-444444444444", i);
    d.uuid = uuid;
    d.name = "NVIDIA A100-SXM4-40GB";
    if (mig && i == 0) {
      d.mig_enabled = true;
      for (int m = 0; m < 2; ++m) {
        gpu::MigDevice md;
        md.index = m;
        md.uuid = "MIG-0000000" + std::to_string(m) + "-aaaa-bbbb-cccc-dddddddddddd";
        md.gpu_instance_id = 1 + m;
        md.compute_instance_id = 0;
        md.profile = "3g.20gb";
        d.mig_devices.push_back(md);
      }
    }
    inv.devices.push_back(d);
  }
  return inv;
}

// A statically linked ldconfig of this host to copy into fake host roots ("" when there is none):
// Debian's /sbin/ldconfig, Ubuntu's /sbin/ldconfig.real. Checked by its ELF header having no
// PT_INTERP by readelf (binutils, which the build needs anyway).
inline std::string HostStaticLdconfig() {
  for (std::string p : {"/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig"})
    if (::access(p.c_str(), X_OK) == 0 &&
        Sh("readelf -h " + p + " >/dev/null && ! readelf -l " + p + " | grep -q interpreter") == 0)
      return p;
  return "";
}

// A busybox rootfs (the static busybox of Debian's busybox-static), with applet links.
inline bool MakeBusyboxRootfs(const std::string& rootfs, std::string* why) {
  const char* bb = "/bin/busybox";
  if (::access(bb, X_OK) != 0) {
    *why = "busybox-static is not installed (apt-get install busybox-static)";
    return false;
  }
  std::filesystem::create_directories(rootfs + "/bin");
  std::filesystem::copy_file(bb, rootfs + "/bin/busybox",
                             std::filesystem::copy_options::overwrite_existing);
  for (const char* a : {"sh", "ls", "cat", "grep", "readlink", "echo", "test", "stat", "touch"})
    std::filesystem::create_symlink("busybox", rootfs + "/bin/" + a);
  for (const char* d : {"proc", "dev", "sys", "tmp", "etc"})
    std::filesystem::create_directories(rootfs + "/" + d);
  return true;
}

}  // namespace gpulet::runtime::testing
