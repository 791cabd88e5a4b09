// The signals a long-running gpulet process stops on (SIGINT, SIGTERM, SIGQUIT), optionally with
// SIGHUP (reload), as one set: every daemon blocks them before it starts a thread and then waits
// for them with sigwait/sigtimedwait, so no thread is interrupted by them.
#pragma once

#include <signal.h>

#include <chrono>

namespace gpulet {

// SIGINT, SIGTERM, SIGQUIT, and SIGHUP when `with_reload`.
inline sigset_t StopSignals(bool with_reload = false) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGQUIT}) sigaddset(&set, s);
  if (with_reload) sigaddset(&set, SIGHUP);
  return set;
}

// Blocks StopSignals(with_reload) in the calling thread and in every thread it starts afterwards.
// REQUIRES: no other thread exists yet (they would keep the default disposition).
inline sigset_t BlockStopSignals(bool with_reload = false) {
  sigset_t set = StopSignals(with_reload);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

// Waits up to `wait` for one of the blocked signals in `set`; the signal, or 0 when none came. The
// one way a command that works in steps (polls, sleeps) stays stoppable: it waits here instead of
// sleeping, so a SIGINT or SIGTERM is seen within one step, not when the work is over.
inline int WaitForStopSignal(const sigset_t& set, std::chrono::milliseconds wait) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  int sig = sigtimedwait(&set, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

}  // namespace gpulet
