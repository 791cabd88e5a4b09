// gpulet-sim: the simulation runner behind `gpulet sim` (which execs it, so the production binary
// links no fake code). Parses flags and wires SimNode / the fault-injection control log.
#include <signal.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_join.h"
#include "cmd/common/cli.h"
#include "common/signals.h"
#include "fake_nvml/fault_cli.h"
#include "fake_nvml/machine.h"
#include "testing/sim/sim_node.h"

namespace {

int RunNode(gpulet::sim::SimOptions opt, bool serve) {
  // Blocked before any thread starts, so that every wait of the node sees them (common/signals.h).
  gpulet::BlockStopSignals();
  gpulet::sim::SimNode node(std::move(opt), std::cout);
  absl::Status s = node.Prepare();
  if (!s.ok()) {
    std::cerr << "gpulet sim: " << s.message() << "\n";
    return 2;
  }
  s = node.Start();
  if (!s.ok()) {
    std::cerr << "gpulet sim: " << s.message() << "\n";
    node.Stop();
    return node.stop_signal() ? 128 + node.stop_signal() : 1;
  }
  node.RunPods();
  if (node.stop_signal()) {  // stopped early: what ran so far, then the usual exit for a signal
    node.PrintPods();
    node.Stop();
    return 128 + node.stop_signal();
  }
  node.PrintNode();
  node.PrintPods();
  if (serve) node.Serve();
  node.Stop();
  return 0;
}

}  // namespace

// `gpulet sim fault --sim-root D xid ...` and `gpulet sim --sim-root D fault xid ...` (the flag
// before the fault kind, as the node commands take it) mean `gpulet sim fault xid ... --sim-root
// D`: the fault kinds own the flag, so it is moved behind the kind.
static std::vector<std::string> NormalizeFaultArgs(int argc, char** argv) {
  std::vector<std::string> a(argv, argv + argc);
  size_t f = std::find(a.begin(), a.end(), "fault") - a.begin();
  if (f == a.size()) return a;
  size_t kind = f + 1;  // the first word after `fault` that is not --sim-root or its value
  while (kind < a.size() && (a[kind] == "--sim-root" || a[kind].rfind("--sim-root=", 0) == 0))
    kind += a[kind] == "--sim-root" ? 2 : 1;
  if (kind >= a.size()) return a;
  std::vector<std::string> kept, moved;
  for (size_t i = 0; i < a.size(); ++i) {
    if (i < kind && a[i] == "--sim-root" && i + 1 < kind) {
      moved = {a[i], a[i + 1]};
      ++i;
    } else if (i < kind && a[i].rfind("--sim-root=", 0) == 0) {
      moved = {a[i]};
    } else {
      kept.push_back(a[i]);
    }
  }
  kept.insert(kept.end(), moved.begin(), moved.end());
  return kept;
}

int main(int argc, char** argv) {
  std::vector<std::string> args = NormalizeFaultArgs(argc, argv);
  std::vector<char*> argp;
  for (auto& s : args) argp.push_back(s.data());
  argc = static_cast<int>(argp.size());
  argv = argp.data();
  CLI::App app{
      "Simulated GPU node: the kubelet emulator, the real agent on the fake NVML, and pods "
      "from YAML. Prints the node's resources and each pod's status and allocation.",
      "gpulet sim"};
  gpulet::cmd::UseConventions(app);
  gpulet::sim::SimOptions opt;
  bool serve = false;
  app.add_option("--simulate", opt.profile,
                 "Machine profile: built-in name (" +
                     absl::StrJoin(gpulet::sim::BuiltinProfiles(), ", ") + ") or machine-file path")
      ->type_name("PROFILE");
  app.add_option("--sim-root", opt.sim_root,
                 "State directory of the simulated node (kubelet sockets, fake /sys, fault log); "
                 "default: $TMPDIR/gpulet-sim-<uid>")
      ->type_name("DIR");
  app.add_flag("--serve", serve,
               "Keep the node running after the pods, printing events, until SIGINT/SIGTERM");
  app.add_option("--agent-binary", opt.agent_binary,
                 "The gpulet binary whose `agent` command serves the node (default: gpulet beside "
                 "gpulet-sim)")
      ->type_name("PATH");
  app.add_option("--agent-arg", opt.agent_extra_args,
                 "Extra argument for the agent (repeatable), e.g. --agent-arg=--config-file=c.yaml")
      ->type_name("ARG")
      ->allow_extra_args(false);
  app.add_option("pods", opt.pod_files, "Pod YAML files (kind: Pod; several documents per file)")
      ->type_name("POD.yaml");

  // gpulet sim fault KIND ...: the GPU layer's fault front end (testing/fake_nvml/fault_cli.h).
  CLI::App* fault = app.add_subcommand(
      "fault",
      "Inject a fault into a running simulated node (XID event, GPU lost, reset, NVML "
      "init failure/recovery, ECC event, telemetry values)");
  std::function<int()> run_fault = gpulet::sim::SetupFaultCommand(*fault);
  gpulet::cmd::Example(app, "gpulet sim --simulate dgx-h100 examples/05-vgpu.yaml");
  gpulet::cmd::Example(*fault, "gpulet sim fault xid --gpu 3 --code 79 --sim-root /tmp/node1");

  if (auto rc = gpulet::cmd::Parse(app, argc, argv)) return *rc;

  if (fault->parsed()) return run_fault();
  return RunNode(std::move(opt), serve);
}
