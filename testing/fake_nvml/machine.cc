#include "fake_nvml/machine.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "abi/nvml_api.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "yaml-cpp/yaml.h"

namespace gpulet::sim {

// Generated from testing/profiles/*.yaml (embed_profiles.cmake).
extern const std::vector<std::pair<std::string, std::string>>& EmbeddedProfiles();

namespace {

// Thrown inside the parser only; ParseMachine turns it into a Status.
struct ParseError {
  std::string msg;
};

class Parser {
 public:
  explicit Parser(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void Fail(const YAML::Node& n, const std::string& what) const {
    int line = n.IsDefined() ? n.Mark().line + 1 : 0;
    throw ParseError{line > 0 ? absl::StrCat(source_, ":", line, ": ", what)
                              : absl::StrCat(source_, ": ", what)};
  }

  // Rejects keys outside `allowed`: a typo must not silently fall back to a default.
  void CheckKeys(const YAML::Node& map, const std::string& where,
                 std::initializer_list<const char*> allowed) const {
    if (!map.IsMap()) Fail(map, absl::StrCat(where, ": expected a mapping"));
    for (const auto& kv : map) {
      std::string k = kv.first.Scalar();
      bool ok = std::any_of(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; });
      if (!ok) {
        Fail(kv.first, absl::StrCat(where.empty() ? "" : where + ": ", "unknown key '", k,
                                    "' (allowed: ", absl::StrJoin(allowed, ", "), ")"));
      }
    }
  }

  std::string Str(const YAML::Node& n, const std::string& what) const {
    if (!n.IsScalar()) Fail(n, absl::StrCat(what, ": expected a scalar"));
    return n.Scalar();
  }

  uint64_t UInt(const YAML::Node& n, const std::string& what, uint64_t max = UINT64_MAX) const {
    std::string s = Str(n, what);
    int base = 10;
    std::string_view v = s;
    if (v.size() > 2 && v[0] == '0' && (v[1] == 'x' || v[1] == 'X')) {
      base = 16;
      v.remove_prefix(2);
    }
    uint64_t out = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out, base);
    if (ec != std::errc() || p != v.data() + v.size() || v.empty()) {
      Fail(n, absl::StrCat(what, ": bad value '", s, "' (want a non-negative integer)"));
    }
    if (out > max) Fail(n, absl::StrCat(what, ": value ", out, " is out of range (max ", max, ")"));
    return out;
  }

  int Int(const YAML::Node& n, const std::string& what, int min, int max) const {
    std::string s = Str(n, what);
    int out = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec != std::errc() || p != s.data() + s.size() || s.empty() || out < min || out > max) {
      Fail(n,
           absl::StrCat(what, ": bad value '", s, "' (want an integer in ", min, "..", max, ")"));
    }
    return out;
  }

  bool Bool(const YAML::Node& n, const std::string& what) const {
    std::string s = absl::AsciiStrToLower(Str(n, what));
    if (s == "true" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "no" || s == "off") return false;
    Fail(n, absl::StrCat(what, ": bad value '", s, "' (want true or false)"));
  }

  std::string Uuid(const YAML::Node& n, const std::string& what, const char* prefix) const {
    std::string s = Str(n, what);
    // PREFIX-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, lower-case hex, as NVML prints them.
    static constexpr int kGroups[] = {8, 4, 4, 4, 12};
    bool ok = s.rfind(prefix, 0) == 0;
    size_t pos = std::string_view(prefix).size();
    for (int g = 0; ok && g < 5; ++g) {
      for (int i = 0; ok && i < kGroups[g]; ++i, ++pos) {
        ok = pos < s.size() && std::isxdigit(static_cast<unsigned char>(s[pos])) &&
             !std::isupper(static_cast<unsigned char>(s[pos]));
      }
      if (ok && g < 4) ok = pos < s.size() && s[pos++] == '-';
    }
    if (!ok || pos != s.size()) {
      Fail(n, absl::StrCat(what, ": bad UUID '", s, "' (want ", prefix,
                           "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, lower-case hex)"));
    }
    return s;
  }

