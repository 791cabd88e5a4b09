// `gpulet info`: the node's GPUs as `nvidia-smi -L` lists them (MIG devices indented beneath their
// GPU), then the GPU-to-GPU topology matrix as `nvidia-smi topo -m` prints it.
#include <iostream>
#include <memory>

#include "absl/strings/str_format.h"
#include "cmd/gpulet/command.h"
#include "cmd/gpulet/gpu_flags.h"
#include "gpu/open.h"

namespace gpulet::cmd {
namespace {

std::string Cell(const gpu::Inventory& inv, size_t i, size_t j) {
  if (i == j) return " X ";
  const gpu::Link& l = inv.topology[i][j];
  if (l.nvlinks > 0) return absl::StrFormat("NV%d", l.nvlinks);
  return gpu::PcieRelationName(l.pcie);
}

void Print(const gpu::Inventory& inv, std::ostream& out) {
  for (const gpu::Device& d : inv.devices) {
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

std::function<int()> SetupInfo(CLI::App& sub) {
  auto opts = std::make_shared<gpu::GpuOptions>();
  AddGpuFlags(sub, *opts);
  return [opts] {
    auto layer = gpu::OpenGpuLayer(*opts);
    if (!layer.ok()) {
      std::cerr << "gpulet info: " << layer.status().message() << "\n";
      return 1;
    }
    auto inv = (*layer)->GetInventory();
    if (!inv.ok()) {
      std::cerr << "gpulet info: " << inv.status().message() << "\n";
      return 1;
    }
    Print(*inv, std::cout);
    return 0;
  };
}

}  // namespace

GPULET_COMMAND(info, "List the node's GPUs (like nvidia-smi -L) and their topology matrix "
                     "(like nvidia-smi topo -m)",
               SetupInfo);

}  // namespace gpulet::cmd
