// The agent's CDI spec refresh (`gpulet agent --cdi-spec ...`): flags and start-up, defined in
// cdi.cc beside `gpulet cdi generate`, which writes the same spec once.
#pragma once

#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "gpu/open.h"
#include "runtime/cdi_refresh.h"

namespace gpulet::cmd {

struct CdiRefreshFlags {
  std::string spec;  // empty: no refresh
  std::string driver_root = "/", hook_path = "/usr/bin/gpulet-container-hook";
  std::string strategy = "both", interval = "10s";
  // Where the host's root is mounted (the agent's --host-root): driver_root is read under it.
  std::string host_root = "/";
};

void AddCdiRefreshFlags(CLI::App& app, CdiRefreshFlags& f);

// Null when --cdi-spec is empty. Bad flags are errors; a failing first write is only logged (the
// device plugin must not stop for it) and retried every interval.
absl::StatusOr<std::unique_ptr<runtime::CdiRefresher>> StartCdiRefresher(const CdiRefreshFlags& f,
                                                                         gpu::Machine& machine);

}  // namespace gpulet::cmd