  // Accepts "0000:18:00.0" or "00000000:18:00.0"; returns NVML's 8-digit-domain form.
  std::string BusId(const YAML::Node& n, const std::string& what) const {
    std::string s = absl::AsciiStrToLower(Str(n, what));
    std::vector<std::string> parts = absl::StrSplit(s, absl::ByAnyChar(":."));
    auto hex = [](const std::string& p, size_t len) {
      return p.size() == len && std::all_of(p.begin(), p.end(), [](char c) {
               return std::isxdigit(static_cast<unsigned char>(c));
             });
    };
    if (parts.size() != 4 || !(hex(parts[0], 4) || hex(parts[0], 8)) || !hex(parts[1], 2) ||
        !hex(parts[2], 2) || !hex(parts[3], 1)) {
      Fail(n, absl::StrCat(what, ": bad PCI bus id '", s, "' (want 00000000:18:00.0)"));
    }
    std::string domain = parts[0].size() == 4 ? "0000" + parts[0] : parts[0];
    return absl::AsciiStrToUpper(absl::StrCat(domain, ":", parts[1], ":", parts[2])) + "." +
           parts[3];
  }

  void Gpu(const YAML::Node& n, const std::string& where, GpuSpec& g,
           const std::map<std::string, YAML::Node>& mig_profiles) const {
    CheckKeys(n, where,
              {"name",
               "brand",
               "architecture",
               "uuid",
               "pci_bus_id",
               "pci_device_id",
               "pci_subsystem_id",
               "minor",
               "numa_node",
               "cpus",
               "compute_capability",
               "sm_count",
               "memory_mib",
               "power_limit_w",
               "pcie_switch",
               "host_bridge",
               "ecc",
               "mig_capable",
               "mig_enabled",
               "mig",
               "telemetry",
               "processes",
               "serial",
               "vbios_version",
               "inforom",
               "max_clocks_mhz",
               "pcie",
               "power_limits_w",
               "persistence_mode",
               "compute_mode",
               "gsp_firmware",
               "gpm"});
    for (const auto& kv : n) {
      const std::string k = kv.first.Scalar();
      const YAML::Node& v = kv.second;
      const std::string w = absl::StrCat(where, ".", k);
      if (k == "name") {
        g.name = Str(v, w);
      } else if (k == "brand") {
        static const std::map<std::string, int> kBrands = {{"tesla", NVML_BRAND_TESLA},
                                                           {"nvidia", NVML_BRAND_NVIDIA},
                                                           {"quadro", NVML_BRAND_QUADRO},
                                                           {"geforce", NVML_BRAND_GEFORCE},
                                                           {"titan", NVML_BRAND_TITAN},
                                                           {"nvidia_rtx", NVML_BRAND_NVIDIA_RTX},
                                                           {"geforce_rtx", NVML_BRAND_GEFORCE_RTX}};
        auto it = kBrands.find(absl::AsciiStrToLower(Str(v, w)));
        if (it == kBrands.end()) Fail(v, absl::StrCat(w, ": unknown brand '", v.Scalar(), "'"));
        g.brand = it->second;
      } else if (k == "architecture") {
        static const std::map<std::string, unsigned> kArch = {
            {"kepler", NVML_DEVICE_ARCH_KEPLER},
            {"maxwell", NVML_DEVICE_ARCH_MAXWELL},
            {"pascal", NVML_DEVICE_ARCH_PASCAL},
            {"volta", NVML_DEVICE_ARCH_VOLTA},
            {"turing", NVML_DEVICE_ARCH_TURING},
            {"ampere", NVML_DEVICE_ARCH_AMPERE},
            {"ada", NVML_DEVICE_ARCH_ADA},
            {"hopper", NVML_DEVICE_ARCH_HOPPER},
            {"blackwell", NVML_DEVICE_ARCH_BLACKWELL}};
        auto it = kArch.find(absl::AsciiStrToLower(Str(v, w)));
        if (it == kArch.end())
          Fail(v, absl::StrCat(w, ": unknown architecture '", v.Scalar(), "'"));
        g.architecture = it->second;
      } else if (k == "uuid") {
        g.uuid = Uuid(v, w, "GPU-");
      } else if (k == "pci_bus_id") {
        g.pci_bus_id = BusId(v, w);
      } else if (k == "pci_device_id") {
        g.pci_device_id = static_cast<uint32_t>(UInt(v, w, UINT32_MAX));
      } else if (k == "pci_subsystem_id") {
        g.pci_subsystem_id = static_cast<uint32_t>(UInt(v, w, UINT32_MAX));
      } else if (k == "minor") {
        g.minor = Int(v, w, 0, 253);  // 254/255 are nvidia-modeset / nvidiactl
      } else if (k == "numa_node") {
        g.numa_node = Int(v, w, -1, 1023);
      } else if (k == "cpus") {
        g.cpus = Str(v, w);
      } else if (k == "compute_capability") {
        std::string s = Str(v, w);
        int a = 0, b = 0;
        char dot = 0;
        std::istringstream is(s);
        if (!(is >> a >> dot >> b) || dot != '.' || !is.eof() || a < 1 || a > 20 || b < 0) {
          Fail(v, absl::StrCat(w, ": bad compute capability '", s, "' (want e.g. \"9.0\")"));
        }
        g.cc_major = a;
        g.cc_minor = b;
      } else if (k == "sm_count") {
        g.sm_count = static_cast<uint32_t>(UInt(v, w, 10000));
      } else if (k == "memory_mib") {
        g.memory_mib = UInt(v, w, 1ull << 30);
      } else if (k == "power_limit_w") {
        g.power_limit_w = static_cast<uint32_t>(UInt(v, w, 100000));
      } else if (k == "pcie_switch") {
        g.pcie_switch = Int(v, w, -1, 1 << 20);
      } else if (k == "host_bridge") {
        g.host_bridge = Int(v, w, -1, 1 << 20);
      } else if (k == "ecc") {
        g.ecc = Bool(v, w);
      } else if (k == "mig_capable") {
        g.mig_capable = Bool(v, w);
      } else if (k == "mig_enabled") {
        g.mig_enabled = Bool(v, w);
      } else if (k == "mig") {
        if (!v.IsSequence()) Fail(v, absl::StrCat(w, ": expected a list of MIG devices"));
        g.mig.clear();
        g.mig_enabled = true;
        for (size_t i = 0; i < v.size(); ++i)
          g.mig.push_back(Mig(v[i], absl::StrCat(w, "[", i, "]"), mig_profiles));
      } else if (k == "telemetry") {
        CheckTelemetry(v, w);
        for (const auto& t : v)
          g.telemetry[t.first.Scalar()] = UInt(t.second, w + "." + t.first.Scalar());
      } else if (Facts(k, v, w, g)) {
      } else if (k == "processes") {
        if (!v.IsSequence()) Fail(v, absl::StrCat(w, ": expected a list"));
        g.processes.clear();
        for (size_t i = 0; i < v.size(); ++i) {
          std::string pw = absl::StrCat(w, "[", i, "]");
          CheckKeys(v[i], pw, {"pid", "used_memory_mib"});
          if (!v[i]["pid"]) Fail(v[i], pw + ": missing field 'pid'");
          g.processes.emplace_back(
              static_cast<uint32_t>(UInt(v[i]["pid"], pw + ".pid", INT32_MAX)),
              v[i]["used_memory_mib"] ? UInt(v[i]["used_memory_mib"], pw + ".used_memory_mib") : 0);
        }
      }
    }
  }

