// The vGPU container contract: what a fractional container gets from the node agent (the device
// plugin's vGPU Allocate and DRA's prepare) and what the interposer (libgpulet-vcuda.so) reads.
// One place for the paths, the names and the limits file, so the writers and the reader cannot
// drift apart.
//
// The limits reach the interposer through a file the agent writes and mounts read-only
// (kContainerLimits). When that file exists it is the only source: the environment of a process
// (envFrom a tenant's ConfigMap, the entrypoint's own `env`, LD_AUDIT tricks on getenv) cannot
// lift, change or switch off a limit. The environment is read only where the file is absent: a
// container started by hand, outside the agent. The library comes through a read-only
// /etc/ld.so.preload mount, so every dynamically linked process of the container loads it
// whatever its LD_PRELOAD says; LD_PRELOAD is set as well, for a runtime that ignores the file
// (musl).
//
// Plain C (no allocation, no libstdc++ at run time): the interposer includes it. The agent's
// side, the environment, mounts and file text of a grant, is vgpu_contract_builder.h.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

namespace gpulet::vgpu {

// Container paths.
inline constexpr char kContainerLibrary[] = "/usr/lib/gpulet/libgpulet-vcuda.so";
inline constexpr char kContainerAccounting[] = "/var/run/gpulet/vgpu/accounting";
inline constexpr char kContainerLimits[] = "/var/run/gpulet/vgpu/limits";
inline constexpr char kContainerPreload[] = "/etc/ld.so.preload";

// The names, as environment variables and as keys of the limits file.
inline constexpr char kVarPrefix[] = "GPULET_VGPU_";
inline constexpr char kVarUuid[] = "GPULET_VGPU_UUID";
inline constexpr char kVarMemoryLimit[] = "GPULET_VGPU_MEMORY_LIMIT";  // bytes
inline constexpr char kVarCoreLimit[] = "GPULET_VGPU_CORE_LIMIT";      // percent
inline constexpr char kVarCoreCeiling[] = "GPULET_VGPU_CORE_CEILING";  // percent
inline constexpr char kVarAccounting[] = "GPULET_VGPU_ACCOUNTING";     // container path
inline constexpr char kVarDisable[] = "GPULET_VGPU_DISABLE";           // "1": pass-through
inline constexpr char kVarContextBytes[] = "GPULET_VGPU_CONTEXT_BYTES";
inline constexpr char kVarRealLibcuda[] = "GPULET_VGPU_REAL_LIBCUDA";  // tests: the fake driver
inline constexpr char kVarPreload[] = "LD_PRELOAD";

// The limits file: NAME=VALUE lines of the names above, '#' comments, at most kLimitsFileMax
// bytes and kLimitsFileEntries entries. Parsed in place, without allocating.
inline constexpr size_t kLimitsFileMax = 4096;
inline constexpr int kLimitsFileEntries = 16;

struct LimitsFile {
  char text[kLimitsFileMax + 1] = {};
  const char* names[kLimitsFileEntries] = {};
  const char* values[kLimitsFileEntries] = {};
  int count = 0;
  char error[160] = {};  // set when Parse fails

  // Takes the file's bytes (n <= kLimitsFileMax). False, with `error` naming the line, on a line
  // that is not NAME=VALUE of a contract name, a NUL byte, or too many entries.
  bool Parse(const char* data, size_t n) {
    count = 0;
    if (n > kLimitsFileMax) return Fail(0, "is larger than 4096 bytes");
    memcpy(text, data, n);
    text[n] = 0;
    if (memchr(text, 0, n) != nullptr) return Fail(0, "holds a NUL byte");
    char* p = text;
    for (int line = 1; *p; ++line) {
      char* end = strchr(p, '\n');
      if (end) *end = 0;
      if (*p && *p != '#') {
        char* eq = strchr(p, '=');
        if (eq == nullptr || strncmp(p, kVarPrefix, sizeof kVarPrefix - 1) != 0)
          return Fail(line, "is not GPULET_VGPU_NAME=VALUE");
        if (count == kLimitsFileEntries) return Fail(line, "is one entry too many");
        *eq = 0;
        names[count] = p;
        values[count++] = eq + 1;
      }
      if (!end) break;
      p = end + 1;
    }
    return true;
  }
  // The last value of `name`, or nullptr.
  const char* Get(const char* name) const {
    for (int i = count - 1; i >= 0; --i)
      if (strcmp(names[i], name) == 0) return values[i];
    return nullptr;
  }

 private:
  bool Fail(int line, const char* what) {
    if (line > 0)
      snprintf(error, sizeof error, "%s:%d %s", kContainerLimits, line, what);
    else
      snprintf(error, sizeof error, "%s %s", kContainerLimits, what);
    count = 0;
    return false;
  }
};

}  // namespace gpulet::vgpu
