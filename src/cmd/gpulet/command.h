// Each `gpulet <command>` lives in its own file in this folder and registers itself here, so adding
// a command touches no shared file. A command's file only declares flags and wires parts together.
#pragma once

#include <functional>
#include <string>

#include "CLI/CLI.hpp"

namespace gpulet::cmd {

// Declares the subcommand's flags on `sub` and returns the function that runs it (exit code).
using CommandSetup = std::function<std::function<int()>(CLI::App& sub)>;

struct CommandRegistration {
  CommandRegistration(const char* name, const char* description, CommandSetup setup);
};

// In a command's .cc file: GPULET_COMMAND(info, "List GPUs and topology", SetupInfo);
#define GPULET_COMMAND(name, description, setup) \
  static ::gpulet::cmd::CommandRegistration gpulet_command_##name(#name, description, setup)

}  // namespace gpulet::cmd