  // The nvidia-smi set's facts of one GPU; false for a key that is not one of them.
  bool Facts(const std::string& k, const YAML::Node& v, const std::string& w, GpuSpec& g) const {
    auto sub = [&](std::initializer_list<std::pair<const char*, uint32_t*>> fields, uint64_t max) {
      std::vector<const char*> names;
      for (const auto& f : fields) names.push_back(f.first);
      if (!v.IsMap()) Fail(v, absl::StrCat(w, ": expected a mapping"));
      for (const auto& kv : v) {
        auto it = std::find_if(fields.begin(), fields.end(),
                               [&](const auto& f) { return kv.first.Scalar() == f.first; });
        if (it == fields.end()) {
          Fail(kv.first, absl::StrCat(w, ": unknown key '", kv.first.Scalar(),
                                      "' (allowed: ", absl::StrJoin(names, ", "), ")"));
        }
        *it->second = static_cast<uint32_t>(UInt(kv.second, w + "." + it->first, max));
      }
    };
    if (k == "serial") {
      g.serial = Str(v, w);
    } else if (k == "vbios_version") {
      g.vbios_version = Str(v, w);
    } else if (k == "inforom") {
      CheckKeys(v, w, {"oem", "ecc"});
      if (v["oem"]) g.inforom_oem = Str(v["oem"], w + ".oem");
      if (v["ecc"]) g.inforom_ecc = Str(v["ecc"], w + ".ecc");
    } else if (k == "max_clocks_mhz") {
      sub({{"graphics", &g.max_graphics_clock_mhz},
           {"sm", &g.max_sm_clock_mhz},
           {"memory", &g.max_memory_clock_mhz}},
          100000);
    } else if (k == "pcie") {
      sub({{"gen", &g.pcie_gen},
           {"gen_max", &g.pcie_gen_max},
           {"gpu_gen_max", &g.pcie_gpu_gen_max},
           {"width", &g.pcie_width},
           {"width_max", &g.pcie_width_max}},
          64);
    } else if (k == "power_limits_w") {
      sub({{"default", &g.power_default_w}, {"min", &g.power_min_w}, {"max", &g.power_max_w}},
          100000);
    } else if (k == "persistence_mode") {
      g.persistence_mode = Bool(v, w);
    } else if (k == "compute_mode") {
      static const std::map<std::string, int> kModes = {
          {"default", 0}, {"prohibited", 2}, {"exclusive_process", 3}};
      auto it = kModes.find(absl::AsciiStrToLower(Str(v, w)));
      if (it == kModes.end()) {
        Fail(v, absl::StrCat(w, ": unknown compute mode '", v.Scalar(),
                             "' (want default, prohibited or exclusive_process)"));
      }
      g.compute_mode = it->second;
    } else if (k == "gsp_firmware") {
      g.gsp_firmware = Bool(v, w) ? 1 : 0;
    } else if (k == "gpm") {
      g.gpm = Bool(v, w) ? 1 : 0;
    } else {
      return false;
    }
    return true;
  }

