// `gpulet labels`: GFD-compatible node labels as an NFD feature file, once (--oneshot) or
// refreshed every --interval (the agent runs the same refresher on its shared GPU layer).
#include "labels/labels.h"

#include <iostream>
#include <memory>

#include "cmd/common/exit.h"
#include "cmd/gpulet/command.h"
#include "cmd/gpulet/gpu_flags.h"
#include "cmd/gpulet/logs.h"
#include "cmd/gpulet/metrics_options.h"
#include "gpu/open.h"

namespace gpulet::cmd {
namespace {

std::function<int()> SetupLabels(CLI::App& sub) {
  auto gpu_opts = std::make_shared<gpu::GpuOptions>();
  auto flags = std::make_shared<LabelFlags>();
  auto oneshot = std::make_shared<bool>(false);
  AddGpuFlags(sub, *gpu_opts);
  AddLabelFlags(sub, *flags);
  sub.add_flag("--oneshot", *oneshot, "Write the labels once and exit");
  Example(sub, "gpulet labels --simulate a100-mig --oneshot --output -");
  return [gpu_opts, flags, oneshot] {
    RootedFilesystem fs("/");
    auto options = ToLabelOptions(*flags, fs);
    if (!options.ok()) return Fail("gpulet labels", options.status(), kUsageError);
    auto interval = ParseFlagDuration("interval", flags->interval);
    if (!interval.ok()) return Fail("gpulet labels", interval.status(), kUsageError);
    const sigset_t stop = BlockStopSignals();
    auto layer = gpu::OpenGpuLayer(*gpu_opts);
    if (!layer.ok()) return Fail("gpulet labels", layer.status());
    labels::LabelRefresher refresher(layer->get(), &fs, flags->output, *options, *interval);
    if (absl::Status st = refresher.WriteOnce(); !st.ok()) return Fail("gpulet labels", st);
    if (*oneshot) return 0;
    UseDaemonLogs();
    refresher.Start();
    int sig = 0;
    sigwait(&stop, &sig);
    refresher.Stop();
    return 0;
  };
}

}  // namespace

GPULET_COMMAND(labels,
               "Write GPU feature labels (gpu-feature-discovery compatible) as an NFD feature file",
               SetupLabels);

}  // namespace gpulet::cmd
