// gpulet: the node agent and its tools. main() only builds the command line from the registered
// commands (see command.h) and runs the chosen one.
#include <spdlog/cfg/env.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <map>
#include <memory>

#include "cmd/common/cli.h"
#include "cmd/gpulet/command.h"
#include "cmd/gpulet/logs.h"
#include "kubelet/grpc_logs.h"
#include "metrics/exporter.h"

namespace gpulet::cmd {
namespace {

struct Entry {
  std::string description;
  CommandSetup setup;
};
std::map<std::string, Entry>& Registry() {
  static auto* r = new std::map<std::string, Entry>();
  return *r;
}

}  // namespace

CommandRegistration::CommandRegistration(const char* name, const char* description,
                                         CommandSetup setup) {
  Registry()[name] = Entry{description, std::move(setup)};
}

}  // namespace gpulet::cmd

int main(int argc, char** argv) {
  // Before any thread exists: the long-running commands (agent, exporter) keep few malloc arenas
  // however many cores the node has (see ConfigureMalloc).
  gpulet::metrics::ConfigureMalloc();
  // Logs on stderr, so what a command prints for scripts (info --json, cdi generate, labels to -)
  // stays parseable on stdout; a container's runtime collects both streams.
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
  // SPDLOG_LEVEL=debug (or warn, ...): spdlog's own variable, read once here.
  spdlog::cfg::load_env_levels();
  gpulet::kubelet::RouteGrpcLogsToDebug();
  CLI::App app{
      "gpulet: NVIDIA GPUs for Kubernetes -- device plugin, runtime, vGPU, metrics, labels",
      "gpulet"};
  gpulet::cmd::UseConventions(app);
  app.require_subcommand(1);
  app.set_version_flag("--version", "gpulet 0.1.0");
  // Only the chosen command declares its flags: the others' setup code (and the libraries it would
  // touch) then never runs, which keeps a long-running command's resident memory down. The top
  // level has no options that take a value, so the first argument naming a command is the command.
  std::string chosen;
  for (int i = 1; i < argc && chosen.empty(); ++i)
    if (gpulet::cmd::Registry().count(argv[i])) chosen = argv[i];
  if (!chosen.empty()) gpulet::cmd::UseOneShotLogs("gpulet " + chosen);
  std::function<int()> run;
  for (auto& [name, entry] : gpulet::cmd::Registry()) {
    CLI::App* sub = app.add_subcommand(name, entry.description);
    if (name == chosen) run = entry.setup(*sub);
  }
  // After the commands: a subcommand inherits the footer its parent has when it is added.
  gpulet::cmd::Example(app,
                       "gpulet info --simulate dgx1-v100   (`gpulet <command> --help`: its flags)");
  if (auto rc = gpulet::cmd::Parse(app, argc, argv)) return *rc;
  return run ? run() : gpulet::cmd::kUsageError;
}
