// A simulated GPU machine as described by a machine file (YAML; format in docs/simulation.md):
// devices, topology, MIG layout, telemetry and processes. Parsed and validated here, then served by
// the fake libnvidia-ml.so.1 (fake_nvml.cc). Plain data; no threads, no globals besides the
// embedded built-in profiles.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace gpulet::sim {

struct MigSpec {
  std::string profile;  // "1g.5gb"
  std::string uuid;     // "MIG-..."
  uint32_t gi = 0, ci = 0;
  uint32_t gi_slices = 0, ci_slices = 0, sm_count = 0;
  uint64_t memory_mib = 0;
};

struct GpuSpec {
  std::string name, uuid, pci_bus_id;  // pci_bus_id normalised: "00000000:18:00.0"
  int brand = 0;                       // nvmlBrandType_t
  unsigned architecture = 0;           // nvmlDeviceArchitecture_t
  uint32_t pci_device_id = 0, pci_subsystem_id = 0;
  int minor = -1;  // -1: the index
  int numa_node = -1;
  std::string cpus;  // local_cpulist, e.g. "0-55,112-167"
  int cc_major = 0, cc_minor = 0;
  uint32_t sm_count = 0;
  uint64_t memory_mib = 0;
  uint32_t power_limit_w = 0;
  int pcie_switch = -1, host_bridge = -1;  // PCIe placement; -1 = alone
  bool ecc = true;
  bool mig_capable = false, mig_enabled = false;
  std::vector<MigSpec> mig;
  // The nvidia-smi set's static facts (docs/simulation.md); empty / 0: NVML answers NOT_SUPPORTED.
  std::string serial, vbios_version, inforom_oem, inforom_ecc;
  uint32_t max_graphics_clock_mhz = 0, max_sm_clock_mhz = 0, max_memory_clock_mhz = 0;
  uint32_t pcie_gen = 0, pcie_gen_max = 0, pcie_gpu_gen_max = 0, pcie_width = 0, pcie_width_max = 0;
  uint32_t power_default_w = 0, power_min_w = 0, power_max_w = 0;
  bool persistence_mode = false;
  int compute_mode = 0;                       // nvmlComputeMode_t
  int gsp_firmware = -1;                      // -1: not supported, 0: off, 1: on
  int gpm = -1;                               // GPM support; -1: by architecture (Hopper and newer)
  std::map<std::string, uint64_t> telemetry;  // keys: TelemetryKeys()
  std::vector<std::pair<uint32_t, uint64_t>> processes;  // pid, used MiB
};

struct Machine {
  std::string name;    // profile name or file path
  std::string source;  // for messages: "dgx-h100 (built-in)" or the path
  std::string driver_version = "550.54.15";
  int cuda_driver_version = 12040;
  std::string nvml_version = "12.550.54.15";
  std::vector<GpuSpec> gpus;
  std::vector<std::vector<int>> nvlink;  // direct NVLinks per pair; empty = none
  int nvswitch_links = 0;                // links from each GPU into the NVSwitch fabric
  std::vector<std::string> nvswitches;   // their PCI bus ids
  int uvm_major = 510, caps_major = 511;
};

// The telemetry keys a machine file and `gpulet sim fault set` accept (gpu::Telemetry's fields;
// memory in MiB: fb_used_mib, fb_reserved_mib).
const std::vector<std::string>& TelemetryKeys();

// Built-in profile names, sorted.
std::vector<std::string> BuiltinProfiles();

// `profile` is a built-in name or a machine-file path (anything with a '/' or ending in
// .yaml/.yml). Errors name the file and line: "m.yaml:12: gpus[1].uuid: bad UUID 'GPU-12' (want
// GPU-xxxxxxxx-...)".
absl::StatusOr<Machine> LoadMachine(const std::string& profile);
absl::StatusOr<Machine> ParseMachine(const std::string& yaml, const std::string& source);

}  // namespace gpulet::sim
