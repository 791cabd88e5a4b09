// gpulet-sim: the simulation runner behind `gpulet sim` (which execs it, so the production binary
// links no fake code). Parses flags and wires SimNode / the fault-injection control log.
#include <signal.h>

#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "fake_nvml/control.h"
#include "testing/sim/sim_node.h"

namespace {

int RunNode(gpulet::sim::SimOptions opt, bool serve) {
  // Block SIGINT/SIGTERM before any thread starts so that Serve() can wait for them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
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
    return 1;
  }
  node.RunPods();
  node.PrintNode();
  node.PrintPods();
  if (serve) node.Serve();
  node.Stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Simulated GPU node: the kubelet emulator, the real agent on the fake NVML, and pods "
               "from YAML. Prints the node's resources and each pod's status and allocation.",
               "gpulet sim"};
  gpulet::sim::SimOptions opt;
  bool serve = false;
  app.add_option("--simulate", opt.profile,
                 "Machine profile: built-in name (dgx-h100, dgx1-v100, a100-mig, pcie-t4, ...) or "
                 "machine-file path")
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

  // gpulet sim fault KIND ...: one fault into the running node's control log.
  CLI::App* fault = app.add_subcommand(
      "fault", "Inject a fault into a running simulated node (XID event, GPU lost, reset, NVML "
               "init failure/recovery, ECC event, telemetry values)");
  std::string kind, ecc_type;
  std::string fault_root;
  int gpu = -1;
  uint64_t code = 0;
  int64_t gi = -1, ci = -1;
  std::vector<std::string> values;
  fault->add_option("kind", kind, "xid | ecc | lost | reset | nvml-fail | nvml-ok | set")
      ->required()
      ->check(CLI::IsMember({"xid", "ecc", "lost", "reset", "nvml-fail", "nvml-ok", "set"}));
  fault->add_option("--sim-root", fault_root,
                    "The node's sim root (default: $TMPDIR/gpulet-sim-<uid>, as `gpulet sim` uses)")
      ->type_name("DIR");
  fault->add_option("--gpu", gpu, "GPU index (all kinds but nvml-fail / nvml-ok)");
  fault->add_option("--code", code, "XID number (xid), e.g. 79 = GPU fell off the bus");
  fault->add_option("--type", ecc_type, "ecc: sbe (single-bit) or dbe (double-bit)")
      ->check(CLI::IsMember({"sbe", "dbe"}));
  fault->add_option("--gi", gi, "xid on a MIG device: GPU instance id");
  fault->add_option("--ci", ci, "xid on a MIG device: compute instance id");
  fault->add_option("values", values, "set: telemetry KEY=VALUE pairs (e.g. temperature_gpu=92)");

  CLI11_PARSE(app, argc, argv);

  if (fault->parsed()) {
    std::string line = kind;
    if (gpu >= 0) line += absl::StrCat(" gpu=", gpu);
    if (code) line += absl::StrCat(" code=", code);
    if (!ecc_type.empty()) line += " type=" + ecc_type;
    if (gi >= 0) line += absl::StrCat(" gi=", gi);
    if (ci >= 0) line += absl::StrCat(" ci=", ci);
    for (const auto& v : values) line += " " + v;
    auto f = gpulet::sim::ParseFault(line);
    if (!f.ok()) {
      std::cerr << "gpulet sim fault: " << f.status().message() << "\n";
      return 2;
    }
    std::string root = fault_root.empty() ? gpulet::sim::DefaultSimRoot() : fault_root;
    absl::Status s = gpulet::sim::InjectFault(root, *f);
    if (!s.ok()) {
      std::cerr << "gpulet sim fault: " << s.message() << "\n";
      return 1;
    }
    std::cout << "injected: " << gpulet::sim::FormatFault(*f) << " (" << root << ")\n";
    return 0;
  }
  return RunNode(std::move(opt), serve);
}
