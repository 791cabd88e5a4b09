#include "vgpu/rules/node_pool.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "nlohmann/json.hpp"
#include "vgpu/rules/rules.h"

namespace gpulet::vgpu {

using nlohmann::json;

bool IsUuidToken(std::string_view s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s) {
    if (!(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
          c == ':')) {
      return false;
    }
  }
  return true;
}

std::string EncodeNodePool(const std::vector<PoolGpu>& gpus) {
  json list = json::array();
  for (const auto& g : gpus) {
    list.push_back({{"uuid", g.uuid},
                    {"index", g.index},
                    {"memoryUnits", g.memory_units},
                    {"healthy", g.healthy}});
  }
  return list.dump();
}

absl::StatusOr<std::vector<PoolGpu>> DecodeNodePool(std::string_view text) {
  const std::string what = absl::StrCat("annotation ", kAnnotationNodeGpus);
  // An annotation is anyone's text: its depth is checked before a DOM is built for it.
  if (JsonDepth(text, 4) > 2) {
    return absl::InvalidArgumentError(what + ": nests deeper than a list of objects");
  }
  json list = json::parse(text.begin(), text.end(), nullptr, false);
  if (!list.is_array()) return absl::InvalidArgumentError(what + ": not a JSON list");
  if (static_cast<int64_t>(list.size()) > kMaxNodeGpus) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", list.size(), " GPUs (at most ", kMaxNodeGpus, ")"));
  }
  std::vector<PoolGpu> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& g = list[i];
    std::string where = absl::StrCat(what, "[", i, "]");
    if (!g.is_object()) return absl::InvalidArgumentError(where + ": not an object");
    PoolGpu gpu;
    if (auto u = g.find("uuid"); u != g.end()) {
      if (!u->is_string() || !IsUuidToken(u->get_ref<const std::string&>())) {
        return absl::InvalidArgumentError(where + ".uuid: not a GPU UUID string");
      }
      gpu.uuid = u->get<std::string>();
    }
    if (auto x = g.find("index");
        x != g.end() && x->is_number_unsigned() && x->get<uint64_t>() <= UINT32_MAX) {
      gpu.index = static_cast<uint32_t>(x->get<uint64_t>());
    }
    if (auto m = g.find("memoryUnits"); m != g.end()) {
      if (!m->is_number_integer() || m->get<int64_t>() < 0 ||
          m->get<int64_t>() > kMaxMemoryUnitsPerGpu) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".memoryUnits: not an integer in 0..", kMaxMemoryUnitsPerGpu));
      }
      gpu.memory_units = m->get<int64_t>();
    }
    if (auto h = g.find("healthy"); h != g.end()) {
      if (!h->is_boolean()) return absl::InvalidArgumentError(where + ".healthy: not a boolean");
      gpu.healthy = h->get<bool>();
    }
    out.push_back(std::move(gpu));
  }
  return out;
}

}  // namespace gpulet::vgpu
