// Time as an outside world: code that waits, backs off or timestamps takes a Clock so tests can
// drive time by hand (testing/common/fake_clock.h).
#pragma once

#include <chrono>

namespace gpulet {

class Clock {
 public:
  using Duration = std::chrono::nanoseconds;
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
  // Wall-clock seconds since the epoch, for timestamps that leave the process (labels, events).
  virtual int64_t UnixSeconds() const = 0;
  virtual void SleepFor(Duration d) = 0;
};

// The process-wide real clock; never null, lives forever.
Clock* RealClock();

}  // namespace gpulet
