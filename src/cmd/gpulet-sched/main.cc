// gpulet-sched: placement tools. `simulate` replays the openb trace through the placement
// policies (src/placement/sim.h) and reports the allocated share of GPU capacity.
// Flags and wiring only.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cmd/common/cli.h"
#include "placement/placement.h"
#include "placement/sim.h"

namespace pl = gpulet::placement;

namespace {

struct SimulateFlags {
  std::string nodes, pods, policies = "random,best-fit,gpu-packing,dot-product,fgd,gpulet";
  std::string out;
  uint64_t seed = 42;
  int seeds = 1;
  double arrivals = 1.3;
  int jobs = 0;
  std::string ties = "first";
  std::string order = "arrival";
};

// Progress of the (policy, seed) runs on stderr, so stdout stays the table: on a terminal one bar
// redrawn in place, otherwise one line per finished run (logs, CI).
class Progress {
 public:
  explicit Progress(size_t total) : total_(total), tty_(isatty(STDERR_FILENO) == 1) {
    if (tty_) Draw();
  }
  void Done(const pl::SimResult& r) {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    if (tty_) {
      Draw();
      return;
    }
    std::cerr << absl::StrFormat("run %d/%d done: %s seed %d, %.2f%% allocated (%.1f s)\n", done_,
                                 total_, r.policy, r.seed, 100 * r.allocated, r.seconds);
  }
  void Finish() {
    if (tty_) std::cerr << "\n";
  }

 private:
  using Clock = std::chrono::steady_clock;
  void Draw() {
    const double secs = std::chrono::duration<double>(Clock::now() - start_).count();
    const int width = 30, filled = static_cast<int>(width * done_ / total_);
    std::cerr << absl::StrFormat("\r[%s%s] %d/%d runs, %.0f s", std::string(filled, '#'),
                                 std::string(width - filled, ' '), done_, total_, secs)
              << std::flush;
  }
  std::mutex mu_;
  const size_t total_;
  const bool tty_;
  size_t done_ = 0;
  const Clock::time_point start_ = Clock::now();
};

int RunSimulate(const SimulateFlags& f) {
  auto cluster = pl::LoadOpenbNodes(f.nodes);
  if (!cluster.ok()) {
    std::cerr << "gpulet-sched simulate: " << cluster.status().message() << "\n";
    return 2;
  }
  auto trace = pl::LoadOpenbPods(f.pods);
  if (!trace.ok()) {
    std::cerr << "gpulet-sched simulate: " << trace.status().message() << "\n";
    return 2;
  }
  if (!(f.arrivals > 0 && f.arrivals <= 100)) {
    std::cerr << "gpulet-sched simulate: --arrivals must be in (0, 100], got " << f.arrivals
              << "\n";
    return 2;
  }
  if (f.seeds < 1) {
    std::cerr << "gpulet-sched simulate: --seeds must be >= 1\n";
    return 2;
  }
  const pl::Workload workload = pl::WorkloadFromPods(*trace);
  std::vector<std::unique_ptr<pl::Policy>> policies;
  for (absl::string_view name : absl::StrSplit(f.policies, ',', absl::SkipEmpty())) {
    auto p = pl::MakePolicy(std::string_view(name.data(), name.size()), {.seed = f.seed});
    if (!p.ok()) {
      std::cerr << "gpulet-sched simulate: --policy: " << p.status().message() << "\n";
      return 2;
    }
    (*p)->SetWorkload(workload);
    policies.push_back(std::move(*p));
  }
  if (policies.empty()) {
    std::cerr << "gpulet-sched simulate: --policy names no policy\n";
    return 2;
  }
  // The header first: a 10-seed run takes tens of seconds, and nothing printed meanwhile looked
  // like a hang.
  std::cout << absl::StrFormat("# %s x %s, %d GPUs, arrivals %.2f, seeds %d..%d\n", f.pods, f.nodes,
                               pl::GpuCapacityMilli(*cluster) / pl::kMilliPerGpu, f.arrivals,
                               f.seed, f.seed + f.seeds - 1)
            << std::flush;
  // Every (policy, seed) run is independent; results land in fixed slots so output order and
  // content do not depend on the number of threads.
  const size_t nruns = policies.size() * static_cast<size_t>(f.seeds);
  std::vector<pl::SimResult> results(nruns);
  std::atomic<size_t> next{0};
  Progress progress(nruns);
  const int jobs = f.jobs > 0 ? f.jobs : std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (int t = 0; t < std::min<int>(jobs, static_cast<int>(nruns)); ++t) {
    threads.emplace_back([&] {
      for (size_t i; (i = next++) < nruns;) {
        pl::SimOptions o{.arrivals = f.arrivals,
                         .seed = f.seed + i % f.seeds,
                         .random_ties = f.ties == "random",
                         .offline = f.order == "offline"};
        results[i] = pl::Simulate(*cluster, *trace, *policies[i / f.seeds], o);
        progress.Done(results[i]);
      }
    });
  }
  for (auto& t : threads) t.join();
  progress.Finish();

  if (!f.out.empty()) {
    // Write to a temporary name and rename, so a failed run never leaves half a file.
    const std::string tmp = f.out + ".tmp";
    {
      std::ofstream out(tmp);
      out << "policy,seed,arrived,allocated\n";
      for (const auto& r : results) {
        for (const auto& p : r.curve) {
          out << absl::StrFormat("%s,%d,%.4f,%.6f\n", r.policy, r.seed, p.arrived, p.allocated);
        }
      }
      if (!out.good()) {
        std::cerr << "gpulet-sched simulate: cannot write " << tmp << "\n";
        std::remove(tmp.c_str());
        return 1;
      }
    }
    if (std::rename(tmp.c_str(), f.out.c_str()) != 0) {
      std::cerr << "gpulet-sched simulate: cannot rename " << tmp << " to " << f.out << "\n";
      std::remove(tmp.c_str());
      return 1;
    }
  }
  std::cout << absl::StrFormat("%-12s %8s %7s %7s %7s %9s %8s\n", "policy", "alloc%", "+-sd", "min",
                               "max", "failed", "s/run");
  for (size_t p = 0; p < policies.size(); ++p) {
    double sum = 0, sq = 0, mn = 1e9, mx = -1e9, secs = 0, failed = 0;
    for (int s = 0; s < f.seeds; ++s) {
      const auto& r = results[p * f.seeds + s];
      sum += r.allocated;
      sq += r.allocated * r.allocated;
      mn = std::min(mn, r.allocated);
      mx = std::max(mx, r.allocated);
      secs += r.seconds;
      failed += static_cast<double>(r.failed);
    }
    const double n = f.seeds;
    const double mean = sum / n;
    const double sd = n > 1 ? std::sqrt(std::max(0.0, (sq - n * mean * mean) / (n - 1))) : 0;
    std::cout << absl::StrFormat("%-12s %8.2f %7.2f %7.2f %7.2f %9.1f %8.2f\n", policies[p]->name(),
                                 100 * mean, 100 * sd, 100 * mn, 100 * mx, failed / n, secs / n);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpulet-sched: GPU placement tools (policies shared with the scheduler extender)"};
  app.require_subcommand(1);
  SimulateFlags f;
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
  sim->add_option("--jobs", f.jobs, "parallel runs (default: number of CPUs)")
      ->check(CLI::Range(1, 4096));
  sim->callback([&] { std::exit(RunSimulate(f)); });
  if (auto rc = gpulet::cmd::Parse(app, argc, argv)) return *rc;
  return 0;
}
