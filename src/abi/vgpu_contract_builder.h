// The agent's side of the vGPU container contract (vgpu_contract.h): from one container's grant
// to its environment, its mounts and the text of the files behind them. Used by the device
// plugin's vGPU Allocate and by DRA's prepare.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "abi/vgpu_contract.h"

namespace gpulet::vgpu {

// What one fractional container is granted.
struct ContainerLimits {
  std::string uuid;           // the GPU (one)
  uint64_t memory_bytes = 0;  // 0: no memory limit
  int64_t cores = 100;        // percent of the GPU's time
  int64_t ceiling = 0;        // percent it may burst to when the GPU is idle; <= cores: hard limit
  bool inject = true;         // false: the pod opted out (gpulet.io/vgpu-disable)
};

// Host paths of the files the container's mounts come from.
struct ContractFiles {
  std::string accounting;  // read-write, shared by the container's processes
  std::string limits;      // read-only; its text is LimitsFileText()
  std::string library;     // the interposer, read-only
  std::string preload;     // read-only; its text is PreloadFileText()
};

struct ContractMount {
  std::string host_path, container_path;
  bool read_only = true;
};

struct ContainerContract {
  std::vector<std::pair<std::string, std::string>> env;
  std::vector<ContractMount> mounts;
};

inline std::vector<std::pair<std::string, std::string>> ContractValues(const ContainerLimits& l) {
  return {{kVarUuid, l.uuid},
          {kVarMemoryLimit, std::to_string(l.memory_bytes)},
          {kVarCoreLimit, std::to_string(l.cores)},
          {kVarCoreCeiling, std::to_string(std::max(l.ceiling, l.cores))},
          {kVarAccounting, kContainerAccounting},
          // Said explicitly: an image's ENV GPULET_VGPU_DISABLE=1 must not reach a process that
          // reads the environment (one started where the limits file is not mounted).
          {kVarDisable, l.inject ? "0" : "1"}};
}

inline std::string LimitsFileText(const ContainerLimits& l) {
  std::string text =
      "# gpulet vGPU limits, written by the node agent; read-only in the container\n";
  for (const auto& [k, v] : ContractValues(l)) text += k + "=" + v + "\n";
  return text;
}

inline std::string PreloadFileText() { return std::string(kContainerLibrary) + "\n"; }

// The environment and mounts of a fractional container. The environment repeats the file's
// values for tools that read them (nvidia-smi wrappers, the user's own scripts); the interposer
// reads the file.
inline ContainerContract BuildContract(const ContainerLimits& l, const ContractFiles& f) {
  ContainerContract c;
  c.env = ContractValues(l);
  if (!l.inject) {
    c.mounts.push_back({f.limits, kContainerLimits, true});
    return c;
  }
  c.env.emplace_back(kVarPreload, kContainerLibrary);
  c.mounts.push_back({f.accounting, kContainerAccounting, false});
  c.mounts.push_back({f.limits, kContainerLimits, true});
  c.mounts.push_back({f.library, kContainerLibrary, true});
  c.mounts.push_back({f.preload, kContainerPreload, true});
  return c;
}

}  // namespace gpulet::vgpu
