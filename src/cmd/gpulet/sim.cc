// `gpulet sim ...`: runs the simulated node by exec'ing gpulet-sim (built beside this binary) with
// the same arguments, so the production binary links no fake code (kubelet emulator, fake NVML).
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "cmd/gpulet/command.h"

namespace gpulet::cmd {
namespace {

std::function<int()> SetupSim(CLI::App& sub) {
  // Everything after `sim`, --help included, belongs to gpulet-sim.
  sub.prefix_command();
  sub.allow_extras();
  sub.set_help_flag();
  sub.footer(
      "Run `gpulet sim --help` for the simulation runner's flags (docs/kubelet-emulator.md).");
  return [&sub] {
    std::error_code ec;
    auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    std::string runner = (ec ? std::filesystem::path(".") : self.parent_path()) / "gpulet-sim";
    std::vector<std::string> args = {runner};
    for (const auto& a : sub.remaining()) args.push_back(a);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(runner.c_str(), argv.data());
    std::cerr << "gpulet sim: cannot run the simulation runner " << runner << ": "
              << std::strerror(errno)
              << (errno == ENOENT ? " (build it: cmake --build build --target gpulet-sim)" : "")
              << "\n";
    return 127;
  };
}

}  // namespace

GPULET_COMMAND(sim, "Simulated GPU node: kubelet emulator + agent on fake GPUs + pods (gpulet-sim)",
               SetupSim);

}  // namespace gpulet::cmd
