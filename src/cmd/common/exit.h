// One way for a gpulet command to give up: "<who>: <why>" on stderr, then the exit status (1: the
// run failed; kUsageError (2): the command line or the configuration is wrong). Header-only, for
// the mains only.
#pragma once

#include <iostream>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "cmd/common/cli.h"

namespace gpulet::cmd {

inline constexpr int kFailure = 1;

// A status's message alone, as every message to a user is written (never the code's name, such
// as NOT_FOUND, that Status::ToString puts first).
inline std::string Message(const absl::Status& s) { return std::string(s.message()); }

// Prints "<who>: <why>" and returns `code`, for `return Fail(...)` in a command.
inline int Fail(std::string_view who, std::string_view why, int code = kFailure) {
  std::cerr << who << ": " << why << "\n";
  return code;
}
// The exit status a failed step gives when the caller does not say: InvalidArgument is what was
// typed or configured wrong (a usage error, 2); anything else is a run that failed (1).
inline int ExitCodeOf(const absl::Status& s) {
  return absl::IsInvalidArgument(s) ? kUsageError : kFailure;
}

inline int Fail(std::string_view who, const absl::Status& s, int code) {
  // absl::string_view is not std::string_view in Debian's absl build.
  return Fail(who, std::string_view(s.message().data(), s.message().size()), code);
}
inline int Fail(std::string_view who, const absl::Status& s) { return Fail(who, s, ExitCodeOf(s)); }

}  // namespace gpulet::cmd