  void CheckTelemetry(const YAML::Node& v, const std::string& w) const {
    if (!v.IsMap()) Fail(v, absl::StrCat(w, ": expected a mapping"));
    for (const auto& t : v) {
      const auto& keys = TelemetryKeys();
      if (std::find(keys.begin(), keys.end(), t.first.Scalar()) == keys.end()) {
        Fail(t.first, absl::StrCat(w, ": unknown key '", t.first.Scalar(),
                                   "' (allowed: ", absl::StrJoin(keys, ", "), ")"));
      }
    }
  }

  MigSpec Mig(const YAML::Node& n, const std::string& w,
              const std::map<std::string, YAML::Node>& profiles) const {
    CheckKeys(n, w, {"profile", "uuid", "gi", "ci"});
    for (const char* req : {"profile", "uuid", "gi"}) {
      if (!n[req]) Fail(n, absl::StrCat(w, ": missing field '", req, "'"));
    }
    MigSpec m;
    m.profile = Str(n["profile"], w + ".profile");
    auto it = profiles.find(m.profile);
    if (it == profiles.end()) {
      Fail(n["profile"], absl::StrCat(w, ".profile: unknown MIG profile '", m.profile,
                                      "' (declare it under mig_profiles)"));
    }
    const YAML::Node& p = it->second;
    std::string pw = "mig_profiles." + m.profile;
    m.gi_slices = static_cast<uint32_t>(UInt(p["slices"], pw + ".slices", 8));
    m.ci_slices = p["compute_slices"]
                      ? static_cast<uint32_t>(UInt(p["compute_slices"], pw + ".compute_slices", 8))
                      : m.gi_slices;
    m.memory_mib = UInt(p["memory_mib"], pw + ".memory_mib");
    m.sm_count = static_cast<uint32_t>(UInt(p["sm_count"], pw + ".sm_count", 1000));
    m.uuid = Uuid(n["uuid"], w + ".uuid", "MIG-");
    m.gi = static_cast<uint32_t>(UInt(n["gi"], w + ".gi", 14));
    m.ci = n["ci"] ? static_cast<uint32_t>(UInt(n["ci"], w + ".ci", 7)) : 0;
    return m;
  }

