// `gpulet exporter`: the Prometheus exporter alone (the agent serves the same from its shared GPU
// layer). NVML missing at start is not fatal: /metrics answers with gpulet_exporter_nvml_up 0 and
// the GPU layer is opened again every interval.
#include "metrics/exporter.h"

#include <iostream>
#include <memory>

#include "cmd/common/exit.h"
#include "cmd/gpulet/command.h"
#include "cmd/gpulet/device_health.h"
#include "cmd/gpulet/gpu_flags.h"
#include "cmd/gpulet/logs.h"
#include "cmd/gpulet/metrics_options.h"
#include "gpu/open.h"
#include "http/listen_address.h"

namespace gpulet::cmd {
namespace {

std::function<int()> SetupExporter(CLI::App& sub) {
  auto gpu_opts = std::make_shared<gpu::GpuOptions>();
  auto flags = std::make_shared<ExporterFlags>();
  AddGpuFlags(sub, *gpu_opts);
  AddExporterFlags(sub, *flags, /*with_pod_socket=*/true);
  Example(sub,
          "gpulet exporter --simulate dgx-h100 --address 127.0.0.1:9400 --families gpulet,dcgm");
  return [gpu_opts, flags] {
    auto options = ToExporterOptions(*flags);
    if (!options.ok()) return Fail("gpulet exporter", options.status(), kUsageError);
    auto health = StandaloneHealth();  // the device plugin's rules, from the same environment
    if (!health.ok()) return Fail("gpulet exporter", health.status(), kUsageError);
    options->sampler.device_health = *std::move(health);
    const sigset_t stop = BlockStopSignals();
    UseDaemonLogs();
    auto opener = [gpu_opts] { return gpu::OpenGpuLayer(*gpu_opts); };
    auto exporter = metrics::Exporter::Start(*std::move(options), nullptr, opener);
    if (!exporter.ok()) return Fail("gpulet exporter", exporter.status());
    // Tests and scripts that pass port 0 read the chosen port here (the number right after
    // "listening on port "); the rest says who can reach it and where to look.
    auto hp = http::ParseListenAddress(flags->address);  // checked by ToExporterOptions
    const std::string host = hp.ok() ? hp->first : "?";
    const int port = (*exporter)->port();
    std::cout << "gpulet exporter: listening on port " << port << " of " << host
              << (host == "0.0.0.0" ? " (every IPv4 address of this host)" : "") << ": http://"
              << (host == "0.0.0.0" ? "localhost" : host) << ":" << port << "/metrics and /health"
              << std::endl;
    int sig = 0;
    sigwait(&stop, &sig);
    (*exporter)->Stop();
    return 0;
  };
}

}  // namespace

GPULET_COMMAND(exporter,
               "Serve GPU metrics for Prometheus (gpulet, DCGM, nvidia_smi, GPU Manager names) "
               "with per-pod attribution",
               SetupExporter);

}  // namespace gpulet::cmd
