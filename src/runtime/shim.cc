#include "runtime/shim.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "runtime/cdi.h"
#include "runtime/edits.h"

namespace gpulet::runtime {
namespace {

// runc's global flags that take a value (so their value is not mistaken for the command).
bool TakesValue(const std::string& flag) {
  return flag == "--root" || flag == "--log" || flag == "--log-format" || flag == "--criu" ||
         flag == "--rootless";
}

bool IsGpuletHook(const Json& hook) {
  return hook.is_object() && hook.contains("args") && hook["args"].is_array() &&
         !hook["args"].empty() && hook["args"][0] == "gpulet-container-hook";
}

// Writes the error where the engine looks for it: runc's --log file (JSON lines when
// --log-format=json, as containerd's shim parses them) and stderr.
void ReportError(const RuncArgs& args, const std::string& msg) {
  std::fprintf(stderr, "gpulet-container-runtime: %s\n", msg.c_str());
  if (args.log_file.empty()) return;
  FILE* f = std::fopen(args.log_file.c_str(), "a");
  if (!f) return;
  if (args.log_format == "json") {
    char when[32];
    std::time_t now = std::time(nullptr);
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    std::fprintf(
        f, "%s\n",
        Json({{"level", "error"}, {"msg", "gpulet-container-runtime: " + msg}, {"time", when}})
            // paths need not be UTF-8: replaced, never a throw
            .dump(-1, ' ', false, Json::error_handler_t::replace)
            .c_str());
  } else {
    std::fprintf(f, "gpulet-container-runtime: %s\n", msg.c_str());
  }
  std::fclose(f);
}

}  // namespace

RuncArgs ParseRuncArgs(const std::vector<std::string>& args) {
  RuncArgs r;
  bool in_command = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const std::string& flag, std::string* out) {
      if (a == flag && i + 1 < args.size()) {
        *out = args[++i];
        return true;
      }
      if (absl::StartsWith(a, flag + "=")) {
        *out = a.substr(flag.size() + 1);
        return true;
      }
      return false;
    };
    if (!in_command) {
      if (value("--log", &r.log_file) || value("--log-format", &r.log_format)) continue;
      if (a.size() > 1 && a[0] == '-') {
        if (TakesValue(a)) ++i;
        continue;
      }
      r.command = a;
      in_command = true;
      continue;
    }
    std::string b;
    if (value("--bundle", &b) || value("-b", &b)) r.bundle = b;
  }
  if (r.bundle.empty()) r.bundle = ".";
  return r;
}

