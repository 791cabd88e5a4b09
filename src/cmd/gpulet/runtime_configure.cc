// `gpulet runtime configure`: registers gpulet-container-runtime with containerd, Docker or CRI-O
// (runtime/engine_config.h).
#include <unistd.h>

#include <climits>
#include <iostream>
#include <memory>

#include "cmd/common/exit.h"
#include "cmd/gpulet/command.h"
#include "runtime/engine_config.h"

namespace gpulet::cmd {
namespace {

struct ConfigureFlags {
  std::string engine, config, drop_in, name = "nvidia", path;
  bool set_default = false, cdi = false, dry_run = false;
};

// Default shim path: beside this gpulet binary when it is there, else /usr/bin.
std::string DefaultShimPath() {
  char self[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    std::string dir(self, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
    std::string p = dir + "/gpulet-container-runtime";
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "/usr/bin/gpulet-container-runtime";
}

int Configure(const ConfigureFlags& f) {
  constexpr char kWho[] = "gpulet runtime configure";
  // What was typed or configured wrong (a relative --runtime-path, the drop-in being the config
  // itself, a file that does not parse) exits 2, the rest 1 (exit.h ExitCodeOf).
  auto fail = [&](const absl::Status& s) { return Fail(kWho, s); };
  auto engine = runtime::ParseEngine(f.engine);
  if (!engine.ok()) return fail(engine.status());
  runtime::ConfigureOptions o;
  o.engine = *engine;
  o.config_path = f.config;
  o.drop_in_path = f.drop_in;
  o.runtime_name = f.name;
  o.runtime_path = f.path.empty() ? DefaultShimPath() : f.path;
  o.set_as_default = f.set_default;
  o.enable_cdi = f.cdi;
  std::vector<std::string> notes;
  auto plan = runtime::PlanConfigure(o, &notes);
  if (!plan.ok()) return fail(plan.status());
  // The engine would take a missing binary as its runtime (its default one, with
  // --set-as-default) and fail every container start on it: said, not refused, since an
  // installer may configure the engine before it copies the binary.
  if (::access(o.runtime_path.c_str(), X_OK) != 0)
    std::cerr << kWho << ": warning: --runtime-path " << o.runtime_path
              << ": no such executable (yet); the engine cannot start containers with runtime "
              << o.runtime_name << (o.set_as_default ? ", its default runtime," : "")
              << " until it exists\n";
  bool any = false;
  for (const auto& c : *plan) any |= c.changed();
  if (f.dry_run) {
    for (const auto& c : *plan)
      if (c.changed()) std::cout << runtime::UnifiedDiff(c);
    if (!any) std::cout << "no change\n";
    return 0;
  }
  if (auto s = runtime::ApplyChanges(*plan); !s.ok()) return fail(s);
  for (const auto& c : *plan)
    std::cerr << (c.changed() ? "wrote " : "unchanged ") << c.path
              << (c.changed() && c.existed ? " (the original is " + c.path + ".bak)" : "") << "\n";
  if (any)
    for (const auto& n : notes) std::cerr << "note: " << n << "\n";
  return 0;
}

std::function<int()> SetupRuntime(CLI::App& sub) {
  sub.require_subcommand(1);
  auto f = std::make_shared<ConfigureFlags>();
  CLI::App* c = sub.add_subcommand("configure", "Register gpulet-container-runtime with an engine");
  c->add_option("--runtime", f->engine, "containerd, docker or crio")
      ->required()
      ->check(CLI::IsMember({"containerd", "docker", "crio"}));
  c->add_option("--config", f->config,
                "Engine config file (default /etc/containerd/config.toml, /etc/docker/daemon.json, "
                "/etc/crio/crio.conf)");
  c->add_option("--drop-in-config", f->drop_in,
                "Drop-in file (containerd: <config dir>/conf.d/99-gpulet.toml, crio: "
                "<config dir>/crio.conf.d/99-gpulet.toml)");
  c->add_option("--runtime-name", f->name, "Name of the runtime in the engine")
      ->capture_default_str();
  c->add_option(
      "--runtime-path", f->path,
      "Absolute path of gpulet-container-runtime (default: beside gpulet, else /usr/bin)");
  c->add_flag("--set-as-default", f->set_default, "Make it the engine's default runtime");
  c->add_flag("--enable-cdi", f->cdi, "Enable CDI devices in the engine (containerd, docker)");
  c->add_flag("--dry-run", f->dry_run, "Print the diff instead of writing");
  Example(*c,
          "gpulet runtime configure --runtime containerd --set-as-default --enable-cdi --dry-run");
  Example(sub,
          "gpulet runtime configure --runtime containerd --set-as-default --enable-cdi --dry-run");
  return [f, c] { return c->parsed() ? Configure(*f) : kUsageError; };
}

}  // namespace

GPULET_COMMAND(runtime, "Container engine integration of gpulet-container-runtime", SetupRuntime);

}  // namespace gpulet::cmd
