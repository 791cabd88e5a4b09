#include "vgpu/rules/rules.h"

#include <charconv>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace gpulet::vgpu {
namespace {

using nlohmann::json;

// Reads resources.<section>[name] of a container; nullopt-like -1 when absent.
absl::StatusOr<int64_t> ReadResource(const json& resources, const char* section,
                                     const std::string& name, const std::string& where) {
  auto sec = resources.find(section);
  if (sec == resources.end() || !sec->is_object()) return -1;
  auto it = sec->find(name);
  if (it == sec->end()) return -1;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (!it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": resources.", section, "[", name, "] must be an integer quantity"));
  }
  auto v = ParseIntQuantity(it->get<std::string>());
  if (!v.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": resources.", section, "[", name, "]: ", v.status().message()));
  }
  return *v;
}

// `c.name` when it is a string (pods reach us unvalidated: webhook, extender), else `fallback`.
std::string NameOf(const json& c, std::string fallback) {
  if (!c.is_object()) return fallback;
  auto it = c.find("name");
  return it != c.end() && it->is_string() ? it->get<std::string>() : fallback;
}

}  // namespace

int64_t MemoryUnitsOf(int64_t bytes) { return bytes / static_cast<int64_t>(kMemoryUnitBytes); }

placement::ContainerRequest PlacementRequestOf(const ContainerUnits& c) {
  placement::ContainerRequest pc;
  if (c.cores >= kCoresPerGpu) {
    pc.whole_gpus = static_cast<int32_t>(c.whole_gpus());
  } else if (c.cores > 0) {
    pc.milli = static_cast<int32_t>(c.cores * placement::kMilliPerVcudaCore);
    pc.memory_bytes = MemoryUnitsToBytes(c.memory_units);
  }
  return pc;
}

int64_t NominalMemoryUnitsOf(int64_t bytes) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  return MemoryUnitsOf((bytes + kGiB - 1) / kGiB * kGiB);
}

absl::StatusOr<int64_t> ParseIntQuantity(std::string_view q) {
  int64_t value = 0;
  auto [p, ec] = std::from_chars(q.data(), q.data() + q.size(), value);
  if (ec != std::errc() || p == q.data()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", std::string(q), "\" is not an integer quantity"));
  }
  std::string_view suffix(p, q.data() + q.size() - p);
  // Kubernetes' suffixes (resource.Quantity): decimal SI and binary, up to exa.
  static constexpr std::pair<std::string_view, int64_t> kSuffixes[] = {{"", 1},
                                                                       {"k", 1000},
                                                                       {"M", 1000000},
                                                                       {"G", 1000000000},
                                                                       {"T", 1000000000000},
                                                                       {"P", 1000000000000000},
                                                                       {"E", 1000000000000000000},
                                                                       {"Ki", int64_t{1} << 10},
                                                                       {"Mi", int64_t{1} << 20},
                                                                       {"Gi", int64_t{1} << 30},
                                                                       {"Ti", int64_t{1} << 40},
                                                                       {"Pi", int64_t{1} << 50},
                                                                       {"Ei", int64_t{1} << 60}};
  for (const auto& [s, mult] : kSuffixes) {
    if (suffix == s) {
      if (value > INT64_MAX / mult || value < INT64_MIN / mult) {
        return absl::InvalidArgumentError(absl::StrCat("\"", std::string(q), "\" is too large"));
      }
      return value * mult;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "\"", std::string(q), "\" is not an integer quantity (vGPU resources are whole units)"));
}

