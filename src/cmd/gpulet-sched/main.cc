// gpulet-sched: placement tools. `simulate` replays the openb trace through the placement
// policies (src/placement/sim.h) and reports the allocated share of GPU capacity.
// Flags and wiring only.
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "cmd/common/cli.h"
#include "cmd/common/exit.h"
#include "placement/sim.h"

namespace pl = gpulet::placement;

namespace {

// Usage errors (bad files, flags) exit 2, a failed write 1.
int Simulate(const pl::SimulationRequest& r, const std::string& out) {
  auto report = pl::RunSimulation(r);
  if (!report.ok()) return gpulet::cmd::Fail("error", report.status(), gpulet::cmd::kUsageError);
  if (!out.empty()) {
    if (auto s = pl::WriteSimulationCurves(*report, out); !s.ok()) {
      return gpulet::cmd::Fail("error", s);
    }
  }
  std::cout << pl::FormatSimulationSummary(r, *report);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpulet-sched: GPU placement tools (policies shared with the scheduler extender)"};
  app.require_subcommand(1);
  pl::SimulationRequest f;
  std::string out, ties = "first", order = "arrival";
  auto* sim = app.add_subcommand(
      "simulate",
      "Replay an openb trace (FGD paper, USENIX ATC'23) through placement policies: tasks arrive "
      "in a seeded random order, no departures, until requested GPU reaches --arrivals x "
      "capacity; prints the allocated share of GPU capacity per policy (mean over seeds)");
  sim->add_option("--nodes", f.nodes, "openb node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
      ->required();
  sim->add_option("--pods", f.pods,
                  "openb pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec])")
      ->required();
  sim->add_option("--policy", f.policies,
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
  sim->add_option("--seed", f.seed, "first seed")->check(whole_u64)->capture_default_str();
  sim->add_option("--seeds", f.seeds, "number of seeds (seed, seed+1, ...)")->capture_default_str();
  sim->add_option("--arrivals", f.arrivals, "stop when requested GPU reaches this x capacity")
      ->capture_default_str();
  sim->add_option("--out", out, "write the curves (policy,seed,arrived,allocated) to this CSV");
  sim->add_option("--ties", ties,
                  "equal scores: first (in per-seed shuffled node order, as the FGD paper's simulator) or random")
      ->check(CLI::IsMember({"random", "first"}))
      ->capture_default_str();
  sim->add_option("--order", order,
                  "arrival (online: tasks placed as they arrive) or offline (the same tasks placed "
                  "hardest first: a reference for what full knowledge reaches)")
      ->check(CLI::IsMember({"arrival", "offline"}))
      ->capture_default_str();
  sim->add_option("--jobs", f.jobs, "parallel runs (default: number of CPUs)")
      ->check(CLI::Range(1, 4096));
  sim->callback([&] {
    f.random_ties = ties == "random";
    f.offline = order == "offline";
    std::exit(Simulate(f, out));
  });
  if (auto rc = gpulet::cmd::Parse(app, argc, argv)) return *rc;
  return 0;
}
