#include "common/duration.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpulet {
namespace {

using ::testing::HasSubstr;

// The one syntax: Go's units, compound forms and fractions.
TEST(Duration, GoSyntax) {
  EXPECT_EQ(ParseDuration("--x", "10s")->value, absl::Seconds(10));
  EXPECT_EQ(ParseDuration("--x", "500ms")->value, absl::Milliseconds(500));
  EXPECT_EQ(ParseDuration("--x", "720h")->value, absl::Hours(720));
  EXPECT_EQ(ParseDuration("--x", "1h30m")->value, absl::Minutes(90));
  EXPECT_EQ(ParseDuration("--x", " 1.5s ")->value, absl::Milliseconds(1500));
  EXPECT_TRUE(ParseDuration("--x", "10s")->deprecation.empty());
}

// Bad text, a bare number where none was ever allowed, zero, negatives and bounds are refused,
// each naming the input and the text.
TEST(Duration, RefusedNamingInputAndText) {
  for (const char* bad : {"", "abc", "10", "5x", "-1s", "0s", "inf", "10 s"}) {
    auto d = ParseDuration("--interval", bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_THAT(d.status().message(), HasSubstr(std::string("--interval \"") + bad + "\"")) << bad;
  }
  EXPECT_THAT(ParseDuration("--x", "10").status().message(), HasSubstr("with its unit"));
  EXPECT_THAT(ParseDuration("--x", "1ms", {.min = absl::Milliseconds(10)}).status().message(),
              HasSubstr("at least 10ms"));
  EXPECT_THAT(ParseDuration("--x", "2h", {.max = absl::Hours(1)}).status().message(),
              HasSubstr("at most 1h"));
}

// Zero only where allowed; a bare number keeps its documented old unit, with a deprecation note.
TEST(Duration, ZeroAndDeprecatedBareNumbers) {
  EXPECT_EQ(ParseDuration("--x", "0", {.allow_zero = true})->value, absl::ZeroDuration());
  EXPECT_EQ(ParseDuration("--x", "0s", {.allow_zero = true})->value, absl::ZeroDuration());
  auto d = ParseDuration("--tls-renew-check", "5000", {.bare_unit = absl::Milliseconds(1)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->value, absl::Seconds(5));
  EXPECT_EQ(d->deprecation,
            "--tls-renew-check 5000: a bare number is read as milliseconds (deprecated); write 5s");
  EXPECT_EQ(ParseDuration("--x", "720", {.bare_unit = absl::Hours(1)})->value, absl::Hours(720));
}

}  // namespace
}  // namespace gpulet