  Machine Parse(const std::string& text) {
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::ParserException& e) {
      throw ParseError{absl::StrCat(source_, ":", e.mark.line + 1, ": YAML syntax error: ", e.msg)};
    }
    if (!root.IsMap()) {
      throw ParseError{
          absl::StrCat(source_, ":1: expected a mapping with 'gpus' (a machine file)")};
    }
    CheckKeys(root, "",
              {"name", "driver_version", "cuda_driver_version", "nvml_version", "defaults",
               "mig_profiles", "nvlink", "nvswitch", "gpus", "uvm_major", "caps_major"});
    Machine m;
    if (root["name"]) m.name = Str(root["name"], "name");
    if (root["driver_version"]) m.driver_version = Str(root["driver_version"], "driver_version");
    if (root["nvml_version"]) m.nvml_version = Str(root["nvml_version"], "nvml_version");
    if (root["cuda_driver_version"]) {
      m.cuda_driver_version = Int(root["cuda_driver_version"], "cuda_driver_version", 1000, 99990);
    }
    if (root["uvm_major"]) m.uvm_major = Int(root["uvm_major"], "uvm_major", 1, 4095);
    if (root["caps_major"]) m.caps_major = Int(root["caps_major"], "caps_major", 1, 4095);

    std::map<std::string, YAML::Node> mig_profiles;
    if (YAML::Node mp = root["mig_profiles"]) {
      if (!mp.IsMap()) Fail(mp, "mig_profiles: expected a mapping");
      for (const auto& kv : mp) {
        std::string w = "mig_profiles." + kv.first.Scalar();
        CheckKeys(kv.second, w, {"slices", "compute_slices", "memory_mib", "sm_count"});
        for (const char* req : {"slices", "memory_mib", "sm_count"}) {
          if (!kv.second[req]) Fail(kv.second, absl::StrCat(w, ": missing field '", req, "'"));
        }
        mig_profiles[kv.first.Scalar()] = kv.second;
      }
    }

