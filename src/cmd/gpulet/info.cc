// `gpulet info`: the node's GPUs as `nvidia-smi -L` lists them (MIG devices indented beneath their
// GPU), then the GPU-to-GPU topology matrix as `nvidia-smi topo -m` prints it.
#include <iostream>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "cmd/common/exit.h"
#include "cmd/gpulet/command.h"
#include "cmd/gpulet/gpu_flags.h"
#include "gpu/open.h"
#include "nlohmann/json.hpp"

namespace gpulet::cmd {
namespace {

std::string Cell(const gpu::Inventory& inv, size_t i, size_t j) {
  if (i == j) return " X ";
  if (!inv.devices[i].Readable() || !inv.devices[j].Readable()) return "N/A";
  const gpu::Link& l = inv.topology[i][j];
  if (l.nvlinks > 0) return absl::StrFormat("NV%d", l.nvlinks);
  return gpu::PcieRelationName(l.pcie);
}

void Print(const gpu::Inventory& inv, std::ostream& out) {
  for (const gpu::Device& d : inv.devices) {
    if (!d.Readable()) {
      // nvidia-smi's words for a GPU it cannot open, so a reader recognises them.
      out << absl::StrFormat("GPU %d: Unable to determine the device handle: %s\n", d.index,
                             d.error);
      continue;
    }
    out << absl::StrFormat("GPU %d: %s (UUID: %s)\n", d.index, d.name, d.uuid);
    for (const gpu::MigDevice& m : d.mig_devices) {
      out << absl::StrFormat("  MIG %-11s Device %2d: (UUID: %s)\n", m.profile, m.index, m.uuid);
    }
  }
  out << absl::StrFormat("\nDriver Version: %s    CUDA Version: %d.%d\n\n", inv.driver_version,
                         inv.cuda_driver_version / 1000, inv.cuda_driver_version % 1000 / 10);
  out << "\t";
  for (const gpu::Device& d : inv.devices) out << "GPU" << d.index << "\t";
  out << "CPU Affinity\tNUMA Affinity\n";
  for (size_t i = 0; i < inv.devices.size(); ++i) {
    const gpu::Device& d = inv.devices[i];
    out << "GPU" << d.index << "\t";
    for (size_t j = 0; j < inv.devices.size(); ++j) out << Cell(inv, i, j) << "\t";
    out << (d.cpu_affinity.empty() ? "N/A" : d.cpu_affinity) << "\t"
        << (d.numa_node < 0 ? "N/A" : std::to_string(d.numa_node)) << "\n";
  }
  out << "\nLegend:\n\n"
         "  X    = the GPU itself\n"
         "  NV#  = # NVLinks between the pair (directly or through NVSwitch)\n"
         "  PIX  = PCIe, through at most one PCIe switch\n"
         "  PXB  = PCIe, through several PCIe switches but no host bridge\n"
         "  PHB  = PCIe, through a PCIe host bridge (the CPU)\n"
         "  NODE = PCIe, across host bridges within one NUMA node\n"
         "  SYS  = PCIe, across the interconnect between NUMA nodes\n";
}

// The same facts for scripts: one JSON object (field names are stable).
nlohmann::json ToJson(const gpu::Inventory& inv) {
  nlohmann::json gpus = nlohmann::json::array();
  for (size_t i = 0; i < inv.devices.size(); ++i) {
    const gpu::Device& d = inv.devices[i];
    if (!d.Readable()) {
      gpus.push_back({{"index", d.index}, {"error", d.error}});
      continue;
    }
    nlohmann::json mig = nlohmann::json::array();
    for (const gpu::MigDevice& m : d.mig_devices)
      mig.push_back({{"index", m.index}, {"profile", m.profile}, {"uuid", m.uuid}});
    nlohmann::json links = nlohmann::json::array();
    for (size_t j = 0; j < inv.devices.size(); ++j)
      links.push_back(std::string(absl::StripAsciiWhitespace(Cell(inv, i, j))));
    gpus.push_back({{"index", d.index},
                    {"name", d.name},
                    {"uuid", d.uuid},
                    {"pciBusId", d.pci_bus_id},
                    {"memoryBytes", d.memory_bytes},
                    {"numaNode", d.numa_node},
                    {"cpuAffinity", d.cpu_affinity},
                    {"migEnabled", d.mig_enabled},
                    {"mig", mig},
                    {"topology", links}});
  }
  return {{"driverVersion", inv.driver_version},
          {"cudaVersion", absl::StrFormat("%d.%d", inv.cuda_driver_version / 1000,
                                          inv.cuda_driver_version % 1000 / 10)},
          {"gpus", gpus}};
}

std::function<int()> SetupInfo(CLI::App& sub) {
  auto opts = std::make_shared<gpu::GpuOptions>();
  auto json = std::make_shared<bool>(false);
  AddGpuFlags(sub, *opts);
  sub.add_flag("--json", *json,
               "Print one JSON object (driverVersion, cudaVersion, gpus[] with index, name, uuid, "
               "pciBusId, memoryBytes, numaNode, cpuAffinity, migEnabled, mig[], topology[]; a "
               "GPU NVML cannot read has only index and error)");
  Example(sub, "gpulet info --simulate dgx1-v100 --json");
  return [opts, json] {
    auto layer = gpu::OpenGpuLayer(*opts);
    if (!layer.ok()) return Fail("gpulet info", layer.status());
    auto inv = (*layer)->GetInventory();
    if (!inv.ok()) return Fail("gpulet info", inv.status());
    if (*json)
      std::cout << ToJson(*inv).dump(2) << "\n";
    else
      Print(*inv, std::cout);
    return 0;
  };
}

}  // namespace

GPULET_COMMAND(info,
               "List the node's GPUs (like nvidia-smi -L) and their topology matrix "
               "(like nvidia-smi topo -m)",
               SetupInfo);

}  // namespace gpulet::cmd
