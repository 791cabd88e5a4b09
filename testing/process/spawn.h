// Starting programs from tests and benchmarks: one way for all of them. posix_spawn (no fork of a
// multi-threaded test process), argv[0] is the path, no signal blocked in the child (the test
// runner's mask must not reach a daemon that stops on SIGTERM).
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace gpulet::testing_process {

struct SpawnOptions {
  std::string log;  // stdout and stderr to this file (truncated); empty: ours
  std::map<std::string, std::string> env;  // set in the child's environment on top of ours
  // The child gets SIGKILL when the spawning thread dies (PR_SET_PDEATHSIG): a runner killed with
  // SIGKILL left its agent running. posix_spawn cannot set it, so this forks (the child only makes
  // async-signal-safe calls before exec).
  bool die_with_parent = false;
};

// Starts argv[0] with `argv`; the child's pid, or -1 with errno set when it could not be started.
inline pid_t Spawn(const std::vector<std::string>& argv, const SpawnOptions& o = {}) {
  if (argv.empty()) return -1;
  std::vector<std::string> env_strings;
  std::map<std::string, std::string> env = o.env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    std::string key = kv.substr(0, kv.find('='));
    if (!env.count(key)) env_strings.push_back(kv);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  if (o.die_with_parent) {
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the parent died before prctl
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      if (!o.log.empty()) {
        int fd = open(o.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(127);
      }
      execve(args[0], args.data(), envp.data());
      _exit(127);
    }
    return pid;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (!o.log.empty()) {
    posix_spawn_file_actions_addopen(&fa, 1, o.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, args[0], &fa, &attr, args.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    errno = rc;
    return -1;
  }
  return pid;
}

// Spawn with stdout and stderr to `log`.
inline pid_t SpawnLogged(const std::vector<std::string>& argv, const std::string& log) {
  return Spawn(argv, {.log = log, .env = {}});
}

// Runs argv to its end; (exit code or 128 + signal, stdout and stderr together). -1 when it could
// not be started.
inline std::pair<int, std::string> RunCaptured(const std::vector<std::string>& argv,
                                               const std::map<std::string, std::string>& env = {}) {
  char tmpl[] = "/tmp/gpulet-run-XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd < 0) return {-1, "mkstemp"};
  close(fd);
  pid_t pid = Spawn(argv, {.log = tmpl, .env = env});
  std::string out;
  int status = 0;
  if (pid > 0) waitpid(pid, &status, 0);
  if (int in = open(tmpl, O_RDONLY | O_CLOEXEC); in >= 0) {
    char b[512];
    for (ssize_t n; (n = read(in, b, sizeof b)) > 0;) out.append(b, static_cast<size_t>(n));
    close(in);
  }
  unlink(tmpl);
  if (pid <= 0) return {-1, out};
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

// SIGTERM, then SIGKILL if it has not exited after `grace`; reaps it. The wait status, or -1.
inline int StopProcess(pid_t pid, std::chrono::milliseconds grace = std::chrono::seconds(5)) {
  if (pid <= 0) return -1;
  kill(pid, SIGTERM);
  int st = 0;
  auto deadline = std::chrono::steady_clock::now() + grace;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return st;
}

}  // namespace gpulet::testing_process
