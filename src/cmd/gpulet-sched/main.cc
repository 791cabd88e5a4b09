// gpulet-sched: placement tools. `simulate` replays the openb trace through the placement
// policies (src/placement/sim.h) and reports the allocated share of GPU capacity.
// Flags and wiring only.
#include <unistd.h>

#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "cmd/common/cli.h"
#include "cmd/common/exit.h"
#include "common/fs.h"
#include "placement/placement.h"
#include "placement/sim.h"

namespace pl = gpulet::placement;

namespace {

// The request's fields take their flags directly; --ties and --order are words for its bools.
struct SimulateFlags {
  pl::SimulationRequest request;
  std::string out;
  std::string ties = "first";
  std::string order = "arrival";
};

int RunSimulate(SimulateFlags f) {
  constexpr char kWho[] = "gpulet-sched simulate";
  f.request.random_ties = f.ties == "random";
  f.request.offline = f.order == "offline";
  auto sim = pl::PrepareSimulation(f.request);
  if (!sim.ok()) return gpulet::cmd::Fail(kWho, sim.status(), gpulet::cmd::kUsageError);
  // Before the runs (tens of seconds): a curve file that cannot be written is a usage error now,
  // not a failure after the work, with the table lost.
  if (!f.out.empty()) {
    if (absl::Status s = gpulet::CheckWritable(f.out); !s.ok())
      return gpulet::cmd::Fail(kWho, "--out " + std::string(s.message()), gpulet::cmd::kUsageError);
  }
  // The header first: a 10-seed run takes tens of seconds, and nothing printed meanwhile looked
  // like a hang. Progress goes to stderr, so stdout stays the header and the table.
  std::cout << pl::FormatSimulationHeader(*sim) << std::flush;
  pl::SimulationProgress progress(std::cerr, sim->runs(), isatty(STDERR_FILENO) == 1);
  const pl::SimulationReport report = pl::RunSimulation(
      *sim, [&progress](const pl::SimResult& r, size_t done) { progress.RunDone(r, done); });
  progress.Finish();
  if (!f.out.empty()) {
    if (absl::Status s = pl::WriteSimulationCurves(report, f.out); !s.ok()) {
      return gpulet::cmd::Fail(kWho, s);
    }
  }
  std::cout << pl::FormatSimulationTable(sim->request, report);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpulet-sched: GPU placement tools (policies shared with the scheduler extender)",
               "gpulet-sched"};
  gpulet::cmd::UseConventions(app);
  app.set_version_flag("--version", std::string("gpulet-sched ") + GPULET_VERSION);
  app.require_subcommand(1);
  SimulateFlags f;
  auto* sim = app.add_subcommand(
      "simulate",
      "Replay an openb trace (FGD paper, USENIX ATC'23) through placement policies: tasks arrive "
      "in a seeded random order, no departures, until requested GPU reaches --arrivals x "
      "capacity; prints the allocated share of GPU capacity per policy (mean over seeds)");
  sim->add_option("--nodes", f.request.nodes,
                  "openb node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
      ->required();
  sim->add_option("--pods", f.request.pods,
                  "openb pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec])")
      ->required();
  sim->add_option("--policy", f.request.policies,
                  "comma-separated policies: random,best-fit,gpu-packing,dot-product,fgd,gpulet")
      ->capture_default_str();
  // CLI11 wraps "-5" into 2^64-5 and clamps values past 2^64-1 for an unsigned option: the text
  // itself is checked.
  const CLI::Validator whole_u64(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos ||
            !absl::SimpleAtoi(s, &v))
          return "must be a whole number 0.." + std::to_string(UINT64_MAX) + ", not \"" + s + "\"";
        return "";
      },
      "UINT64");
  sim->add_option("--seed", f.request.seed, "first seed")->check(whole_u64)->capture_default_str();
  sim->add_option("--seeds", f.request.seeds, "number of seeds, counting up from --seed")
      ->capture_default_str();
  sim->add_option("--arrivals", f.request.arrivals,
                  "stop when requested GPU reaches this x capacity")
      ->capture_default_str();
  sim->add_option("--out", f.out, "write the curves (policy,seed,arrived,allocated) to this CSV");
  sim->add_option("--ties", f.ties,
                  "equal scores: first (in per-seed shuffled node order, as the FGD paper's "
                  "simulator) or random")
      ->check(CLI::IsMember({"random", "first"}))
      ->capture_default_str();
  sim->add_option("--order", f.order,
                  "arrival (online: tasks placed as they arrive) or offline (the same tasks placed "
                  "hardest first: a reference for what full knowledge reaches)")
      ->check(CLI::IsMember({"arrival", "offline"}))
      ->capture_default_str();
  sim->add_option("--jobs", f.request.jobs, "parallel runs (default: number of CPUs)")
      ->check(CLI::Range(1, 4096));
  gpulet::cmd::Example(*sim,
                       "gpulet-sched simulate --nodes data/openb/openb_node_list_gpu_node.csv "
                       "--pods data/openb/openb_pod_list_default.csv --policy fgd,best-fit "
                       "--seeds 3");
  sim->callback([&] { std::exit(RunSimulate(f)); });
  if (auto rc = gpulet::cmd::Parse(app, argc, argv)) return *rc;
  return 0;
}
