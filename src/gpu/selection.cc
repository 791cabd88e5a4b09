#include "gpu/selection.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace gpulet::gpu {

absl::StatusOr<std::vector<uint32_t>> SelectGpus(const Inventory& inv,
                                                 const std::string& selection) {
  std::vector<uint32_t> out;
  std::string sel(absl::StripAsciiWhitespace(selection));
  if (sel.empty()) return out;
  if (sel == "all") {
    for (uint32_t i = 0; i < inv.devices.size(); ++i) out.push_back(i);
    return out;
  }
  for (absl::string_view part : absl::StrSplit(sel, ',', absl::SkipWhitespace())) {
    std::string item(absl::StripAsciiWhitespace(part));
    uint32_t idx = 0;
    bool by_index = absl::SimpleAtoi(item, &idx);
    bool found = false;
    for (uint32_t i = 0; i < inv.devices.size(); ++i) {
      const auto& d = inv.devices[i];
      if ((by_index && d.index == idx) || (!by_index && d.uuid == item)) {
        if (std::find(out.begin(), out.end(), i) == out.end()) out.push_back(i);
        found = true;
      }
    }
    if (!found) return absl::NotFoundError(absl::StrCat("GPU \"", item, "\" is not on this node"));
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::set<std::string>> DevicePluginIds(const Inventory& inv,
                                                      const std::string& selection) {
  auto gpus = SelectGpus(inv, selection);
  if (!gpus.ok()) return gpus.status();
  std::set<std::string> out;
  for (uint32_t g : *gpus) {
    const Device& d = inv.devices[g];
    out.insert(d.uuid);
    out.insert(absl::StrCat(d.index));
    for (const auto& mig : d.mig_devices) {
      out.insert(mig.uuid);
      out.insert(absl::StrCat(d.index, ":", mig.index));
    }
  }
  return out;
}

}  // namespace gpulet::gpu
