// `gpulet cdi generate`: writes the CDI spec for this node's GPUs (runtime/cdi.h), atomically.
#include "runtime/cdi.h"

#include <unistd.h>

#include <iostream>
#include <memory>

#include "absl/strings/match.h"
#include "cmd/common/exit.h"
#include "cmd/gpulet/cdi_flags.h"
#include "cmd/gpulet/command.h"
#include "cmd/gpulet/gpu_flags.h"
#include "common/duration.h"
#include "common/fs.h"
#include "common/status.h"
#include "gpu/open.h"
#include "spdlog/spdlog.h"

namespace gpulet::cmd {
namespace {

struct CdiFlags {
  gpu::GpuOptions gpu;
  std::string output, format, strategy = "both", driver_root = "/", kind = "nvidia.com/gpu";
  std::string hook_path = "/usr/bin/gpulet-container-hook";
};

int Generate(const CdiFlags& f) {
  // Exit 2 for what was typed wrong (--kind, a profile), 1 for the rest (exit.h ExitCodeOf).
  auto fail = [](const absl::Status& s) { return Fail("gpulet cdi generate", s); };
  auto strategy = runtime::ParseNameStrategy(f.strategy);
  if (!strategy.ok()) return fail(strategy.status());
  auto layer = gpu::OpenGpuLayer(f.gpu);
  if (!layer.ok()) return fail(layer.status());
  auto inv = (*layer)->GetInventory();
  if (!inv.ok()) return fail(inv.status());
  runtime::CdiGenerateOptions opts;
  opts.driver_root = f.driver_root;
  opts.kind = f.kind;
  opts.names = *strategy;
  opts.hook_path = f.hook_path;
  std::vector<std::string> warnings;
  auto spec = runtime::GenerateCdiSpec(*inv, opts, &warnings);
  if (!spec.ok()) return fail(spec.status());
  for (const auto& w : warnings) std::cerr << "gpulet cdi generate: warning: " << w << "\n";
  // Without --format, the output's extension decides (.json: JSON, which the runtime reads about
  // ten times faster than YAML; anything else: YAML).
  std::string format = f.format;
  if (format.empty()) format = absl::EndsWith(f.output, ".json") ? "json" : "yaml";
  std::string text =
      format == "json" ? runtime::CdiSpecToJson(*spec) : runtime::CdiSpecToYaml(*spec);
  if (f.output.empty() || f.output == "-") {
    std::cout << text;
    return 0;
  }
  if (auto s = WriteFileAtomic(f.output, text, 0644); !s.ok()) return fail(s);
  return 0;
}

std::function<int()> SetupCdi(CLI::App& sub) {
  sub.require_subcommand(1);
  auto f = std::make_shared<CdiFlags>();
  CLI::App* gen = sub.add_subcommand("generate", "Write the CDI spec of this node's GPUs");
  AddGpuFlags(*gen, f->gpu);
  gen->add_option("--output,-o", f->output, "Spec file to write atomically (default: stdout)");
  gen->add_option("--format", f->format,
                  "yaml or json (default: json when --output ends in .json, else yaml)")
      ->check(CLI::IsMember({"yaml", "json"}));
  gen->add_option("--device-name-strategy", f->strategy,
                  "Device names: index (\"0\", \"0:1\"), uuid (GPU-..., MIG-...) or both")
      ->check(CLI::IsMember({"index", "uuid", "both"}))
      ->capture_default_str();
  gen->add_option("--driver-root", f->driver_root,
                  "Root of the driver installation (device nodes, ld cache, libraries)")
      ->capture_default_str();
  gen->add_option("--kind", f->kind, "CDI kind (vendor/class)")->capture_default_str();
  gen->add_option("--hook-path", f->hook_path,
                  "gpulet-container-hook path for the ld-cache hook (empty: no hook)")
      ->capture_default_str();
  Example(*gen, "gpulet cdi generate --simulate dgx-h100 --output /var/run/cdi/nvidia.json");
  Example(sub, "gpulet cdi generate --simulate dgx-h100 --output /var/run/cdi/nvidia.json");
  return [f, gen] {
    if (gen->parsed()) return Generate(*f);
    return kUsageError;
  };
}

}  // namespace

void AddCdiRefreshFlags(CLI::App& app, CdiRefreshFlags& f) {
  app.add_option("--cdi-spec", f.spec,
                 "Keep this CDI spec file in step with the GPUs (e.g. /var/run/cdi/nvidia.json; "
                 "JSON when it ends in .json); empty: off");
  app.add_option("--cdi-driver-root", f.driver_root, "Driver root for the CDI spec")
      ->capture_default_str();
  app.add_option("--cdi-hook-path", f.hook_path, "gpulet-container-hook path in the CDI spec")
      ->capture_default_str();
  app.add_option("--cdi-device-name-strategy", f.strategy, "index, uuid or both")
      ->check(CLI::IsMember({"index", "uuid", "both"}))
      ->capture_default_str();
  app.add_option("--cdi-interval", f.interval, "How often the CDI spec is checked")
      ->capture_default_str()
      ->type_name("DURATION");
}

absl::StatusOr<std::unique_ptr<runtime::CdiRefresher>> StartCdiRefresher(const CdiRefreshFlags& f,
                                                                         gpu::Machine& machine) {
  if (f.spec.empty()) return nullptr;
  ASSIGN_OR_RETURN(ParsedDuration parsed, ParseDuration("--cdi-interval", f.interval));
  const absl::Duration interval = parsed.value;
  auto strategy = runtime::ParseNameStrategy(f.strategy);
  if (!strategy.ok()) return strategy.status();
  runtime::CdiGenerateOptions o;
  o.driver_root = f.driver_root;
  o.host_root = f.host_root;
  o.hook_path = f.hook_path;
  o.names = *strategy;
  o.proc_root = machine.kernel_root();
  auto r = std::make_unique<runtime::CdiRefresher>(&machine.gpus(), f.spec, o,
                                                   absl::ToChronoMilliseconds(interval));
  if (auto first = r->RefreshOnce(); !first.ok())
    spdlog::warn("CDI spec {}: {} (retried every {})", f.spec,
                 std::string(first.status().message()), f.interval);
  r->Start();
  return r;
}

GPULET_COMMAND(cdi, "Container Device Interface specs for the node's GPUs", SetupCdi);

}  // namespace gpulet::cmd
