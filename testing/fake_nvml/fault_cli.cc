#include "fake_nvml/fault_cli.h"

#include <iostream>
#include <limits>
#include <map>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fake_nvml/control.h"
#include "fake_nvml/machine.h"

namespace gpulet::sim {
namespace {

struct Args {
  std::string sim_root;
  Fault fault;
  std::string code;  // kept as typed: parsed against the XID's real range below
  int64_t gi = -1, ci = -1;
  std::string ecc_type = "sbe";
  // `set` conveniences by flag; every telemetry key is also reachable through --value KEY=N.
  std::map<std::string, std::string> named;  // flag -> value as typed
  std::vector<std::string> values;
};

// The largest value NVML can report for a telemetry key (what its C type and meaning allow):
// percentages 100, P-states 15, temperatures 200 C (NVML's are unsigned), 64-bit counters
// (energy, NVLink, PCIe throughput), every other 32-bit. Values past it would reach the exporter
// as nonsense (a wrapped -40 C was served as 4294967256).
uint64_t TelemetryMax(const std::string& key) {
  if (absl::EndsWith(key, "_pct")) return 100;
  if (key == "pstate") return 15;
  if (absl::EndsWith(key, "_temp_c")) return 200;
  if (key == "total_energy_mj" || absl::StartsWith(key, "nvlink_") || absl::EndsWith(key, "_ns")) {
    return std::numeric_limits<uint64_t>::max();
  }
  return std::numeric_limits<uint32_t>::max();
}

// `text` as a whole number 0..max; else the message says what was typed and the real range.
absl::StatusOr<uint64_t> Bounded(const std::string& what, const std::string& text, uint64_t max) {
  uint64_t v = 0;
  bool negative = !text.empty() && text[0] == '-';
  if (negative || !absl::SimpleAtoi(text, &v) || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", text, "' is out of range: want a whole number 0..", max,
                     negative ? " (NVML reports it unsigned)" : ""));
  }
  return v;
}

// `set`'s convenience flags, each one telemetry key (ordered by flag, as they are applied).
struct NamedValue {
  const char *flag, *key, *help, *type;
};
constexpr NamedValue kNamedValues[] = {
    {"--mem-used-mib", "fb_used_mib", "Framebuffer used, MiB", "MIB"},
    {"--mem-util", "memory_util_pct", "Memory utilisation, %", "PCT"},
    {"--power-mw", "power_usage_mw", "Power draw, mW", "MW"},
    {"--temp", "gpu_temp_c", "GPU temperature, C", "C"},
    {"--util", "gpu_util_pct", "GPU utilisation, %", "PCT"},
};

// CLI11's NonNegativeNumber prints its range as 0 to 1.8e308 written out in full.
const CLI::Validator kIndex(
    [](std::string& s) -> std::string {
      uint32_t v = 0;
      return absl::SimpleAtoi(s, &v) && !s.empty() && s[0] != '-' && v <= 1023
                 ? ""
                 : absl::StrCat("'", s, "' is not an index 0..1023");
    },
    "INDEX", "index");

}  // namespace

