#include "plugin/mps.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/fs.h"
#include "common/status.h"

extern char** environ;

namespace gpulet::plugin {
namespace {

constexpr char kControl[] = "nvidia-cuda-mps-control";
constexpr char kSmi[] = "nvidia-smi";

std::string Join(const std::string& root, const std::string& a, const std::string& b = "") {
  std::string p = root;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  p += "/" + a;
  if (!b.empty()) p += "/" + b;
  return p;
}

// The program's path: in bin_dir when set, else the first executable on $PATH.
absl::StatusOr<std::string> Which(const std::string& bin_dir, const std::string& name) {
  if (!bin_dir.empty()) {
    std::string p = Join(bin_dir, name);
    if (::access(p.c_str(), X_OK) == 0) return p;
    return absl::NotFoundError(absl::StrCat(p, " is not an executable (gpulet.mps.binDir)"));
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    if (dir.empty()) continue;
    std::string p = Join(std::string(dir), name);
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return absl::NotFoundError(
      absl::StrCat(name, " is not on $PATH (set gpulet.mps.binDir / GPULET_MPS_BIN_DIR)"));
}

struct RunResult {
  int status = -1;     // exit code; -1: killed or did not exit in time
  std::string out;     // stdout and stderr
  int bind_errno = 0;  // the /dev/shm bind in the child failed with this
};

// Runs `argv` with the process environment plus `extra_env`, `input` on stdin; stdout and stderr
// captured unless `detach` (a daemonising program keeps them open: then they go to /dev/null and
// only the exit is awaited). `shm_from`, when set, is bind-mounted on /dev/shm in a mount
// namespace of the child's own, so the daemon and its servers share the clients' /dev/shm.
absl::StatusOr<RunResult> Run(const std::vector<std::string>& argv,
                              const std::map<std::string, std::string>& extra_env,
                              const std::string& input, absl::Duration timeout, bool detach,
                              const std::string& shm_from = "") {
  // Everything the child needs is built before fork: only async-signal-safe calls after it.
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (!extra_env.count(kv.substr(0, kv.find('=')))) env_store.push_back(kv);
  }
  for (const auto& [k, v] : extra_env) env_store.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_store) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_store = argv;
  for (auto& s : argv_store) args.push_back(s.data());
  args.push_back(nullptr);

  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]), ::close(in[1]);
    return absl::InternalError("pipe failed");
  }
  if (::pipe2(err, O_CLOEXEC) != 0) {
    for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
    return absl::InternalError("pipe failed");
  }
  int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  const char* shm = shm_from.empty() ? nullptr : shm_from.c_str();
  pid_t pid = ::fork();
  if (pid < 0) {
    for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1], devnull}) ::close(fd);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    ::setpgid(0, 0);  // a timeout kills the whole group
    if (shm) {
      int e = 0;
      if (::unshare(CLONE_NEWNS) != 0 ||
          ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
          ::mount(shm, "/dev/shm", nullptr, MS_BIND, nullptr) != 0)
        e = errno;
      if (e != 0) (void)!::write(err[1], &e, sizeof e);
    }
    ::dup2(in[0], 0);
    ::dup2(detach ? devnull : out[1], 1);
    ::dup2(detach ? devnull : out[1], 2);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);  // the agent blocks its signals; children must not
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  ::close(devnull);
  // Small inputs (one command line) fit the pipe buffer; the write cannot block.
  if (!input.empty()) (void)!::write(in[1], input.data(), input.size());
  ::close(in[1]);
  RunResult r;
  absl::Time deadline = absl::Now() + timeout;
  bool out_open = true;
  int st = 0;
  pid_t done = 0;
  for (;;) {
    if (out_open) {
      struct pollfd p = {out[0], POLLIN, 0};
      if (::poll(&p, 1, 5) > 0) {
        char buf[4096];
        ssize_t n = ::read(out[0], buf, sizeof buf);
        if (n > 0)
          r.out.append(buf, n);
        else if (n == 0 || errno != EINTR)
          out_open = false;
      }
    } else {
      ::usleep(2000);
    }
    if (done == 0) done = ::waitpid(pid, &st, WNOHANG);
    if (done == pid && !out_open) break;
    if (absl::Now() > deadline) {
      ::kill(-pid, SIGKILL);
      if (done == 0) ::waitpid(pid, &st, 0);
      ::close(out[0]);
      ::close(err[0]);
      return absl::DeadlineExceededError(absl::StrCat(
          absl::StrJoin(argv, " "), ": no answer within ", absl::FormatDuration(timeout)));
    }
  }
  ::close(out[0]);
  int e = 0;
  if (::read(err[0], &e, sizeof e) == sizeof e) r.bind_errno = e;
  ::close(err[0]);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string Trimmed(const std::string& s) { return std::string(absl::StripAsciiWhitespace(s)); }

