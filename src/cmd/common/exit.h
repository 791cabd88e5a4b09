// One way for a gpulet command to give up: "<who>: <why>" on stderr, then the exit status (1: the
// run failed; kUsageError (2): the command line or the configuration is wrong). Header-only, for
// the mains only.
#pragma once

#include <iostream>
#include <string_view>

#include "absl/status/status.h"
#include "cmd/common/cli.h"

namespace gpulet::cmd {

inline constexpr int kFailure = 1;

// Prints "<who>: <why>" and returns `code`, for `return Fail(...)` in a command.
inline int Fail(std::string_view who, std::string_view why, int code = kFailure) {
  std::cerr << who << ": " << why << "\n";
  return code;
}
inline int Fail(std::string_view who, const absl::Status& s, int code = kFailure) {
  // absl::string_view is not std::string_view in Debian's absl build.
  return Fail(who, std::string_view(s.message().data(), s.message().size()), code);
}

}  // namespace gpulet::cmd
