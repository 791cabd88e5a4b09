// A fake `nvidia-cuda-mps-control` (and, installed under the name `nvidia-smi`, a fake nvidia-smi)
// for tests. It records what it was told to the file named by $GPULET_FAKE_MPS_RECORD, one line
// each (appended with O_APPEND, so concurrent writers do not interleave):
//   smi <args...>                                    nvidia-smi -i <uuid> -c <mode>
//   daemon pipe=<CUDA_MPS_PIPE_DIRECTORY> log=<CUDA_MPS_LOG_DIRECTORY> pid=<pid>
//   cmd pipe=<dir> <command line>                    a command read from the client's stdin
// `-d`: becomes a daemon (like the real one) serving a unix socket <pipe>/control and writing
// <pipe>/nvidia-cuda-mps-control.pid; it answers get_default_active_thread_percentage with the
// last value set, and exits on `quit`, on SIGTERM, or when its pipe directory disappears (so a
// test that forgets it leaks nothing). Without arguments: a client that sends stdin to the daemon
// and prints the answer; no daemon → exit 1 with the real tool's message.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

void Record(const std::string& line) {
  const char* path = std::getenv("GPULET_FAKE_MPS_RECORD");
  if (!path) return;
  int fd = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  std::string l = line + "\n";
  (void)!::write(fd, l.data(), l.size());
  ::close(fd);
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

sockaddr_un Address(const std::string& pipe) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s/control", pipe.c_str());
  return a;
}

int Daemon(const std::string& pipe, int ready) {
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a = Address(pipe);
  ::unlink(a.sun_path);
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s, 16) != 0) {
    std::perror("fake mps daemon: bind");
    (void)!::write(ready, "n", 1);
    return 1;
  }
  std::string pidfile = pipe + "/nvidia-cuda-mps-control.pid";
  FILE* f = std::fopen(pidfile.c_str(), "w");
  if (f) std::fprintf(f, "%d\n", ::getpid()), std::fclose(f);
  Record("daemon pipe=" + pipe + " log=" + Env("CUDA_MPS_LOG_DIRECTORY") +
         " pid=" + std::to_string(::getpid()));
  // Tell the launcher (still waiting in main) that the socket is up: it exits 0 then.
  (void)!::write(ready, "y", 1);
  ::close(ready);
  std::string threads = "100.0";
  for (;;) {
    fd_set r;
    FD_ZERO(&r);
    FD_SET(s, &r);
    timeval tv{0, 100 * 1000};
    int n = ::select(s + 1, &r, nullptr, nullptr, &tv);
    struct stat st;
    if (::stat(pipe.c_str(), &st) != 0) return 0;  // the test's directory is gone
    if (n <= 0) continue;
    int c = ::accept4(s, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    std::string cmd;
    char buf[512];
    ssize_t k;
    while ((k = ::read(c, buf, sizeof buf)) > 0) cmd.append(buf, k);
    cmd = Trim(cmd);
    Record("cmd pipe=" + pipe + " " + cmd);
    std::string answer;
    const std::string set = "set_default_active_thread_percentage ";
    if (cmd.rfind(set, 0) == 0) threads = cmd.substr(set.size());
    if (cmd == "get_default_active_thread_percentage") answer = threads + "\n";
    (void)!::write(c, answer.data(), answer.size());
    ::close(c);
    if (cmd == "quit") {
      ::unlink(a.sun_path);
      ::unlink(pidfile.c_str());
      return 0;
    }
  }
}

int Client(const std::string& pipe) {
  std::string input;
  char buf[512];
  ssize_t k;
  while ((k = ::read(0, buf, sizeof buf)) > 0) input.append(buf, k);
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a = Address(pipe);
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    std::fprintf(stderr, "Cannot find MPS control daemon process\n");
    return 1;
  }
  (void)!::write(s, input.data(), input.size());
  ::shutdown(s, SHUT_WR);
  while ((k = ::read(s, buf, sizeof buf)) > 0) (void)!::write(1, buf, k);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string self = argv[0];
  self = self.substr(self.rfind('/') + 1);
  if (self == "nvidia-smi") {
    std::string line = "smi";
    for (int i = 1; i < argc; ++i) line += std::string(" ") + argv[i];
    Record(line);
    return Env("GPULET_FAKE_SMI_FAIL").empty() ? 0 : 3;
  }
  std::string pipe = Env("CUDA_MPS_PIPE_DIRECTORY");
  if (pipe.empty()) pipe = "/tmp/nvidia-mps";
  if (argc > 1 && std::string(argv[1]) == "-d") {
    int ready[2];
    if (::pipe(ready) != 0) return 1;
    pid_t pid = ::fork();
    if (pid < 0) return 1;
    if (pid > 0) {  // the launcher: returns once the daemon listens (or failed)
      ::close(ready[1]);
      char c = 0;
      ssize_t n = ::read(ready[0], &c, 1);
      return n == 1 && c == 'y' ? 0 : 1;
    }
    ::close(ready[0]);
    ::setsid();
    ::signal(SIGTERM, SIG_DFL);
    // The daemon itself reports once it listens (a stale socket file left by a killed daemon
    // must not count as ready); the middle process exits at once, like a daemonising fork.
    pid_t inner = ::fork();
    if (inner < 0) return 1;
    if (inner > 0) return 0;
    int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, 0), ::dup2(null, 1), ::dup2(null, 2);
    return Daemon(pipe, ready[1]);
  }
  return Client(pipe);
}
