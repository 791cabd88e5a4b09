#include "runtime/hook.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/did_you_mean.h"
#include "common/status.h"
#include "runtime/cdi.h"
#include "runtime/ldconfig.h"
#include "runtime/request.h"
#include "runtime/rootfs.h"

extern char** environ;

namespace gpulet::runtime {
namespace {

constexpr size_t kMaxState = 1 << 20;

absl::Status InternalErrno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

std::string Rootfs(const ContainerState& state, const Json& spec) {
  std::string root = spec["root"]["path"].get<std::string>();
  return root.empty() || root[0] != '/' ? state.bundle + "/" + root : root;
}

// Runs `fn` in a child process inside the container's mount namespace; its result comes back as
// the exit status plus a message on a pipe.
absl::Status InContainerMountNs(int pid, const std::function<absl::Status()>& fn) {
  int ns = ::open(absl::StrCat("/proc/", pid, "/ns/mnt").c_str(), O_RDONLY | O_CLOEXEC);
  if (ns < 0)
    return InternalErrno(absl::StrCat("cannot open the mount namespace of container pid ", pid));
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    ::close(ns);
    return InternalErrno("pipe");
  }
  pid_t child = ::fork();
  if (child < 0) {
    ::close(ns), ::close(p[0]), ::close(p[1]);
    return InternalErrno("fork");
  }
  if (child == 0) {
    ::close(p[0]);
    absl::Status s =
        ::setns(ns, CLONE_NEWNS) == 0 ? fn() : InternalErrno("setns into the container");
    if (!s.ok()) {
      std::string m(s.message());
      (void)!::write(p[1], m.data(), m.size());
    }
    ::_exit(s.ok() ? 0 : 1);
  }
  ::close(ns), ::close(p[1]);
  std::string msg;
  char buf[512];
  ssize_t n;
  while ((n = ::read(p[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<size_t>(n));
  ::close(p[0]);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(msg.empty() ? "container setup failed" : msg);
}

// In the container's mount namespace: chroot into the rootfs and run the host's ldconfig (already
// open as `ldconfig_fd` and checked by OpenLdconfig: a static ELF, never a script) with a fixed
// environment and only the capabilities it needs, so neither the image's ldconfig, nor its
// interpreter, nor its LD_PRELOAD can run. ldconfig writes /etc/ld.so.cache of the rootfs.
absl::Status RunLdconfig(int ldconfig_fd, const std::string& rootfs,
                         const std::vector<std::string>& folders) {
  if (::chroot(rootfs.c_str()) != 0 || ::chdir("/") != 0) return InternalErrno("chroot " + rootfs);
  ::mkdir("/etc", 0755);  // inside the chroot: cannot reach the host whatever /etc is
  std::vector<std::string> argv = {"ldconfig"};
  for (const auto& f : folders) argv.push_back(f);
  std::vector<char*> a, e;
  for (auto& s : argv) a.push_back(s.data());
  a.push_back(nullptr);
  std::vector<std::string> env = CleanEnvironment();
  for (auto& s : env) e.push_back(s.data());
  e.push_back(nullptr);
  pid_t child = ::fork();
  if (child < 0) return InternalErrno("fork");
  if (child == 0) {
    int devnull = ::open("/dev/null", O_WRONLY);
    if (devnull >= 0) ::dup2(devnull, 1);
    absl::Status dropped = DropCapabilitiesForLdconfig();
    if (!dropped.ok()) {
      std::fprintf(stderr, "gpulet-container-hook: %s\n", std::string(dropped.message()).c_str());
      ::_exit(126);
    }
    ::fexecve(ldconfig_fd, a.data(), e.data());
    std::fprintf(stderr, "gpulet-container-hook: cannot exec ldconfig: %s\n", std::strerror(errno));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return absl::InternalError(absl::StrCat("ldconfig in the container failed (",
                                            WIFEXITED(status) ? "exit " : "wait status ",
                                            WIFEXITED(status) ? WEXITSTATUS(status) : status, ")"));
  return absl::OkStatus();
}

absl::StatusOr<ContainerState> ReadState() {
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(0, buf, sizeof buf)) > 0) {
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxState)
      return absl::InvalidArgumentError("container state on stdin is too large");
  }
  if (n < 0) return InternalErrno("cannot read the container state from stdin");
  return ParseContainerState(text);
}

// Legacy mode: the edits for the container's request, applied from the runtime's lifecycle.
absl::Status Prestart(const ContainerState& state, const RuntimeConfig& config, int ldconfig_fd) {
  ASSIGN_OR_RETURN(Json spec, LoadOciSpec(state.bundle + "/config.json"));
  ASSIGN_OR_RETURN(GpuRequest req, ResolveRequest(spec, config));
  if (!req.gpu_container) return absl::OkStatus();
  CdiRegistry registry;
  RETURN_IF_ERROR(registry.Load(config.spec_dirs));
  ASSIGN_OR_RETURN(ContainerEdits edits, EditsForRequest(req, registry, config));
  DriverFacts facts;
  facts.driver_version = GetEnv(edits.env, "GPULET_DRIVER_VERSION").value_or("");
  facts.cuda_version = GetEnv(edits.env, "GPULET_CUDA_DRIVER_VERSION").value_or("");
  RETURN_IF_ERROR(CheckRequirements(req.requirements, facts));
  std::string rootfs = Rootfs(state, spec);
  std::set<std::string> folders;
  for (const auto& m : edits.mounts)
    if (absl::StrContains(m.container_path, ".so"))
      folders.insert(m.container_path.substr(0, m.container_path.rfind('/')));
  return InContainerMountNs(state.pid, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(Fd root, OpenRoot(rootfs));
    for (const auto& d : edits.device_nodes) {
      mode_t type = d.type == "b" ? S_IFBLK : S_IFCHR;
      RETURN_IF_ERROR(MknodInRoot(root, d.path, type | d.file_mode.value_or(0666),
                                  makedev(*d.major, *d.minor)));
    }
    for (const auto& m : edits.mounts) {
      struct stat st;
      if (::stat(m.host_path.c_str(), &st) != 0) return InternalErrno("cannot stat " + m.host_path);
      absl::StatusOr<Fd> target = S_ISDIR(st.st_mode) ? MkdirAllInRoot(root, m.container_path)
                                                      : CreateFileInRoot(root, m.container_path);
      if (!target.ok()) return target.status();
      // Read-only before it is attached, attached to exactly the object resolved in the root.
      RETURN_IF_ERROR(BindReadOnly(m.host_path, root, m.container_path, *target));
    }
    if (folders.empty()) return absl::OkStatus();
    return RunLdconfig(ldconfig_fd, rootfs, {folders.begin(), folders.end()});
  });
}

constexpr int kUsageError = 2;  // as every gpulet binary (src/cmd/common/cli.h)

// "gpulet-container-hook <command>: <what>" on stderr, and `code`.
int Fail(const std::string& cmd, const std::string& msg, int code = 1) {
  std::fprintf(stderr, "gpulet-container-hook%s%s: %s\n", cmd.empty() ? "" : " ", cmd.c_str(),
               msg.c_str());
  return code;
}

constexpr char kUsage[] =
    "usage: gpulet-container-hook prestart [--config FILE]\n"
    "         legacy mode: device nodes, driver mounts and the ld cache for the request\n"
    "       gpulet-container-hook update-ldcache [--config FILE] [--folder DIR ...]\n"
    "         CDI mode: the host's ldconfig, chrooted into the rootfs, for DIRs\n"
    "       gpulet-container-hook poststart|poststop   (nothing to do)\n"
    "Config: --config FILE, else $GPULET_RUNTIME_CONFIG, else /etc/gpulet/container-runtime.json\n"
    "(docs/runtime.md). The container state comes on stdin, as runc gives it.\n"
    "Example (in an OCI spec's hooks.prestart):\n"
    "  {\"path\": \"/usr/bin/gpulet-container-hook\", \"args\": [\"gpulet-container-hook\", "
    "\"prestart\"]}\n";

}  // namespace