    GpuSpec defaults;
    if (root["defaults"]) Gpu(root["defaults"], "defaults", defaults, mig_profiles);
    YAML::Node gpus = root["gpus"];
    if (!gpus) Fail(root, "missing field 'gpus'");
    if (!gpus.IsSequence() || gpus.size() == 0) Fail(gpus, "gpus: expected a non-empty list");
    if (gpus.size() > 64) Fail(gpus, "gpus: at most 64 GPUs");
    std::set<std::string> uuids, buses;
    std::set<int> minors;
    for (size_t i = 0; i < gpus.size(); ++i) {
      std::string w = absl::StrCat("gpus[", i, "]");
      GpuSpec g = defaults;
      Gpu(gpus[i], w, g, mig_profiles);
      for (auto [field, empty] : {std::pair{"name", g.name.empty()},
                                  {"uuid", g.uuid.empty()},
                                  {"pci_bus_id", g.pci_bus_id.empty()},
                                  {"memory_mib", g.memory_mib == 0}}) {
        if (empty) Fail(gpus[i], absl::StrCat(w, ": missing field '", field, "'"));
      }
      if (g.minor < 0) g.minor = static_cast<int>(i);
      if (!uuids.insert(g.uuid).second)
        Fail(gpus[i]["uuid"], absl::StrCat(w, ".uuid: duplicate UUID ", g.uuid));
      if (!buses.insert(g.pci_bus_id).second)
        Fail(gpus[i]["pci_bus_id"],
             absl::StrCat(w, ".pci_bus_id: duplicate bus id ", g.pci_bus_id));
      if (!minors.insert(g.minor).second)
        Fail(gpus[i], absl::StrCat(w, ".minor: duplicate minor ", g.minor));
      if (g.mig_enabled && !g.mig_capable)
        Fail(gpus[i], absl::StrCat(w, ": MIG enabled on a GPU that is not mig_capable"));
      uint32_t slices = 0;
      std::set<std::pair<uint32_t, uint32_t>> ids;
      for (const MigSpec& d : g.mig) {
        if (!uuids.insert(d.uuid).second)
          Fail(gpus[i], absl::StrCat(w, ".mig: duplicate UUID ", d.uuid));
        if (!ids.insert({d.gi, d.ci}).second)
          Fail(gpus[i], absl::StrCat(w, ".mig: duplicate GPU/compute instance ", d.gi, "/", d.ci));
        if (d.ci == 0) slices += d.gi_slices;
      }
      if (slices > 7)
        Fail(gpus[i]["mig"],
             absl::StrCat(w, ".mig: ", slices, " GPU slices exceed the 7 a GPU has"));
      m.gpus.push_back(std::move(g));
    }

    const size_t n = m.gpus.size();
    if (YAML::Node nv = root["nvlink"]) {
      if (!nv.IsSequence() || nv.size() != n)
        Fail(nv, absl::StrCat("nvlink: expected ", n, " rows (one per GPU)"));
      m.nvlink.assign(n, std::vector<int>(n, 0));
      for (size_t i = 0; i < n; ++i) {
        if (!nv[i].IsSequence() || nv[i].size() != n)
          Fail(nv[i], absl::StrCat("nvlink[", i, "]: expected ", n, " columns"));
        int total = 0;
        for (size_t j = 0; j < n; ++j) {
          m.nvlink[i][j] =
              Int(nv[i][j], absl::StrCat("nvlink[", i, "][", j, "]"), 0, NVML_NVLINK_MAX_LINKS);
          if (i == j && m.nvlink[i][j] != 0)
            Fail(nv[i][j], absl::StrCat("nvlink[", i, "][", i, "]: a GPU has no NVLink to itself"));
          total += m.nvlink[i][j];
        }
        if (total > static_cast<int>(NVML_NVLINK_MAX_LINKS))
          Fail(nv[i], absl::StrCat("nvlink[", i, "]: ", total, " links exceed NVML's ",
                                   int{NVML_NVLINK_MAX_LINKS}));
      }
      for (size_t i = 0; i < n; ++i)
        for (size_t j = 0; j < i; ++j)
          if (m.nvlink[i][j] != m.nvlink[j][i])
            Fail(nv[i][j], absl::StrCat("nvlink[", i, "][", j, "]: matrix is not symmetric (",
                                        m.nvlink[i][j], " vs ", m.nvlink[j][i], ")"));
    }
    if (YAML::Node sw = root["nvswitch"]) {
      if (root["nvlink"])
        Fail(sw, "nvswitch: give either 'nvlink' (direct links) or 'nvswitch', not both");
      CheckKeys(sw, "nvswitch", {"links_per_gpu", "switches"});
      if (!sw["links_per_gpu"] || !sw["switches"])
        Fail(sw, "nvswitch: needs links_per_gpu and switches");
      m.nvswitch_links =
          Int(sw["links_per_gpu"], "nvswitch.links_per_gpu", 1, NVML_NVLINK_MAX_LINKS);
      if (!sw["switches"].IsSequence() || sw["switches"].size() == 0)
        Fail(sw["switches"], "nvswitch.switches: expected a list of PCI bus ids");
      for (size_t i = 0; i < sw["switches"].size(); ++i)
        m.nvswitches.push_back(
            BusId(sw["switches"][i], absl::StrCat("nvswitch.switches[", i, "]")));
    }
    return m;
  }

 private:
  std::string source_;
};

}  // namespace

