// One duration syntax for every flag and configuration key: Go's (as Kubernetes and NVIDIA's
// tools write them), "10s", "500ms", "720h", "1h30m", "1.5s". A bare number has no unit and is
// refused, except where a flag took bare numbers before this syntax: there it keeps its old unit
// and the caller is told to warn that it is deprecated.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gpulet {

struct DurationRules {
  bool allow_zero = false;                    // "0s" (and "0") accepted
  std::optional<absl::Duration> bare_unit;    // unit of a bare number; unset: bare numbers refused
  absl::Duration min = absl::ZeroDuration();  // inclusive bounds (min only above zero)
  absl::Duration max = absl::InfiniteDuration();
};

struct ParsedDuration {
  absl::Duration value;
  // Set when a bare number was read in `bare_unit`: the deprecation note to log, e.g.
  // "a bare number is read as milliseconds (deprecated): write 5s".
  std::string deprecation;
};

// `what` names the input in errors ("--tls-renew-check", "gpulet.health.holdDown").
absl::StatusOr<ParsedDuration> ParseDuration(absl::string_view what, absl::string_view text,
                                             const DurationRules& rules = {});

}  // namespace gpulet
