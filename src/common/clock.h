// Time as an outside world: code whose behaviour depends on how much time has passed (backoffs,
// renewals, expiry, health windows, cache lifetimes, rate limits, periodic re-checks) takes a
// Clock, so that tests drive it by hand with testing/common/fake_clock.h instead of waiting.
//
// Reading std::chrono::*::now() or absl::Now() directly stays right, and is not a bypass, for:
// - timestamps that only describe (log lines, Event and condition times, unique names, the
//   seconds a run took): nothing decides on them, and a fake would only make them lie;
// - deadlines handed to something that runs on real time (gRPC deadlines and Shutdown, poll and
//   socket timeouts in the HTTP servers, waiting for a real daemon or process to answer): the
//   peer does not see a test's clock, so a faked deadline would expire early or never;
// - the interposer's pacing: it has its own seam (vcuda::ClockFns) with no virtual call and no
//   lock on the CUDA launch path.
#pragma once

#include <chrono>
#include <cstdint>

namespace gpulet {

class Clock {
 public:
  using Duration = std::chrono::nanoseconds;
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
  // Wall-clock seconds since the epoch, for timestamps that leave the process (labels, events)
  // and for comparing with wall-clock dates (a certificate's notAfter).
  virtual int64_t UnixSeconds() const = 0;
  virtual void SleepFor(Duration d) = 0;
};

// The process-wide real clock; never null, lives forever.
Clock* RealClock();

}  // namespace gpulet