const std::vector<std::string>& CleanEnvironment() {
  static const std::vector<std::string> k = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
  return k;
}

absl::StatusOr<ContainerState> ParseContainerState(const std::string& text) {
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return absl::InvalidArgumentError("container state on stdin is not a JSON object");
  ContainerState s;
  if (!j.contains("pid") || !j["pid"].is_number_integer() || j["pid"].get<int64_t>() <= 0 ||
      j["pid"].get<int64_t>() > (1 << 22))
    return absl::InvalidArgumentError("container state on stdin: \"pid\" is not a valid pid");
  s.pid = j["pid"].get<int>();
  const char* key = j.contains("bundle") ? "bundle" : "bundlePath";
  if (!j.contains(key) || !j[key].is_string() || j[key].get<std::string>().empty() ||
      j[key].get<std::string>()[0] != '/')
    return absl::InvalidArgumentError(
        "container state on stdin: \"bundle\" is not an absolute path");
  s.bundle = j[key].get<std::string>();
  return s;
}

int HookMain(int argc, char** argv) {
  // First thing: forget the inherited environment, whoever set it.
  ::clearenv();
  for (const auto& kv : CleanEnvironment()) ::putenv(const_cast<char*>(kv.c_str()));
  const std::vector<std::string> commands = {"prestart", "update-ldcache", "poststart", "poststop"};
  if (argc < 2) return Fail("", "a command is required.\n" + std::string(kUsage), kUsageError);
  std::string cmd = argv[1];
  if (cmd == "--version" || cmd == "-v") {
    std::printf("gpulet-container-hook %s\n", GPULET_VERSION);
    return 0;
  }
  auto help = [] {
    std::printf(
        "gpulet-container-hook %s: OCI hook that runc runs with the container state on "
        "stdin\n%s",
        GPULET_VERSION, kUsage);
    return 0;
  };
  if (cmd == "--help" || cmd == "-h") return help();
  if (std::find(commands.begin(), commands.end(), cmd) == commands.end()) {
    std::string hint = DidYouMean(commands, cmd);
    return Fail("",
                "unknown command \"" + cmd + "\"" +
                    (hint.empty() ? "" : "; did you mean " + hint + "?") +
                    " Run `gpulet-container-hook --help`.",
                kUsageError);
  }
  for (int i = 2; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") return help();
  if (cmd == "poststart" || cmd == "poststop") return 0;
  std::vector<std::string> folders;
  std::string config_path;
  const std::vector<std::string> flags = {"--config", "--folder"};
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    bool known = std::find(flags.begin(), flags.end(), a) != flags.end();
    if (known && i + 1 >= argc) return Fail(cmd, a + " needs a value", kUsageError);
    if (a == "--config") {
      config_path = argv[++i];
    } else if (a == "--folder") {
      folders.push_back(argv[++i]);
      if (folders.back().empty() || folders.back()[0] != '/')
        return Fail(cmd, "--folder \"" + folders.back() + "\" is not an absolute container path",
                    kUsageError);
    } else {
      std::string hint = a.rfind("--", 0) == 0 ? DidYouMean(flags, a) : "";
      return Fail(cmd,
                  "unknown argument \"" + a + "\"" +
                      (hint.empty() ? "" : "; did you mean " + hint + "?") +
                      " Run `gpulet-container-hook --help`.",
                  kUsageError);
    }
  }
  auto config = LoadDefaultRuntimeConfig(config_path);
  if (!config.ok()) return Fail(cmd, std::string(config.status().message()), kUsageError);
  auto state = ReadState();
  if (!state.ok()) return Fail(cmd, std::string(state.status().message()), kUsageError);
  auto ld = OpenLdconfig(config->ldconfig);
  if (!ld.ok()) return Fail(cmd, std::string(ld.status().message()));
  int ldconfig = ld->fd.get();
  absl::Status s;
  if (cmd == "prestart") {
    s = Prestart(*state, *config, ldconfig);
  } else {
    auto spec = LoadOciSpec(state->bundle + "/config.json");
    if (!spec.ok()) return Fail(cmd, std::string(spec.status().message()));
    std::string rootfs = Rootfs(*state, *spec);
    s = InContainerMountNs(state->pid, [&] { return RunLdconfig(ldconfig, rootfs, folders); });
  }
  if (!s.ok()) return Fail(cmd, std::string(s.message()));
  return 0;
}

}  // namespace gpulet::runtime
