// gpulet-fake-apiserver: the fake API server (fake_apiserver.h) as a process, for scripts that
// drive it over HTTP (tests/k8s/api_probe.py). Prints its URL on one line, then serves until
// SIGTERM or SIGINT.  usage: gpulet-fake-apiserver [PORT]   (0 or none: any free port)
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "testing/apiserver/fake_apiserver.h"

int main(int argc, char** argv) {
  gpulet::testing::FakeApiServer::Options o;
  if (argc > 1) o.port = std::atoi(argv[1]);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  // Blocked before the server's threads start, so only sigwait below receives them.
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  gpulet::testing::FakeApiServer server(o);
  if (!server.Start()) return 1;
  std::printf("%s\n", server.url().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  server.Stop();
  return 0;
}