absl::StatusOr<int64_t> ParseMilliQuantity(std::string_view q) {
  // resource.Quantity's grammar: [+-]digits[.digits][suffix], suffix one of the binary or
  // decimal SI ones or e<int>. Written here because the one integer parser above refuses
  // fractions by design (vGPU units are whole) and no packaged library reads this format.
  const auto bad = [&q](const char* why) {
    return absl::InvalidArgumentError(absl::StrCat("\"", std::string(q.substr(0, 64)), "\" ", why));
  };
  if (q.empty() || q.size() > 64) return bad("is not a quantity");
  size_t i = 0;
  bool negative = false;
  if (q[i] == '+' || q[i] == '-') negative = q[i++] == '-';
  __int128 digits = 0;  // the mantissa's digits as one integer
  int fraction = 0;     // digits after the point
  bool any = false, point = false;
  for (; i < q.size(); ++i) {
    if (q[i] == '.' && !point) {
      point = true;
    } else if (q[i] >= '0' && q[i] <= '9') {
      if (digits >= __int128{1000000000000000000} * 10) return bad("has too many digits");
      digits = digits * 10 + (q[i] - '0');
      fraction += point;
      if (fraction > 9) return bad("has more than 9 decimals");
      any = true;
    } else {
      break;
    }
  }
  if (!any) return bad("is not a quantity");
  std::string_view suffix = q.substr(i);
  // value = digits * num / den, in milli-units.
  __int128 num = 1000, den = 1;
  for (int f = 0; f < fraction; ++f) den *= 10;
  static constexpr std::pair<std::string_view, int> kDecimal[] = {
      {"n", -9}, {"u", -6}, {"m", -3}, {"", 0},   {"k", 3},
      {"M", 6},  {"G", 9},  {"T", 12}, {"P", 15}, {"E", 18}};
  static constexpr std::pair<std::string_view, int> kBinary[] = {
      {"Ki", 10}, {"Mi", 20}, {"Gi", 30}, {"Ti", 40}, {"Pi", 50}, {"Ei", 60}};
  int exp10 = 0, exp2 = 0;
  bool known = false;
  for (const auto& [s, e] : kDecimal) known = known || (suffix == s && (exp10 = e, true));
  for (const auto& [s, e] : kBinary) known = known || (suffix == s && (exp2 = e, true));
  if (!known && suffix.size() >= 2 && (suffix[0] == 'e' || suffix[0] == 'E')) {
    auto [p, ec] = std::from_chars(suffix.data() + 1, suffix.data() + suffix.size(), exp10);
    known = ec == std::errc() && p == suffix.data() + suffix.size() && exp10 >= -9 && exp10 <= 18;
  }
  if (!known) return bad("is not a quantity (unknown suffix)");
  for (; exp10 > 0; --exp10) num *= 10;
  for (; exp10 < 0; ++exp10) den *= 10;
  num <<= exp2;
  // den <= 1e18 and digits < 1e19: once the estimate is within int64, the exact product fits in
  // 128 bits.
  if (static_cast<long double>(digits) * static_cast<long double>(num) /
          static_cast<long double>(den) >
      static_cast<long double>(INT64_MAX) / 2) {
    return bad("is too large");
  }
  const __int128 v = (digits * num + den - 1) / den;  // rounded up, like MilliValue()
  return negative ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
}