std::function<int()> SetupFaultCommand(CLI::App& fault) {
  auto a = std::make_shared<Args>();
  fault.require_subcommand(1);
  auto add = [&](const char* name, const char* help, Fault::Kind kind, bool gpu) {
    CLI::App* sub = fault.add_subcommand(name, help);
    sub->add_option("--sim-root", a->sim_root, "State directory of the running simulated node")
        ->required()
        ->type_name("DIR");
    if (gpu)
      sub->add_option("--gpu", a->fault.gpu, "GPU index (nvidia-smi's)")->required()->check(kIndex);
    sub->callback([a, kind] { a->fault.kind = kind; });
    sub->footer(absl::StrCat("Example:\n  gpulet sim fault ", name, " --sim-root /tmp/gpulet-sim-0",
                             gpu ? " --gpu 0" : "",
                             kind == Fault::Kind::kXid   ? " --code 79"
                             : kind == Fault::Kind::kSet ? " --temp 90"
                                                         : ""));
    return sub;
  };
  CLI::App* xid = add("xid", "Raise an XID event on a GPU (or one of its MIG devices)",
                      Fault::Kind::kXid, true);
  xid->add_option("--code", a->code, "XID number 0..4294967295, e.g. 79 (fallen off the bus)")
      ->required()
      ->type_name("XID");
  xid->add_option("--gi", a->gi, "GPU instance id of the MIG device")->check(kIndex);
  xid->add_option("--ci", a->ci, "Compute instance id of the MIG device")->check(kIndex);
  CLI::App* ecc = add("ecc", "Raise an ECC error event and count it", Fault::Kind::kEcc, true);
  ecc->add_option("--type", a->ecc_type, "sbe (single-bit, corrected) or dbe (double-bit)")
      ->check(CLI::IsMember({"sbe", "dbe"}));
  add("lost", "Make the GPU fall off the bus: NVML calls on it return GPU_IS_LOST",
      Fault::Kind::kLost, true);
  add("reset", "Reset the GPU: clears lost and the volatile ECC counters", Fault::Kind::kReset,
      true);
  add("nvml-fail", "Make NVML fail (init: DRIVER_NOT_LOADED, calls: UNINITIALIZED) until nvml-ok",
      Fault::Kind::kNvmlFail, false);
  add("nvml-ok", "End an nvml-fail", Fault::Kind::kNvmlOk, false);
  CLI::App* set = add("set", "Change telemetry of a GPU", Fault::Kind::kSet, true);
  for (const NamedValue& n : kNamedValues) {
    set->add_option(n.flag, a->named[n.flag],
                    absl::StrCat(n.help, " (0..", TelemetryMax(n.key), ")"))
        ->type_name(n.type);
  }
  set->add_option("--value", a->values,
                  "KEY=N for any telemetry key: " + absl::StrJoin(TelemetryKeys(), ", "))
      ->type_name("KEY=N");

  return [a, set, &fault] {
    // One voice: "gpulet sim fault KIND: what" and exit 2 for what was typed wrong, 1 when the
    // node refuses or is not there.
    const std::string who = absl::StrCat(
        "gpulet sim fault ",
        fault.get_subcommands().empty() ? std::string() : fault.get_subcommands()[0]->get_name());
    auto usage = [&](const absl::Status& st) {
      std::cerr << who << ": " << st.message() << "\n";
      return 2;
    };
    Fault f = a->fault;
    f.gi = a->gi;
    f.ci = a->ci;
    f.double_bit = a->ecc_type == "dbe";
    if (f.kind == Fault::Kind::kXid) {
      absl::StatusOr<uint64_t> code = Bounded("--code", a->code, 0xffffffffu);
      if (!code.ok()) return usage(code.status());
      f.code = *code;
    }
    if (f.kind == Fault::Kind::kSet) {
      for (const NamedValue& n : kNamedValues) {
        if (set->count(n.flag) == 0) continue;
        absl::StatusOr<uint64_t> v = Bounded(n.flag, a->named[n.flag], TelemetryMax(n.key));
        if (!v.ok()) return usage(v.status());
        f.values.emplace_back(n.key, *v);
      }
      const auto& keys = TelemetryKeys();
      for (const std::string& kv : a->values) {
        size_t eq = kv.find('=');
        std::string key = kv.substr(0, eq);
        if (eq == std::string::npos || std::find(keys.begin(), keys.end(), key) == keys.end()) {
          return usage(absl::InvalidArgumentError(absl::StrCat("bad --value '", kv,
                                                               "' (want KEY=N with KEY one of ",
                                                               absl::StrJoin(keys, ", "), ")")));
        }
        absl::StatusOr<uint64_t> v =
            Bounded(absl::StrCat("--value ", key), kv.substr(eq + 1), TelemetryMax(key));
        if (!v.ok()) return usage(v.status());
        f.values.emplace_back(key, *v);
      }
      if (f.values.empty()) {
        return usage(absl::InvalidArgumentError(
            "nothing to set (give --temp, --util, ... or --value KEY=N)"));
      }
    }
    absl::Status st = InjectFault(a->sim_root, f);
    if (!st.ok()) {
      std::cerr << who << ": " << st.message() << "\n";
      return 1;
    }
    // Say what was done: a fault that prints nothing looks like one that did nothing.
    std::cout << who << ": " << FormatFault(f) << " -> the node at " << a->sim_root << "\n";
    return 0;
  };
}

int RunFaultCommand(int argc, char** argv) {
  CLI::App app{"Inject a fault into a running simulated GPU node", "fault"};
  std::function<int()> run = SetupFaultCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return run();
}

}  // namespace gpulet::sim
