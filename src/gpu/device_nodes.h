// The NVIDIA driver's device nodes a GPU container needs, named once: the control nodes, each
// GPU's /dev/nvidiaN, and a MIG device's capability nodes (/dev/nvidia-caps/nvidia-capM, whose
// minors the driver lists in /proc/driver/nvidia-caps/mig-minors). The device plugin's device
// specs and the CDI spec both build on these. Header-only: the static runtime binaries use it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace gpulet::gpu {

// Every GPU container gets those of these that exist on the host.
inline constexpr std::array<const char*, 4> kControlNodes = {
    "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"};

inline constexpr char kMigMinorsFile[] = "/proc/driver/nvidia-caps/mig-minors";

inline std::string GpuNode(uint32_t minor) { return absl::StrCat("/dev/nvidia", minor); }

// The text of kMigMinorsFile ("gpu0/gi1/access 21" lines) as key -> capability minor; malformed
// lines are skipped.
inline std::map<std::string, int> ParseMigMinors(absl::string_view text) {
  std::map<std::string, int> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    int minor;
    if (f.size() == 2 && absl::SimpleAtoi(f[1], &minor)) out[std::string(f[0])] = minor;
  }
  return out;
}

// The kMigMinorsFile keys of a MIG device: its GPU instance's and its compute instance's access.
inline std::array<std::string, 2> MigCapabilityKeys(uint32_t gpu_minor, uint32_t gpu_instance,
                                                    uint32_t compute_instance) {
  std::string gi = absl::StrCat("gpu", gpu_minor, "/gi", gpu_instance);
  return {gi + "/access", absl::StrCat(gi, "/ci", compute_instance, "/access")};
}

inline std::string CapabilityNode(int cap_minor) {
  return absl::StrCat("/dev/nvidia-caps/nvidia-cap", cap_minor);
}

}  // namespace gpulet::gpu