bool SameDir(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

}  // namespace

std::string MpsPipeDir(const std::string& root, const std::string& resource) {
  return Join(root, resource, "pipe");
}
std::string MpsLogDir(const std::string& root, const std::string& resource) {
  return Join(root, resource, "log");
}
std::string MpsShmDir(const std::string& root) { return Join(root, "shm"); }

absl::Status ValidateMpsShare(const MpsShare& share) {
  for (const MpsGpu& g : share.gpus) {
    const bool turing_on = g.cc_major > 7 || (g.cc_major == 7 && g.cc_minor >= 5);
    const int max = turing_on ? 48 : 16;
    if (share.replicas > max)
      return absl::InvalidArgumentError(
          absl::StrCat("sharing.mps: ", share.resource, ": ", share.replicas, " replicas on GPU ",
                       g.index, " (compute capability ", g.cc_major, ".", g.cc_minor,
                       ") exceed the ", max, " clients an MPS server takes there"));
  }
  return absl::OkStatus();
}

std::vector<std::string> MpsLimitCommands(const MpsShare& share) {
  std::vector<std::string> cmds;
  if (share.replicas <= 0 || share.gpus.empty()) return cmds;
  for (const MpsGpu& g : share.gpus)
    if (g.memory_bytes > 0)
      cmds.push_back(absl::StrCat("set_default_device_pinned_mem_limit ", g.index, " ",
                                  g.memory_bytes / share.replicas / 1024 / 1024, "M"));
  cmds.push_back(absl::StrCat("set_default_active_thread_percentage ", 100 / share.replicas));
  return cmds;
}

MpsDaemon::MpsDaemon(MpsShare share, MpsOptions options)
    : share_(std::move(share)), options_(std::move(options)) {}

MpsDaemon::~MpsDaemon() { Stop(); }

std::map<std::string, std::string> MpsDaemon::DaemonEnv() const {
  std::map<std::string, std::string> env = options_.env;
  env["CUDA_MPS_PIPE_DIRECTORY"] = MpsPipeDir(options_.root, share_.resource);
  env["CUDA_MPS_LOG_DIRECTORY"] = MpsLogDir(options_.root, share_.resource);
  return env;
}

absl::StatusOr<std::string> MpsDaemon::Command(const std::string& command) const {
  ASSIGN_OR_RETURN(std::string bin, Which(options_.bin_dir, kControl));
  ASSIGN_OR_RETURN(RunResult r, Run({bin}, DaemonEnv(), command + "\n", options_.command_timeout,
                                    /*detach=*/false));
  if (r.status != 0)
    return absl::UnavailableError(absl::StrCat("MPS control of ", share_.resource, ": \"", command,
                                               "\" failed (exit ", r.status,
                                               "): ", Trimmed(r.out)));
  return r.out;
}

absl::Status MpsDaemon::SetComputeMode(const std::string& mode) const {
  ASSIGN_OR_RETURN(std::string smi, Which(options_.bin_dir, kSmi));
  for (const MpsGpu& g : share_.gpus) {
    ASSIGN_OR_RETURN(RunResult r, Run({smi, "-i", g.uuid, "-c", mode}, options_.env, "",
                                      options_.command_timeout, /*detach=*/false));
    if (r.status != 0)
      return absl::UnavailableError(absl::StrCat("nvidia-smi -i ", g.uuid, " -c ", mode,
                                                 " failed (exit ", r.status,
                                                 "): ", Trimmed(r.out)));
  }
  return absl::OkStatus();
}

absl::Status MpsDaemon::SetLimits() {
  for (const std::string& c : MpsLimitCommands(share_)) RETURN_IF_ERROR(Command(c).status());
  return absl::OkStatus();
}