absl::StatusOr<std::string> ModifyBundle(const std::string& bundle, const RuntimeConfig& config) {
  std::string path = bundle + "/config.json";
  ASSIGN_OR_RETURN(Json spec, LoadOciSpec(path));
  ASSIGN_OR_RETURN(GpuRequest req, ResolveRequest(spec, config));
  if (!req.gpu_container) return std::string("no GPU request");

  CdiRegistry registry;
  RETURN_IF_ERROR(registry.Load(config.spec_dirs));
  std::string mode = config.mode;
  if (mode == "auto")
    mode = (req.from_cdi || registry.HasKind(config.default_kind)) ? "cdi" : "legacy";

  if (mode == "legacy") {
    if (req.from_cdi)
      return absl::FailedPreconditionError("CDI devices were requested but the mode is legacy");
    if (spec.contains("hooks") && spec["hooks"].is_object() && spec["hooks"].contains("prestart") &&
        spec["hooks"]["prestart"].is_array())
      for (const auto& h : spec["hooks"]["prestart"])
        if (IsGpuletHook(h)) return std::string("legacy: hook already present");
    // The hook creates the nodes, but runc sets up the device cgroup before any hook runs: the
    // allow rules must be in config.json now (same request, same edits as the hook will compute).
    ASSIGN_OR_RETURN(ContainerEdits devices, EditsForRequest(req, registry, config));
    RETURN_IF_ERROR(AllowDevices(devices.device_nodes, spec));
    ContainerEdits e;
    std::vector<std::string> args = {"gpulet-container-hook", "prestart"};
    if (!config.source.empty()) args.insert(args.end(), {"--config", config.source});
    // An explicit env: the runtime would otherwise hand the hook the container's environment.
    e.hooks.push_back(Hook{
        "prestart", config.hook_path, args, {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, std::nullopt});
    RETURN_IF_ERROR(ApplyEdits(e, spec));
    RETURN_IF_ERROR(SaveOciSpec(path, spec));
    return std::string("legacy: prestart hook added");
  }

  ASSIGN_OR_RETURN(ContainerEdits edits, EditsForRequest(req, registry, config));
  // The GPUs are given here; a legacy hook already in the spec must not act again.
  if (spec.contains("hooks") && spec["hooks"].is_object() && spec["hooks"].contains("prestart") &&
      spec["hooks"]["prestart"].is_array()) {
    Json kept = Json::array();
    for (const auto& h : spec["hooks"]["prestart"])
      if (!IsGpuletHook(h) || h["args"].size() < 2 || h["args"][1] != "prestart") kept.push_back(h);
    spec["hooks"]["prestart"] = kept;
  }
  RETURN_IF_ERROR(ApplyEdits(edits, spec));
  RETURN_IF_ERROR(SaveOciSpec(path, spec));
  return absl::StrCat("cdi: ", req.devices.size(), " device(s) from ", req.source);
}

absl::StatusOr<std::string> FindRuntime(const RuntimeConfig& config, const std::string& self) {
  char self_real[4096] = {0};
  if (!self.empty()) (void)!::realpath(self.c_str(), self_real);
  auto usable = [&](const std::string& p) {
    char real[4096];
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0 &&
           ::realpath(p.c_str(), real) && std::string(real) != self_real;
  };
  const char* path_env = std::getenv("PATH");
  std::string search =
      path_env ? path_env : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  for (const auto& r : config.runtimes) {
    if (r.find('/') != std::string::npos) {
      if (usable(r)) return r;
      continue;
    }
    for (absl::string_view dir : absl::StrSplit(search, ':', absl::SkipEmpty())) {
      std::string p = absl::StrCat(dir, "/", r);
      if (usable(p)) return p;
    }
  }
  return absl::NotFoundError(absl::StrCat("no low-level runtime found (looked for ",
                                          absl::StrJoin(config.runtimes, ", "), ")"));
}

int ShimMain(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  // `--version` / `--help` alone: say what this is first (a shim in front of runc), then pass the
  // flag on, so tools that parse runc's version or help still find it after our line.
  bool identify = argc == 2 && (args[0] == "--version" || args[0] == "-v" || args[0] == "--help" ||
                                args[0] == "-h");
  if (identify) {
    std::printf(
        "gpulet-container-runtime %s: OCI runtime shim; edits GPU containers' bundles on "
        "create/run, then runs the runtime below (docs/runtime.md)\n",
        GPULET_VERSION);
    if (args[0] == "--help" || args[0] == "-h")
      std::printf(
          "Config: $GPULET_RUNTIME_CONFIG, else /etc/gpulet/container-runtime.json.\n"
          "Example (containerd runtime options):\n"
          "  BinaryName = \"/usr/bin/gpulet-container-runtime\"   "
          "(gpulet runtime configure --runtime containerd writes it)\n"
          "The runtime below's own help follows.\n");
    std::fflush(stdout);
  }
  RuncArgs runc = ParseRuncArgs(args);
  auto config = LoadDefaultRuntimeConfig();
  if (!config.ok()) {
    ReportError(runc, std::string(config.status().message()));
    return 1;
  }
  auto runtime = FindRuntime(*config, "/proc/self/exe");
  if (!runtime.ok()) {
    ReportError(runc, std::string(runtime.status().message()));
    return 1;
  }
  if (runc.command == "create" || runc.command == "run") {
    auto done = ModifyBundle(runc.bundle, *config);
    if (!done.ok()) {
      ReportError(runc, absl::StrCat("container not started: ", done.status().message()));
      return 1;
    }
  }
  std::vector<char*> exec_args;
  exec_args.push_back(const_cast<char*>(runtime->c_str()));
  for (int i = 1; i < argc; ++i) exec_args.push_back(argv[i]);
  exec_args.push_back(nullptr);
  ::execv(runtime->c_str(), exec_args.data());
  ReportError(runc, absl::StrCat("cannot exec ", *runtime, ": ", std::strerror(errno)));
  return 1;
}

}  // namespace gpulet::runtime
