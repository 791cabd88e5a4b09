// `gpulet-sched simulate` as a library call (sim.h): loading, the parallel runs, their progress,
// the CSV, the header and the summary table.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "placement/sim.h"

namespace gpulet::placement {

absl::StatusOr<Simulation> PrepareSimulation(const SimulationRequest& f) {
  Simulation sim;
  sim.request = f;
  ASSIGN_OR_RETURN(sim.cluster, LoadOpenbNodes(f.nodes));
  ASSIGN_OR_RETURN(sim.trace, LoadOpenbPods(f.pods));
  if (!(f.arrivals > 0 && f.arrivals <= 100)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--arrivals must be in (0, 100], got ", f.arrivals));
  }
  if (f.seeds < 1) return absl::InvalidArgumentError("--seeds must be >= 1");
  const Workload workload = WorkloadFromPods(sim.trace);
  for (absl::string_view name : absl::StrSplit(f.policies, ',', absl::SkipEmpty())) {
    auto p = MakePolicy(std::string_view(name.data(), name.size()), {.seed = f.seed});
    if (!p.ok())
      return absl::InvalidArgumentError(absl::StrCat("--policy: ", p.status().message()));
    (*p)->SetWorkload(workload);
    sim.policies.push_back(std::move(*p));
  }
  if (sim.policies.empty()) return absl::InvalidArgumentError("--policy names no policy");
  sim.capacity_milli = GpuCapacityMilli(sim.cluster);
  return sim;
}

SimulationReport RunSimulation(const Simulation& sim, const SimulationRunDone& run_done) {
  const SimulationRequest& f = sim.request;
  SimulationReport report;
  for (const auto& p : sim.policies) report.policies.emplace_back(p->name());
  report.capacity_milli = sim.capacity_milli;
  // Every (policy, seed) run is independent; results land in fixed slots so output order and
  // content do not depend on the number of threads.
  const size_t nruns = sim.runs();
  report.results.resize(nruns);
  std::atomic<size_t> next{0};
  std::mutex done_mu;  // one run_done call at a time, `done` in the order of the calls
  size_t done = 0;
  const int jobs = f.jobs > 0 ? f.jobs : std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (int t = 0; t < std::min<int>(jobs, static_cast<int>(nruns)); ++t) {
    threads.emplace_back([&] {
      for (size_t i; (i = next++) < nruns;) {
        SimOptions o{.arrivals = f.arrivals,
                     .seed = f.seed + i % f.seeds,
                     .random_ties = f.random_ties,
                     .offline = f.offline};
        report.results[i] = Simulate(sim.cluster, sim.trace, *sim.policies[i / f.seeds], o);
        std::lock_guard<std::mutex> lock(done_mu);
        ++done;
        if (run_done) run_done(report.results[i], done);
      }
    });
  }
  for (auto& t : threads) t.join();
  return report;
}

absl::Status WriteSimulationCurves(const SimulationReport& report, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << "policy,seed,arrived,allocated\n";
    for (const auto& r : report.results) {
      for (const auto& p : r.curve) {
        out << absl::StrFormat("%s,%d,%.4f,%.6f\n", r.policy, r.seed, p.arrived, p.allocated);
      }
    }
    if (!out.good()) {
      std::remove(tmp.c_str());
      return absl::UnavailableError(absl::StrCat("cannot write ", path));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

std::string FormatSimulationHeader(const Simulation& sim) {
  const SimulationRequest& f = sim.request;
  return absl::StrFormat("# %s x %s, %d GPUs, arrivals %.2f, seeds %d..%d\n", f.pods, f.nodes,
                         sim.capacity_milli / kMilliPerGpu, f.arrivals, f.seed,
                         f.seed + f.seeds - 1);
}

std::string FormatSimulationTable(const SimulationRequest& f, const SimulationReport& report) {
  std::string out = absl::StrFormat("%-12s %8s %7s %7s %7s %9s %8s\n", "policy", "alloc%", "+-sd",
                                    "min", "max", "failed", "s/run");
  for (size_t p = 0; p < report.policies.size(); ++p) {
    double sum = 0, sq = 0, mn = 1e9, mx = -1e9, secs = 0, failed = 0;
    for (int s = 0; s < f.seeds; ++s) {
      const auto& r = report.results[p * f.seeds + s];
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
    absl::StrAppend(
        &out, absl::StrFormat("%-12s %8.2f %7.2f %7.2f %7.2f %9.1f %8.2f\n", report.policies[p],
                              100 * mean, 100 * sd, 100 * mn, 100 * mx, failed / n, secs / n));
  }
  return out;
}

SimulationProgress::SimulationProgress(std::ostream& out, size_t total, bool redraw)
    : out_(out), total_(total), redraw_(redraw) {
  if (redraw_) Draw(0);
}

void SimulationProgress::RunDone(const SimResult& r, size_t done) {
  if (redraw_) {
    Draw(done);
    return;
  }
  out_ << absl::StrFormat("run %d/%d done: %s seed %d, %.2f%% allocated (%.1f s)\n", done, total_,
                          r.policy, r.seed, 100 * r.allocated, r.seconds);
}

void SimulationProgress::Finish() {
  if (redraw_) out_ << "\n";
}

void SimulationProgress::Draw(size_t done) {
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int width = 30, filled = total_ ? static_cast<int>(width * done / total_) : width;
  out_ << absl::StrFormat("\r[%s%s] %d/%d runs, %.0f s", std::string(filled, '#'),
                          std::string(width - filled, ' '), done, total_, secs)
       << std::flush;
}

}  // namespace gpulet::placement
