// Starting the gpulet binary from the vGPU end-to-end tests.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace gpulet::testing_vgpu {

// Starts argv[0] with `argv`, stdout and stderr going to `log` (truncated) and no signal blocked
// (the test runner's mask must not reach the daemon: it stops on SIGTERM). Returns the child's pid.
inline pid_t SpawnLogged(const std::vector<std::string>& argv, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

}  // namespace gpulet::testing_vgpu
