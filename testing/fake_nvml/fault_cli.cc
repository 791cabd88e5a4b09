#include "fake_nvml/fault_cli.h"

#include <iostream>
#include <map>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "fake_nvml/control.h"
#include "fake_nvml/machine.h"

namespace gpulet::sim {
namespace {

struct Args {
  std::string sim_root;
  Fault fault;
  int64_t gi = -1, ci = -1;
  std::string ecc_type = "sbe";
  // `set` conveniences; every telemetry key is also reachable through --value KEY=N.
  std::map<std::string, uint64_t> named;
  std::vector<std::string> values;
};

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
      sub->add_option("--gpu", a->fault.gpu, "GPU index")
          ->required()
          ->check(CLI::NonNegativeNumber);
    sub->callback([a, kind] { a->fault.kind = kind; });
    return sub;
  };
  CLI::App* xid = add("xid", "Raise an XID event on a GPU (or one of its MIG devices)",
                      Fault::Kind::kXid, true);
  xid->add_option("--code", a->fault.code, "XID number, e.g. 79 (fallen off the bus)")->required();
  xid->add_option("--gi", a->gi, "GPU instance id of the MIG device")
      ->check(CLI::NonNegativeNumber);
  xid->add_option("--ci", a->ci, "Compute instance id of the MIG device")
      ->check(CLI::NonNegativeNumber);
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
  set->add_option("--temp", a->named["gpu_temp_c"], "GPU temperature, C");
  set->add_option("--util", a->named["gpu_util_pct"], "GPU utilisation, %");
  set->add_option("--mem-util", a->named["memory_util_pct"], "Memory utilisation, %");
  set->add_option("--mem-used-mib", a->named["fb_used_mib"], "Framebuffer used, MiB");
  set->add_option("--power-mw", a->named["power_usage_mw"], "Power draw, mW");
  set->add_option("--value", a->values,
                  "KEY=N for any telemetry key: " + absl::StrJoin(TelemetryKeys(), ", "))
      ->type_name("KEY=N");

  return [a, set] {
    Fault f = a->fault;
    f.gi = a->gi;
    f.ci = a->ci;
    f.double_bit = a->ecc_type == "dbe";
    if (f.kind == Fault::Kind::kSet) {
      for (const auto& [key, value] : a->named) {
        if (set->count(key == "gpu_temp_c"        ? "--temp"
                       : key == "gpu_util_pct"    ? "--util"
                       : key == "memory_util_pct" ? "--mem-util"
                       : key == "fb_used_mib"     ? "--mem-used-mib"
                                                  : "--power-mw") > 0) {
          f.values.emplace_back(key, value);
        }
      }
      for (const std::string& kv : a->values) {
        size_t eq = kv.find('=');
        uint64_t v = 0;
        const auto& keys = TelemetryKeys();
        if (eq == std::string::npos || !absl::SimpleAtoi(kv.substr(eq + 1), &v) ||
            std::find(keys.begin(), keys.end(), kv.substr(0, eq)) == keys.end()) {
          std::cerr << "gpulet sim fault set: bad --value '" << kv
                    << "' (want KEY=N with KEY one of " << absl::StrJoin(keys, ", ") << ")\n";
          return 1;
        }
        f.values.emplace_back(kv.substr(0, eq), v);
      }
      if (f.values.empty()) {
        std::cerr
            << "gpulet sim fault set: nothing to set (give --temp, --util, ... or --value KEY=N)\n";
        return 1;
      }
    }
    absl::Status st = InjectFault(a->sim_root, f);
    if (!st.ok()) {
      std::cerr << "gpulet sim fault: " << st.message() << "\n";
      return 1;
    }
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
