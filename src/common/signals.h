// The signals a long-running gpulet process stops on (SIGINT, SIGTERM, SIGQUIT), optionally with
// SIGHUP (reload), as one set: every daemon blocks them before it starts a thread and then waits
// for them with sigwait/sigtimedwait, so no thread is interrupted by them.
#pragma once

#include <signal.h>

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

}  // namespace gpulet
