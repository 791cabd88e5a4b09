#include "dra/devices.h"

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/fs.h"
#include "gpu/selection.h"
#include "vgpu/rules/rules.h"

namespace gpulet::dra {
namespace {

json Str(const std::string& s) { return {{"string", s}}; }
json Int(int64_t v) { return {{"int", v}}; }
json Ver(const std::string& v) { return {{"version", v}}; }

// Memory as a Kubernetes quantity in whole MiB (what NVML reports is a whole number of MiB).
std::string Quantity(uint64_t bytes) { return absl::StrCat(bytes >> 20, "Mi"); }

// "00000000:18:00.0" -> "0000:18:00.0", the sysfs name.
std::string SysfsPciName(const std::string& bus_id) {
  std::string s = absl::AsciiStrToLower(bus_id);
  size_t colon = s.find(':');
  if (colon != std::string::npos && colon > 4) s = s.substr(colon - 4);
  return s;
}

// The PCI root complex of a GPU ("pci0000:17"), from where its sysfs device lives; "" unknown.
std::string PcieRoot(const std::string& host_root, const std::string& bus_id) {
  if (bus_id.empty()) return "";
  std::error_code ec;
  auto real = std::filesystem::canonical(
      JoinRoot(host_root, "/sys/bus/pci/devices/" + SysfsPciName(bus_id)), ec);
  if (ec) return "";
  for (const auto& part : real) {
    std::string p = part.string();
    if (absl::StartsWith(p, "pci") && p.find(':') != std::string::npos) return p;
  }
  return "";
}

void CommonAttributes(const gpu::Inventory& inv, const gpu::Device& d, json& attrs) {
  attrs["productName"] = Str(d.name);
  if (!d.brand.empty()) attrs["brand"] = Str(d.brand);
  if (!d.architecture.empty()) attrs["architecture"] = Str(absl::AsciiStrToLower(d.architecture));
  if (std::string v = SemverOf(inv.driver_version); !v.empty()) attrs["driverVersion"] = Ver(v);
  if (inv.cuda_driver_version > 0)
    attrs["cudaDriverVersion"] = Ver(absl::StrCat(inv.cuda_driver_version / 1000, ".",
                                                  inv.cuda_driver_version % 1000 / 10, ".0"));
  if (d.cc_major > 0)
    attrs["cudaComputeCapability"] = Ver(absl::StrCat(d.cc_major, ".", d.cc_minor, ".0"));
  attrs["minor"] = Int(d.minor);
  if (!d.pci_bus_id.empty()) attrs["pcieBusID"] = Str(absl::AsciiStrToLower(d.pci_bus_id));
}

}  // namespace

uint64_t WholeShareBytes(uint64_t memory_bytes) {
  return memory_bytes / vgpu::kMemoryUnitBytes * vgpu::kMemoryUnitBytes;
}

std::string SemverOf(const std::string& dotted) {
  std::vector<std::string> parts;
  for (absl::string_view p : absl::StrSplit(dotted, '.')) {
    uint64_t n;
    if (!absl::SimpleAtoi(p, &n)) break;  // leading zeros are fine for SimpleAtoi: "04" -> 4
    parts.push_back(absl::StrCat(n));
    if (parts.size() == 3) break;
  }
  if (parts.empty()) return "";
  while (parts.size() < 3) parts.push_back("0");
  return absl::StrJoin(parts, ".");
}

std::vector<int> NvlinkDomains(const gpu::Inventory& inv) {
  size_t n = inv.devices.size();
  std::vector<int> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  std::function<int(int)> find = [&](int x) {
    return parent[x] == x ? x : parent[x] = find(parent[x]);
  };
  std::vector<bool> linked(n, false);
  for (size_t i = 0; i < n && i < inv.topology.size(); ++i)
    for (size_t j = 0; j < n && j < inv.topology[i].size(); ++j) {
      if (i == j || inv.topology[i][j].nvlinks <= 0) continue;
      linked[i] = linked[j] = true;
      int a = find(i), b = find(j);
      if (a != b) parent[std::max(a, b)] = std::min(a, b);
    }
  std::vector<int> out(n, -1);
  for (size_t i = 0; i < n; ++i)
    if (linked[i]) out[i] = static_cast<int>(inv.devices[find(i)].index);
  return out;
}

absl::StatusOr<std::vector<DraDevice>> BuildDevices(const gpu::Inventory& inv,
                                                    const DeviceOptions& opt) {
  auto gpus = gpu::SelectGpus(inv, opt.selection);
  if (!gpus.ok()) return gpus.status();
  std::vector<int> domains = NvlinkDomains(inv);
  std::vector<DraDevice> out;
  for (uint32_t g : *gpus) {
    const gpu::Device& d = inv.devices[g];
    std::string root = PcieRoot(opt.host_root, d.pci_bus_id);
    if (!d.mig_enabled) {
      DraDevice dev;
      dev.name = absl::StrCat("gpu-", d.index);
      dev.gpu = g;
      dev.uuid = d.uuid;
      dev.memory_bytes = d.memory_bytes;
      json attrs;
      attrs["type"] = Str("gpu");
      attrs["uuid"] = Str(d.uuid);
      attrs["index"] = Int(d.index);
      CommonAttributes(inv, d, attrs);
      if (domains[g] >= 0) attrs["nvlinkDomain"] = Int(domains[g]);
      if (!root.empty()) attrs["resource.kubernetes.io/pcieRoot"] = Str(root);
      json cap;
      cap["memory"] = {{"value", Quantity(d.memory_bytes)}};
      if (opt.consumable_capacity) {
        // A share is at least one vcuda-memory unit (256 MiB) and a multiple of it, and 1..100
        // percent of the compute; a claim that names no amount takes the whole GPU (its memory
        // on that grid: the API refuses a default off it, and so the whole slice).
        cap["memory"]["requestPolicy"] = {{"default", Quantity(WholeShareBytes(d.memory_bytes))},
                                          {"validRange", {{"min", "256Mi"}, {"step", "256Mi"}}}};
        cap["cores"] = {
            {"value", "100"},
            {"requestPolicy",
             {{"default", "100"}, {"validRange", {{"min", "1"}, {"max", "100"}, {"step", "1"}}}}}};
      }
      if (d.sm_count > 0) {
        cap["multiprocessors"] = {{"value", absl::StrCat(d.sm_count)}};
        // Informational: a capacity without a policy is consumed whole by every claim that
        // names no amount (the scheduler's rule), which would let only one share on the GPU.
        // Shares consume none of it; a claim asking for some finds no device.
        if (opt.consumable_capacity)
          cap["multiprocessors"]["requestPolicy"] = {{"default", "0"}, {"validValues", {"0"}}};
      }
      dev.entry = {{"name", dev.name}, {"attributes", attrs}, {"capacity", cap}};
      if (opt.consumable_capacity) dev.entry["allowMultipleAllocations"] = true;
      out.push_back(std::move(dev));
      continue;
    }
    for (size_t m = 0; m < d.mig_devices.size(); ++m) {
      const gpu::MigDevice& mig = d.mig_devices[m];
      DraDevice dev;
      dev.name =
          absl::StrCat("gpu-", d.index, "-mig-", mig.gpu_instance_id, "-", mig.compute_instance_id);
      dev.gpu = g;
      dev.mig = static_cast<int>(m);
      dev.uuid = mig.uuid;
      dev.memory_bytes = mig.memory_bytes;
      json attrs;
      attrs["type"] = Str("mig");
      attrs["uuid"] = Str(mig.uuid);
      attrs["parentUUID"] = Str(d.uuid);
      attrs["parentIndex"] = Int(d.index);
      attrs["index"] = Int(d.index);  // the GPU's, as nvidia-smi lists a MIG device under it
      attrs["profile"] = Str(mig.profile);
      attrs["gpuInstanceID"] = Int(mig.gpu_instance_id);
      attrs["computeInstanceID"] = Int(mig.compute_instance_id);
      CommonAttributes(inv, d, attrs);
      if (domains[g] >= 0) attrs["nvlinkDomain"] = Int(domains[g]);
      if (!root.empty()) attrs["resource.kubernetes.io/pcieRoot"] = Str(root);
      json cap;
      cap["memory"] = {{"value", Quantity(mig.memory_bytes)}};
      if (mig.sm_count > 0) cap["multiprocessors"] = {{"value", absl::StrCat(mig.sm_count)}};
      dev.entry = {{"name", dev.name}, {"attributes", attrs}, {"capacity", cap}};
      out.push_back(std::move(dev));
    }
  }
  return out;
}

}  // namespace gpulet::dra
