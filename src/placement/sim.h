// Trace-driven placement simulator over the openb GPU cluster trace (Alibaba, the trace of the
// FGD paper, USENIX ATC'23), following the paper's method: tasks arrive in a seeded random order
// with no departures until the GPU they ask reaches `arrivals` x the cluster's GPU capacity; each
// is placed by the policy or fails; the figure of merit is the allocated share of GPU capacity.
//
// Loading is strict: a malformed file gets one error naming the file and line.
// Everything here is single-threaded; Simulate() only reads `cluster` and `trace` and copies the
// cluster, so several simulations may run at once on the same inputs and the same policy.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "placement/placement.h"

namespace gpulet::placement {

// openb node list (columns sn,cpu_milli,memory_mib,gpu,model; extra columns ignored). `source`
// names the input in errors ("nodes.csv:12: ...").
absl::StatusOr<Cluster> ParseOpenbNodes(std::string_view csv, std::string_view source);
// openb pod list (columns name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec]; others ignored).
absl::StatusOr<std::vector<PodRequest>> ParseOpenbPods(std::string_view csv,
                                                       std::string_view source);
// The same, reading a file.
absl::StatusOr<Cluster> LoadOpenbNodes(const std::string& path);
absl::StatusOr<std::vector<PodRequest>> LoadOpenbPods(const std::string& path);

// Sum of healthy GPUs' compute, in milli-GPU.
int64_t GpuCapacityMilli(const Cluster& cluster);

// The arrival sequence for one seed: the trace shuffled, then (if it asks less than the target
// arrivals x capacity) tasks drawn from it at random with replacement, appended until the next
// one would pass the target; or (if it asks more) random tasks removed until it does not.
std::vector<PodRequest> ArrivalStream(std::span<const PodRequest> trace, int64_t capacity_milli,
                                      double arrivals, uint64_t seed);

struct SimOptions {
  double arrivals = 1.3;     // stop when requested GPU reaches this multiple of capacity
  uint64_t seed = 42;        // arrival order, resampling and tie-breaking
  double curve_step = 0.01;  // a curve point each time arrivals pass another step
  // Equal scores: a uniformly random node among them (kube-scheduler's selectHost) or the first
  // in node order. Node order is itself shuffled per seed, as the paper's simulator does by
  // prefixing node names with a random permutation.
  bool random_ties = false;
  // Offline packing, a reference for what full knowledge of the arrivals reaches: the same
  // arrivals, placed hardest first (SortForOfflinePacking) instead of in arrival order.
  bool offline = false;
};

// Orders an arrival stream for offline packing: more whole GPUs first, then larger shares,
// model-constrained before unconstrained, CPU-only tasks last.
void SortForOfflinePacking(std::vector<PodRequest>& stream);

struct SimPoint {
  double arrived = 0;    // requested GPU so far / capacity
  double allocated = 0;  // placed GPU so far / capacity
};

struct SimResult {
  std::string policy;
  uint64_t seed = 0;
  std::vector<SimPoint> curve;
  double arrived = 0;    // final
  double allocated = 0;  // final: the figure of merit
  int64_t tasks = 0;
  int64_t failed = 0;            // tasks no node could take
  int64_t failed_gpu_milli = 0;  // GPU those failed tasks asked
  double seconds = 0;            // wall time of the run
};

// One run. `policy` must already know the workload (Policy::SetWorkload) if it needs it.
SimResult Simulate(const Cluster& cluster, std::span<const PodRequest> trace, const Policy& policy,
                   const SimOptions& options);

// `gpulet-sched simulate` as a library call: files in, one result per (policy, seed) out, in two
// steps so that a caller can say what it runs (FormatSimulationHeader) before the runs take their
// seconds.
struct SimulationRequest {
  std::string nodes, pods;                                                      // openb CSV files
  std::string policies = "random,best-fit,gpu-packing,dot-product,fgd,gpulet";  // comma-separated
  uint64_t seed = 42;                                                           // first seed
  int seeds = 1;                                                                // seed, seed+1, ...
  double arrivals = 1.3;
  int jobs = 0;  // parallel runs; 0: one per CPU
  bool random_ties = false;
  bool offline = false;  // SimOptions::offline
};

// A checked request with its files loaded and its policies made (each knows the workload).
struct Simulation {
  SimulationRequest request;
  Cluster cluster;
  std::vector<PodRequest> trace;
  std::vector<std::unique_ptr<Policy>> policies;
  int64_t capacity_milli = 0;
  // policies x seeds.
  size_t runs() const { return policies.size() * static_cast<size_t>(request.seeds); }
};

struct SimulationReport {
  std::vector<std::string> policies;  // names, in request order
  std::vector<SimResult> results;     // policy-major: results[p * seeds + s]
  int64_t capacity_milli = 0;
};

// Loads the files and checks the request: InvalidArgument naming the file:line or the flag.
absl::StatusOr<Simulation> PrepareSimulation(const SimulationRequest& request);

// Told of each finished run: `done` of simulation.runs() so far. Called from the worker that
// ran it, one call at a time (the caller needs no lock of its own).
using SimulationRunDone = std::function<void(const SimResult& run, size_t done)>;

// Every (policy, seed) on up to request.jobs threads; the results do not depend on the thread
// count.
SimulationReport RunSimulation(const Simulation& simulation,
                               const SimulationRunDone& run_done = nullptr);

// The curves as CSV (policy,seed,arrived,allocated), written to a temporary name and renamed so a
// failed run never leaves half a file.
absl::Status WriteSimulationCurves(const SimulationReport& report, const std::string& path);

// The line that says what runs: "# PODS x NODES, N GPUs, arrivals A, seeds S..T\n".
std::string FormatSimulationHeader(const Simulation& simulation);
// The summary table: per policy, mean allocated share (+- sd, min, max over seeds), failed tasks
// and seconds per run.
std::string FormatSimulationTable(const SimulationRequest& request, const SimulationReport& report);

// Progress of the runs for whoever watches `out` (gpulet-sched writes it to stderr, so stdout stays
// the table): with `redraw` (a terminal) one bar redrawn in place, otherwise one line per finished
// run (logs, CI). Finish() after the last run.
class SimulationProgress {
 public:
  SimulationProgress(std::ostream& out, size_t total, bool redraw);
  void RunDone(const SimResult& run, size_t done);
  void Finish();

 private:
  void Draw(size_t done);
  std::ostream& out_;
  const size_t total_;
  const bool redraw_;
  // Elapsed time shown on the bar: a measurement, on the real clock (common/clock.h).
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace gpulet::placement
