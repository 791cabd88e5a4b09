// NVIDIA's device-plugin flags that gpulet accepts, so a DaemonSet written for NVIDIA's plugin
// starts, but has no use for (plugin_flags.h defines them): what start says of each one given.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpulet::cmd {

// What gpulet does with each NVIDIA-only flag: nothing (said once at start, with why), except a
// discovery strategy it cannot honour, which stops the start.
struct NvidiaOnlyFlag {
  const char* flag;
  const char* env;
  const char* why;
};
inline const std::vector<NvidiaOnlyFlag>& NvidiaOnlyFlags() {
  static const std::vector<NvidiaOnlyFlag> k = {
      {"container-driver-root", "CONTAINER_DRIVER_ROOT",
       "gpulet finds the driver through --nvidia-driver-root (the host path) only"},
      {"device-discovery-strategy", "DEVICE_DISCOVERY_STRATEGY",
       "gpulet discovers GPUs through NVML (auto and nvml mean that; tegra is not supported)"},
      {"imex-channel-ids", "IMEX_CHANNEL_IDS", "IMEX channels are not supported by gpulet"},
      {"nvidia-ctk-path", "NVIDIA_CTK_PATH",
       "gpulet writes its CDI specs itself, without nvidia-ctk"},
  };
  return k;
}

// One line per NVIDIA-only flag given ("--mps-root=/x is accepted and ignored: ..."), or an error
// for a discovery strategy other than auto/nvml.
// `given`: flag name -> value of those given.
inline absl::StatusOr<std::vector<std::string>> NvidiaOnlyFlagNotes(
    const std::map<std::string, std::string>& given) {
  std::vector<std::string> notes;
  for (const auto& n : NvidiaOnlyFlags()) {
    auto it = given.find(n.flag);
    if (it == given.end()) continue;
    if (std::string(n.flag) == "device-discovery-strategy" && it->second != "auto" &&
        it->second != "nvml") {
      return absl::InvalidArgumentError(std::string("--device-discovery-strategy ") + it->second +
                                        ": " + n.why);
    }
    notes.push_back(std::string("--") + n.flag + "=" + it->second +
                    " (NVIDIA device-plugin flag) is accepted and ignored: " + n.why);
  }
  return notes;
}

}  // namespace gpulet::cmd