absl::Status MpsDaemon::Launch() {
  const std::string pipe = MpsPipeDir(options_.root, share_.resource);
  const std::string log = MpsLogDir(options_.root, share_.resource);
  const std::string shm = MpsShmDir(options_.root);
  std::error_code ec;
  for (const std::string& d : {pipe, log, shm}) {
    std::filesystem::create_directories(d, ec);
    if (ec)
      return absl::PermissionDeniedError(absl::StrCat("cannot create ", d, ": ", ec.message()));
  }
  ASSIGN_OR_RETURN(std::string bin, Which(options_.bin_dir, kControl));
  // Clients get <root>/shm as /dev/shm; the daemon must see the same directory there.
  const bool bind = !SameDir(shm, "/dev/shm");
  ASSIGN_OR_RETURN(RunResult r, Run({bin, "-d"}, DaemonEnv(), "", options_.command_timeout,
                                    /*detach=*/true, bind ? shm : ""));
  if (r.bind_errno != 0)
    spdlog::warn(
        "MPS {}: cannot bind {} on the daemon's /dev/shm ({}); clients reach it only if "
        "/dev/shm already is {}",
        share_.resource, shm, std::strerror(r.bind_errno), shm);
  if (r.status != 0)
    return absl::UnavailableError(
        absl::StrCat(bin, " -d for ", share_.resource, " failed (exit ", r.status, ")"));
  // `-d` may return before the daemon listens (the real one forks first): limits sent too early
  // are refused with "Cannot find MPS control daemon process", so wait for its first answer.
  const absl::Time deadline = absl::Now() + options_.command_timeout;
  for (;;) {
    absl::Status up = Command("get_default_active_thread_percentage").status();
    if (up.ok()) break;
    if (absl::Now() >= deadline)
      return absl::UnavailableError(
          absl::StrCat(bin, " -d for ", share_.resource, ": the daemon did not answer within ",
                       absl::FormatDuration(options_.command_timeout), ": ", up.message()));
    absl::SleepFor(absl::Milliseconds(20));
  }
  return SetLimits();
}

absl::Status MpsDaemon::Start() {
  RETURN_IF_ERROR(ValidateMpsShare(share_));
  RETURN_IF_ERROR(SetComputeMode("EXCLUSIVE_PROCESS"));
  // A daemon that already answers (the agent restarted; clients may be running) is kept.
  if (Command("get_default_active_thread_percentage").ok()) {
    spdlog::info("MPS {}: adopting the running control daemon", share_.resource);
    RETURN_IF_ERROR(SetLimits());
  } else {
    RETURN_IF_ERROR(Launch());
  }
  RETURN_IF_ERROR(Command("get_default_active_thread_percentage").status());
  std::string started = Join(options_.root, share_.resource, ".started");
  if (absl::Status s = WriteFileAtomic(started, ""); !s.ok())
    spdlog::warn("MPS {}: {}", share_.resource, std::string(s.message()));
  (void)WriteFileAtomic(Join(options_.root, ".ready"), "");
  spdlog::info("MPS {}: control daemon ready ({} GPUs, {} replicas: {}% threads each)",
               share_.resource, share_.gpus.size(), share_.replicas, 100 / share_.replicas);
  {
    absl::MutexLock l(&mu_);
    started_ = true;
    stopping_ = false;
  }
  SetHealthy(true);
  supervisor_ = std::thread([this] { Supervise(); });
  return absl::OkStatus();
}

void MpsDaemon::SetHealthy(bool h) {
  {
    absl::MutexLock l(&mu_);
    if (healthy_ == h) return;
    healthy_ = h;
  }
  changes_.Notify();
  if (options_.on_health_change) options_.on_health_change();
}

bool MpsDaemon::healthy() const {
  absl::MutexLock l(&mu_);
  return healthy_;
}

void MpsDaemon::Supervise() {
  absl::Duration wait = options_.probe_interval;
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      auto stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop), wait)) return;
    }
    if (Command("get_default_active_thread_percentage").ok()) {
      SetHealthy(true);
      wait = options_.probe_interval;
      continue;
    }
    SetHealthy(false);
    spdlog::warn("MPS {}: control daemon does not answer; starting it again", share_.resource);
    restarts_.fetch_add(1);
    if (absl::Status s = Launch(); s.ok()) {
      SetHealthy(true);
      wait = options_.probe_interval;
    } else {
      spdlog::error("MPS {}: restart failed: {}", share_.resource, std::string(s.message()));
      wait = std::min(wait * 2, options_.max_backoff);
    }
  }
}

void MpsDaemon::Stop() {
  {
    absl::MutexLock l(&mu_);
    if (!started_) return;
    started_ = false;
    stopping_ = true;
  }
  if (supervisor_.joinable()) supervisor_.join();
  if (auto q = Command("quit"); !q.ok())
    spdlog::warn("MPS {}: {}", share_.resource, std::string(q.status().message()));
  if (absl::Status s = SetComputeMode("DEFAULT"); !s.ok())
    spdlog::warn("MPS {}: {}", share_.resource, std::string(s.message()));
  std::error_code ec;
  std::filesystem::remove(Join(options_.root, share_.resource, ".started"), ec);
  std::filesystem::remove_all(MpsLogDir(options_.root, share_.resource), ec);
  SetHealthy(false);
  spdlog::info("MPS {}: control daemon stopped", share_.resource);
}

}  // namespace gpulet::plugin