const std::vector<std::string>& TelemetryKeys() {
  static const auto* k = new std::vector<std::string>{
      "gpu_temp_c", "memory_temp_c", "sm_clock_mhz", "memory_clock_mhz", "graphics_clock_mhz",
      "video_clock_mhz", "power_usage_mw", "total_energy_mj", "gpu_util_pct", "memory_util_pct",
      "encoder_util_pct", "decoder_util_pct", "fb_used_mib", "fb_reserved_mib", "ecc_sbe_volatile",
      "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate", "throttle_reasons",
      "pcie_replay_count", "pcie_tx_kbps", "pcie_rx_kbps", "fan_speed_pct", "pstate",
      "nvlink_tx_kib", "nvlink_rx_kib",
      // The nvidia-smi set (absent: NVML answers NOT_SUPPORTED).
      "jpeg_util_pct", "ofa_util_pct", "clocks_event_power_cap_ns", "clocks_event_sync_boost_ns",
      "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
      "remapped_rows_failure",
      // GPM (percent; on GPUs with GPM support): absent graphics / DRAM utilisation follow
      // gpu_util_pct / memory_util_pct, the other metrics are 0.
      "gpm_graphics_util_pct", "gpm_sm_util_pct", "gpm_sm_occupancy_pct", "gpm_tensor_util_pct",
      "gpm_dram_bw_util_pct", "gpm_fp64_util_pct", "gpm_fp32_util_pct", "gpm_fp16_util_pct"};
  return *k;
}

std::vector<std::string> BuiltinProfiles() {
  std::vector<std::string> out;
  for (const auto& [name, text] : EmbeddedProfiles()) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<Machine> ParseMachine(const std::string& yaml, const std::string& source) {
  try {
    Machine m = Parser(source).Parse(yaml);
    m.source = source;
    return m;
  } catch (const ParseError& e) {
    return absl::InvalidArgumentError(e.msg);
  } catch (const YAML::Exception& e) {  // conversions of odd nodes; keep the position
    return absl::InvalidArgumentError(absl::StrCat(source, ":", e.mark.line + 1, ": ", e.msg));
  }
}

absl::StatusOr<Machine> LoadMachine(const std::string& profile) {
  bool is_path = profile.find('/') != std::string::npos || profile.ends_with(".yaml") ||
                 profile.ends_with(".yml");
  if (!is_path) {
    for (const auto& [name, text] : EmbeddedProfiles()) {
      if (name == profile) {
        auto m = ParseMachine(text, profile + ".yaml (built-in)");
        if (m.ok() && m->name.empty()) m->name = profile;
        return m;
      }
    }
    return absl::NotFoundError(absl::StrCat("unknown profile '", profile,
                                            "' (built-in: ", absl::StrJoin(BuiltinProfiles(), ", "),
                                            "; or the path of a machine file)"));
  }
  std::ifstream in(profile);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read machine file ", profile, ": ", std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  auto m = ParseMachine(ss.str(), profile);
  if (m.ok() && m->name.empty()) m->name = profile;
  return m;
}

}  // namespace gpulet::sim
