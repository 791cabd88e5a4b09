#include "common/clock.h"

#include <thread>

namespace gpulet {
namespace {

class SteadyClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  int64_t UnixSeconds() const override {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  void SleepFor(Duration d) override { std::this_thread::sleep_for(d); }
};

}  // namespace

Clock* RealClock() {
  static SteadyClock* clock = new SteadyClock();  // intentionally leaked: usable during shutdown
  return clock;
}

}  // namespace gpulet
