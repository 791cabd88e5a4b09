#include "common/duration.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gpulet {
namespace {

std::string UnitName(absl::Duration unit) {
  if (unit == absl::Milliseconds(1)) return "milliseconds";
  if (unit == absl::Seconds(1)) return "seconds";
  if (unit == absl::Hours(1)) return "hours";
  return absl::FormatDuration(unit) + " units";
}

}  // namespace

absl::StatusOr<ParsedDuration> ParseDuration(absl::string_view what, absl::string_view text,
                                             const DurationRules& rules) {
  const absl::string_view t = absl::StripAsciiWhitespace(text);
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(what, " \"", text, "\": ", why));
  };
  ParsedDuration out;
  double bare = 0;
  if (!t.empty() && absl::SimpleAtod(t, &bare) && t.find_first_not_of("0123456789.") == t.npos) {
    if (bare == 0 && rules.allow_zero) {
      out.value = absl::ZeroDuration();
    } else if (!rules.bare_unit) {
      return bad("expected a duration with its unit, like 10s, 500ms or 720h");
    } else {
      out.value = bare * *rules.bare_unit;
      out.deprecation =
          absl::StrCat(what, " ", t, ": a bare number is read as ", UnitName(*rules.bare_unit),
                       " (deprecated); write ", absl::FormatDuration(out.value));
    }
  } else if (!absl::ParseDuration(t, &out.value) || out.value == absl::InfiniteDuration() ||
             out.value == -absl::InfiniteDuration()) {
    return bad("expected a duration like 10s, 500ms or 720h");
  }
  if (out.value < absl::ZeroDuration()) return bad("a duration cannot be negative");
  if (out.value == absl::ZeroDuration() && !rules.allow_zero) return bad("must be more than 0");
  if (out.value != absl::ZeroDuration() && out.value < rules.min)
    return bad(absl::StrCat("must be at least ", absl::FormatDuration(rules.min)));
  if (out.value > rules.max)
    return bad(absl::StrCat("must be at most ", absl::FormatDuration(rules.max)));
  return out;
}

}  // namespace gpulet
