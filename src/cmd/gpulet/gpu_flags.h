// The GPU-selection flags shared by every `gpulet` command that touches GPUs, so they are spelled,
// documented and defaulted the same everywhere (DESIGN.md: `--simulate PROFILE` on every such
// command).
//
//   auto opts = std::make_shared<gpu::GpuOptions>();
//   AddGpuFlags(sub, *opts);                 // declare; `opts` must outlive parsing and the run
//   return [opts] { auto layer = gpu::OpenGpuLayer(*opts); ... };
#pragma once

#include <fstream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gpu/open.h"
#include "runtime/driver.h"
#include "spdlog/spdlog.h"

namespace gpulet::cmd {

// The machine a --simulate argument stands for: a built-in profile's own name, or the top-level
// `name:` of a machine file; empty when it cannot be told.
inline std::string SimulatedMachineName(const std::string& simulate) {
  if (simulate.find('/') == std::string::npos && !absl::EndsWith(simulate, ".yaml"))
    return simulate;
  std::ifstream f(simulate);
  std::string line;
  while (std::getline(f, line)) {
    absl::string_view v(line);
    if (!absl::ConsumePrefix(&v, "name:")) continue;
    v = absl::StripAsciiWhitespace(v.substr(0, v.find('#')));
    return std::string(absl::StripSuffix(absl::StripPrefix(v, "\""), "\""));
  }
  return "";
}

// A sim root belongs to one simulated machine (its fake /sys, /proc, /dev and fault log): opening
// it as another machine would silently rewrite a running node's state, after which fault commands
// refuse that node's GPU numbers. Refused, naming both machines.
inline absl::Status CheckSimRoot(const gpu::GpuOptions& o) {
  if (o.simulate.empty() || o.sim_root.empty()) return absl::OkStatus();
  std::ifstream node(o.sim_root + "/control/node");
  std::string line, have;
  while (std::getline(node, line))
    if (absl::StartsWith(line, "machine ")) have = line.substr(8);
  std::string want = SimulatedMachineName(o.simulate);
  if (have.empty() || want.empty() || have == want) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "--sim-root ", o.sim_root, " holds the simulated node of machine ", have, " (", o.sim_root,
      "/control/node); --simulate ", o.simulate, " would rewrite its state. Use --simulate ", have,
      " to look at that node, or another --sim-root for a new one"));
}

inline void AddGpuFlags(CLI::App& sub, gpu::GpuOptions& opts) {
  sub.add_option("--simulate", opts.simulate,
                 "Simulate a GPU node instead of using the real NVML: a built-in profile "
                 "(dgx-h100, dgx1-v100, a100-mig, pcie-t4, dgx2-v100) or a machine-file path "
                 "(docs/simulation.md)")
      ->type_name("PROFILE");
  sub.add_option("--sim-root", opts.sim_root,
                 "State directory of the simulated node (fake /sys, /proc, /dev and the fault "
                 "log), shared by every process of one node; default: a private temporary "
                 "directory")
      ->type_name("DIR");
  sub.add_option("--nvml-library", opts.nvml_library,
                 "NVML library to dlopen (name or path) when not simulating")
      ->capture_default_str()
      ->type_name("LIB");
  sub.parse_complete_callback([&opts] {
    if (absl::Status s = CheckSimRoot(opts); !s.ok())
      throw CLI::ValidationError(std::string(s.message()));
  });
}

// Whether this process reads the host's driver under `host_root` (a container with the host
// mounted, not simulating): where NVML and the driver's programs are looked for.
inline bool ReadsHostDriver(const gpu::GpuOptions& o, const std::string& host_root) {
  return o.simulate.empty() && !host_root.empty() && host_root != "/";
}

// Commands that read the host under --host-root run in the node DaemonSet's containers, started
// by the engine's default runtime (runc), which injects no driver, from an image that has none.
// Unless --nvml-library names a library, they load the host's NVML (runtime::FindNvmlLibrary:
// the host's driver, else a driver container's root). Found nowhere: the name stays, and loading
// it fails naming the library.
inline void UseHostNvml(gpu::GpuOptions& o, const std::string& host_root) {
  if (!ReadsHostDriver(o, host_root) || o.nvml_library != gpu::GpuOptions().nvml_library) return;
  absl::StatusOr<std::string> lib = runtime::FindNvmlLibrary(host_root);
  if (lib.ok()) {
    spdlog::info("NVML: the host's {}", *lib);
    o.nvml_library = *lib;
  } else {
    spdlog::warn("{}; trying {} on this container's loader path",
                 std::string(lib.status().message()), o.nvml_library);
  }
}

// `gpulet install` and `validate` under --host-root: the GPU layer reads the host's /sys and /proc
// there too, and loads the host's NVML (UseHostNvml).
inline void ReadHostUnder(gpu::GpuOptions& o, const std::string& host_root) {
  if (ReadsHostDriver(o, host_root)) o.host_root = host_root;
  UseHostNvml(o, host_root);
}

}  // namespace gpulet::cmd
