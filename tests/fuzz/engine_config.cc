// The engines' own configuration files that `gpulet runtime configure` edits: containerd's
// config.toml, Docker's daemon.json, CRI-O's crio.conf. The first byte picks the engine.
#include "runtime/engine_config.h"

#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gpulet::runtime;
  if (size == 0) return 0;
  static const struct {
    Engine engine;
    const char* path;
  } kEngines[] = {{Engine::kContainerd, "etc/containerd/config.toml"},
                  {Engine::kDocker, "etc/docker/daemon.json"},
                  {Engine::kCrio, "etc/crio/crio.conf"}};
  const auto& e = kEngines[data[0] % 3];
  ConfigureOptions o;
  o.engine = e.engine;
  gpulet::fuzz::ScratchFile(e.path, gpulet::fuzz::Input(data + 1, size - 1));
  o.root = gpulet::fuzz::ScratchRoot();
  o.runtime_path = "/usr/bin/gpulet-container-runtime";
  o.enable_cdi = data[0] & 4;
  o.set_as_default = data[0] & 8;
  auto plan = PlanConfigure(o);
  if (plan.ok())
    for (const auto& c : *plan) (void)UnifiedDiff(c);
  return 0;
}
