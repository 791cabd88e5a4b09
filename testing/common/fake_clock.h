// The test Clock (common/clock.h): time moves only when the test moves it (Advance), or when code
// under test sleeps (SleepFor advances instead of waiting, so a backoff loop runs at full speed).
// UnixSeconds follows the same time from `unix_start`. Thread-safe: the code under test may read
// it from its own threads while the test advances it.
#pragma once

#include <chrono>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace gpulet::testing {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(TimePoint start = TimePoint(std::chrono::seconds(1000)),
                     int64_t unix_start = 1700000000)
      : start_(start), unix_start_(unix_start), now_(start) {}

  TimePoint Now() const override {
    absl::MutexLock l(&mu_);
    return now_;
  }
  int64_t UnixSeconds() const override {
    absl::MutexLock l(&mu_);
    return unix_start_ + std::chrono::duration_cast<std::chrono::seconds>(now_ - start_).count();
  }
  void SleepFor(Duration d) override { Advance(d); }
  // REQUIRES: d >= 0 (a steady clock never goes back).
  void Advance(Duration d) {
    absl::MutexLock l(&mu_);
    now_ += d;
  }

 private:
  const TimePoint start_;
  const int64_t unix_start_;
  mutable absl::Mutex mu_;
  TimePoint now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpulet::testing
