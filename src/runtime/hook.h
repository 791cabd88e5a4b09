// gpulet-container-hook: OCI hooks run by the runtime with the container state on stdin.
//   prestart        legacy mode: gives the container its GPUs from inside the runtime's lifecycle
//                   (device nodes, read-only library mounts, ld cache) after checking
//                   NVIDIA_REQUIRE_*
//   update-ldcache  CDI mode (createRuntime hook of the generated spec): refreshes the container's
//                   ld cache for the mounted driver libraries
//   poststart, poststop: nothing
// The hook never runs anything from the container: it drops its inherited environment first thing,
// runs the host's ldconfig (opened and checked to be a static ELF before entering the container:
// runtime/ldconfig.h) chrooted into the rootfs with a fixed environment and only the capabilities
// it needs, and creates files and read-only mounts in the rootfs only through rootfs.h. It reads
// --config F, else /etc/gpulet/container-runtime.json (never $GPULET_RUNTIME_CONFIG: the
// environment is cleared). It is linked statically
// so that LD_PRELOAD / LD_LIBRARY_PATH in its environment cannot load code into it
// (CVE-2025-23266 class). Single-threaded; process-level.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/edits.h"

namespace gpulet::runtime {

// The OCI state the runtime writes on the hook's stdin.
struct ContainerState {
  int pid = 0;
  std::string bundle;
};
// Parses and validates the state JSON (pid > 0, bundle or legacy bundlePath).
absl::StatusOr<ContainerState> ParseContainerState(const std::string& text);

// The environment every child of the hook gets.
const std::vector<std::string>& CleanEnvironment();

// main() of gpulet-container-hook.
int HookMain(int argc, char** argv);

}  // namespace gpulet::runtime
