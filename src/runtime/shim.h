// gpulet-container-runtime: a runc-compatible OCI runtime shim. On `create` and `run` it edits the
// bundle's config.json for the GPUs the container is given (CDI edits, or the legacy prestart
// hook), rewrites it atomically, then execs the real runtime with the very same arguments; every
// other command passes straight through. Any error stops the start before the real runtime runs
// (fail closed) and leaves config.json as it was. Single-threaded; process-level.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/request.h"

namespace gpulet::runtime {

// The parts of a runc command line the shim needs.
struct RuncArgs {
  std::string command;   // "create", "run", "start", ...; empty when none
  std::string bundle;    // --bundle/-b value, else "."
  std::string log_file;  // --log value (the engine reads errors from there)
  std::string log_format = "text";
};
RuncArgs ParseRuncArgs(const std::vector<std::string>& args);

// Edits the bundle's config.json for `create`/`run`. Returns what it did, for logs ("no GPU
// request", "cdi: 3 devices", ...). Errors leave the file untouched.
absl::StatusOr<std::string> ModifyBundle(const std::string& bundle, const RuntimeConfig& config);

// Finds the real runtime: the first of config.runtimes that is an executable (absolute, or on
// PATH), skipping this very binary.
absl::StatusOr<std::string> FindRuntime(const RuntimeConfig& config, const std::string& self);

// main() of gpulet-container-runtime.
int ShimMain(int argc, char** argv);

}  // namespace gpulet::runtime
