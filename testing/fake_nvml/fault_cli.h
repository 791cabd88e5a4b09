// The command line of live fault injection: `gpulet sim fault <kind> --sim-root DIR ...` (wired
// into `gpulet sim` by src/cmd/gpulet; see docs/simulation.md). Kinds: xid, ecc, lost, reset,
// nvml-fail, nvml-ok, set. Each appends one line to the node's control log (fake_nvml/control.h).
#pragma once

#include <functional>

#include "CLI/CLI.hpp"

namespace gpulet::sim {

// Declares the fault kinds as subcommands of `fault` (require one) and returns the function that
// runs the chosen one: 0 on success, 1 with one line on stderr otherwise.
std::function<int()> SetupFaultCommand(CLI::App& fault);

// Standalone form for tools and tests: argv[0] is the program name, argv[1..] the fault kind and
// its flags, e.g. {"fault", "xid", "--gpu", "3", "--code", "79", "--sim-root", "/tmp/node"}.
int RunFaultCommand(int argc, char** argv);

}  // namespace gpulet::sim
