// The GPU-selection flags shared by every `gpulet` command that touches GPUs, so they are spelled,
// documented and defaulted the same everywhere (DESIGN.md: `--simulate PROFILE` on every such command).
//
//   auto opts = std::make_shared<gpu::GpuOptions>();
//   AddGpuFlags(sub, *opts);                 // declare; `opts` must outlive parsing and the run
//   return [opts] { auto layer = gpu::OpenGpuLayer(*opts); ... };
#pragma once

#include "CLI/CLI.hpp"
#include "gpu/open.h"

namespace gpulet::cmd {

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
}

}  // namespace gpulet::cmd