absl::Status ValidateContainer(const ContainerUnits& c, int64_t max_units_per_gpu,
                               const ResourceNames& names) {
  std::string where = absl::StrCat("container \"", c.name, "\"");
  const std::string allowed =
      absl::StrCat("allowed: ", names.core, " 1-99 (a share of one GPU, with ", names.memory,
                   " >= 1) or a multiple of 100 (that many whole GPUs)");
  if (c.cores < 0 || c.memory_units < 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": negative vGPU request; ", allowed));
  }
  if (c.cores > kMaxGpusPerContainer * kCoresPerGpu ||
      c.memory_units > kMaxGpusPerContainer * kMaxMemoryUnitsPerGpu) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": vGPU request too large (at most ", kMaxGpusPerContainer * kCoresPerGpu, " ",
        names.core, " and ", kMaxGpusPerContainer * kMaxMemoryUnitsPerGpu, " ", names.memory, ")"));
  }
  // A bound from a node inventory is trusted no further than the same limit.
  max_units_per_gpu = std::min(max_units_per_gpu, kMaxMemoryUnitsPerGpu);
  if (c.cores == 0) {
    if (c.memory_units > 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", names.memory, " ", c.memory_units,
                                                     " without ", names.core,
                                                     "; memory needs a core share; ", allowed));
    }
    return absl::OkStatus();
  }
  if (c.cores > kCoresPerGpu && c.cores % kCoresPerGpu != 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", names.core, " ", c.cores,
                                                   " is more than one GPU but not a multiple of "
                                                   "100; ",
                                                   allowed));
  }
  if (c.fractional()) {
    if (c.memory_units == 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", names.core, " ", c.cores,
                                                     " is a share of one GPU and needs ",
                                                     names.memory, " >= 1 (256 MiB units)"));
    }
    if (max_units_per_gpu > 0 && c.memory_units > max_units_per_gpu) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", names.memory, " ", c.memory_units, " (",
                       MemoryUnitsToBytes(c.memory_units) >> 20, " MiB) is larger than one GPU (",
                       max_units_per_gpu, " units = ", MemoryUnitsToBytes(max_units_per_gpu) >> 20,
                       " MiB); a share must fit on one GPU"));
    }
  } else if (max_units_per_gpu > 0 && c.memory_units > c.whole_gpus() * max_units_per_gpu) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", names.memory, " ", c.memory_units, " is more than ", c.whole_gpus(),
        " whole GPU(s) hold (", c.whole_gpus() * max_units_per_gpu, " units)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PodUnits> ParsePod(const json& pod, const ResourceNames& names,
                                  int64_t max_units_per_gpu) {
  PodUnits out;
  auto spec = pod.find("spec");
  if (spec == pod.end() || !spec->is_object()) {
    return absl::InvalidArgumentError("pod has no spec");
  }
  // Init containers: any vGPU request is refused (see header).
  if (auto init = spec->find("initContainers"); init != spec->end() && init->is_array()) {
    for (const json& c : *init) {
      if (!c.is_object()) continue;
      auto res = c.find("resources");
      if (res == c.end() || !res->is_object()) continue;
      for (const char* sec : {"limits", "requests"}) {
        auto list = res->find(sec);
        if (list == res->end() || !list->is_object()) continue;
        if (list->contains(names.core) || list->contains(names.memory)) {
          return absl::InvalidArgumentError(absl::StrCat("init container \"", NameOf(c, ""),
                                                         "\": ", names.core, "/", names.memory,
                                                         " are not supported on init containers"));
        }
      }
    }
  }
  auto containers = spec->find("containers");
  if (containers == spec->end() || !containers->is_array()) return out;
  for (size_t i = 0; i < containers->size(); ++i) {
    const json& c = (*containers)[i];
    ContainerUnits req;
    req.index = static_cast<int>(i);
    req.name = NameOf(c, absl::StrCat("#", i));
    std::string where = absl::StrCat("container \"", req.name, "\"");
    if (!c.is_object()) continue;
    auto res = c.find("resources");
    if (res == c.end() || !res->is_object()) continue;
    int64_t got[2][2];  // [core|memory][limit|request]
    const std::string* rnames[2] = {&names.core, &names.memory};
    for (int r = 0; r < 2; ++r) {
      ASSIGN_OR_RETURN(got[r][0], ReadResource(*res, "limits", *rnames[r], where));
      ASSIGN_OR_RETURN(got[r][1], ReadResource(*res, "requests", *rnames[r], where));
      if (got[r][1] >= 0 && got[r][1] != got[r][0]) {
        return absl::InvalidArgumentError(
            got[r][0] < 0
                ? absl::StrCat(where, ": ", *rnames[r], " is in requests (", got[r][1],
                               ") but not in limits; give it in limits (requests, if given, "
                               "must equal limits)")
                : absl::StrCat(where, ": ", *rnames[r], " request ", got[r][1],
                               " differs from limit ", got[r][0],
                               "; requests, if given, must equal limits"));
      }
    }
    req.cores = std::max<int64_t>(got[0][0], 0);
    req.memory_units = std::max<int64_t>(got[1][0], 0);
    if (got[0][0] < 0 && got[1][0] < 0) continue;
    RETURN_IF_ERROR(ValidateContainer(req, max_units_per_gpu, names));
    if (req.wants_gpu()) out.containers.push_back(std::move(req));
  }
  return out;
}

int64_t QuantityIn(const nlohmann::json& list, const std::string& name) {
  auto it = list.find(name);
  if (it == list.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (!it->is_string()) return 0;
  auto v = ParseIntQuantity(it->get<std::string>());
  return v.ok() ? *v : 0;
}

}  // namespace gpulet::vgpu
